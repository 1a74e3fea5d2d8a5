#include "tests/local_cluster.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace shardtrain::testing {
namespace {

// The ports `pid` writes to `port_file` once it serves; fails at once,
// with the process's log, if it exits first.
absl::StatusOr<std::vector<int>> WaitForPorts(ProcessGroup& group, pid_t pid,
                                              const std::string& port_file,
                                              const std::string& log) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline) {
    absl::StatusOr<std::vector<int>> ports = ReadPortFile(port_file, absl::Milliseconds(250));
    if (ports.ok()) return ports;
    absl::StatusOr<int> exited = group.Wait(pid, absl::ZeroDuration());
    if (exited.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "process ", pid, " exited with ", *exited, " before serving; its log:\n", ReadFile(log)));
    }
  }
  return absl::DeadlineExceededError(
      absl::StrCat("no ports in ", port_file, " after 30 s; log:\n", ReadFile(log)));
}

}  // namespace

absl::StatusOr<LocalCluster> StartLocalCluster(ProcessGroup& group,
                                               const LocalClusterOptions& options) {
  LocalCluster cluster;
  cluster.dir = MakeTempDir("shardtrain-cluster-");
  if (cluster.dir.empty()) return absl::InternalError("cannot make a temporary directory");
  const std::string server_bin = absl::StrCat(options.bin_dir, "/ps-server");
  const std::string worker_bin = absl::StrCat(options.bin_dir, "/ps-worker");
  std::vector<pid_t> shard_pids;
  for (int s = 0; s < options.shards; ++s) {
    std::vector<std::string> argv = {
        server_bin, absl::StrCat("--shard_index=", s),
        absl::StrCat("--num_shards=", options.shards),
        absl::StrCat("--num_workers=", options.workers), "--mode=" + options.mode,
        absl::StrCat("--port_file=", cluster.dir, "/shard", s, ".ports")};
    argv.insert(argv.end(), options.server_flags.begin(), options.server_flags.end());
    absl::StatusOr<pid_t> pid = group.Start(argv, absl::StrCat(cluster.dir, "/shard", s, ".log"));
    if (!pid.ok()) return pid.status();
    shard_pids.push_back(*pid);
  }
  for (int s = 0; s < options.shards; ++s) {
    absl::StatusOr<std::vector<int>> ports =
        WaitForPorts(group, shard_pids[s], absl::StrCat(cluster.dir, "/shard", s, ".ports"),
                     absl::StrCat(cluster.dir, "/shard", s, ".log"));
    if (!ports.ok()) return ports.status();
    if (ports->size() != 2) return absl::InternalError("a shard's port file needs 2 ports");
    cluster.servers.push_back(absl::StrCat("127.0.0.1:", (*ports)[0]));
    cluster.shard_metrics_ports.push_back((*ports)[1]);
  }
  for (int w = 0; w < options.workers; ++w) {
    std::vector<std::string> argv = {
        worker_bin, "--servers=" + absl::StrJoin(cluster.servers, ","),
        absl::StrCat("--worker_index=", w), absl::StrCat("--num_workers=", options.workers),
        absl::StrCat("--results=", cluster.dir, "/results.json"),
        absl::StrCat("--port_file=", cluster.dir, "/worker", w, ".port")};
    argv.insert(argv.end(), options.worker_flags.begin(), options.worker_flags.end());
    absl::StatusOr<pid_t> pid = group.Start(argv, absl::StrCat(cluster.dir, "/worker", w, ".log"));
    if (!pid.ok()) return pid.status();
    cluster.workers.push_back(*pid);
  }
  for (int w = 0; w < options.workers; ++w) {
    absl::StatusOr<std::vector<int>> ports =
        WaitForPorts(group, cluster.workers[w], absl::StrCat(cluster.dir, "/worker", w, ".port"),
                     absl::StrCat(cluster.dir, "/worker", w, ".log"));
    if (!ports.ok()) return ports.status();
    cluster.worker_metrics_ports.push_back((*ports)[0]);
  }
  return cluster;
}

absl::StatusOr<double> WaitForFinalAccuracy(ProcessGroup& group, const LocalCluster& cluster,
                                            absl::Duration timeout,
                                            const std::function<void()>& while_waiting) {
  const std::string results = cluster.dir + "/results.json";
  const absl::Time deadline = absl::Now() + timeout;
  bool chief_exited = false;
  while (absl::Now() < deadline && !chief_exited && access(results.c_str(), F_OK) != 0) {
    if (while_waiting) while_waiting();
    chief_exited = group.Wait(cluster.workers[0], absl::Milliseconds(200)).ok();
  }
  const std::string json = ReadFile(results);
  constexpr char kKey[] = "\"final_test_accuracy\": ";
  const size_t at = json.find(kKey);
  if (at == std::string::npos) {
    return absl::DeadlineExceededError(absl::StrCat(
        chief_exited ? "the chief exited without results"
                     : absl::StrCat("no results within ", absl::FormatDuration(timeout)),
        "; chief log:\n", ReadFile(cluster.dir + "/worker0.log")));
  }
  return std::stod(json.substr(at + sizeof(kKey) - 1));
}

}  // namespace shardtrain::testing
