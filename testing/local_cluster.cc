#include "testing/local_cluster.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <system_error>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"

namespace shardtrain::testutil {
namespace {

std::string ShardPortFile(const LocalCluster& cluster, int s) {
  return absl::StrCat(cluster.dir, "/shard", s, ".ports");
}

std::string WorkerPortFile(const LocalCluster& cluster, int w) {
  return absl::StrCat(cluster.dir, "/worker", w, ".port");
}

absl::Status WaitForShard(ProcessGroup& group, LocalCluster& cluster, int s) {
  absl::StatusOr<std::vector<int>> ports =
      WaitForPorts(group, cluster.shards[s], ShardPortFile(cluster, s), cluster.ShardLog(s),
                   cluster.start_timeout);
  if (!ports.ok()) return ports.status();
  if (ports->size() < 2) return absl::InternalError("a shard's port file needs 2 ports");
  cluster.shard_metrics_ports[s] = (*ports)[1];
  return absl::OkStatus();
}

absl::Status LaunchWorker(ProcessGroup& group, LocalCluster& cluster, int w) {
  std::remove(WorkerPortFile(cluster, w).c_str());
  absl::StatusOr<pid_t> pid = group.Start(cluster.worker_argv[w], cluster.WorkerLog(w));
  if (!pid.ok()) return pid.status();
  cluster.workers[w] = *pid;
  cluster.worker_metrics_ports[w] = 0;
  return absl::OkStatus();
}

absl::Status WaitForWorker(ProcessGroup& group, LocalCluster& cluster, int w) {
  absl::StatusOr<std::vector<int>> ports =
      WaitForPorts(group, cluster.workers[w], WorkerPortFile(cluster, w), cluster.WorkerLog(w),
                   cluster.start_timeout);
  if (!ports.ok()) return ports.status();
  cluster.worker_metrics_ports[w] = (*ports)[0];
  return absl::OkStatus();
}

// The integer after `"key": ` at or after `from`; -1 if absent.
int64_t JsonInt(const std::string& json, const std::string& key, size_t from = 0) {
  const std::string pattern = absl::StrCat("\"", key, "\": ");
  const size_t at = json.find(pattern, from);
  if (at == std::string::npos) return -1;
  const size_t start = at + pattern.size();
  const size_t end = json.find_first_not_of("-0123456789", start);
  int64_t value = -1;
  if (!absl::SimpleAtoi(json.substr(start, end - start), &value)) return -1;
  return value;
}

}  // namespace

std::string LocalCluster::ShardLog(int s) const { return absl::StrCat(dir, "/shard", s, ".log"); }

std::string LocalCluster::WorkerLog(int w) const {
  return absl::StrCat(dir, "/worker", w, ".log");
}

absl::StatusOr<LocalCluster> StartLocalCluster(ProcessGroup& group,
                                               const LocalClusterOptions& options) {
  LocalCluster cluster;
  cluster.start_timeout = options.start_timeout;
  cluster.dir = options.dir.empty() ? MakeTempDir("shardtrain-cluster-") : options.dir;
  if (cluster.dir.empty()) return absl::InternalError("cannot make a temporary directory");
  if (options.dir.empty()) {
    cluster.dir_owner = std::shared_ptr<const void>(nullptr, [dir = cluster.dir](const void*) {
      if (!::testing::Test::HasFailure()) {
        std::error_code ignored;
        std::filesystem::remove_all(dir, ignored);
      }
    });
  }
  const std::string server_bin = absl::StrCat(options.bin_dir, "/ps-server");
  const std::string worker_bin = absl::StrCat(options.bin_dir, "/ps-worker");
  cluster.shards.assign(options.shards, 0);
  cluster.shard_metrics_ports.assign(options.shards, 0);
  for (int s = 0; s < options.shards; ++s) {
    std::vector<std::string> argv;
    if (auto prefix = options.shard_prefix.find(s); prefix != options.shard_prefix.end()) {
      argv = prefix->second;
    }
    argv.insert(argv.end(), {
        server_bin, absl::StrCat("--shard_index=", s),
        absl::StrCat("--num_shards=", options.shards),
        absl::StrCat("--num_workers=", options.workers), "--mode=" + options.mode,
        "--port_file=" + ShardPortFile(cluster, s)});
    if (options.fixed_ports) {
      int port = 0;
      if (s < static_cast<int>(options.shard_ports.size())) {
        port = options.shard_ports[s];
      } else {
        absl::StatusOr<int> picked = PickFreePort();
        if (!picked.ok()) return picked.status();
        port = *picked;
      }
      auto host = options.shard_listen_host.find(s);
      const std::string& listen_host =
          host != options.shard_listen_host.end() ? host->second : options.listen_host;
      argv.push_back(absl::StrCat("--listen=", listen_host, ":", port));
      cluster.servers.push_back(absl::StrCat(listen_host, ":", port));
      if (options.data_port) argv.push_back(absl::StrCat("--data_listen=", listen_host, ":0"));
    } else if (options.data_port) {
      argv.push_back("--data_listen=127.0.0.1:0");
    }
    argv.insert(argv.end(), options.server_flags.begin(), options.server_flags.end());
    std::remove(ShardPortFile(cluster, s).c_str());
    absl::StatusOr<pid_t> pid = group.Start(argv, cluster.ShardLog(s));
    if (!pid.ok()) return pid.status();
    cluster.shards[s] = *pid;
    cluster.shard_argv.push_back(std::move(argv));
  }
  for (int s = 0; s < options.shards; ++s) {
    absl::StatusOr<std::vector<int>> ports =
        WaitForPorts(group, cluster.shards[s], ShardPortFile(cluster, s), cluster.ShardLog(s),
                   cluster.start_timeout);
    if (!ports.ok()) return ports.status();
    if (ports->size() < 2) return absl::InternalError("a shard's port file needs 2 ports");
    if (!options.fixed_ports) {
      cluster.servers.push_back(absl::StrCat("127.0.0.1:", (*ports)[0]));
    }
    cluster.shard_metrics_ports[s] = (*ports)[1];
  }
  cluster.workers.assign(options.workers, 0);
  cluster.worker_metrics_ports.assign(options.workers, 0);
  for (int w = 0; w < options.workers; ++w) {
    std::vector<std::string> argv;
    if (auto prefix = options.worker_prefix.find(w); prefix != options.worker_prefix.end()) {
      argv = prefix->second;
    }
    auto servers = options.worker_servers.find(w);
    argv.insert(argv.end(),
                {worker_bin,
                 "--servers=" + (servers != options.worker_servers.end()
                                     ? servers->second
                                     : absl::StrJoin(cluster.servers, ",")),
                 absl::StrCat("--worker_index=", w), absl::StrCat("--num_workers=", options.workers),
                 "--results=" + cluster.ResultsPath(), "--port_file=" + WorkerPortFile(cluster, w)});
    argv.insert(argv.end(), options.worker_flags.begin(), options.worker_flags.end());
    cluster.worker_argv.push_back(std::move(argv));
  }
  const int start = options.start_workers < 0 ? options.workers : options.start_workers;
  for (int w = 0; w < start; ++w) {
    absl::Status launched = LaunchWorker(group, cluster, w);
    if (!launched.ok()) return launched;
  }
  for (int w = 0; w < start; ++w) {
    absl::Status served = WaitForWorker(group, cluster, w);
    if (!served.ok()) return served;
  }
  return cluster;
}

absl::Status RestartShard(ProcessGroup& group, LocalCluster& cluster, int s) {
  std::remove(ShardPortFile(cluster, s).c_str());
  absl::StatusOr<pid_t> pid = group.Start(cluster.shard_argv[s], cluster.ShardLog(s));
  if (!pid.ok()) return pid.status();
  cluster.shards[s] = *pid;
  return WaitForShard(group, cluster, s);
}

absl::Status StartWorker(ProcessGroup& group, LocalCluster& cluster, int w) {
  absl::Status launched = LaunchWorker(group, cluster, w);
  if (!launched.ok()) return launched;
  return WaitForWorker(group, cluster, w);
}

absl::StatusOr<double> WaitForFinalAccuracy(ProcessGroup& group, const LocalCluster& cluster,
                                            absl::Duration timeout,
                                            const std::function<void()>& while_waiting) {
  const std::string results = cluster.ResultsPath();
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
        "; chief log:\n", ReadFile(cluster.WorkerLog(0))));
  }
  return std::stod(json.substr(at + sizeof(kKey) - 1));
}

absl::StatusOr<RunResults> ReadResults(const std::string& path) {
  const std::string json = ReadFile(path);
  constexpr char kKey[] = "\"final_test_accuracy\": ";
  const size_t at = json.find(kKey);
  if (at == std::string::npos) return absl::NotFoundError(absl::StrCat("no results in ", path));
  RunResults results;
  if (!absl::SimpleAtod(json.substr(at + sizeof(kKey) - 1,
                                    json.find_first_of(",\n", at + sizeof(kKey) - 1) - at -
                                        sizeof(kKey) + 1),
                        &results.final_test_accuracy)) {
    return absl::DataLossError(absl::StrCat("bad final_test_accuracy in ", path, ":\n", json));
  }
  results.epochs = static_cast<int>(JsonInt(json, "epochs"));
  results.steps_per_worker = static_cast<int>(JsonInt(json, "steps_per_worker"));
  const size_t per_epoch = json.find("\"per_epoch\"");
  if (per_epoch != std::string::npos) {
    const size_t last = json.rfind("{\"epoch\": ");
    if (last != std::string::npos && last > per_epoch) {
      results.last_epoch = static_cast<int>(JsonInt(json, "epoch", last));
    }
  }
  return results;
}

}  // namespace shardtrain::testutil
