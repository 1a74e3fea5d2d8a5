#include "bench/bench_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"

extern char** environ;

namespace shardtrain::bench {
namespace {

// The PIDs of running children, for the signal handler (wire_bench
// --scaling runs every configuration's shards at once: 1x1..8x4 is 21).
constexpr int kMaxChildren = 128;
std::atomic<pid_t> g_children[kMaxChildren];

void Forget(pid_t pid) {
  for (std::atomic<pid_t>& child : g_children) {
    if (child.load() == pid) child.store(0);
  }
}

double Seconds(const rusage& usage) {
  return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec +
         1e-6 * (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
}

}  // namespace

void KillChildrenAndExit(int signal) {
  for (std::atomic<pid_t>& child : g_children) {
    const pid_t pid = child.load();
    if (pid > 0) kill(pid, SIGKILL);
  }
  _exit(128 + signal);
}

Children::~Children() {
  const std::vector<pid_t> running = mine_;
  for (pid_t pid : running) kill(pid, SIGTERM);
  for (pid_t pid : running) {
    if (!Wait(pid, absl::Seconds(5)).ok()) {
      kill(pid, SIGKILL);
      (void)Wait(pid, absl::Seconds(5));
    }
  }
}

absl::StatusOr<pid_t> Children::Start(const std::vector<std::string>& argv,
                                      const std::string& log_path, bool append_log) {
  std::atomic<pid_t>* slot = nullptr;
  for (std::atomic<pid_t>& child : g_children) {
    if (child.load() == 0) {
      slot = &child;
      break;
    }
  }
  if (slot == nullptr) return absl::ResourceExhaustedError("too many child processes");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path.c_str(),
                                   O_WRONLY | O_CREAT | (append_log ? O_APPEND : O_TRUNC), 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  std::vector<char*> args;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  // Block the stop signals around the spawn so that the handler never
  // misses a PID: it is stored before they are let through again.
  sigset_t stop, old;
  sigemptyset(&stop);
  for (int s : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&stop, s);
  pthread_sigmask(SIG_BLOCK, &stop, &old);
  const int err = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  if (err == 0) slot->store(pid);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  posix_spawn_file_actions_destroy(&actions);
  if (err != 0) {
    return absl::NotFoundError(absl::StrCat("cannot start ", argv[0], ": ", std::strerror(err)));
  }
  mine_.push_back(pid);
  return pid;
}

absl::StatusOr<int> Children::Wait(pid_t pid, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    int status = 0;
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid || done < 0) {
      Forget(pid);
      mine_.erase(std::remove(mine_.begin(), mine_.end(), pid), mine_.end());
      if (done < 0) {
        return absl::InternalError(absl::StrCat("waitpid ", pid, ": ", std::strerror(errno)));
      }
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat("process ", pid, " still running"));
    }
    absl::SleepFor(absl::Milliseconds(2));
  }
}

absl::Status Children::Stop(pid_t pid, absl::Duration grace) {
  if (std::find(mine_.begin(), mine_.end(), pid) == mine_.end()) {
    return absl::NotFoundError(absl::StrCat("process ", pid, " is not a running child"));
  }
  kill(pid, SIGTERM);
  if (Wait(pid, grace).ok()) return absl::OkStatus();
  return Kill(pid);
}

absl::Status Children::Kill(pid_t pid) {
  if (std::find(mine_.begin(), mine_.end(), pid) == mine_.end()) {
    return absl::NotFoundError(absl::StrCat("process ", pid, " is not a running child"));
  }
  kill(pid, SIGKILL);
  return Wait(pid, absl::Seconds(10)).status();
}

absl::StatusOr<int> WaitForPort(Children& children, pid_t pid, const std::string& path,
                                const std::string& log_path, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    std::ifstream in(path);
    int port = 0;
    if (in >> port && port > 0) return port;
    if (children.Exited(pid)) {
      return absl::UnavailableError(absl::StrCat("process ", pid, " exited before writing ",
                                                 path, "; its log:\n", ReadFile(log_path)));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError(absl::StrCat("no port in ", path));
}

double SelfCpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return Seconds(usage);
}

double ReapedChildrenCpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_CHILDREN, &usage);
  return Seconds(usage);
}

absl::StatusOr<double> ProcessCpuSeconds(pid_t pid) {
  const std::string stat = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) {
    return absl::NotFoundError(absl::StrCat("cannot read /proc/", pid, "/stat"));
  }
  // Fields after the command name start at field 3 (state); utime and
  // stime are fields 14 and 15.
  const std::vector<std::string> fields =
      absl::StrSplit(stat.substr(paren + 2), ' ', absl::SkipEmpty());
  if (fields.size() < 13) return absl::InternalError("short /proc/PID/stat");
  const double ticks = std::strtod(fields[11].c_str(), nullptr) +
                       std::strtod(fields[12].c_str(), nullptr);
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

absl::StatusOr<double> ProcessesCpuSeconds(const std::vector<pid_t>& pids) {
  double total = 0;
  for (pid_t pid : pids) {
    ASSIGN_OR_RETURN(double seconds, ProcessCpuSeconds(pid));
    total += seconds;
  }
  return total;
}

std::string SelfPath() {
  std::error_code error;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  return error ? "" : self.string();
}

LoadAverage ReadLoadAverage() {
  LoadAverage load;
  const std::vector<std::string> fields =
      absl::StrSplit(ReadFile("/proc/loadavg"), ' ', absl::SkipEmpty());
  if (fields.size() < 3) {
    load.text = "unknown";
    return load;
  }
  load.text = absl::StrCat(fields[0], " ", fields[1], " ", fields[2]);
  load.one_minute = std::strtod(fields[0].c_str(), nullptr);
  return load;
}

}  // namespace shardtrain::bench
