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
//  - SparseBadInput: unknown tables, wrong sizes and dims, NaN gradients,
//    duplicate ids, ids of another shard and every limit flag are refused
//    with their status code and name, and nothing changes; a push sent
//    twice is applied once.
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "client/ps_client.h"
#include "common/payload.h"
#include "client/table_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sparse/embedding_table.h"
#include "sparse/id_hash.h"
#include "testing/files.h"
#include "testing/free_port.h"
#include "tests/cluster_util.h"
#include "tests/shard_process.h"

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
