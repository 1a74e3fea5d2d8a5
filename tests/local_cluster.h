// LocalCluster: real ps-server and ps-worker processes on 127.0.0.1, started
// with the flags scripts/run-local.sh uses, for the end-to-end tests. The
// processes belong to the caller's ProcessGroup, which stops them.
#ifndef SHARDTRAIN_TESTS_LOCAL_CLUSTER_H_
#define SHARDTRAIN_TESTS_LOCAL_CLUSTER_H_

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tests/cluster_util.h"

namespace shardtrain::testing {

// Where Fashion-MNIST is installed (Debian's dataset-fashion-mnist), which
// is also ps-worker's default --data_dir.
inline constexpr char kFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";

struct LocalClusterOptions {
  std::string bin_dir;  // Holds ps-server and ps-worker.
  std::string mode = "async";
  int shards = 2;
  int workers = 2;
  // Appended to every ps-server / ps-worker command line.
  std::vector<std::string> server_flags;
  std::vector<std::string> worker_flags;
};

struct LocalCluster {
  std::string dir;  // Logs, port files and the chief's results.json.
  std::vector<std::string> servers;
  std::vector<int> shard_metrics_ports;
  std::vector<int> worker_metrics_ports;
  std::vector<pid_t> workers;
};

// Starts the shards, waits for their ports, then starts the workers and
// waits for their metrics ports (30 s each at most; a process that exits
// first fails the start at once, with its log).
absl::StatusOr<LocalCluster> StartLocalCluster(ProcessGroup& group,
                                               const LocalClusterOptions& options);

// Waits up to `timeout` for the chief's results.json and returns its final
// test accuracy; fails at once if the chief exits without it, and the
// message then includes the chief's log. Until then, `while_waiting` (if
// set) runs about every 200 ms.
absl::StatusOr<double> WaitForFinalAccuracy(
    ProcessGroup& group, const LocalCluster& cluster, absl::Duration timeout,
    const std::function<void()>& while_waiting = nullptr);

}  // namespace shardtrain::testing

#endif  // SHARDTRAIN_TESTS_LOCAL_CLUSTER_H_
