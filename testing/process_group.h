// ProcessGroup: the processes a test or a benchmark starts (ps-server,
// ps-worker, etcd, iperf3 ...), each with its output in a log file, waited
// for, signalled and stopped by PID, and always stopped when the group
// goes, so that no run leaves a process behind. They also die (SIGKILL,
// PR_SET_PDEATHSIG) when the process that started them ends without
// stopping them: a failed CHECK, an abort, a test's timeout. A thread of its
// own that lives as long as the process starts them, since that signal
// follows the thread that started a process, not its process.
//
//   ProcessGroup group;  // stops every process still running when it goes
//   ASSIGN_OR_RETURN(pid_t pid, group.Start({bin + "/ps-server", ...}, log));
//   ASSIGN_OR_RETURN(std::vector<int> ports,
//                    WaitForPorts(group, pid, port_file, log, absl::Seconds(30)));
//   RETURN_IF_ERROR(group.Signal(pid, SIGKILL));
//   ASSIGN_OR_RETURN(int code, group.Wait(pid, absl::Seconds(5)));  // 137
//
// A benchmark that may be interrupted installs KillAllProcessesAndExit for
// SIGINT, SIGTERM and SIGHUP, so that Ctrl-C does not orphan its servers.
//
// Not thread-safe: one thread starts, waits for and stops a group's
// processes. Different groups may be used from different threads.
#ifndef SHARDTRAIN_TESTING_PROCESS_GROUP_H_
#define SHARDTRAIN_TESTING_PROCESS_GROUP_H_

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace shardtrain::testutil {

// A signal handler: SIGKILLs every running process of every ProcessGroup,
// then exits with 128 + signal. Async-signal-safe.
void KillAllProcessesAndExit(int signal);

class ProcessGroup {
 public:
  // At most this many processes run at once over all groups (the signal
  // handler's table): wire_bench --scaling starts 21 shards for 1x1..8x4.
  static constexpr int kMaxRunning = 128;

  ProcessGroup() = default;
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;
  // Stops every process still running, as StopAll.
  ~ProcessGroup();

  // Starts `argv` (argv[0] a path, or a name looked up on the PATH) with
  // stdout and stderr appended to `log_path`, so that a restarted process
  // keeps the lines of the one before. RESOURCE_EXHAUSTED past kMaxRunning;
  // NOT_FOUND when argv[0] cannot be run.
  absl::StatusOr<pid_t> Start(const std::vector<std::string>& argv,
                              const std::string& log_path);

  // Waits up to `timeout` for `pid` to exit and returns its exit code (128
  // + the signal for a killed process), also when asked again later.
  // DEADLINE_EXCEEDED while it runs; NOT_FOUND for a PID this group never
  // started.
  absl::StatusOr<int> Wait(pid_t pid, absl::Duration timeout);

  // Whether `pid` has exited (it is then reaped).
  bool Exited(pid_t pid) { return Wait(pid, absl::ZeroDuration()).ok(); }

  // Sends `signal` (SIGKILL, SIGSTOP, SIGCONT, SIGTERM ...) to `pid`, which
  // must be one of this group's running processes; NOT_FOUND otherwise.
  absl::Status Signal(pid_t pid, int signal);

  // SIGTERM (and SIGCONT, so that a stopped process sees it), then SIGKILL
  // if `pid` has not exited within `grace`; returns once it is reaped.
  absl::Status Stop(pid_t pid, absl::Duration grace = absl::Seconds(5));

  // SIGKILL, and returns once it is reaped.
  absl::Status Kill(pid_t pid);

  // Stops every process still running, all at once: SIGTERM, then SIGKILL
  // for those still running 5 s later.
  void StopAll();

 private:
  std::vector<pid_t> running_;   // started and not reaped
  std::map<pid_t, int> exited_;  // exit codes of the processes reaped
};

}  // namespace shardtrain::testutil

#endif  // SHARDTRAIN_TESTING_PROCESS_GROUP_H_
