// Helpers for tests that run real shardtrain processes on 127.0.0.1:
// starting binaries with their output in files, stopping them (always, in
// the destructor), waiting for port files, scraping /metrics, and waiting
// for a replicated job's chains in etcd to reach a state.
#ifndef SHARDTRAIN_TESTS_CLUSTER_UTIL_H_
#define SHARDTRAIN_TESTS_CLUSTER_UTIL_H_

#include <sys/types.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "chain/chain_config.h"
#include "etcd/etcd_client.h"
#include "testing/files.h"
#include "testing/free_port.h"

namespace shardtrain::testutil {

// Processes started by a test. Not thread-safe.
class ProcessGroup {
 public:
  ProcessGroup() = default;
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;
  // Stops every process still running: SIGTERM, then SIGKILL after 5 s.
  ~ProcessGroup();

  // Starts `argv` with stdout and stderr appended to `log_path`.
  absl::StatusOr<pid_t> Start(const std::vector<std::string>& argv,
                              const std::string& log_path);
  // Waits for `pid` to exit within `timeout`; returns its exit status
  // (DEADLINE_EXCEEDED if it is still running), also when asked again.
  absl::StatusOr<int> Wait(pid_t pid, absl::Duration timeout);
  // Sends `signal` to `pid`, which must be one of this group's running
  // processes (SIGKILL, SIGSTOP, SIGCONT, SIGTERM ...).
  absl::Status Signal(pid_t pid, int signal);
  // Stops every process still running (SIGCONT, so a stopped one can die).
  void StopAll();

 private:
  std::vector<pid_t> running_;
  std::map<pid_t, int> exited_;  // exit statuses of the processes reaped
};


// Waits until `path` holds a whitespace-separated list of integers.
absl::StatusOr<std::vector<int>> ReadPortFile(const std::string& path,
                                              absl::Duration timeout);

// GET http://127.0.0.1:<port><path>; returns the body.
absl::StatusOr<std::string> HttpGet(int port, const std::string& path);

// Sums the samples of each metric name in a Prometheus text exposition
// (all label sets together).
std::map<std::string, double> SumByName(const std::string& exposition);

// Waits up to `timeout` until the chain of every replica group 0 ..
// num_groups - 1 of `job` satisfies `ok` (read from etcd every 100 ms; a
// chain that cannot be read does not); false when they do not by then.
bool WaitForChains(etcd::EtcdClient& etcd, const std::string& job, int num_groups,
                   const std::function<bool(const chain::ChainConfig&)>& ok,
                   absl::Duration timeout);

}  // namespace shardtrain::testutil

#endif  // SHARDTRAIN_TESTS_CLUSTER_UTIL_H_
