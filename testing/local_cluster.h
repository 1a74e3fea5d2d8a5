// LocalCluster: real ps-server and ps-worker processes on 127.0.0.1, started
// with the flags scripts/run-local.sh uses, for the end-to-end tests and the
// benchmarks that run shard processes (with no workers, start_workers = 0).
// The processes belong to the caller's ProcessGroup, which stops them.
#ifndef SHARDTRAIN_TESTING_LOCAL_CLUSTER_H_
#define SHARDTRAIN_TESTING_LOCAL_CLUSTER_H_

#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "testing/files.h"
#include "testing/free_port.h"
#include "testing/port_file.h"
#include "testing/process_group.h"

namespace shardtrain::testutil {

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

  // Fault tests. Shards listen on ports picked before they start
  // (--listen=<listen_host>:PORT), so a restarted shard keeps its address.
  bool fixed_ports = false;
  std::string listen_host = "127.0.0.1";
  // Where logs, port files and results go; empty: a fresh temporary
  // directory. A cluster started again in the same directory (with the
  // same ports) is the same job.
  std::string dir;
  std::vector<int> shard_ports;  // with fixed_ports; empty: picked
  // Workers started at once (the first ones; -1: all). StartWorker starts
  // the others.
  int start_workers = -1;
  // Put in front of worker w's / shard s's command line (e.g. ip netns
  // exec NAME).
  std::map<int, std::vector<std::string>> worker_prefix;
  std::map<int, std::vector<std::string>> shard_prefix;
  // With fixed_ports: shard s listens on this host instead of listen_host
  // (e.g. its address inside a network namespace).
  std::map<int, std::string> shard_listen_host;
  // Replace --servers for worker w (e.g. another address of the shards).
  std::map<int, std::string> worker_servers;
  // Each shard also opens a data port (--data_listen=HOST:0, HOST its
  // listen host), which the workers send the data path to.
  bool data_port = false;
  // How long a process may take to serve (write its port file), also when
  // restarted; one that exits first fails the start at once, with its log.
  absl::Duration start_timeout = absl::Seconds(30);
};

struct LocalCluster {
  std::string dir;  // Logs, port files and the chief's results.json.
  // Set when StartLocalCluster made `dir` (options.dir empty): the last
  // copy of the cluster removes it, unless the test has failed, so that
  // only failures leave their logs behind.
  std::shared_ptr<const void> dir_owner;
  std::vector<std::string> servers;
  std::vector<int> shard_metrics_ports;
  std::vector<int> worker_metrics_ports;  // 0: not started yet
  std::vector<pid_t> workers;             // 0: not started yet
  std::vector<pid_t> shards;
  // The command lines, for restarts with the same flags.
  std::vector<std::vector<std::string>> shard_argv;
  std::vector<std::vector<std::string>> worker_argv;
  absl::Duration start_timeout;  // LocalClusterOptions::start_timeout

  std::string ShardLog(int s) const;
  std::string WorkerLog(int w) const;
  std::string ResultsPath() const { return dir + "/results.json"; }
};

// Starts the shards, waits for their ports, then starts the workers and
// waits for their metrics ports (start_timeout each at most; a process that
// exits first fails the start at once, with its log).
absl::StatusOr<LocalCluster> StartLocalCluster(ProcessGroup& group,
                                               const LocalClusterOptions& options);

// Starts shard `s` again with the same command line (the same port with
// fixed_ports, the same log, appended) and waits for its ports; the old
// process must have exited.
absl::Status RestartShard(ProcessGroup& group, LocalCluster& cluster, int s);

// Starts worker `w` (again) with the same command line and waits for its
// metrics port; the old process, if any, must have exited.
absl::Status StartWorker(ProcessGroup& group, LocalCluster& cluster, int w);

// Waits up to `timeout` for the chief's results.json and returns its final
// test accuracy; fails at once if the chief exits without it, and the
// message then includes the chief's log. Until then, `while_waiting` (if
// set) runs about every 200 ms.
absl::StatusOr<double> WaitForFinalAccuracy(
    ProcessGroup& group, const LocalCluster& cluster, absl::Duration timeout,
    const std::function<void()>& while_waiting = nullptr);

// What a chief's results.json says.
struct RunResults {
  double final_test_accuracy = 0;
  int epochs = 0;            // "epochs": the job's epochs
  int last_epoch = 0;        // the last per_epoch entry's "epoch"
  int steps_per_worker = 0;  // "steps_per_worker"
};
absl::StatusOr<RunResults> ReadResults(const std::string& path);

}  // namespace shardtrain::testutil

#endif  // SHARDTRAIN_TESTING_LOCAL_CLUSTER_H_
