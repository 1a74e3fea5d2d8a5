#include "testing/process_group.h"

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
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

// What the new process does before it runs its program, and what it says
// back: clone(CLONE_VM | CLONE_VFORK) shares this memory with it until it
// calls execve, as posix_spawn does.
struct ChildSetup {
  char* const* argv = nullptr;
  const char* log_path = nullptr;
  sigset_t mask;  // the mask it runs its program with
  pid_t parent = 0;
  int error = 0;  // errno of the step that failed, 0 if execve ran
};

// The new process. Every signal is blocked until its handlers are the
// defaults (so that none of this process's handlers runs in the shared
// memory), it asks for SIGKILL when the thread that started it ends (the
// spawner thread, which lives as long as this process: so when this process
// ends, however it ends), then runs its program. Only system calls.
int ChildMain(void* arg) {
  ChildSetup* setup = static_cast<ChildSetup*>(arg);
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != setup->parent) {
    setup->error = errno != 0 ? errno : ESRCH;  // the parent is already gone
    _exit(127);
  }
  for (int signal = 1; signal < NSIG; ++signal) {
    struct sigaction action;
    if (signal == SIGKILL || signal == SIGSTOP || sigaction(signal, nullptr, &action) != 0) {
      continue;
    }
    if (action.sa_handler != SIG_IGN && action.sa_handler != SIG_DFL) {
      action.sa_handler = SIG_DFL;
      action.sa_flags = 0;
      sigaction(signal, &action, nullptr);
    }
  }
  const int log = open(setup->log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log < 0 || dup2(log, STDOUT_FILENO) < 0 || dup2(log, STDERR_FILENO) < 0) {
    setup->error = errno;
    _exit(127);
  }
  sigprocmask(SIG_SETMASK, &setup->mask, nullptr);
  execvpe(setup->argv[0], setup->argv, environ);
  setup->error = errno;
  _exit(127);
}

// The thread that starts every group's processes. PR_SET_PDEATHSIG fires
// when the thread that created a process ends, not its process: a process
// started from a test's short-lived thread would be killed with that
// thread. This one never ends, so the processes it starts die with this
// process only, also when it aborts or is SIGKILLed (a failed CHECK, a
// test's timeout), which no destructor or handler here would see.
class Spawner {
 public:
  // The one spawner, started on first use and never destroyed (it may be
  // used until the process exits).
  static Spawner& Get() {
    static Spawner* const spawner = new Spawner();
    return *spawner;
  }

  // Starts the process of `setup` on the spawner thread; returns its PID,
  // or -1 with setup->error set.
  pid_t Spawn(ChildSetup* setup) {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](Spawner* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) { return s->request_ == nullptr; },
        this));
    request_ = setup;
    done_ = false;
    mu_.Await(absl::Condition(&done_));
    const pid_t pid = pid_;
    request_ = nullptr;
    return pid;
  }

 private:
  Spawner() { std::thread([this] { Serve(); }).detach(); }

  void Serve() {
    // 64 KiB of stack for the new process until its execve (ChildMain only
    // makes system calls).
    std::vector<char> stack(64 << 10);
    while (true) {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](Spawner* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) {
            return s->request_ != nullptr && !s->done_;
          },
          this));
      ChildSetup* setup = request_;
      setup->parent = getpid();
      setup->error = 0;
      // Every signal blocked in this thread while the child shares its
      // memory; the child sets its own mask.
      sigset_t all, old;
      sigfillset(&all);
      pthread_sigmask(SIG_SETMASK, &all, &old);
      pid_t pid = clone(ChildMain, stack.data() + stack.size(),
                        CLONE_VM | CLONE_VFORK | SIGCHLD, setup);
      const int clone_error = errno;
      pthread_sigmask(SIG_SETMASK, &old, nullptr);
      if (pid < 0) {
        setup->error = clone_error;
      } else if (setup->error != 0) {
        // It could not run its program and has exited (or is exiting).
        int status = 0;
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
        }
        pid = -1;
      }
      pid_ = pid;
      done_ = true;
    }
  }

  absl::Mutex mu_;
  ChildSetup* request_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  pid_t pid_ ABSL_GUARDED_BY(mu_) = 0;
};

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
  std::vector<char*> args;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  ChildSetup setup;
  setup.argv = args.data();
  setup.log_path = log_path.c_str();
  // The stop signals wait until the PID is in the table, so that the
  // handler never misses a process; the process itself starts with the
  // mask from before (it would inherit the blocked ones, and a server that
  // does not unblock SIGTERM would then ignore it).
  sigset_t stop;
  sigemptyset(&stop);
  for (int s : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&stop, s);
  pthread_sigmask(SIG_BLOCK, &stop, &setup.mask);
  const pid_t pid = Spawner::Get().Spawn(&setup);
  entry->store(pid > 0 ? pid : 0);
  pthread_sigmask(SIG_SETMASK, &setup.mask, nullptr);
  if (pid <= 0) {
    return absl::NotFoundError(
        absl::StrCat("cannot start ", argv[0], ": ", std::strerror(setup.error)));
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
