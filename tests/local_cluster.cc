#include "tests/local_cluster.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace shardtrain::testing {

absl::StatusOr<LocalCluster> StartLocalCluster(ProcessGroup& group,
                                               const LocalClusterOptions& options) {
  LocalCluster cluster;
  cluster.dir = MakeTempDir("shardtrain-cluster-");
  if (cluster.dir.empty()) return absl::InternalError("cannot make a temporary directory");
  const std::string server_bin = absl::StrCat(options.bin_dir, "/ps-server");
  const std::string worker_bin = absl::StrCat(options.bin_dir, "/ps-worker");
  for (int s = 0; s < options.shards; ++s) {
    std::vector<std::string> argv = {
        server_bin, absl::StrCat("--shard_index=", s),
        absl::StrCat("--num_shards=", options.shards),
        absl::StrCat("--num_workers=", options.workers), "--mode=" + options.mode,
        absl::StrCat("--port_file=", cluster.dir, "/shard", s, ".ports")};
    argv.insert(argv.end(), options.server_flags.begin(), options.server_flags.end());
    absl::StatusOr<pid_t> pid = group.Start(argv, absl::StrCat(cluster.dir, "/shard", s, ".log"));
    if (!pid.ok()) return pid.status();
  }
  for (int s = 0; s < options.shards; ++s) {
    absl::StatusOr<std::vector<int>> ports =
        ReadPortFile(absl::StrCat(cluster.dir, "/shard", s, ".ports"), absl::Seconds(30));
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
        ReadPortFile(absl::StrCat(cluster.dir, "/worker", w, ".port"), absl::Seconds(30));
    if (!ports.ok()) {
      return absl::Status(ports.status().code(),
                          absl::StrCat("worker ", w, ": ", ports.status().message(), "; its log:\n",
                                       ReadFile(absl::StrCat(cluster.dir, "/worker", w, ".log"))));
    }
    cluster.worker_metrics_ports.push_back((*ports)[0]);
  }
  return cluster;
}

absl::StatusOr<double> WaitForFinalAccuracy(const LocalCluster& cluster,
                                            absl::Duration timeout,
                                            const std::function<void()>& while_waiting) {
  const std::string results = cluster.dir + "/results.json";
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline && access(results.c_str(), F_OK) != 0) {
    if (while_waiting) while_waiting();
    absl::SleepFor(absl::Milliseconds(200));
  }
  const std::string json = ReadFile(results);
  constexpr char kKey[] = "\"final_test_accuracy\": ";
  const size_t at = json.find(kKey);
  if (at == std::string::npos) {
    return absl::DeadlineExceededError(
        absl::StrCat("no results within ", absl::FormatDuration(timeout), "; chief log:\n",
                     ReadFile(cluster.dir + "/worker0.log")));
  }
  return std::stod(json.substr(at + sizeof(kKey) - 1));
}

}  // namespace shardtrain::testing
