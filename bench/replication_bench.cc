// replication_bench: what replicated shards (--replicas R: chain
// replication, the chains kept in etcd) cost per push and pull, and how
// long a worker waits when a chain's head dies. Every shard runs in its
// own ps-server process; the bench starts one local etcd (in a temporary
// directory, stopped by its PID).
//
//   replication_bench --out=bench/results/replication_cpu.txt   (about 90 s)
//
// Part 1, throughput. Three clusters of 3 ps-server processes each (async,
// sgd) run side by side: R=1 (no etcd), R=2 and R=3 (two jobs of the
// etcd). --workers PsClients per cluster (one thread each) push and pull a
// model: the tensors of an MLP (--model, default the Fashion-MNIST MLP
// 784-256-128-10, 0.94 MB of f32) or one tensor of --tensor_kb. For each op
// (push; pull; pushpull, a training step's Push then Pull) a round times
// one block of --block_seconds of each R, in an order that rotates from
// round to round, so that a shared machine's drifting speed touches every
// R alike. Figures:
//   MB/s         payload bytes per second of wall time (both directions for
//                pushpull; all workers together): the median round
//   calls/s      calls per second, all workers together: the median round
//   p50, p99, max  call latency over all rounds' calls, ms (after one
//                untimed call per worker and block: see TimeBlock)
//   srv ms/call  CPU time of the cluster's ps-server processes per call
//   retries      worker RPC attempts retried (client metrics), all rounds
//   x R=1        median over rounds of MB/s / the R=1 MB/s of that round
//
// Tables (--table_ids > 0, after the dense ops, same clusters and rounds):
// each worker's TableClient looks up (training) and pushes the row
// gradients of --table_ids fixed ids (a 16-dim row-wise Adagrad table,
// rows created by the first call), as one call each; rows/s is
// --table_ids x calls/s, and x R=1 as above. A replicated lookup and push
// go to each group's chain head and are answered once the tail has them.
//
// Part 2, failover. A fresh R=2 cluster (--lease_ttl_s, default 1: the
// etcd runs with --heartbeat-interval 25 --election-timeout 250, so it
// grants 1 s leases) and one worker pushing the model continuously. Repeat
// i (of --failover_repeats) SIGKILLs the head of group i % 3, as its chain
// in etcd names it, and measures from the SIGKILL to the end of the first
// push that started after it: every push touches every group (the bench
// refuses a model that does not), so that is the first push the new
// configuration acknowledged. A watch on the job's
// etcd keys says when the killed shard's liveness key vanished (its lease
// expired) and when the group's chain changed; polling the worker's
// ChainRouter says when the worker saw the new chain; the rest is the
// worker's retry backoff. The killed shard is then restarted on its port,
// and the next repeat starts once every chain has 2 members again and the
// heads are back in the placement order. With --failover_hang the head is
// SIGSTOPped instead (a hung process, or a host lost without a reset: the
// push in flight gets no error and must be moved to the new chain), and
// SIGKILLed only after the measurement, before its restart.
//
// Every process the bench starts is stopped (by PID) when it ends, on
// error, and on SIGINT/SIGTERM/SIGHUP (etcd dies with the bench).
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <glog/logging.h>
#include <prometheus/registry.h>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/bench_util.h"
#include "bench/process_stats.h"
#include "bench/replication_cluster.h"
#include "chain/chain_config.h"
#include "chain/chain_reader.h"
#include "chain/replication_keys.h"
#include "client/ps_client_metrics.h"
#include "client/shard_channel.h"
#include "client/table_client.h"
#include "common/status_macros.h"
#include "etcd/etcd_client.h"
#include "testing/chain_waits.h"
#include "testing/etcd_process.h"
#include "testing/files.h"
#include "testing/local_cluster.h"
#include "testing/process_group.h"

ABSL_FLAG(std::string, out, "", "If set, also write the results to this file");
ABSL_FLAG(std::string, bin_dir, "",
          "Directory holding ps-server; default: this binary's own directory");
ABSL_FLAG(std::string, model, "784-256-128-10",
          "Layer sizes of the MLP whose tensors (fcN.weight, fcN.bias) are pushed and pulled");
ABSL_FLAG(int, tensor_kb, 0, "If > 0: one f32 tensor of this many KiB instead of --model");
ABSL_FLAG(int, workers, 1, "PsClients (one thread each) per cluster in the throughput part");
ABSL_FLAG(int, rounds, 7,
          "Throughput rounds; each times one block of every (op, R). Odd: the median is a "
          "round");
ABSL_FLAG(double, block_seconds, 0.5, "Length of one timed block");
ABSL_FLAG(std::string, ops, "push,pull,pushpull", "Ops to time, comma-separated");
ABSL_FLAG(int, table_ids, 0,
          "If > 0: also time sparse-table Lookup and PushSparse of this many ids per call");
ABSL_FLAG(int, throughput_lease_ttl_s, 2, "--lease_ttl_s of the throughput clusters");
ABSL_FLAG(int, failover_repeats, 10, "Head kills in the failover part (0: skip it)");
ABSL_FLAG(int, lease_ttl_s, 1, "--lease_ttl_s of the failover cluster");
ABSL_FLAG(bool, failover_hang, false,
          "SIGSTOP the head instead of SIGKILLing it (it hangs: no reset reaches its peers)");
ABSL_FLAG(int, failover_max_backoff_ms, 0,
          "If > 0: the failover worker's PsClientOptions::max_backoff (the ceiling of its "
          "retry backoff), to see what the default (2 s) adds to the failover time");
ABSL_FLAG(bool, skip_throughput, false, "Run the failover part only");
ABSL_FLAG(double, start_timeout_s, 30, "Wait this long for a server or a chain to form");

namespace shardtrain::bench {
namespace {

using testutil::EtcdProcess;
using testutil::ReadFile;

// How often the failover part reads the chains from etcd while it times
// a rejoin.
constexpr absl::Duration kChainPoll = absl::Milliseconds(5);

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// ---------------------------------------------------------------------------
// Part 1: throughput.

struct BenchOptions {
  std::string bin_dir;
  std::string dir;
  Model model;
  int workers = 1;
  int rounds = 7;
  double block_seconds = 0.5;
  std::vector<Op> ops;
  int table_ids = 0;
  int throughput_lease_ttl_s = 2;
  int failover_repeats = 10;
  int lease_ttl_s = 1;
  bool failover_hang = false;  // SIGSTOP instead of SIGKILL
  // > 0: the failover worker's retry backoff ceiling.
  absl::Duration failover_max_backoff = absl::ZeroDuration();
  bool skip_throughput = false;
  absl::Duration start_timeout = absl::Seconds(30);
  std::string out_path;
};

// One (op, R) over all rounds.
struct Case {
  std::vector<double> rates;       // MB/s by round
  std::vector<double> call_rates;  // calls/s by round
  std::vector<double> vs_r1;       // MB/s / R=1's MB/s, by round
  Sampler calls;
  int64_t total_calls = 0;
  double server_cpu_seconds = 0;
  int64_t retries = 0;  // worker RPC attempts retried
};

// Runs every worker's op at once for `block_seconds`; adds the block to `c`.
// Each worker first makes one untimed call: its connections sat idle while
// the other clusters' blocks ran, and the first call of a block then took
// ~100 ms now and then, at every R alike (the only calls over 15 ms).
// It is the connection's idleness: with gRPC's BDP probe off (the HTTP/2
// window then stays at 64 KB) about half of the blocks' first calls took
// ~100 ms, and with Linux's restart of slow start after idle turned off as
// well (sysctl net.ipv4.tcp_slow_start_after_idle=0) 1 in 15. Training
// keeps its connections busy; the figures are the busy connection's.
absl::Status TimeBlock(const std::vector<OpFn>& ops, double block_seconds,
                       double megabytes_per_call, const std::vector<pid_t>& servers, Case* c) {
  std::vector<Sampler> samplers(ops.size());
  std::vector<absl::Status> statuses(ops.size());
  absl::BlockingCounter warm(static_cast<int>(ops.size()));
  absl::Notification go;
  std::vector<std::thread> threads;
  for (size_t i = 0; i < ops.size(); ++i) {
    threads.emplace_back([&, i] {
      statuses[i] = ops[i]();
      warm.DecrementCount();
      go.WaitForNotification();
      if (statuses[i].ok()) statuses[i] = samplers[i].RunBlock(ops[i], block_seconds);
    });
  }
  warm.Wait();
  const absl::StatusOr<double> cpu_before = ProcessesCpuSeconds(servers);
  const Clock::time_point start = Clock::now();
  go.Notify();
  for (std::thread& thread : threads) thread.join();
  RETURN_IF_ERROR(cpu_before.status());
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  ASSIGN_OR_RETURN(const double cpu_after, ProcessesCpuSeconds(servers));
  for (const absl::Status& status : statuses) RETURN_IF_ERROR(status);
  int64_t calls = 0;
  for (const Sampler& sampler : samplers) {
    calls += sampler.calls();
    c->calls.Merge(sampler);
  }
  c->rates.push_back(megabytes_per_call * calls / seconds);
  c->call_rates.push_back(calls / seconds);
  c->total_calls += calls;
  c->server_cpu_seconds += cpu_after - *cpu_before;
  return absl::OkStatus();
}

// The tables part of RunThroughput (see the file comment) on its clusters
// and workers; the figures' table.
absl::StatusOr<std::string> TimeTables(
    const BenchOptions& options, const std::vector<Cluster>& clusters,
    const std::vector<std::vector<std::unique_ptr<Worker>>>& workers) {
  constexpr int kDim = 16;
  const int kR[kClusterShards] = {1, 2, 3};
  TableSpec spec;
  spec.set_name("bench");
  spec.set_dim(kDim);
  spec.set_optimizer("rowwise_adagrad");
  spec.set_learning_rate(0.01f);
  spec.set_init_scale(0.01f);
  const size_t n = static_cast<size_t>(options.table_ids);
  // What one worker's calls use; owned here, outliving the ops.
  struct TableWorker {
    std::unique_ptr<client::TableClient> tables;
    std::vector<uint64_t> ids;
    std::vector<float> rows;
    std::vector<float> grads;
  };
  std::vector<std::vector<std::unique_ptr<TableWorker>>> table_workers(kClusterShards);
  std::vector<std::vector<std::vector<OpFn>>> ops(2, std::vector<std::vector<OpFn>>(kClusterShards));
  for (int i = 0; i < kClusterShards; ++i) {
    for (size_t w = 0; w < workers[i].size(); ++w) {
      auto worker = std::make_unique<TableWorker>();
      worker->tables = std::make_unique<client::TableClient>(&workers[i][w]->client());
      RETURN_IF_ERROR(worker->tables->Register({spec}));
      std::mt19937_64 random(1000 + w);
      for (size_t k = 0; k < n; ++k) worker->ids.push_back(random());
      worker->rows.resize(n * kDim);
      worker->grads.assign(n * kDim, 1e-3f);
      TableWorker* t = worker.get();
      ops[0][i].push_back([t] {
        return t->tables->Lookup("bench", t->ids, /*train=*/true, 0, t->rows.data());
      });
      ops[1][i].push_back([t] { return t->tables->Push("bench", t->ids, t->grads.data(), 0); });
      table_workers[i].push_back(std::move(worker));
      for (int o = 0; o < 2; ++o) RETURN_IF_ERROR(WarmUp(ops[o][i].back()));
    }
  }
  const char* const kNames[2] = {"lookup", "pushsparse"};
  const double megabytes_per_call = static_cast<double>(n) * kDim * sizeof(float) / 1e6;
  std::vector<std::vector<Case>> cases(2, std::vector<Case>(kClusterShards));
  for (int round = 0; round < options.rounds; ++round) {
    for (int o = 0; o < 2; ++o) {
      for (int k = 0; k < kClusterShards; ++k) {
        const int i = (k + round) % kClusterShards;
        RETURN_IF_ERROR(TimeBlock(ops[o][i], options.block_seconds, megabytes_per_call,
                                  clusters[i].pids(), &cases[o][i]));
      }
      for (int i = 0; i < kClusterShards; ++i) {
        cases[o][i].vs_r1.push_back(cases[o][i].rates.back() / cases[o][0].rates.back());
      }
    }
    std::printf("table round %d of %d done\n", round + 1, options.rounds);
    std::fflush(stdout);
  }
  std::string table = absl::StrFormat(
      "sparse table \"bench\": dim %d, row-wise Adagrad, %d ids per call (one call: every "
      "shard's share at once)\n%-10s %2s %11s %9s %8s %8s %8s %11s %7s\n",
      kDim, options.table_ids, "op", "R", "rows/s", "calls/s", "p50 ms", "p99 ms", "max ms",
      "srv ms/call", "x R=1");
  for (int o = 0; o < 2; ++o) {
    for (int i = 0; i < kClusterShards; ++i) {
      const Case& c = cases[o][i];
      const Timing timing = c.calls.Summary();
      absl::StrAppendFormat(&table, "%-10s %2d %11.0f %9.1f %8.3f %8.3f %8.1f %11.3f %7.2f\n",
                            kNames[o], kR[i], Median(c.call_rates) * static_cast<double>(n),
                            Median(c.call_rates), 1e3 * timing.p50_seconds,
                            1e3 * timing.p99_seconds, 1e3 * timing.max_seconds,
                            1e3 * c.server_cpu_seconds / static_cast<double>(c.total_calls),
                            Median(c.vs_r1));
    }
  }
  return table;
}

absl::StatusOr<std::string> RunThroughput(testutil::ProcessGroup& processes, const BenchOptions& options,
                                          const std::string& etcd_endpoint,
                                          etcd::EtcdClient& etcd) {
  const int kR[kClusterShards] = {1, 2, 3};
  std::vector<Cluster> clusters;
  // By cluster; before the workers, which report to them.
  std::vector<std::unique_ptr<prometheus::Registry>> registries;
  std::vector<std::unique_ptr<client::PsClientMetrics>> metrics;
  std::vector<std::vector<std::unique_ptr<Worker>>> workers(kClusterShards);
  for (int r : kR) {
    ClusterOptions cluster;
    cluster.bin_dir = options.bin_dir;
    cluster.dir = options.dir;
    cluster.name = absl::StrCat("throughput-r", r);
    cluster.replicas = r;
    cluster.etcd_endpoint = etcd_endpoint;
    cluster.lease_ttl_s = options.throughput_lease_ttl_s;
    cluster.num_workers = options.workers;
    cluster.start_timeout = options.start_timeout;
    ASSIGN_OR_RETURN(clusters.emplace_back(), StartCluster(processes, &etcd, cluster));
  }
  for (int i = 0; i < kClusterShards; ++i) {
    registries.push_back(std::make_unique<prometheus::Registry>());
    metrics.push_back(std::make_unique<client::PsClientMetrics>(*registries.back()));
    for (int w = 0; w < options.workers; ++w) {
      ASSIGN_OR_RETURN(workers[i].emplace_back(),
                       Worker::Connect(clusters[i], w, options.model, metrics[i].get()));
    }
  }
  std::string table =
      absl::StrFormat("%-9s %2s %9s %9s %8s %8s %8s %11s %7s %7s\n", "op", "R", "MB/s",
                      "calls/s", "p50 ms", "p99 ms", "max ms", "srv ms/call", "retries", "x R=1");
  std::vector<std::vector<Case>> cases(options.ops.size(), std::vector<Case>(kClusterShards));
  std::vector<std::vector<std::vector<OpFn>>> ops(options.ops.size(),
                                                  std::vector<std::vector<OpFn>>(kClusterShards));
  for (size_t o = 0; o < options.ops.size(); ++o) {
    for (int i = 0; i < kClusterShards; ++i) {
      for (auto& worker : workers[i]) {
        ops[o][i].push_back(worker->MakeOp(options.ops[o]));
        RETURN_IF_ERROR(WarmUp(ops[o][i].back()));
      }
    }
  }
  for (int round = 0; round < options.rounds; ++round) {
    for (size_t o = 0; o < options.ops.size(); ++o) {
      const double megabytes_per_call =
          options.model.bytes * (options.ops[o] == Op::kPushPull ? 2.0 : 1.0) / 1e6;
      for (int k = 0; k < kClusterShards; ++k) {
        const int i = (k + round) % kClusterShards;
        const double retries_before = RetriesTotal(*registries[i]);
        RETURN_IF_ERROR(TimeBlock(ops[o][i], options.block_seconds, megabytes_per_call,
                                  clusters[i].pids(), &cases[o][i]));
        cases[o][i].retries +=
            static_cast<int64_t>(RetriesTotal(*registries[i]) - retries_before);
      }
      for (int i = 0; i < kClusterShards; ++i) {
        cases[o][i].vs_r1.push_back(cases[o][i].rates.back() / cases[o][0].rates.back());
      }
    }
    std::printf("round %d of %d done\n", round + 1, options.rounds);
    std::fflush(stdout);
  }
  for (size_t o = 0; o < options.ops.size(); ++o) {
    for (int i = 0; i < kClusterShards; ++i) {
      const Case& c = cases[o][i];
      const Timing timing = c.calls.Summary();
      absl::StrAppendFormat(&table, "%-9s %2d %9.1f %9.1f %8.3f %8.3f %8.1f %11.3f %7d %7.2f\n",
                            OpName(options.ops[o]), kR[i], Median(c.rates),
                            Median(c.call_rates), 1e3 * timing.p50_seconds,
                            1e3 * timing.p99_seconds, 1e3 * timing.max_seconds,
                            1e3 * c.server_cpu_seconds / static_cast<double>(c.total_calls),
                            c.retries, Median(c.vs_r1));
    }
  }
  if (options.table_ids > 0) {
    ASSIGN_OR_RETURN(const std::string tables, TimeTables(options, clusters, workers));
    absl::StrAppend(&table, "\n", tables);
  }
  workers.clear();  // the clients go before their shards
  for (const Cluster& cluster : clusters) StopCluster(processes, cluster);
  return table;
}

// ---------------------------------------------------------------------------
// Part 2: failover.

// What the bench's watch on the job's etcd keys saw, with when it saw it.
class EtcdLog {
 public:
  void Add(const etcd::WatchEvent& event) {
    const Clock::time_point now = Clock::now();
    absl::MutexLock lock(&mu_);
    events_.push_back({now, event});
  }

  // When `key` was first deleted at or after `after`.
  std::optional<Clock::time_point> Deleted(const std::string& key, Clock::time_point after) {
    absl::MutexLock lock(&mu_);
    for (const auto& [time, event] : events_) {
      if (time >= after && event.key == key && event.type == etcd::WatchEvent::Type::kDelete) {
        return time;
      }
    }
    return std::nullopt;
  }

  // When chain `key` was first put without `shard` at or after `after`.
  std::optional<Clock::time_point> ChainWithout(const std::string& key, int shard,
                                                Clock::time_point after) {
    absl::MutexLock lock(&mu_);
    for (const auto& [time, event] : events_) {
      if (time < after || event.key != key || event.type != etcd::WatchEvent::Type::kPut) {
        continue;
      }
      absl::StatusOr<chain::ChainConfig> chain = chain::DecodeChainConfig(event.value);
      if (chain.ok() && !chain->Contains(shard)) return time;
    }
    return std::nullopt;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::pair<Clock::time_point, etcd::WatchEvent>> events_ ABSL_GUARDED_BY(mu_);
};

// Pushes until stopped, noting each push's start, end and outcome.
class Pusher {
 public:
  explicit Pusher(OpFn push) : push_(std::move(push)), thread_([this] { Run(); }) {}
  ~Pusher() {
    stop_ = true;
    thread_.join();
  }

  // The end of the first successful push that started at or after `after`.
  std::optional<Clock::time_point> FirstOkAfter(Clock::time_point after) {
    absl::MutexLock lock(&mu_);
    auto it = std::partition_point(records_.begin(), records_.end(),
                                   [after](const Record& r) { return r.start < after; });
    for (; it != records_.end(); ++it) {
      if (it->ok) return it->end;
    }
    return std::nullopt;
  }

  int64_t pushes() {
    absl::MutexLock lock(&mu_);
    return static_cast<int64_t>(records_.size());
  }
  int64_t failures() {
    absl::MutexLock lock(&mu_);
    return failures_;
  }
  std::string last_error() {
    absl::MutexLock lock(&mu_);
    return last_error_;
  }

 private:
  struct Record {
    Clock::time_point start;
    Clock::time_point end;
    bool ok = false;
  };

  void Run() {
    while (!stop_) {
      const Clock::time_point start = Clock::now();
      const absl::Status status = push_();
      const Clock::time_point end = Clock::now();
      absl::MutexLock lock(&mu_);
      records_.push_back({start, end, status.ok()});
      if (!status.ok()) {
        ++failures_;
        last_error_ = status.ToString();
      }
    }
  }

  const OpFn push_;
  std::atomic<bool> stop_{false};
  absl::Mutex mu_;
  std::vector<Record> records_ ABSL_GUARDED_BY(mu_);
  int64_t failures_ ABSL_GUARDED_BY(mu_) = 0;
  std::string last_error_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // last: starts after everything above exists
};

// One head kill; times in ms after the SIGKILL (-1: not seen).
struct Failover {
  int group = 0;
  int shard = 0;
  double lease_ms = -1;       // the shard's liveness key deleted
  double chain_ms = -1;       // the group's chain put without it
  double all_chains_ms = -1;  // every chain it was in put without it
  double router_ms = -1;      // the worker's ChainRouter without it
  double push_ms = -1;        // the first push after the kill acknowledged
  double rejoin_ms = -1;      // restart to every chain at 2 members again
  double resume_ms = -1;      // then to the first push started after it acknowledged
  double heads_ms = -1;       // restart to every chain in the placement order again
  double after_ms = -1;       // then to the first push started after it acknowledged
  int64_t retries = 0;        // worker RPC attempts retried meanwhile
};

// The ttl etcd granted, from the shard's "etcd lease N (ttl T)" log line.
std::string GrantedTtl(const std::string& log) {
  const size_t at = log.find("(ttl ");
  if (at == std::string::npos) return "not in the shard's log";
  const size_t end = log.find(')', at);
  return log.substr(at + 5, end == std::string::npos ? 8 : end - at - 5);
}

absl::StatusOr<Failover> KillHead(testutil::ProcessGroup& processes, Cluster& cluster, Worker& worker,
                                  Pusher& pusher, EtcdLog& log, etcd::EtcdClient& etcd,
                                  const prometheus::Registry& registry, int group,
                                  bool hang, absl::Duration timeout) {
  const std::string& job = cluster.options.name;
  ASSIGN_OR_RETURN(const std::vector<chain::ChainConfig> before,
                   chain::ReadAllChains(etcd, job, kClusterShards));
  Failover f;
  f.group = group;
  f.shard = before[group].head().shard;
  // Steady pushing first: at least 5 pushes in 300 ms.
  const absl::Time steady_deadline = absl::Now() + timeout;
  while (true) {
    const int64_t pushes_before = pusher.pushes();
    absl::SleepFor(absl::Milliseconds(300));
    if (pusher.pushes() >= pushes_before + 5) break;
    if (absl::Now() > steady_deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "the worker did not push steadily within ", absl::FormatDuration(timeout),
          "; last push error: ", pusher.last_error()));
    }
  }
  const double retries_before = RetriesTotal(registry);
  const Clock::time_point killed = Clock::now();
  if (hang) {
    if (kill(cluster.pids()[f.shard], SIGSTOP) != 0) {
      return absl::InternalError(absl::StrCat("SIGSTOP of shard ", f.shard, " failed"));
    }
  } else {
    RETURN_IF_ERROR(processes.Kill(cluster.pids()[f.shard]));
  }
  const Clock::time_point deadline = killed + absl::ToChronoNanoseconds(timeout);
  std::optional<Clock::time_point> pushed;
  while (Clock::now() < deadline && !(pushed.has_value() && f.router_ms >= 0)) {
    if (f.router_ms < 0) {
      const std::optional<chain::ChainConfig> seen = worker.client().router()->Config(group);
      if (seen.has_value() && !seen->Contains(f.shard)) f.router_ms = Ms(Clock::now() - killed);
    }
    if (!pushed.has_value()) pushed = pusher.FirstOkAfter(killed);
    absl::SleepFor(absl::Milliseconds(1));
  }
  if (!pushed.has_value()) {
    return absl::DeadlineExceededError(absl::StrCat(
        "no push succeeded within ", absl::FormatDuration(timeout), " of killing shard ",
        f.shard, " (head of group ", group, "); last push error: ", pusher.last_error()));
  }
  f.push_ms = Ms(*pushed - killed);
  f.retries = static_cast<int64_t>(RetriesTotal(registry) - retries_before);
  // The watch's events may trail the client's: give them a moment.
  const Clock::time_point events_deadline = Clock::now() + std::chrono::seconds(5);
  while (true) {
    const std::optional<Clock::time_point> lease =
        log.Deleted(chain::MemberKey(job, f.shard), killed);
    const std::optional<Clock::time_point> chain =
        log.ChainWithout(chain::ChainKey(job, group), f.shard, killed);
    f.lease_ms = lease.has_value() ? Ms(*lease - killed) : -1;
    f.chain_ms = chain.has_value() ? Ms(*chain - killed) : -1;
    f.all_chains_ms = 0;
    for (const chain::ChainConfig& chain_before : before) {
      if (!chain_before.Contains(f.shard)) continue;
      const std::optional<Clock::time_point> changed =
          log.ChainWithout(chain::ChainKey(job, chain_before.group), f.shard, killed);
      f.all_chains_ms = changed.has_value() ? std::max(f.all_chains_ms, Ms(*changed - killed)) : -1;
      if (!changed.has_value()) break;
    }
    if ((lease.has_value() && chain.has_value() && f.all_chains_ms >= 0) ||
        Clock::now() > events_deadline) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  // Back to full chains: the shard restarts and rejoins as a tail.
  if (hang) RETURN_IF_ERROR(processes.Kill(cluster.pids()[f.shard]));
  const Clock::time_point restarted = Clock::now();
  RETURN_IF_ERROR(testutil::RestartShard(processes, cluster.shards, f.shard));
  if (!testutil::WaitForChains(etcd, job, kClusterShards, testutil::HasMembers(2), timeout,
                               kChainPoll)) {
    return absl::DeadlineExceededError(
        absl::StrCat("shard ", f.shard, " did not rejoin the chains of job ", job));
  }
  const Clock::time_point full = Clock::now();
  f.rejoin_ms = Ms(full - restarted);
  const Clock::time_point resume_deadline = full + absl::ToChronoNanoseconds(timeout);
  std::optional<Clock::time_point> resumed;
  while (!(resumed = pusher.FirstOkAfter(full)).has_value()) {
    if (Clock::now() > resume_deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "no push succeeded within ", absl::FormatDuration(timeout), " of shard ", f.shard,
          " rejoining; last push error: ", pusher.last_error()));
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
  f.resume_ms = Ms(*resumed - full);
  const absl::Time router_deadline = absl::Now() + timeout;
  const auto router_full = [&] {
    for (int g = 0; g < kClusterShards; ++g) {
      const std::optional<chain::ChainConfig> seen = worker.client().router()->Config(g);
      if (!seen.has_value() || seen->members.size() != 2) return false;
    }
    return true;
  };
  while (!router_full()) {
    if (absl::Now() > router_deadline) {
      return absl::DeadlineExceededError("the worker did not see the chains back at 2 members");
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  // The rejoined shard gets its group's head back (--restore_chain_order).
  if (!testutil::WaitForChains(etcd, job, kClusterShards,
                               testutil::InPlacementOrder(kClusterShards, 2), timeout,
                               kChainPoll)) {
    return absl::DeadlineExceededError(
        absl::StrCat("the chains of job ", job, " did not go back to the placement order"));
  }
  const Clock::time_point ordered = Clock::now();
  f.heads_ms = Ms(ordered - restarted);
  std::optional<Clock::time_point> after;
  while (!(after = pusher.FirstOkAfter(ordered)).has_value()) {
    if (Clock::now() > resume_deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "no push succeeded after the heads went back; last push error: ",
          pusher.last_error()));
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
  f.after_ms = Ms(*after - ordered);
  return f;
}

std::string FormatMs(double ms) { return ms < 0 ? "-" : absl::StrFormat("%.0f", ms); }

// Nearest-rank percentile of the values >= 0; -1 when there are none.
double SeenPercentile(const std::vector<double>& values, double q) {
  std::vector<double> seen;
  for (double v : values) {
    if (v >= 0) seen.push_back(v);
  }
  if (seen.empty()) return -1;
  std::sort(seen.begin(), seen.end());
  return Percentile(seen, q);
}

absl::StatusOr<std::string> RunFailover(testutil::ProcessGroup& processes, const BenchOptions& options,
                                        const std::string& etcd_endpoint,
                                        etcd::EtcdClient& etcd) {
  ClusterOptions cluster_options;
  cluster_options.bin_dir = options.bin_dir;
  cluster_options.dir = options.dir;
  cluster_options.name = "failover";
  cluster_options.replicas = 2;
  cluster_options.etcd_endpoint = etcd_endpoint;
  cluster_options.lease_ttl_s = options.lease_ttl_s;
  cluster_options.num_workers = 1;
  cluster_options.start_timeout = options.start_timeout;
  ASSIGN_OR_RETURN(Cluster cluster, StartCluster(processes, &etcd, cluster_options));
  EtcdLog log;
  std::unique_ptr<etcd::Watcher> watcher = etcd.Watch(
      chain::JobPrefix(cluster_options.name), 0, [&log](const etcd::WatchEvent& event) {
        log.Add(event);
      });
  prometheus::Registry registry;
  client::PsClientMetrics metrics(registry);
  ASSIGN_OR_RETURN(std::unique_ptr<Worker> worker,
                   Worker::Connect(cluster, 0, options.model, &metrics,
                                   options.failover_max_backoff));
  std::vector<Failover> failovers;
  {
    Pusher pusher(worker->MakeOp(Op::kPush));
    for (int i = 0; i < options.failover_repeats; ++i) {
      ASSIGN_OR_RETURN(failovers.emplace_back(),
                       KillHead(processes, cluster, *worker, pusher, log, etcd, registry,
                                i % kClusterShards, options.failover_hang,
                                std::max(absl::Seconds(30), options.start_timeout)));
      const Failover& f = failovers.back();
      std::printf("failover %d: %s shard %d (head of group %d): first push acknowledged "
                  "after %.0f ms\n",
                  i + 1, options.failover_hang ? "stopped" : "killed", f.shard, f.group,
                  f.push_ms);
      std::fflush(stdout);
    }
    if (pusher.failures() > 0) {
      return absl::InternalError(absl::StrCat(pusher.failures(), " pushes failed; the last: ",
                                              pusher.last_error()));
    }
  }
  watcher.reset();
  const std::string granted_ttl = GrantedTtl(ReadFile(cluster.shards.ShardLog(0)));
  worker.reset();  // the client goes before its shards
  StopCluster(processes, cluster);
  std::string text = absl::StrFormat(
      "# lease TTL: --lease_ttl_s=%d (etcd granted ttl %s); etcd --heartbeat-interval 25 "
      "--election-timeout 250; etcd's lessor revokes expired leases in a loop that runs every "
      "500 ms\n",
      options.lease_ttl_s, granted_ttl);
  absl::StrAppend(&text, "# worker retry backoff: full jitter from 50 ms doubling up to ",
                  options.failover_max_backoff > absl::ZeroDuration()
                      ? absl::StrCat(absl::FormatDuration(options.failover_max_backoff),
                                     " (--failover_max_backoff_ms)")
                      : "2s (PsClientOptions default)",
                  "; calls routed by the chains capped at ",
                  absl::FormatDuration(client::RetryPolicy().routed_max_backoff),
                  " (RetryPolicy::routed_max_backoff)\n");
  absl::StrAppend(&text, "# the head ",
                  options.failover_hang
                      ? "SIGSTOPped (it hangs; SIGKILLed after the measurement, before its "
                        "restart); read SIGSTOP for SIGKILL below (--failover_hang)\n"
                      : "SIGKILLed\n");
  absl::StrAppend(&text,
                  "# ms after the SIGKILL: lease = the killed shard's liveness key deleted in "
                  "etcd (its lease expired); chain = the group's chain put without it; all = "
                  "every chain it was in changed; router = the worker's ChainRouter without "
                  "it; push = the first push started after the kill acknowledged (= the "
                  "failover time); retries = worker RPC attempts retried until then; "
                  "rejoin = ms from restarting the killed shard until every chain has 2 "
                  "members again; resume = ms from then until the first push started after "
                  "it is acknowledged; heads = ms from the restart until every chain is in "
                  "the placement order again (the rejoined shard heads its group); after = "
                  "ms from then until the first push started after it is acknowledged\n");
  absl::StrAppendFormat(&text, "%-3s %5s %5s %6s %6s %6s %6s %6s %7s %7s %7s %6s %6s\n", "#",
                        "group", "shard", "lease", "chain", "all", "router", "push", "retries",
                        "rejoin", "resume", "heads", "after");
  std::vector<double> lease, chain, router, push, cas, watch, retry, rejoin, resume, heads,
      after;
  for (size_t i = 0; i < failovers.size(); ++i) {
    const Failover& f = failovers[i];
    absl::StrAppendFormat(&text, "%-3d %5d %5d %6s %6s %6s %6s %6s %7d %7s %7s %6s %6s\n",
                          i + 1, f.group, f.shard, FormatMs(f.lease_ms), FormatMs(f.chain_ms),
                          FormatMs(f.all_chains_ms), FormatMs(f.router_ms),
                          FormatMs(f.push_ms), f.retries, FormatMs(f.rejoin_ms),
                          FormatMs(f.resume_ms), FormatMs(f.heads_ms), FormatMs(f.after_ms));
    resume.push_back(f.resume_ms);
    heads.push_back(f.heads_ms);
    after.push_back(f.after_ms);
    lease.push_back(f.lease_ms);
    chain.push_back(f.chain_ms);
    router.push_back(f.router_ms);
    push.push_back(f.push_ms);
    rejoin.push_back(f.rejoin_ms);
    const bool all_seen = f.lease_ms >= 0 && f.chain_ms >= 0 && f.router_ms >= 0;
    cas.push_back(all_seen ? f.chain_ms - f.lease_ms : -1);
    watch.push_back(all_seen ? f.router_ms - f.chain_ms : -1);
    retry.push_back(all_seen ? f.push_ms - f.router_ms : -1);
  }
  absl::StrAppendFormat(&text,
                        "failover (%s of a head -> first push acknowledged): median %s ms, "
                        "p90 %s ms, min %s, max %s (%d repeats)\n",
                        options.failover_hang ? "SIGSTOP" : "SIGKILL", FormatMs(SeenPercentile(push, 0.5)), FormatMs(SeenPercentile(push, 0.9)),
                        FormatMs(SeenPercentile(push, 0)), FormatMs(SeenPercentile(push, 1)),
                        static_cast<int>(push.size()));
  const auto row = [&text](const char* what, const std::vector<double>& values) {
    absl::StrAppendFormat(&text, "  %-52s median %5s ms  p90 %5s ms\n", what,
                          FormatMs(SeenPercentile(values, 0.5)),
                          FormatMs(SeenPercentile(values, 0.9)));
  };
  row("kill -> lease expired (liveness key deleted)", lease);
  row("lease expired -> chain changed (a live member's CAS)", cas);
  row("chain changed -> worker's router saw it (its watch)", watch);
  row("router saw it -> first push acknowledged (backoff)", retry);
  row("restart -> chains back to 2 members (rejoin, copy)", rejoin);
  row("chains back -> first push after it acknowledged", resume);
  row("restart -> heads back in the placement order", heads);
  row("heads back -> first push after it acknowledged", after);
  return text;
}

// "3.4.23", from `etcd --version`; "unknown" when it does not say.
std::string EtcdVersion(testutil::ProcessGroup& processes, const std::string& dir) {
  const std::string path = absl::StrCat(dir, "/etcd-version.txt");
  absl::StatusOr<pid_t> pid = processes.Start({EtcdProcess::kBinary, "--version"}, path);
  if (!pid.ok() || !processes.Wait(*pid, absl::Seconds(10)).ok()) return "unknown";
  const std::string text = ReadFile(path);
  const std::string prefix = "etcd Version: ";
  const size_t at = text.find(prefix);
  if (at == std::string::npos) return "unknown";
  const size_t start = at + prefix.size();
  const size_t end = text.find('\n', start);
  return text.substr(start, end == std::string::npos ? std::string::npos : end - start);
}

// INVALID_ARGUMENT for options that cannot run.
absl::Status Validate(const BenchOptions& options) {
  if (options.rounds < 1) return absl::InvalidArgumentError("--rounds must be at least 1");
  if (options.block_seconds <= 0) {
    return absl::InvalidArgumentError("--block_seconds must be positive");
  }
  if (options.workers < 1) return absl::InvalidArgumentError("--workers must be at least 1");
  if (options.table_ids < 0) return absl::InvalidArgumentError("--table_ids must be >= 0");
  if (options.failover_repeats > 0 && options.model.groups_touched < kClusterShards) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the model (%s) has partitions in %d of the %d replica groups; the failover part "
        "needs every push to touch every group: a larger --model or --tensor_kb, or "
        "--failover_repeats=0",
        options.model.description, options.model.groups_touched, kClusterShards));
  }
  return absl::OkStatus();
}

absl::Status Run(const BenchOptions& options, const std::string& command_line) {
  if (!EtcdProcess::Available()) return absl::FailedPreconditionError(EtcdProcess::kMissingMessage);
  const LoadAverage load_before = ReadLoadAverage();
  const absl::Time started = absl::Now();
  ASSIGN_OR_RETURN(std::unique_ptr<EtcdProcess> etcd_process, EtcdProcess::Start());
  etcd::EtcdClient::Options etcd_options;
  etcd_options.endpoints = etcd_process->endpoint();
  ASSIGN_OR_RETURN(std::unique_ptr<etcd::EtcdClient> etcd, etcd::EtcdClient::Create(etcd_options));
  // After etcd, so that the shards still running on an error stop first
  // (they revoke their leases in etcd as they go).
  testutil::ProcessGroup processes;
  const std::string etcd_version = EtcdVersion(processes, options.dir);

  std::string throughput;
  if (!options.skip_throughput) {
    ASSIGN_OR_RETURN(throughput,
                     RunThroughput(processes, options, etcd_process->endpoint(), *etcd));
    std::printf("%s", throughput.c_str());
    std::fflush(stdout);
  }
  std::string failover;
  if (options.failover_repeats > 0) {
    ASSIGN_OR_RETURN(failover, RunFailover(processes, options, etcd_process->endpoint(), *etcd));
    std::printf("%s", failover.c_str());
  }
  const LoadAverage load_after = ReadLoadAverage();
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  std::string header = absl::StrCat(
      "# replication_bench: replicated shards (--replicas R, chain replication, chains in a "
      "local etcd ", etcd_version, ") with ps-server processes on loopback\n",
      CommonHeader(command_line),
      absl::StrFormat("# load average before: %s; after: %s (the bench's own processes "
                      "included); run took %s\n",
                      load_before.text, load_after.text,
                      absl::FormatDuration(absl::Trunc(absl::Now() - started, absl::Seconds(1)))));
  if (load_before.one_minute > 0.5 * cores) {
    absl::StrAppendFormat(&header,
                          "# NOTE: the 1-minute load average was %.2f on %d cores before the "
                          "bench started: the machine was busy with other work, so absolute "
                          "figures are low and noisy; the ratios of the same rounds hold better\n",
                          load_before.one_minute, cores);
  }
  absl::StrAppend(&header, "# model: ", options.model.description, "\n");
  std::string text = header;
  if (!throughput.empty()) {
    absl::StrAppendFormat(
        &text,
        "\n## throughput: 3 clusters of %d ps-server processes (async, sgd) side by side, "
        "R=1 (no etcd), R=2, R=3; %d worker(s) each; %d rounds, each one block of %.2f s per "
        "(op, R), R order rotating by round\n"
        "# MB/s and calls/s: the median round (MB = 1e6 payload bytes, both directions for "
        "pushpull, all workers); p50/p99/max over all timed calls (each worker makes one "
        "untimed call before each block: the first call on a connection idle for a second "
        "took ~100 ms now and then); srv ms/call = ps-server CPU per call; retries = worker RPC attempts retried in all rounds; x R=1 = median over rounds "
        "of MB/s / the same round's R=1 MB/s\n"
        "# pushpull: one PushPull RPC per shard (R=1) or per group, to its chain's head, which "
        "answers once the tail has the push and the versions read (R>1)\n",
        kClusterShards, options.workers, options.rounds, options.block_seconds);
    absl::StrAppend(&text, throughput);
  }
  if (!failover.empty()) {
    absl::StrAppendFormat(&text,
                          "\n## failover: R=2, %d ps-server processes, one worker pushing the "
                          "model continuously; repeat i SIGKILLs the head of group i %% 3, then "
                          "restarts it on its port and waits for full chains and the heads back\n",
                          kClusterShards);
    absl::StrAppend(&text, failover);
  }
  if (!options.out_path.empty()) RETURN_IF_ERROR(WriteTable(options.out_path, text));
  return absl::OkStatus();
}

}  // namespace
}  // namespace shardtrain::bench

int main(int argc, char** argv) {
  namespace b = shardtrain::bench;
  const std::string command_line = b::StartBenchmark(
      argc, argv,
      "Times push/pull/pushpull with replicated shards (R = 1, 2, 3) against ps-server\n"
      "processes and a local etcd, then the failover time after a chain head is SIGKILLed.");
  for (int s : {SIGINT, SIGTERM, SIGHUP}) std::signal(s, shardtrain::testutil::KillAllProcessesAndExit);
  b::BenchOptions options;
  options.bin_dir = absl::GetFlag(FLAGS_bin_dir);
  if (options.bin_dir.empty()) {
    const std::string self = b::SelfPath();
    if (self.empty()) {
      LOG(ERROR) << "cannot find this binary through /proc/self/exe; pass --bin_dir";
      return 2;
    }
    options.bin_dir = std::filesystem::path(self).parent_path().string();
  }
  absl::StatusOr<b::Model> model =
      b::MakeModel(absl::GetFlag(FLAGS_model), absl::GetFlag(FLAGS_tensor_kb));
  if (!model.ok()) {
    LOG(ERROR) << model.status();
    return 2;
  }
  options.model = *std::move(model);
  options.workers = absl::GetFlag(FLAGS_workers);
  options.rounds = absl::GetFlag(FLAGS_rounds);
  options.block_seconds = absl::GetFlag(FLAGS_block_seconds);
  options.table_ids = absl::GetFlag(FLAGS_table_ids);
  options.throughput_lease_ttl_s = absl::GetFlag(FLAGS_throughput_lease_ttl_s);
  options.failover_repeats = absl::GetFlag(FLAGS_failover_repeats);
  options.lease_ttl_s = absl::GetFlag(FLAGS_lease_ttl_s);
  options.failover_hang = absl::GetFlag(FLAGS_failover_hang);
  options.failover_max_backoff = absl::Milliseconds(absl::GetFlag(FLAGS_failover_max_backoff_ms));
  options.skip_throughput = absl::GetFlag(FLAGS_skip_throughput);
  options.start_timeout = absl::Seconds(absl::GetFlag(FLAGS_start_timeout_s));
  options.out_path = absl::GetFlag(FLAGS_out);
  for (absl::string_view name : absl::StrSplit(absl::GetFlag(FLAGS_ops), ',')) {
    if (name == "push") {
      options.ops.push_back(b::Op::kPush);
    } else if (name == "pull") {
      options.ops.push_back(b::Op::kPull);
    } else if (name == "pushpull") {
      options.ops.push_back(b::Op::kPushPull);
    } else {
      LOG(ERROR) << "--ops: unknown op " << name;
      return 2;
    }
  }
  if (const absl::Status valid = b::Validate(options); !valid.ok()) {
    LOG(ERROR) << valid;
    return 2;
  }
  options.dir = shardtrain::testutil::MakeTempDir("replication_bench-");
  if (options.dir.empty()) {
    LOG(ERROR) << "cannot make a temporary directory";
    return 1;
  }
  const absl::Status status = b::Run(options, command_line);
  if (!status.ok()) {
    LOG(ERROR) << status << " (logs in " << options.dir << ")";
    return 1;
  }
  std::error_code ignored;
  std::filesystem::remove_all(options.dir, ignored);
  return 0;
}
