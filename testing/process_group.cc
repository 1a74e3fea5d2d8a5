#include "testing/process_group.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

extern char** environ;

namespace shardtrain::testutil {
namespace {

// The PIDs of every group's running processes, for the signal handler:
// 0 marks a free entry.
std::atomic<pid_t> g_running[ProcessGroup::kMaxRunning];

void Forget(pid_t pid) {
  for (std::atomic<pid_t>& entry : g_running) {
    pid_t expected = pid;
    entry.compare_exchange_strong(expected, 0);
  }
}

}  // namespace

void KillAllProcessesAndExit(int signal) {
  for (std::atomic<pid_t>& entry : g_running) {
    const pid_t pid = entry.load();
    if (pid > 0) kill(pid, SIGKILL);
  }
  _exit(128 + signal);
}

ProcessGroup::~ProcessGroup() { StopAll(); }

absl::StatusOr<pid_t> ProcessGroup::Start(const std::vector<std::string>& argv,
                                          const std::string& log_path) {
  if (argv.empty()) return absl::InvalidArgumentError("no command to start");
  std::atomic<pid_t>* entry = nullptr;
  for (std::atomic<pid_t>& candidate : g_running) {
    pid_t free = 0;
    // -1 reserves the entry until the PID is known.
    if (candidate.compare_exchange_strong(free, -1)) {
      entry = &candidate;
      break;
    }
  }
  if (entry == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("more than ", kMaxRunning, " processes at once"));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path.c_str(),
                                   O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  std::vector<char*> args;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  // The stop signals wait until the PID is in the table, so that the
  // handler never misses a process; the process itself starts with the
  // mask from before (it would inherit the blocked ones, and a server that
  // does not unblock SIGTERM would then ignore it).
  sigset_t stop, old;
  sigemptyset(&stop);
  for (int s : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&stop, s);
  pthread_sigmask(SIG_BLOCK, &stop, &old);
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  posix_spawnattr_setsigmask(&attributes, &old);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGMASK);
  const int err = posix_spawnp(&pid, args[0], &actions, &attributes, args.data(), environ);
  entry->store(err == 0 ? pid : 0);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  posix_spawnattr_destroy(&attributes);
  posix_spawn_file_actions_destroy(&actions);
  if (err != 0) {
    return absl::NotFoundError(absl::StrCat("cannot start ", argv[0], ": ", std::strerror(err)));
  }
  running_.push_back(pid);
  exited_.erase(pid);  // a reused PID
  return pid;
}

absl::StatusOr<int> ProcessGroup::Wait(pid_t pid, absl::Duration timeout) {
  if (auto it = exited_.find(pid); it != exited_.end()) return it->second;
  if (std::find(running_.begin(), running_.end(), pid) == running_.end()) {
    return absl::NotFoundError(absl::StrCat("process ", pid, " was not started by this group"));
  }
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    int status = 0;
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid || done < 0) {
      const int code = done < 0                ? -1
                       : WIFEXITED(status)     ? WEXITSTATUS(status)
                                               : 128 + WTERMSIG(status);
      Forget(pid);
      running_.erase(std::remove(running_.begin(), running_.end(), pid), running_.end());
      if (done < 0) {
        return absl::InternalError(absl::StrCat("waitpid ", pid, ": ", std::strerror(errno)));
      }
      exited_[pid] = code;
      return code;
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("process ", pid, " still running"));
    }
    // Short enough for a benchmark timing a restart, cheap for a test
    // waiting minutes.
    absl::SleepFor(absl::Milliseconds(2));
  }
}

absl::Status ProcessGroup::Signal(pid_t pid, int signal) {
  if (std::find(running_.begin(), running_.end(), pid) == running_.end()) {
    return absl::NotFoundError(absl::StrCat("process ", pid, " is not running in this group"));
  }
  if (kill(pid, signal) != 0) {
    return absl::InternalError(absl::StrCat("kill ", pid, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status ProcessGroup::Stop(pid_t pid, absl::Duration grace) {
  if (absl::Status sent = Signal(pid, SIGTERM); !sent.ok()) return sent;
  kill(pid, SIGCONT);  // a stopped process sees its SIGTERM only when it runs
  if (Wait(pid, grace).ok()) return absl::OkStatus();
  return Kill(pid);
}

absl::Status ProcessGroup::Kill(pid_t pid) {
  if (absl::Status sent = Signal(pid, SIGKILL); !sent.ok()) return sent;
  return Wait(pid, absl::Seconds(10)).status();
}

void ProcessGroup::StopAll() {
  const std::vector<pid_t> pids = running_;
  for (pid_t pid : pids) {
    kill(pid, SIGTERM);
    kill(pid, SIGCONT);
  }
  for (pid_t pid : pids) {
    if (!Wait(pid, absl::Seconds(5)).ok()) {
      kill(pid, SIGKILL);
      (void)Wait(pid, absl::Seconds(5));
    }
  }
}

}  // namespace shardtrain::testutil
