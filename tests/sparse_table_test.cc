// Sparse tables against real ps-server processes on 127.0.0.1:
//  - SparseCountingOracle: two workers push, at once, row gradients of -1
//    (SGD, lr 1, zero-initialised rows) for overlapping ids, repeated ids
//    within a batch included: every row ends at exactly the number of times
//    it was named: no update lost, none applied twice.
//  - SparseSyncEquivalence: two workers on a sync table, one of them slow,
//    end with the rows of one process trained on the union of their
//    batches (lazy Adam, within 1e-6); on an async table they do not.
//  - SparseCheckpointResume: the whole job (both shards) is SIGKILLed after
//    a checkpoint and started again: every row's value, Adam state and step
//    count are back, bit for bit, and the next update is the one an
//    uninterrupted table makes; the admission counts are back too.
//  - ARestartedShardIsGivenItsTablesAgain: a shard SIGKILLed before any
//    checkpoint comes back empty; the worker registers its tables again and
//    goes on, that shard's rows starting over.
//  - SparseReplicatedKill: the counting oracle on a replicated job (three
//    shards, --replicas 2, a real etcd, the data path on the members' data
//    ports): the head of a group is SIGKILLed while two workers push, dropped from its chains, restarted and rejoins
//    them; no update is lost, none applied twice, and every group's head
//    and tail hold the same rows, bit for bit, including a table of more
//    rows per group than one message (--max_message_mb) holds.
//  - SparseBadInput: unknown tables, wrong sizes and dims, NaN gradients,
//    duplicate ids, ids of another shard and every limit flag are refused
//    with their status code and name, and nothing changes; a push sent
//    twice is applied once.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "chain/chain_config.h"
#include "chain/chain_reader.h"
#include "client/ps_client.h"
#include "client/table_client.h"
#include "common/grpc_status.h"
#include "common/payload.h"
#include "common/status_macros.h"
#include "ctl/chain_admin.h"
#include "etcd/etcd_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sparse/embedding_table.h"
#include "sparse/id_hash.h"
#include "testing/chain_waits.h"
#include "testing/etcd_process.h"
#include "testing/files.h"
#include "testing/free_port.h"
#include "testing/local_cluster.h"
#include "testing/metrics_scrape.h"
#include "testing/port_file.h"
#include "testing/process_group.h"
#include "testing/shard_process.h"

namespace shardtrain {
namespace {

using ::testing::HasSubstr;

constexpr int kShards = 2;

// Two ps-server processes on fixed ports, each with its checkpoint dir.
class TableJob {
 public:
  explicit TableJob(int workers) : workers_(workers), dir_(testutil::MakeTempDir("tables")) {}

  void Start() {
    for (int s = 0; s < kShards; ++s) ASSERT_NO_FATAL_FAILURE(StartShard(s));
  }

  // Starts shard s (on the port it had, if it ran before).
  void StartShard(int s) {
    if (ports_.size() <= static_cast<size_t>(s)) {
      absl::StatusOr<int> port = testutil::PickFreePort();
      ASSERT_TRUE(port.ok()) << port.status();
      ports_.push_back(*port);
      pids_.push_back(0);
    }
    const std::string port_file = absl::StrCat(dir_, "/ports", s);
    std::remove(port_file.c_str());
    absl::StatusOr<pid_t> pid = group_.Start(
        {std::string(SHARDTRAIN_BIN_DIR) + "/ps-server",
         absl::StrCat("--listen=127.0.0.1:", ports_[s]), "--port_file=" + port_file,
         absl::StrCat("--shard_index=", s), absl::StrCat("--num_shards=", kShards),
         absl::StrCat("--num_workers=", workers_), "--mode=async",
         absl::StrCat("--checkpoint_dir=", dir_, "/ckpt", s), "--checkpoint_interval_s=3600",
         "--allow_fresh_start"},
        absl::StrCat(dir_, "/shard", s, ".log"));
    ASSERT_TRUE(pid.ok()) << pid.status();
    pids_[s] = *pid;
    absl::StatusOr<std::vector<int>> ports = testutil::ReadPortFile(port_file, absl::Seconds(30));
    ASSERT_TRUE(ports.ok() && ports->size() >= 2)
        << testutil::ReadFile(absl::StrCat(dir_, "/shard", s, ".log"));
    if (metrics_ports_.size() <= static_cast<size_t>(s)) metrics_ports_.resize(s + 1);
    metrics_ports_[s] = (*ports)[1];
  }

  int MetricsPort(int s) const { return metrics_ports_[s]; }

  // Shard s's /metrics, summed by metric name.
  std::map<std::string, double> Metrics(int s) {
    absl::StatusOr<std::string> body = testutil::HttpGet(metrics_ports_[s], "/metrics");
    EXPECT_TRUE(body.ok()) << body.status();
    return body.ok() ? testutil::SumByName(*body) : std::map<std::string, double>();
  }

  void KillAll() {
    for (int s = 0; s < kShards; ++s) ASSERT_NO_FATAL_FAILURE(Kill(s));
  }

  void Kill(int s) {
    ASSERT_TRUE(group_.Signal(pids_[s], SIGKILL).ok());
    ASSERT_TRUE(group_.Wait(pids_[s], absl::Seconds(10)).ok());
  }

  std::unique_ptr<client::PsClient> Connect(int worker) {
    client::PsClientOptions options;
    for (int port : ports_) options.servers.push_back(absl::StrCat("127.0.0.1:", port));
    options.worker_index = worker;
    options.num_workers = workers_;
    options.rpc_timeout = absl::Seconds(10);
    options.reconnect_timeout = absl::Seconds(30);
    auto client = client::PsClient::Create(options, nullptr, nullptr);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? std::move(*client) : nullptr;
  }

  // Shard s's Status.
  StatusResponse Status(int s) {
    auto stub = ParameterServer::NewStub(grpc::CreateChannel(
        absl::StrCat("127.0.0.1:", ports_[s]), grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    StatusResponse response;
    grpc::Status status = stub->Status(&context, StatusRequest(), &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response;
  }

  // A Checkpoint RPC on every shard.
  void Checkpoint() {
    for (int port : ports_) {
      auto stub = ParameterServer::NewStub(grpc::CreateChannel(
          absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
      CheckpointResponse response;
      grpc::Status status = stub->Checkpoint(&context, CheckpointRequest(), &response);
      ASSERT_TRUE(status.ok()) << status.error_message();
    }
  }

 private:
  int workers_;
  std::string dir_;
  testutil::ProcessGroup group_;
  std::vector<int> ports_;
  std::vector<int> metrics_ports_;
  std::vector<pid_t> pids_;
};

// An in-process table with Adam's usual betas and eps, as a shard makes one
// from a TableSpec with those fields unset: the reference tests compare the
// shards' rows with.
std::unique_ptr<sparse::EmbeddingTable> AdamTable(const std::string& name, int dim,
                                                  sparse::RowInit init, float lr) {
  sparse::TableConfig config;
  config.name = name;
  config.dim = dim;
  config.init = init;
  config.optimizer.kind = sparse::SparseOptimizerKind::kAdam;
  config.optimizer.learning_rate = lr;
  config.optimizer.eps = 1e-8f;
  return *sparse::EmbeddingTable::Create(config, {});
}

TableSpec Spec(const std::string& name, int dim, const std::string& optimizer, float lr) {
  TableSpec spec;
  spec.set_name(name);
  spec.set_dim(dim);
  spec.set_optimizer(optimizer);
  spec.set_learning_rate(lr);
  spec.set_init(TableSpec::INIT_ZEROS);
  return spec;
}

TEST(SparseTables, SparseCountingOracle) {
  TableJob job(2);
  ASSERT_NO_FATAL_FAILURE(job.Start());
  constexpr int kDim = 4;
  constexpr int kRounds = 40;
  std::vector<std::unique_ptr<client::PsClient>> clients;
  for (int w = 0; w < 2; ++w) clients.push_back(job.Connect(w));
  ASSERT_TRUE(clients[0] && clients[1]);
  // Worker w names id i + w * 50 for i in [0, 100) every round, and ids
  // 0..9 a second time in the same batch: overlapping ranges, repeats.
  std::vector<std::thread> threads;
  std::vector<absl::Status> results(2);
  for (int w = 0; w < 2; ++w) {
    threads.emplace_back([&, w] {
      client::TableClient tables(clients[w].get());
      absl::Status status = tables.Register({Spec("count", kDim, "sgd", 1.0f)});
      std::vector<uint64_t> ids;
      for (uint64_t i = 0; i < 100; ++i) ids.push_back(i + w * 50);
      for (uint64_t i = 0; i < 10; ++i) ids.push_back(i + w * 50);
      const std::vector<float> grads(ids.size() * kDim, -1.0f);
      std::vector<float> rows(ids.size() * kDim);
      for (int round = 0; status.ok() && round < kRounds; ++round) {
        status = tables.Lookup("count", ids, true, round, rows.data());
        if (status.ok()) status = tables.Push("count", ids, grads.data(), round + 1);
      }
      results[w] = status;
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_TRUE(results[0].ok()) << results[0];
  ASSERT_TRUE(results[1].ok()) << results[1];
  // Expected count of id x: rounds x (times worker 0 names it + worker 1's).
  auto named = [](uint64_t x, int w) {
    const uint64_t lo = w * 50;
    if (x < lo || x >= lo + 100) return 0;
    return x < lo + 10 ? 2 : 1;
  };
  client::TableClient reader(clients[0].get());
  ASSERT_TRUE(reader.Register({Spec("count", kDim, "sgd", 1.0f)}).ok());
  std::vector<uint64_t> all;
  for (uint64_t x = 0; x < 160; ++x) all.push_back(x);
  std::vector<float> rows(all.size() * kDim);
  ASSERT_TRUE(reader.Lookup("count", all, false, 0, rows.data()).ok());
  int64_t unique_rows = 0, unique_pushed = 0;
  for (uint64_t x = 0; x < 160; ++x) {
    const float want = static_cast<float>(kRounds * (named(x, 0) + named(x, 1)));
    for (int j = 0; j < kDim; ++j) ASSERT_EQ(rows[x * kDim + j], want) << "id " << x;
    unique_rows += want > 0;
    unique_pushed += kRounds * ((named(x, 0) > 0) + (named(x, 1) > 0));
  }
  // The shards' metrics count the same: rows stored, row gradients applied
  // (a repeated id's summed into one by the client), none dropped.
  double rows_stored = 0, applied = 0, created = 0;
  for (int s = 0; s < kShards; ++s) {
    std::map<std::string, double> m = job.Metrics(s);
    rows_stored += m["shardtrain_table_rows"];
    applied += m["shardtrain_table_gradients_total"];
    created += m["shardtrain_table_rows_created_total"];
    EXPECT_GT(m["shardtrain_table_bytes_per_row"], 0) << "shard " << s;
  }
  EXPECT_EQ(rows_stored, unique_rows);
  EXPECT_EQ(created, unique_rows);
  EXPECT_EQ(applied, unique_pushed);

  // Staleness: every push observed once per shard (each push names ids of
  // both); a push at clock 990 after a lookup at 1000 is 10 steps stale.
  std::vector<double> pushes(kShards), stale_steps(kShards);
  for (int s = 0; s < kShards; ++s) {
    std::map<std::string, double> m = job.Metrics(s);
    pushes[s] = m["shardtrain_table_push_staleness_steps_count"];
    stale_steps[s] = m["shardtrain_table_push_staleness_steps_sum"];
    EXPECT_EQ(pushes[s], 2 * kRounds) << "shard " << s;
  }
  ASSERT_TRUE(reader.Lookup("count", all, true, 1000, rows.data()).ok());
  const std::vector<float> zeros(all.size() * kDim, 0.0f);
  ASSERT_TRUE(reader.Push("count", all, zeros.data(), 990).ok());
  for (int s = 0; s < kShards; ++s) {
    std::map<std::string, double> m = job.Metrics(s);
    EXPECT_EQ(m["shardtrain_table_push_staleness_steps_count"], pushes[s] + 1) << "shard " << s;
    EXPECT_EQ(m["shardtrain_table_push_staleness_steps_sum"], stale_steps[s] + 10)
        << "shard " << s;
  }
}

// SparseSyncEquivalence: what each worker does in one step of a toy model
// whose loss is the mean of 0.5 * |row(id) - target|^2 over its batch.
struct SyncWorkload {
  static constexpr int kDim = 4;
  static constexpr int kBatch = 24;
  static constexpr int kSteps = 10;

  static uint64_t Hash(uint64_t x) { return sparse::Mix64(x * 0x9E3779B97F4A7C15ull + 1); }
  // Worker w's ids in step t: worker 0 names ids in [0, 40), worker 1 in
  // [20, 60), with repeats.
  static std::vector<uint64_t> Ids(int w, int t) {
    std::vector<uint64_t> ids;
    for (int i = 0; i < kBatch; ++i) ids.push_back(Hash(w * 100000 + t * 100 + i) % 40 + w * 20);
    return ids;
  }
  // The gradient of each position's loss from the rows looked up.
  static std::vector<float> Grads(int w, int t, const std::vector<float>& rows) {
    std::vector<float> grads(rows.size());
    for (size_t k = 0; k < rows.size(); ++k) {
      const float target = static_cast<float>(Hash(w * 7919 + t * 104729 + k) % 2001) / 1000 - 1;
      grads[k] = (rows[k] - target) / kBatch;
    }
    return grads;
  }
  // One process on the union of both workers' batches, in a table of its
  // own: each step, the rows as they are, then the mean over the workers of
  // their gradients (each worker's repeated ids summed first, in order, as
  // TableClient sums them), applied once per row.
  static std::unique_ptr<sparse::EmbeddingTable> Reference(const std::string& name, int steps) {
    auto table = AdamTable(name, kDim, {sparse::RowInit::Kind::kUniform, 0.5f, 7}, 0.05f);
    for (int t = 0; t < steps; ++t) {
      std::map<uint64_t, std::vector<float>> sum;
      for (int w = 0; w < 2; ++w) {
        const std::vector<uint64_t> ids = Ids(w, t);
        std::vector<float> rows(ids.size() * kDim);
        table->LookupForTraining(ids, t, rows.data());
        const std::vector<float> grads = Grads(w, t, rows);
        std::map<uint64_t, std::vector<float>> mine;
        for (size_t i = 0; i < ids.size(); ++i) {
          std::vector<float>& row = mine.try_emplace(ids[i], kDim, 0.0f).first->second;
          for (int j = 0; j < kDim; ++j) row[j] += grads[i * kDim + j];
        }
        for (const auto& [id, g] : mine) {
          auto [it, fresh] = sum.try_emplace(id, g);
          if (!fresh) {
            for (int j = 0; j < kDim; ++j) it->second[j] += g[j];
          }
        }
      }
      std::vector<uint64_t> ids;
      std::vector<float> mean;
      for (const auto& [id, g] : sum) {
        ids.push_back(id);
        for (float x : g) mean.push_back(x * 0.5f);
      }
      table->Apply(ids, mean.data(), t + 1, 1.0f);
    }
    return table;
  }
  static TableSpec Spec(const std::string& name, bool sync) {
    TableSpec spec;
    spec.set_name(name);
    spec.set_dim(kDim);
    spec.set_optimizer("adam");
    spec.set_learning_rate(0.05f);
    spec.set_init(TableSpec::INIT_UNIFORM);
    spec.set_init_scale(0.5f);
    spec.set_seed(7);
    spec.set_sync(sync);
    return spec;
  }
  // Both workers train `spec` at once, worker 1 pausing before its pushes
  // of even steps: a sync worker 0 must wait for them before looking up.
  static absl::Status Train(TableJob& job, const TableSpec& spec) {
    std::vector<std::unique_ptr<client::PsClient>> clients;
    for (int w = 0; w < 2; ++w) clients.push_back(job.Connect(w));
    if (!clients[0] || !clients[1]) return absl::UnavailableError("no client");
    std::vector<absl::Status> results(2);
    std::vector<std::thread> threads;
    for (int w = 0; w < 2; ++w) {
      threads.emplace_back([&, w] {
        client::TableClient tables(clients[w].get());
        absl::Status status = tables.Register({spec});
        for (int t = 0; status.ok() && t < kSteps; ++t) {
          const std::vector<uint64_t> ids = Ids(w, t);
          std::vector<float> rows(ids.size() * kDim);
          status = tables.Lookup(spec.name(), ids, true, t, rows.data());
          if (!status.ok()) break;
          if (w == 1 && t % 2 == 0) absl::SleepFor(absl::Milliseconds(150));
          status = tables.Push(spec.name(), ids, Grads(w, t, rows).data(), t + 1);
        }
        results[w] = status;
      });
    }
    for (std::thread& t : threads) t.join();
    for (const absl::Status& status : results) RETURN_IF_ERROR(status);
    return absl::OkStatus();
  }
  // The largest difference between the shards' rows of ids [0, 60) and the
  // reference's.
  static float MaxDiff(TableJob& job, const TableSpec& spec) {
    auto client = job.Connect(0);
    client::TableClient reader(client.get());
    EXPECT_TRUE(reader.Register({spec}).ok());
    std::vector<uint64_t> all;
    for (uint64_t x = 0; x < 60; ++x) all.push_back(x);
    std::vector<float> rows(all.size() * kDim), want(all.size() * kDim);
    EXPECT_TRUE(reader.Lookup(spec.name(), all, false, 0, rows.data()).ok());
    Reference(spec.name(), kSteps)->LookupReadOnly(all, want.data());
    float diff = 0;
    for (size_t k = 0; k < rows.size(); ++k) diff = std::max(diff, std::abs(rows[k] - want[k]));
    return diff;
  }
};

// Two workers on a sync table (lazy Adam) equal one process on the union of
// their batches, every touched row within 1e-6; the same schedule on an
// async table does not (worker 0 reads rows before worker 1's push of the
// step is in), which shows the comparison can fail.
TEST(SparseTables, SparseSyncEquivalence) {
  TableJob job(2);
  ASSERT_NO_FATAL_FAILURE(job.Start());
  const TableSpec sync = SyncWorkload::Spec("sync", true);
  ASSERT_TRUE(SyncWorkload::Train(job, sync).ok());
  EXPECT_LE(SyncWorkload::MaxDiff(job, sync), 1e-6f);

  const TableSpec async = SyncWorkload::Spec("async", false);
  ASSERT_TRUE(SyncWorkload::Train(job, async).ok());
  EXPECT_GT(SyncWorkload::MaxDiff(job, async), 1e-4f);

  // psctl's view: every shard applied kSteps steps of the sync table.
  for (int s = 0; s < kShards; ++s) {
    StatusResponse status = job.Status(s);
    bool found = false;
    for (const TableState& table : status.tables()) {
      if (table.name() != "sync") continue;
      found = true;
      EXPECT_TRUE(table.sync());
      EXPECT_EQ(table.steps(), SyncWorkload::kSteps) << "shard " << s;
    }
    EXPECT_TRUE(found) << "shard " << s;
  }

  // A worker pushing twice in one step is refused, and nothing changes.
  auto client = job.Connect(0);
  client::TableClient tables(client.get());
  ASSERT_TRUE(tables.Register({sync}).ok());
  const std::vector<uint64_t> ids = {1, 2, 3};
  std::vector<float> before(ids.size() * SyncWorkload::kDim), after(before.size());
  ASSERT_TRUE(tables.Lookup("sync", ids, true, SyncWorkload::kSteps, before.data()).ok());
  const std::vector<float> grads(before.size(), 0.5f);
  ASSERT_TRUE(tables.Push("sync", ids, grads.data(), SyncWorkload::kSteps + 1).ok());
  const absl::Status twice = tables.Push("sync", ids, grads.data(), SyncWorkload::kSteps + 1);
  EXPECT_EQ(twice.code(), absl::StatusCode::kFailedPrecondition) << twice;
  EXPECT_THAT(twice.message(), HasSubstr("twice in step"));
  ASSERT_TRUE(tables.Lookup("sync", ids, false, 0, after.data()).ok());
  EXPECT_EQ(before, after) << "a step was applied without worker 1's push";
  // The metrics say so: every shard applied kSteps steps and has worker
  // 0's push of the next one (an empty one where it had no ids).
  for (int s = 0; s < kShards; ++s) {
    std::map<std::string, double> m = job.Metrics(s);
    EXPECT_EQ(m["shardtrain_table_sync_steps"], SyncWorkload::kSteps) << "shard " << s;
    EXPECT_EQ(m["shardtrain_table_step_arrivals"], 1) << "shard " << s;
  }
}

TEST(SparseTables, SparseCheckpointResume) {
  TableJob job(1);
  ASSERT_NO_FATAL_FAILURE(job.Start());
  constexpr int kDim = 8;
  TableSpec spec = Spec("items", kDim, "adam", 0.01f);
  spec.set_init(TableSpec::INIT_NORMAL);
  spec.set_init_scale(0.1f);
  spec.set_seed(3);
  // The reference: one in-process table given the same operations (rows are
  // independent, so one table stands for both shards).
  auto reference = AdamTable("items", kDim, {sparse::RowInit::Kind::kNormal, 0.1f, 3}, 0.01f);

  std::vector<uint64_t> ids;
  for (uint64_t i = 0; i < 300; ++i) ids.push_back(sparse::Mix64(i));
  std::vector<float> grads(ids.size() * kDim), rows(ids.size() * kDim), want(ids.size() * kDim);
  auto step = [&](client::TableClient& tables, int s) {
    for (size_t i = 0; i < grads.size(); ++i) grads[i] = std::sin(0.37f * (i + 11 * s));
    // Every third id skips odd steps, so rows have different step counts.
    std::vector<uint64_t> some;
    std::vector<float> some_grads;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i % 3 == 0 && s % 2 == 1) continue;
      some.push_back(ids[i]);
      some_grads.insert(some_grads.end(), grads.begin() + i * kDim, grads.begin() + (i + 1) * kDim);
    }
    ASSERT_TRUE(tables.Lookup("items", some, true, s, rows.data()).ok());
    reference->LookupForTraining(some, static_cast<uint32_t>(s), want.data());
    ASSERT_TRUE(tables.Push("items", some, some_grads.data(), s + 1).ok());
    reference->Apply(some, some_grads.data(), static_cast<uint32_t>(s + 1), 1.0f);
  };
  // A table admitting an id on its third training lookup: its counts are
  // in the checkpoint too.
  TableSpec rare = Spec("rare", 1, "sgd", 1.0f);
  rare.set_admission("count");
  rare.set_admission_count(3);
  rare.set_admission_filter_counters(1 << 12);
  std::vector<uint64_t> rare_ids;
  for (uint64_t i = 1000; i < 1100; ++i) rare_ids.push_back(sparse::Mix64(i));
  std::vector<float> rare_rows(rare_ids.size());
  {
    auto client = job.Connect(0);
    client::TableClient tables(client.get());
    ASSERT_TRUE(tables.Register({spec, rare}).ok());
    for (int s = 0; s < 5; ++s) ASSERT_NO_FATAL_FAILURE(step(tables, s));
    for (int s = 0; s < 2; ++s) {
      ASSERT_TRUE(tables.Lookup("rare", rare_ids, true, s, rare_rows.data()).ok());
    }
    ASSERT_NO_FATAL_FAILURE(job.Checkpoint());
  }
  ASSERT_NO_FATAL_FAILURE(job.KillAll());
  ASSERT_NO_FATAL_FAILURE(job.Start());
  auto client = job.Connect(0);
  client::TableClient tables(client.get());
  ASSERT_TRUE(tables.Register({spec, rare}).ok());  // identical specs: accepted
  // Each rare id's third lookup takes a row, which the push then moves.
  ASSERT_TRUE(tables.Lookup("rare", rare_ids, true, 2, rare_rows.data()).ok());
  const std::vector<float> minus_one(rare_ids.size(), -1.0f);
  ASSERT_TRUE(tables.Push("rare", rare_ids, minus_one.data(), 3).ok());
  ASSERT_TRUE(tables.Lookup("rare", rare_ids, false, 3, rare_rows.data()).ok());
  EXPECT_EQ(rare_rows, std::vector<float>(rare_ids.size(), 1.0f))
      << "the admission counts were not restored";
  ASSERT_TRUE(tables.Lookup("items", ids, false, 0, rows.data()).ok());
  reference->LookupReadOnly(ids, want.data());
  ASSERT_EQ(0, std::memcmp(rows.data(), want.data(), rows.size() * sizeof(float)))
      << "restored rows differ";
  // The optimizer state came back too: the next Adam steps match.
  for (int s = 5; s < 7; ++s) ASSERT_NO_FATAL_FAILURE(step(tables, s));
  ASSERT_TRUE(tables.Lookup("items", ids, false, 0, rows.data()).ok());
  reference->LookupReadOnly(ids, want.data());
  EXPECT_EQ(0, std::memcmp(rows.data(), want.data(), rows.size() * sizeof(float)))
      << "Adam's state was not restored";
}

// What a training lookup costs on the wire, as the shards count it: the
// request carries each unique id of a batch once, as 8 raw bytes (3000 ids,
// 1000 of them unique: 8000 bytes and a few of name and flags per call),
// and the response exactly dim x 4 bytes per row, with no per-row framing.
TEST(SparseTables, ALookupSendsEightBytesPerUniqueIdAndGetsItsRowsUnframed) {
  TableJob job(1);
  ASSERT_NO_FATAL_FAILURE(job.Start());
  constexpr int kDim = 4;
  auto client = job.Connect(0);
  client::TableClient tables(client.get());
  ASSERT_TRUE(tables.Register({Spec("wire", kDim, "sgd", 0.1f)}).ok());
  std::vector<uint64_t> ids;
  for (uint64_t i = 0; i < 3000; ++i) ids.push_back(sparse::Mix64(i % 1000));
  std::vector<float> rows(ids.size() * kDim);
  ASSERT_TRUE(tables.Lookup("wire", ids, /*train=*/true, /*clock=*/1, rows.data()).ok());
  double received = 0, sent = 0, calls = 0;
  for (int s = 0; s < kShards; ++s) {
    absl::StatusOr<std::string> body = testutil::HttpGet(job.MetricsPort(s), "/metrics");
    ASSERT_TRUE(body.ok()) << body.status();
    std::map<std::string, double> lookups =
        testutil::SumByName(*body, {"method=\"Lookup\"", "side=\"server\""});
    received += lookups["shardtrain_rpc_received_bytes_total"];
    sent += lookups["shardtrain_rpc_sent_bytes_total"];
    calls += lookups["shardtrain_rpc_requests_total"];
  }
  ASSERT_GE(calls, 1);
  EXPECT_GE(received, 8.0 * 1000);
  EXPECT_LE(received, 8.0 * 1000 + 32 * calls) << calls << " calls";
  EXPECT_GE(sent, 4.0 * kDim * 1000);
  EXPECT_LE(sent, 4.0 * kDim * 1000 + 16 * calls) << calls << " calls";
}

// A shard SIGKILLed before any checkpoint comes back without the table: the
// next call of the worker finds it missing, registers the tables again (with
// a warning) and goes on; the rows of the other shard are untouched and the
// restarted shard's start over from their initial values.
TEST(SparseTables, ARestartedShardIsGivenItsTablesAgain) {
  TableJob job(1);
  ASSERT_NO_FATAL_FAILURE(job.Start());
  constexpr int kDim = 2;
  auto client = job.Connect(0);
  client::TableClient tables(client.get());
  ASSERT_TRUE(tables.Register({Spec("t", kDim, "sgd", 1.0f)}).ok());
  std::vector<uint64_t> ids;
  for (uint64_t x = 0; x < 40; ++x) ids.push_back(x);
  std::vector<float> rows(ids.size() * kDim);
  const std::vector<float> grads(ids.size() * kDim, -1.0f);
  ASSERT_TRUE(tables.Lookup("t", ids, true, 0, rows.data()).ok());
  ASSERT_TRUE(tables.Push("t", ids, grads.data(), 1).ok());
  ASSERT_NO_FATAL_FAILURE(job.Kill(1));
  ASSERT_NO_FATAL_FAILURE(job.StartShard(1));
  ASSERT_TRUE(tables.Lookup("t", ids, true, 1, rows.data()).ok());
  for (size_t i = 0; i < ids.size(); ++i) {
    const float want = sparse::ShardOfId(ids[i], kShards) == 0 ? 1.0f : 0.0f;
    EXPECT_EQ(rows[i * kDim], want) << "id " << ids[i];
  }
  ASSERT_TRUE(tables.Push("t", ids, grads.data(), 2).ok());
  ASSERT_TRUE(tables.Lookup("t", ids, false, 2, rows.data()).ok());
  for (size_t i = 0; i < ids.size(); ++i) {
    const float want = sparse::ShardOfId(ids[i], kShards) == 0 ? 2.0f : 1.0f;
    EXPECT_EQ(rows[i * kDim], want) << "id " << ids[i];
  }
}

// SparseReplicatedKill: three shards with --replicas 2, so group g's chain
// is shards [g, g + 1 mod 3] and every shard heads one group and tails
// another.
constexpr int kReplicatedShards = 3;
constexpr int kReplicas = 2;

// Workers in threads of the test, each with its own PsClient (replicated,
// so every group's calls follow its chain) and TableClient: each step a
// training lookup of every id of `ids`, then a push of -1 for each (SGD, lr
// 1, rows from zeros: +1 per push in every coordinate), until stopped. A
// worker stops at its first error. Not thread-safe: one test thread drives
// it.
class CountingWorkers {
 public:
  // What one worker did, complete after Stop.
  struct Result {
    absl::Status status;
    int64_t pushes = 0;      // acknowledged
    int64_t dropped = 0;     // row gradients the shards had no row for
    int64_t duplicates = 0;  // shards that had applied a (retried) push already
  };

  // `clients` (one per worker, their worker_index in order) are not owned
  // and must outlive this.
  CountingWorkers(std::vector<client::PsClient*> clients, TableSpec spec,
                  std::vector<uint64_t> ids)
      : clients_(std::move(clients)),
        spec_(std::move(spec)),
        ids_(std::move(ids)),
        results_(clients_.size()) {}
  ~CountingWorkers() { Stop(); }

  void Start() {
    running_ = static_cast<int>(clients_.size());
    for (size_t w = 0; w < clients_.size(); ++w) threads_.emplace_back([this, w] { Run(w); });
  }

  // Lets each worker finish its step and waits for them.
  void Stop() {
    stop_ = true;
    for (std::thread& thread : threads_) {
      if (thread.joinable()) thread.join();
    }
  }

  // Pushes acknowledged so far, all workers together.
  int64_t pushes() const { return pushes_; }
  // Whether every worker is still pushing.
  bool running() const { return running_ == static_cast<int>(clients_.size()); }

  // Waits up to `timeout` until pushes() >= n; false when not by then or
  // when a worker stopped first.
  bool WaitForPushes(int64_t n, absl::Duration timeout) const {
    const absl::Time deadline = absl::Now() + timeout;
    while (pushes() < n && running() && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    return pushes() >= n;
  }

  // Complete once stopped.
  const std::vector<Result>& results() const { return results_; }

  // For a failure message: stops the workers and says what each did.
  std::string StopAndDescribe() {
    Stop();
    std::string out;
    for (size_t w = 0; w < results_.size(); ++w) {
      absl::StrAppend(&out, "\n  worker ", w, ": ", results_[w].pushes, " pushes, ",
                      results_[w].status.ToString());
    }
    return out;
  }

 private:
  // Bounds a worker whatever the test thread does.
  static constexpr absl::Duration kMaxRun = absl::Minutes(3);

  void Run(size_t w) {
    Result& result = results_[w];
    client::TableClient tables(clients_[w]);
    result.status = tables.Register({spec_});
    const int dim = spec_.dim();
    std::vector<float> rows(ids_.size() * dim);
    const std::vector<float> grads(ids_.size() * dim, -1.0f);
    const absl::Time deadline = absl::Now() + kMaxRun;
    while (result.status.ok() && !stop_ && absl::Now() < deadline) {
      const int64_t clock = result.pushes;
      result.status = tables.Lookup(spec_.name(), ids_, /*train=*/true, clock, rows.data());
      if (!result.status.ok()) break;
      client::TableCallStats stats;
      result.status = tables.Push(spec_.name(), ids_, grads.data(), clock + 1, &stats);
      if (!result.status.ok()) break;
      ++result.pushes;
      result.dropped += stats.dropped;
      result.duplicates += stats.duplicates;
      ++pushes_;
    }
    if (result.status.ok() && !stop_) {
      result.status = absl::DeadlineExceededError(
          absl::StrCat("worker ", w, " still pushing after ", absl::FormatDuration(kMaxRun)));
    }
    --running_;
  }

  const std::vector<client::PsClient*> clients_;
  const TableSpec spec_;
  const std::vector<uint64_t> ids_;
  std::vector<Result> results_;  // by worker; each written by its thread only
  std::vector<std::thread> threads_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> pushes_{0};
  std::atomic<int> running_{0};
};

// The counting oracle's verdict on rows (dim floats per id of `ids`) that
// should all be `want` in every coordinate.
struct Tally {
  int64_t lost = 0;     // row updates missing, summed over the rows
  int64_t doubled = 0;  // row updates applied more than once
  int64_t uneven = 0;   // rows whose coordinates differ
  std::string first;    // the first rows off, for the message

  Tally(const std::vector<uint64_t>& ids, const float* rows, int dim, int64_t want) {
    int shown = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      const float* row = rows + i * dim;
      const int64_t got = static_cast<int64_t>(row[0]);
      lost += std::max<int64_t>(0, want - got);
      doubled += std::max<int64_t>(0, got - want);
      bool even = static_cast<float>(got) == row[0];
      for (int j = 1; j < dim; ++j) even = even && row[j] == row[0];
      uneven += !even;
      if ((got != want || !even) && shown++ < 5) {
        absl::StrAppend(&first, " id ", ids[i], " (group ",
                        sparse::ShardOfId(ids[i], kReplicatedShards), "): [");
        for (int j = 0; j < dim; ++j) absl::StrAppend(&first, j ? " " : "", row[j]);
        absl::StrAppend(&first, "];");
      }
    }
  }
  bool ok() const { return lost == 0 && doubled == 0 && uneven == 0; }
  std::string Describe(int64_t want, size_t rows) const {
    return absl::StrCat(lost, " row updates lost, ", doubled, " applied twice, ", uneven,
                        " rows uneven (", rows, " rows, each should be ", want,
                        " in every coordinate); first rows off:", first);
  }
};

// The rows of `table` the shard at `address` holds for replica group
// `group`, as it would hand them to a joining tail (FetchGroupState): id ->
// its whole record (value, optimizer state, metadata), `record_bytes` each.
absl::StatusOr<std::map<uint64_t, std::string>> GroupRows(const std::string& address, int group,
                                                          const std::string& table,
                                                          int record_bytes) {
  auto stub = ParameterServer::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
  GroupStateRequest request;
  request.set_group(group);
  // The state's parts, put together.
  GroupStateResponse state, part;
  std::unique_ptr<grpc::ClientReader<GroupStateResponse>> reader =
      stub->FetchGroupState(&context, request);
  while (reader->Read(&part)) state.MergeFrom(part);
  const absl::Status status = common::FromGrpcStatus(reader->Finish());
  if (!status.ok()) {
    return absl::Status(status.code(), absl::StrCat("FetchGroupState of group ", group,
                                                    " from ", address, ": ", status.message()));
  }
  std::string records;
  for (const CheckpointRecord& record : state.records()) {
    if (record.has_table() && record.table().name() == table) records += record.table_rows();
  }
  if (records.size() % record_bytes != 0) {
    return absl::DataLossError(absl::StrCat(address, " sent ", records.size(), " bytes of ",
                                            table, "'s records, not a multiple of ",
                                            record_bytes));
  }
  std::map<uint64_t, std::string> rows;
  for (size_t at = 0; at < records.size(); at += record_bytes) {
    uint64_t id;
    std::memcpy(&id, records.data() + at, sizeof(id));
    if (!rows.emplace(id, records.substr(at, record_bytes)).second) {
      return absl::DataLossError(absl::StrCat(address, " sent id ", id, " twice"));
    }
  }
  return rows;
}

// Group `group`'s rows of `table` on the head and the tail of its chain in
// etcd (GroupRows of each).
struct ChainRows {
  size_t members = 0;
  int head = -1, tail = -1;
  std::map<uint64_t, std::string> head_rows, tail_rows;
};
absl::StatusOr<ChainRows> HeadAndTailRows(etcd::EtcdClient& chains, const std::string& job,
                                          const testutil::LocalCluster& cluster, int group,
                                          const std::string& table, int record_bytes) {
  ASSIGN_OR_RETURN(const chain::ChainConfig chain, chain::ReadChain(chains, job, group));
  ChainRows rows;
  rows.members = chain.members.size();
  rows.head = chain.head().shard;
  rows.tail = chain.tail().shard;
  ASSIGN_OR_RETURN(rows.head_rows,
                   GroupRows(cluster.servers[rows.head], group, table, record_bytes));
  ASSIGN_OR_RETURN(rows.tail_rows,
                   GroupRows(cluster.servers[rows.tail], group, table, record_bytes));
  return rows;
}

// "Counting oracle (SGD, lr 1, every push adds exactly 1 to a row): SIGKILL
// a head while 2 workers push: 0 lost and 0 double-applied updates; head
// and tail bit-identical." The head of group 0 is SIGKILLed mid-run; the
// workers go on once its chains drop it; it is restarted, rejoins them as a
// tail (copying the rows of its groups while the workers push) and gets
// group 0's head back. Every row ends at exactly the pushes acknowledged,
// read by the workers' client and in each group's head and tail, which
// hold the same records. The shards allow 1 MiB messages and a second
// table holds more than that per group, so the restarted shard copies each
// group's state in parts.
TEST(SparseTables, SparseReplicatedKill) {
  using testutil::EtcdProcess;
  if (!EtcdProcess::Available()) GTEST_SKIP() << EtcdProcess::kMissingMessage;
  constexpr int kDim = 4;
  constexpr int kIds = 96;
  constexpr int kWorkers = 2;
  constexpr int64_t kPushesPerPhase = 100;  // before the kill, without it, after it is back
  constexpr int kBulkIds = 60000;           // dim 16: about 1.6 MB of rows per group
  const std::string job = "sparsekill";
  absl::StatusOr<std::unique_ptr<EtcdProcess>> etcd = EtcdProcess::Start();
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  etcd::EtcdClient::Options etcd_options;
  etcd_options.endpoints = (*etcd)->endpoint();
  absl::StatusOr<std::unique_ptr<etcd::EtcdClient>> chains =
      etcd::EtcdClient::Create(etcd_options);
  ASSERT_TRUE(chains.ok()) << chains.status();
  auto whole = [](const chain::ChainConfig& c) { return !ctl::Degraded(c); };
  auto in_placement_order = [](const chain::ChainConfig& c) {
    return !ctl::Degraded(c) && !ctl::OutOfPlacementOrder(c, kReplicatedShards);
  };

  testutil::ProcessGroup processes;
  testutil::LocalClusterOptions options;
  options.bin_dir = SHARDTRAIN_BIN_DIR;
  options.mode = "async";
  options.shards = kReplicatedShards;
  options.workers = kWorkers;
  options.start_workers = 0;   // the workers are threads of this test
  options.fixed_ports = true;  // a restarted shard keeps its address
  options.data_port = true;    // lookups and pushes on the members' data ports
  options.server_flags = {absl::StrCat("--replicas=", kReplicas),
                          "--etcd_endpoints=" + (*etcd)->endpoint(), "--job=" + job,
                          "--lease_ttl_s=1", "--max_message_mb=1"};
  absl::StatusOr<testutil::LocalCluster> cluster =
      testutil::StartLocalCluster(processes, options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ASSERT_TRUE(
      testutil::WaitForChains(**chains, job, kReplicatedShards, whole, absl::Seconds(10)))
      << "the chains did not form with " << kReplicas << " members";

  const TableSpec spec = Spec("count", kDim, "sgd", 1.0f);  // zeros, async, admits every id
  std::vector<uint64_t> ids;
  std::vector<int> ids_of_group(kReplicatedShards);
  for (uint64_t x = 0; x < kIds; ++x) {
    ids.push_back(x);
    ++ids_of_group[sparse::ShardOfId(x, kReplicatedShards)];
  }
  for (int g = 0; g < kReplicatedShards; ++g) ASSERT_GT(ids_of_group[g], 0) << "group " << g;
  std::vector<std::unique_ptr<client::PsClient>> clients;
  for (int w = 0; w < kWorkers; ++w) {
    client::PsClientOptions client_options;
    client_options.servers = cluster->servers;
    client_options.worker_index = w;
    client_options.num_workers = kWorkers;
    client_options.rpc_timeout = absl::Seconds(10);
    client_options.reconnect_timeout = absl::Seconds(60);
    client_options.replicas = kReplicas;
    client_options.etcd_endpoints = (*etcd)->endpoint();
    client_options.job = job;
    absl::StatusOr<std::unique_ptr<client::PsClient>> client =
        client::PsClient::Create(client_options, nullptr, nullptr);
    ASSERT_TRUE(client.ok()) << client.status();
    clients.push_back(*std::move(client));
  }
  const TableSpec bulk = Spec("bulk", 16, "sgd", 1.0f);
  std::vector<uint64_t> bulk_ids;
  for (uint64_t x = 0; x < kBulkIds; ++x) bulk_ids.push_back(x * 0x9E3779B97F4A7C15ull);
  {
    client::TableClient tables(clients[0].get());
    const absl::Status registered = tables.Register({spec, bulk});
    ASSERT_TRUE(registered.ok()) << "RegisterTables on a replicated job: " << registered;
    // Rows of the bulk table, in calls whose answers fit in 1 MiB.
    constexpr size_t kPerCall = 6000;
    std::vector<float> rows(kPerCall * 16);
    for (size_t at = 0; at < bulk_ids.size(); at += kPerCall) {
      const std::vector<uint64_t> some(bulk_ids.begin() + at,
                                       bulk_ids.begin() + std::min(at + kPerCall, bulk_ids.size()));
      const absl::Status filled =
          tables.Lookup(bulk.name(), some, /*train=*/true, 0, rows.data());
      ASSERT_TRUE(filled.ok()) << "filling the bulk table: " << filled;
    }
  }

  CountingWorkers workers({clients[0].get(), clients[1].get()}, spec, ids);
  workers.Start();
  ASSERT_TRUE(workers.WaitForPushes(kPushesPerPhase, absl::Seconds(60)))
      << "the workers did not start pushing:" << workers.StopAndDescribe();
  // Their routed lookups and pushes went to the members' data ports.
  for (int s = 0; s < kReplicatedShards; ++s) {
    absl::StatusOr<std::string> metrics =
        testutil::HttpGet(cluster->shard_metrics_ports[s], "/metrics");
    ASSERT_TRUE(metrics.ok()) << metrics.status();
    EXPECT_GE(testutil::SumByName(*metrics)["shardtrain_data_connections"], kWorkers)
        << "shard " << s << ": the workers' calls are not on its data port";
  }
  absl::StatusOr<chain::ChainConfig> before = chain::ReadChain(**chains, job, 0);
  ASSERT_TRUE(before.ok()) << before.status();
  const int victim = before->head().shard;
  const absl::Time killed = absl::Now();
  const int64_t at_kill = workers.pushes();
  ASSERT_TRUE(processes.Signal(cluster->shards[victim], SIGKILL).ok());
  (void)processes.Wait(cluster->shards[victim], absl::Seconds(10));
  ASSERT_TRUE(testutil::WaitForChains(
      **chains, job, kReplicatedShards,
      [victim](const chain::ChainConfig& c) { return !c.Contains(victim); }, absl::Seconds(10)))
      << "shard " << victim << " was not dropped from its chains";
  const absl::Duration to_drop = absl::Now() - killed;
  const int64_t at_drop = workers.pushes();
  ASSERT_TRUE(workers.WaitForPushes(at_drop + kPushesPerPhase, absl::Seconds(30)))
      << "the workers did not go on without shard " << victim << " (" << at_drop
      << " pushes when it was dropped):" << workers.StopAndDescribe();

  const absl::Time restarted = absl::Now();
  const int64_t at_restart = workers.pushes();
  const absl::Status restarted_status = testutil::RestartShard(processes, *cluster, victim);
  ASSERT_TRUE(restarted_status.ok()) << restarted_status;
  ASSERT_TRUE(
      testutil::WaitForChains(**chains, job, kReplicatedShards, whole, absl::Seconds(30)))
      << "shard " << victim << " did not rejoin its chains:\n"
      << testutil::ReadFile(cluster->ShardLog(victim));
  const absl::Duration to_rejoin = absl::Now() - restarted;
  const int64_t at_rejoin = workers.pushes();
  ASSERT_TRUE(workers.running()) << "a worker stopped before shard " << victim
                                 << " rejoined:" << workers.StopAndDescribe();
  ASSERT_TRUE(testutil::WaitForChains(**chains, job, kReplicatedShards, in_placement_order,
                                      absl::Seconds(30)))
      << "the heads did not go back to the placement's order";
  const int64_t at_placed = workers.pushes();
  ASSERT_TRUE(workers.WaitForPushes(at_placed + kPushesPerPhase, absl::Seconds(30)))
      << "the workers did not go on after shard " << victim
      << " rejoined:" << workers.StopAndDescribe();
  workers.Stop();
  int64_t pushes = 0, dropped = 0, duplicates = 0;
  for (size_t w = 0; w < workers.results().size(); ++w) {
    const CountingWorkers::Result& result = workers.results()[w];
    EXPECT_TRUE(result.status.ok()) << "worker " << w << ": " << result.status;
    pushes += result.pushes;
    dropped += result.dropped;
    duplicates += result.duplicates;
  }
  std::printf(
      "SPARSE REPLICATED KILL: head shard %d of group 0 SIGKILLed at %lld pushes, dropped "
      "from its chains %s later (%lld pushes), restarted at %lld pushes, rejoined %s later "
      "(%lld pushes), heads back in placement order at %lld; %lld pushes in all, %lld row "
      "gradients dropped, %lld retried pushes found applied already\n",
      victim, static_cast<long long>(at_kill), absl::FormatDuration(to_drop).c_str(),
      static_cast<long long>(at_drop), static_cast<long long>(at_restart),
      absl::FormatDuration(to_rejoin).c_str(), static_cast<long long>(at_rejoin),
      static_cast<long long>(at_placed), static_cast<long long>(pushes),
      static_cast<long long>(dropped), static_cast<long long>(duplicates));
  ASSERT_FALSE(HasFailure());
  EXPECT_EQ(dropped, 0) << "pushes found rows missing";

  // The oracle, through the workers' client: every row at `pushes`.
  client::TableClient reader(clients[0].get());
  ASSERT_TRUE(reader.Register({spec}).ok());
  std::vector<float> rows(ids.size() * kDim);
  const absl::Status read = reader.Lookup(spec.name(), ids, /*train=*/false, 0, rows.data());
  ASSERT_TRUE(read.ok()) << read;
  const Tally tally(ids, rows.data(), kDim, pushes);
  EXPECT_TRUE(tally.ok()) << tally.Describe(pushes, ids.size());

  // Each group's head and tail: the same records (value, optimizer state
  // and metadata of every row), and the oracle's values.
  sparse::TableConfig config;
  config.name = spec.name();
  config.dim = kDim;
  config.init.kind = sparse::RowInit::Kind::kZeros;
  config.optimizer.kind = sparse::SparseOptimizerKind::kSgd;
  config.optimizer.learning_rate = 1.0f;
  absl::StatusOr<std::unique_ptr<sparse::EmbeddingTable>> layout =
      sparse::EmbeddingTable::Create(config, {});
  ASSERT_TRUE(layout.ok()) << layout.status();
  const int record_bytes = (*layout)->record_bytes();
  for (int g = 0; g < kReplicatedShards; ++g) {
    absl::StatusOr<ChainRows> rows =
        HeadAndTailRows(**chains, job, *cluster, g, spec.name(), record_bytes);
    ASSERT_TRUE(rows.ok()) << rows.status();
    ASSERT_EQ(rows->members, static_cast<size_t>(kReplicas)) << "group " << g;
    const int head = rows->head, tail = rows->tail;
    const std::map<uint64_t, std::string>& head_rows = rows->head_rows;
    const std::map<uint64_t, std::string>& tail_rows = rows->tail_rows;
    EXPECT_EQ(head_rows.size(), static_cast<size_t>(ids_of_group[g]))
        << "group " << g << "'s head, shard " << head;
    int differing = 0, missing = 0;
    std::string first;
    for (const auto& [id, record] : head_rows) {
      EXPECT_EQ(sparse::ShardOfId(id, kReplicatedShards), g) << "id " << id << " in group " << g;
      auto it = tail_rows.find(id);
      if (it == tail_rows.end()) {
        ++missing;
      } else if (it->second != record) {
        if (differing++ == 0) {
          // Which part differs: the value, or the state and metadata after it.
          const bool value = std::memcmp(it->second.data(), record.data(),
                                         sizeof(uint64_t) + kDim * sizeof(float)) != 0;
          first = absl::StrCat("; first: id ", id, ", in its ", value ? "value" : "metadata");
        }
      }
    }
    for (const auto& [id, record] : tail_rows) missing += head_rows.count(id) == 0;
    EXPECT_TRUE(differing == 0 && missing == 0)
        << "group " << g << ": head shard " << head << " and tail shard " << tail << " differ: "
        << differing << " rows differ, " << missing << " rows only on one of them" << first;
    std::vector<uint64_t> tail_ids;
    std::vector<float> tail_values;
    for (const auto& [id, record] : tail_rows) {
      tail_ids.push_back(id);
      tail_values.resize(tail_values.size() + kDim);
      std::memcpy(tail_values.data() + tail_values.size() - kDim, record.data() + sizeof(id),
                  kDim * sizeof(float));
    }
    const Tally stored(tail_ids, tail_values.data(), kDim, pushes);
    EXPECT_TRUE(stored.ok()) << "group " << g << "'s tail, shard " << tail << ": "
                             << stored.Describe(pushes, tail_ids.size());
  }

  // The bulk table: more than a 1 MiB message of rows per group, the same
  // records on each group's head and tail (the restarted shard copied them
  // in parts).
  config.name = bulk.name();
  config.dim = bulk.dim();
  absl::StatusOr<std::unique_ptr<sparse::EmbeddingTable>> bulk_layout =
      sparse::EmbeddingTable::Create(config, {});
  ASSERT_TRUE(bulk_layout.ok()) << bulk_layout.status();
  const int bulk_record_bytes = (*bulk_layout)->record_bytes();
  size_t bulk_rows = 0;
  for (int g = 0; g < kReplicatedShards; ++g) {
    absl::StatusOr<ChainRows> rows =
        HeadAndTailRows(**chains, job, *cluster, g, bulk.name(), bulk_record_bytes);
    ASSERT_TRUE(rows.ok()) << rows.status();
    EXPECT_GT(rows->head_rows.size() * bulk_record_bytes, size_t{1} << 20) << "group " << g;
    EXPECT_TRUE(rows->head_rows == rows->tail_rows)
        << "group " << g << "'s bulk rows: head shard " << rows->head << " holds "
        << rows->head_rows.size() << ", tail shard " << rows->tail << " "
        << rows->tail_rows.size() << ", and they differ";
    bulk_rows += rows->head_rows.size();
  }
  EXPECT_EQ(bulk_rows, static_cast<size_t>(kBulkIds));
}

class SparseBadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(shard_
                    .Start(SHARDTRAIN_BIN_DIR,
                           {"--num_shards=2", "--shard_index=0", "--num_workers=1",
                            "--max_table_ids_per_request=64", "--max_table_dim=32",
                            "--max_table_rows=1000", "--max_tables=2"})
                    .ok());
    RegisterTablesRequest request;
    *request.add_tables() = Spec("t", 4, "adagrad", 0.1f);
    ASSERT_EQ(Register(request).error_code(), grpc::StatusCode::OK);
    for (uint64_t x = 0; own_.size() < 10; ++x) {
      if (sparse::ShardOfId(x, 2) == 0) own_.push_back(x);
      else if (other_ == UINT64_MAX) other_ = x;
    }
    LookupRequest lookup;
    lookup.set_table("t");
    lookup.set_ids(Bytes(own_));
    lookup.set_train(true);
    LookupResponse response;
    ASSERT_TRUE(shard_.Call(&ParameterServer::Stub::Lookup, lookup, &response).ok());
    before_ = Rows();
  }

  static std::string Bytes(const std::vector<uint64_t>& ids) {
    return std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * 8);
  }
  static std::string Floats(const std::vector<float>& v) {
    return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
  }
  grpc::Status Register(const RegisterTablesRequest& request) {
    RegisterTablesResponse response;
    return shard_.Call(&ParameterServer::Stub::RegisterTables, request, &response);
  }
  // The stored rows of own_, read only.
  std::string Rows() {
    LookupRequest lookup;
    lookup.set_table("t");
    lookup.set_ids(Bytes(own_));
    LookupResponse response;
    EXPECT_TRUE(shard_.Call(&ParameterServer::Stub::Lookup, lookup, &response).ok());
    return response.rows();
  }
  PushSparseRequest Push(const std::vector<uint64_t>& ids, int dim = 4, float value = 0.5f) {
    PushSparseRequest push;
    push.set_table("t");
    push.set_ids(Bytes(ids));
    push.set_grads(Floats(std::vector<float>(ids.size() * dim, value)));
    push.set_sequence(++sequence_);
    return push;
  }
  void ExpectRefused(const PushSparseRequest& push, grpc::StatusCode code, const std::string& what) {
    PushSparseResponse response;
    grpc::Status status = shard_.Call(&ParameterServer::Stub::PushSparse, push, &response);
    EXPECT_EQ(status.error_code(), code) << what << ": " << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr(what));
    EXPECT_EQ(Rows(), before_) << what;
  }

  testutil::ShardProcess shard_;
  std::vector<uint64_t> own_;
  uint64_t other_ = UINT64_MAX;
  std::string before_;
  uint64_t sequence_ = 0;
};

TEST_F(SparseBadInput, PushesAreRefusedAndChangeNothing) {
  PushSparseRequest push = Push(own_);
  push.set_table("nope");
  ExpectRefused(push, grpc::StatusCode::NOT_FOUND, "no table \"nope\"");
  push = Push(own_, 5);
  ExpectRefused(push, grpc::StatusCode::INVALID_ARGUMENT, "has dim 4");
  push = Push(own_);
  push.mutable_ids()->pop_back();
  ExpectRefused(push, grpc::StatusCode::INVALID_ARGUMENT, "whole number");
  push = Push(own_, 4, std::nanf(""));
  ExpectRefused(push, grpc::StatusCode::INVALID_ARGUMENT, "NaN or Inf");
  push = Push(own_, 4, INFINITY);
  ExpectRefused(push, grpc::StatusCode::INVALID_ARGUMENT, "NaN or Inf");
  std::vector<uint64_t> twice = own_;
  twice.push_back(own_[3]);
  ExpectRefused(Push(twice), grpc::StatusCode::INVALID_ARGUMENT, "appears twice");
  std::vector<uint64_t> foreign = own_;
  foreign.push_back(other_);
  ExpectRefused(Push(foreign), grpc::StatusCode::INVALID_ARGUMENT, "belongs to shard 1");
  std::vector<uint64_t> many;
  for (uint64_t x = 0; many.size() < 65; ++x) {
    if (sparse::ShardOfId(x, 2) == 0) many.push_back(x);
  }
  ExpectRefused(Push(many), grpc::StatusCode::INVALID_ARGUMENT, "--max_table_ids_per_request");
  push = Push(own_);
  push.set_worker(1);
  ExpectRefused(push, grpc::StatusCode::INVALID_ARGUMENT, "worker 1");
  // bf16 gradients: 2 bytes each, so f32-sized grads are the wrong size; an
  // unknown dtype; a bf16 NaN (0x7fc0) and an f16 Inf (0x7c00).
  push = Push(own_);
  push.set_dtype(DTYPE_BF16);
  ExpectRefused(push, grpc::StatusCode::INVALID_ARGUMENT, "bytes of bf16 gradients");
  push = Push(own_);
  push.set_dtype(static_cast<DType>(99));
  ExpectRefused(push, grpc::StatusCode::INVALID_ARGUMENT, "grads dtype 99");
  push = Push(own_);
  push.set_dtype(DTYPE_BF16);
  push.set_grads(std::string(own_.size() * 4 * 2, '\0'));
  std::memcpy(push.mutable_grads()->data() + 6, "\xc0\x7f", 2);
  ExpectRefused(push, grpc::StatusCode::INVALID_ARGUMENT, "NaN or Inf");
  push.set_dtype(DTYPE_F16);
  push.set_grads(std::string(own_.size() * 4 * 2, '\0'));
  std::memcpy(push.mutable_grads()->data() + 6, "\x00\x7c", 2);
  ExpectRefused(push, grpc::StatusCode::INVALID_ARGUMENT, "NaN or Inf");
}

// Rows and gradients in bf16 on the wire: a lookup answers 2 bytes per
// value, each the stored f32 rounded to nearest even; a bf16 push applies
// exactly the gradient an f32 push of the same values applies.
TEST_F(SparseBadInput, Bf16RowsAndGradientsOnTheWire) {
  LookupRequest lookup;
  lookup.set_table("t");
  lookup.set_ids(Bytes(own_));
  lookup.set_dtype(DTYPE_BF16);
  LookupResponse response;
  ASSERT_TRUE(shard_.Call(&ParameterServer::Stub::Lookup, lookup, &response).ok());
  ASSERT_EQ(response.rows().size(), own_.size() * 4 * 2);
  const std::string f32 = Rows();
  for (size_t i = 0; i < own_.size() * 4; ++i) {
    float x;
    uint16_t b;
    std::memcpy(&x, f32.data() + 4 * i, 4);
    std::memcpy(&b, response.rows().data() + 2 * i, 2);
    ASSERT_EQ(b, common::FloatToBfloat16(x)) << "value " << i;
  }
  lookup.set_dtype(static_cast<DType>(42));
  EXPECT_EQ(shard_.Call(&ParameterServer::Stub::Lookup, lookup, &response).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);

  // 0.5 in bf16 is 0x3f00; the same push in f32 to a copy of the table.
  RegisterTablesRequest copy;
  *copy.add_tables() = Spec("u", 4, "adagrad", 0.1f);
  ASSERT_EQ(Register(copy).error_code(), grpc::StatusCode::OK);
  LookupRequest touch;
  touch.set_table("u");
  touch.set_ids(Bytes(own_));
  touch.set_train(true);
  ASSERT_TRUE(shard_.Call(&ParameterServer::Stub::Lookup, touch, &response).ok());
  PushSparseRequest half = Push(own_);
  half.set_dtype(DTYPE_BF16);
  half.set_grads(std::string(own_.size() * 4 * 2, '\0'));
  for (size_t i = 0; i < own_.size() * 4; ++i) {
    std::memcpy(half.mutable_grads()->data() + 2 * i, "\x00\x3f", 2);
  }
  PushSparseResponse pushed;
  ASSERT_TRUE(shard_.Call(&ParameterServer::Stub::PushSparse, half, &pushed).ok());
  PushSparseRequest full = Push(own_);
  full.set_table("u");
  ASSERT_TRUE(shard_.Call(&ParameterServer::Stub::PushSparse, full, &pushed).ok());
  touch.set_train(false);
  ASSERT_TRUE(shard_.Call(&ParameterServer::Stub::Lookup, touch, &response).ok());
  // Both tables start from the same zeros (Spec's init) and took the same step.
  EXPECT_EQ(Rows(), response.rows());
  EXPECT_NE(Rows(), before_);
}

TEST_F(SparseBadInput, APushIsAppliedOnceHoweverOftenItIsSent) {
  const PushSparseRequest push = Push(own_);
  PushSparseResponse first, second;
  ASSERT_TRUE(shard_.Call(&ParameterServer::Stub::PushSparse, push, &first).ok());
  const std::string after = Rows();
  EXPECT_NE(after, before_);
  ASSERT_TRUE(shard_.Call(&ParameterServer::Stub::PushSparse, push, &second).ok());
  EXPECT_FALSE(first.duplicate());
  EXPECT_TRUE(second.duplicate());
  EXPECT_EQ(Rows(), after);
}

TEST_F(SparseBadInput, TableSpecsOutsideTheLimitsAreRefused) {
  auto refused = [&](const TableSpec& spec, grpc::StatusCode code, const std::string& what) {
    RegisterTablesRequest request;
    *request.add_tables() = spec;
    grpc::Status status = Register(request);
    EXPECT_EQ(status.error_code(), code) << what << ": " << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr(what));
  };
  refused(Spec("wide", 33, "sgd", 0.1f), grpc::StatusCode::INVALID_ARGUMENT, "--max_table_dim");
  TableSpec big = Spec("big", 4, "sgd", 0.1f);
  big.set_capacity(1001);
  refused(big, grpc::StatusCode::INVALID_ARGUMENT, "--max_table_rows");
  refused(Spec("lamb", 4, "lamb", 0.1f), grpc::StatusCode::INVALID_ARGUMENT, "unknown optimizer");
  refused(Spec("t", 8, "adagrad", 0.1f), grpc::StatusCode::FAILED_PRECONDITION, "another spec");
  TableSpec nan_lr = Spec("nan", 4, "sgd", std::nanf(""));
  refused(nan_lr, grpc::StatusCode::INVALID_ARGUMENT, "learning_rate");
  // One more table fits (--max_tables=2), two more do not: neither lands.
  RegisterTablesRequest two;
  *two.add_tables() = Spec("a", 4, "sgd", 0.1f);
  *two.add_tables() = Spec("b", 4, "sgd", 0.1f);
  grpc::Status status = Register(two);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(), HasSubstr("--max_tables"));
  StatusResponse state;
  ASSERT_TRUE(shard_.Call(&ParameterServer::Stub::Status, StatusRequest(), &state).ok());
  ASSERT_EQ(state.tables_size(), 1);
  EXPECT_EQ(state.tables(0).name(), "t");
  EXPECT_EQ(state.tables(0).rows(), 10);
}

TEST_F(SparseBadInput, LookupsAreRefusedAndChangeNothing) {
  LookupRequest lookup;
  lookup.set_table("t");
  lookup.set_train(true);
  std::vector<uint64_t> ids = own_;
  ids.push_back(other_);
  lookup.set_ids(Bytes(ids));
  LookupResponse response;
  grpc::Status status = shard_.Call(&ParameterServer::Stub::Lookup, lookup, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("belongs to shard 1"));
  lookup.set_table("nope");
  status = shard_.Call(&ParameterServer::Stub::Lookup, lookup, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  StatusResponse state;
  ASSERT_TRUE(shard_.Call(&ParameterServer::Stub::Status, StatusRequest(), &state).ok());
  EXPECT_EQ(state.tables(0).rows(), 10);
  EXPECT_EQ(Rows(), before_);
}

}  // namespace
}  // namespace shardtrain
