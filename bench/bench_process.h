// Child processes for the benchmarks that run servers in processes of their
// own (wire_bench, replication_bench): starting and stopping them by PID,
// waiting for the port a server writes, their CPU time, and the bench's
// temporary directory.
//
//   for (int s : {SIGINT, SIGTERM, SIGHUP}) std::signal(s, KillChildrenAndExit);
//   Children children;  // stops every child still running when it goes
//   ASSIGN_OR_RETURN(pid_t pid, children.Start({bin + "/ps-server", ...}, log));
//   ASSIGN_OR_RETURN(int port, WaitForPort(children, pid, port_file, log, timeout));
//   ASSIGN_OR_RETURN(double cpu, ProcessCpuSeconds(pid));
//   RETURN_IF_ERROR(children.Stop(pid));
#ifndef SHARDTRAIN_BENCH_BENCH_PROCESS_H_
#define SHARDTRAIN_BENCH_BENCH_PROCESS_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "testing/files.h"
#include "testing/free_port.h"

namespace shardtrain::bench {

// A signal handler: SIGKILLs every running child of every Children, then
// exits with 128 + signal. Install it for SIGINT, SIGTERM and SIGHUP.
void KillChildrenAndExit(int signal);

// Processes started by the bench (at most 16 at a time, over all Children
// objects), stopped (SIGTERM, then SIGKILL after 5 s) when this object
// goes, and killed by KillChildrenAndExit if the bench is interrupted.
// Not thread-safe: one thread starts, waits for and stops children.
class Children {
 public:
  Children() = default;
  Children(const Children&) = delete;
  Children& operator=(const Children&) = delete;
  ~Children();

  // Starts `argv` (argv[0] looked up on the PATH) with stdout and stderr
  // going to `log_path`, truncated first unless `append_log` (a restart
  // keeps the earlier lines).
  absl::StatusOr<pid_t> Start(const std::vector<std::string>& argv,
                              const std::string& log_path, bool append_log = false);

  // Waits up to `timeout` for `pid` to exit; returns its exit code (128 +
  // the signal for a killed process). DEADLINE_EXCEEDED while it runs.
  absl::StatusOr<int> Wait(pid_t pid, absl::Duration timeout);

  // Whether `pid` has exited (and is then reaped).
  bool Exited(pid_t pid) { return Wait(pid, absl::ZeroDuration()).ok(); }

  // SIGTERM, then SIGKILL if `pid` has not exited within `grace`; reaps it.
  absl::Status Stop(pid_t pid, absl::Duration grace = absl::Seconds(5));

  // SIGKILL, and reaps it.
  absl::Status Kill(pid_t pid);

 private:
  // PIDs this object started and has not reaped.
  std::vector<pid_t> mine_;
};

// Shared with the tests (testing/): a port below the ephemeral range, so
// a shard restarted on it finds it free; scratch directories; file reads.
using testutil::MakeTempDir;
using testutil::PickFreePort;
using testutil::ReadFile;

// Waits for `path` to name a port (the first number in it) while `pid`
// runs; UNAVAILABLE with the process's log when it exits first.
absl::StatusOr<int> WaitForPort(Children& children, pid_t pid, const std::string& path,
                                const std::string& log_path, absl::Duration timeout);

// CPU time (user + system) of this process, and of its reaped children.
double SelfCpuSeconds();
double ReapedChildrenCpuSeconds();

// utime + stime of a running process, from /proc/PID/stat.
absl::StatusOr<double> ProcessCpuSeconds(pid_t pid);
// Their sum over `pids`.
absl::StatusOr<double> ProcessesCpuSeconds(const std::vector<pid_t>& pids);

// This binary's path, from /proc/self/exe; empty when unknown.
std::string SelfPath();

// "1.23 0.98 0.75" (the 1, 5 and 15 minute load averages) and the first.
struct LoadAverage {
  std::string text;
  double one_minute = 0;
};
LoadAverage ReadLoadAverage();

}  // namespace shardtrain::bench

#endif  // SHARDTRAIN_BENCH_BENCH_PROCESS_H_
