#include "server/sparse_tables.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sparse/id_hash.h"
#include "wire/testing/flatten.h"

namespace shardtrain::server {
namespace {

using ::testing::HasSubstr;

constexpr int kDim = 2;

std::string Bytes(const void* data, size_t size) {
  return std::string(static_cast<const char*>(data), size);
}

class SyncTableTest : public ::testing::Test {
 protected:
  SyncTableTest() : tables_(Options(), {0}, /*incarnation=*/1, /*metrics=*/nullptr) {
    RegisterTablesRequest request;
    TableSpec* spec = request.add_tables();
    spec->set_name("t");
    spec->set_dim(kDim);
    spec->set_optimizer("sgd");
    spec->set_learning_rate(1.0f);
    spec->set_init(TableSpec::INIT_ZEROS);
    spec->set_sync(true);
    EXPECT_TRUE(tables_.Register(request).ok());
  }

  static ShardOptions Options() {
    ShardOptions options;
    options.num_workers = 2;
    return options;
  }

  LookupRequest Lookup(uint32_t worker, const std::vector<uint64_t>& ids, bool train = true) {
    LookupRequest request;
    request.set_table("t");
    request.set_ids(Bytes(ids.data(), ids.size() * 8));
    request.set_train(train);
    request.set_worker(worker);
    return request;
  }

  absl::Status Push(uint32_t worker, uint64_t sequence, const std::vector<uint64_t>& ids,
                    float grad, bool* step_applied = nullptr) {
    PushSparseRequest request;
    request.set_worker(worker);
    request.set_worker_incarnation(1);
    request.set_sequence(sequence);
    request.set_table("t");
    request.set_ids(Bytes(ids.data(), ids.size() * 8));
    const std::vector<float> grads(ids.size() * kDim, grad);
    request.set_grads(Bytes(grads.data(), grads.size() * sizeof(float)));
    PushSparseResponse response;
    return tables_.PushSparse(request, &response, step_applied);
  }

  // A training lookup: creates the rows.
  void Touch(uint32_t worker, const std::vector<uint64_t>& ids) {
    wire::LookupResponseBuilder builder;
    ASSERT_TRUE(tables_.Lookup(Lookup(worker, ids), &builder).ok());
  }

  // The first element of each id's row, read only.
  std::vector<float> Rows(const std::vector<uint64_t>& ids) {
    wire::LookupResponseBuilder builder;
    EXPECT_TRUE(tables_.Lookup(Lookup(0, ids, false), &builder).ok());
    grpc::ByteBuffer buffer;
    builder.Finish(&buffer);
    LookupResponse response;
    EXPECT_TRUE(response.ParseFromString(wire::Flatten(buffer)));
    std::vector<float> firsts;
    for (size_t i = 0; i < ids.size(); ++i) {
      float x;
      std::memcpy(&x, response.rows().data() + i * kDim * sizeof(float), sizeof(float));
      firsts.push_back(x);
    }
    return firsts;
  }

  SparseTables tables_;
};

TEST_F(SyncTableTest, AStepIsAppliedOnceEveryWorkerPushedItsMean) {
  EXPECT_FALSE(tables_.LookupWaits(Lookup(0, {1, 2})));
  Touch(0, {1, 2});
  Touch(1, {2, 3});
  bool applied = false;
  ASSERT_TRUE(Push(0, 1, {1, 2}, -2.0f, &applied).ok());
  EXPECT_FALSE(applied);
  EXPECT_EQ(Rows({1, 2}), std::vector<float>({0, 0})) << "applied before worker 1 pushed";
  // Worker 0's next training lookup waits; worker 1's, and reads, do not.
  EXPECT_TRUE(tables_.LookupWaits(Lookup(0, {1})));
  EXPECT_FALSE(tables_.LookupWaits(Lookup(0, {1}, /*train=*/false)));
  EXPECT_FALSE(tables_.LookupWaits(Lookup(1, {1})));
  ASSERT_TRUE(Push(1, 1, {2, 3}, -4.0f, &applied).ok());
  EXPECT_TRUE(applied);
  EXPECT_FALSE(tables_.LookupWaits(Lookup(0, {1})));
  // SGD, lr 1: the mean over 2 workers (a row named by one gets half).
  EXPECT_EQ(Rows({1, 2, 3}), std::vector<float>({1, 3, 2}));
}

TEST_F(SyncTableTest, ASecondPushInAStepIsRefusedAndChangesNothing) {
  Touch(0, {1});
  ASSERT_TRUE(Push(0, 1, {1}, -2.0f).ok());
  const absl::Status twice = Push(0, 2, {1}, -2.0f);
  EXPECT_EQ(twice.code(), absl::StatusCode::kFailedPrecondition) << twice;
  EXPECT_THAT(twice.message(), HasSubstr("twice in step 0"));
  // The first push sent again is a duplicate, not a second push.
  ASSERT_TRUE(Push(0, 1, {1}, -2.0f).ok());
  ASSERT_TRUE(Push(1, 1, {}, 0.0f).ok());
  EXPECT_EQ(Rows({1}), std::vector<float>({1}));
}

TEST_F(SyncTableTest, CheckpointsCarryTheStepsApplied) {
  Touch(0, {1});
  for (uint64_t step = 1; step <= 3; ++step) {
    ASSERT_TRUE(Push(0, step, {1}, -2.0f).ok());
    ASSERT_TRUE(Push(1, step, {}, 0.0f).ok());
  }
  std::vector<CheckpointRecord> records;
  tables_.Snapshot(1 << 20, &records);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].table_steps(), 3);
  SparseTables restored(Options(), {0}, 2, nullptr);
  ASSERT_TRUE(restored.Restore(records[0]).ok());
  StatusResponse status;
  restored.FillStatus(&status);
  ASSERT_EQ(status.tables_size(), 1);
  EXPECT_TRUE(status.tables(0).sync());
  EXPECT_EQ(status.tables(0).steps(), 3);
  EXPECT_EQ(status.tables(0).rows(), 1);
  records[0].set_table_steps(-1);
  SparseTables bad(Options(), {0}, 3, nullptr);
  EXPECT_EQ(bad.Restore(records[0]).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(SyncTableTest, ALookupOfAWorkerOutsideTheJobIsRefused) {
  wire::LookupResponseBuilder builder;
  const absl::Status status = tables_.Lookup(Lookup(2, {1}), &builder);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_FALSE(tables_.LookupWaits(Lookup(2, {1})));
}

// Two members of a replica group (2 shards, R = 2: each holds both
// groups): what the head does, the replica does from its SparseOps.
class ReplicatedTableTest : public ::testing::Test {
 protected:
  static constexpr int kTableDim = 3;

  ReplicatedTableTest()
      : head_(Options(0), {0, 1}, /*incarnation=*/1, nullptr),
        replica_(Options(1), {1, 0}, /*incarnation=*/2, nullptr) {
    for (uint64_t id = 0; group0_.size() < 40; ++id) {
      if (sparse::ShardOfId(id, 2) == 0) group0_.push_back(id);
    }
    RegisterTablesRequest request;
    for (bool sync : {false, true}) {
      TableSpec* spec = request.add_tables();
      spec->set_name(sync ? "sync" : "async");
      spec->set_dim(kTableDim);
      spec->set_optimizer("adam");
      spec->set_learning_rate(0.1f);
      spec->set_init(TableSpec::INIT_NORMAL);
      spec->set_init_scale(0.1f);
      spec->set_seed(7);
      spec->set_admission("count");
      spec->set_admission_count(2);
      spec->set_ttl(6);
      spec->set_sync(sync);
    }
    EXPECT_TRUE(head_.Register(request).ok());
    EXPECT_TRUE(replica_.Register(request).ok());
  }

  static ShardOptions Options(int shard) {
    ShardOptions options;
    options.num_workers = 2;
    options.replicas = 2;
    options.partitioning.num_shards = 2;
    options.shard_index = shard;
    return options;
  }

  // A training lookup of `ids` (of group 0) at the head: its op.
  SparseOp HeadLookup(const std::string& table, uint32_t worker, int64_t clock,
                      const std::vector<uint64_t>& ids) {
    LookupRequest request;
    request.set_table(table);
    request.set_ids(Bytes(ids.data(), ids.size() * 8));
    request.set_train(true);
    request.set_worker(worker);
    request.set_clock(clock);
    request.set_group(0);
    wire::LookupResponseBuilder builder;
    SparseOp op;
    EXPECT_TRUE(head_.Lookup(request, &builder, &op).ok());
    return op;
  }

  PushSparseRequest PushRequestOf(const std::string& table, uint32_t worker, uint64_t sequence,
                                  int64_t clock, const std::vector<uint64_t>& ids) {
    PushSparseRequest request;
    request.set_worker(worker);
    request.set_worker_incarnation(1);
    request.set_sequence(sequence);
    request.set_clock(clock);
    request.set_table(table);
    request.set_group(0);
    request.set_ids(Bytes(ids.data(), ids.size() * 8));
    std::vector<float> grads(ids.size() * kTableDim);
    for (float& g : grads) g = std::uniform_real_distribution<float>(-1, 1)(random_);
    request.set_grads(Bytes(grads.data(), grads.size() * sizeof(float)));
    return request;
  }

  // A push at the head: its op.
  SparseOp HeadPush(const PushSparseRequest& request) {
    PushSparseResponse response;
    SparseOp op;
    EXPECT_TRUE(head_.PushSparse(request, &response, nullptr, &op).ok());
    EXPECT_FALSE(response.duplicate());
    return op;
  }

  // Group 0's checkpoint records of `tables`, as bytes to compare.
  static std::string GroupRecords(const SparseTables& tables) {
    std::vector<CheckpointRecord> records;
    tables.Snapshot(1 << 20, &records);
    std::map<std::string, std::string> by_table;
    for (const CheckpointRecord& record : records) {
      if (record.table_group() != 0) continue;
      CheckpointRecord copy = record;
      copy.clear_table();
      by_table[record.table().name()] += copy.SerializeAsString();
    }
    std::string all;
    for (const auto& [name, bytes] : by_table) all += name + bytes;
    return all;
  }

  // `steps` steps of both workers on both tables: each a training lookup
  // of random ids of group 0, then a push of random gradients for them.
  std::vector<SparseOp> Train(int first_step, int steps) {
    std::vector<SparseOp> ops;
    for (int step = first_step; step < first_step + steps; ++step) {
      for (const std::string table : {"async", "sync"}) {
        for (uint32_t w = 0; w < 2; ++w) {
          std::vector<uint64_t> ids;
          for (uint64_t id : group0_) {
            if (std::bernoulli_distribution(0.3)(random_)) ids.push_back(id);
          }
          ops.push_back(HeadLookup(table, w, step, ids));
          ops.push_back(HeadPush(
              PushRequestOf(table, w, static_cast<uint64_t>(step) * 2 + 1 + (table == "sync"),
                            step, ids)));
        }
      }
    }
    return ops;
  }

  static absl::Status Apply(SparseTables& tables, const SparseOp& op) {
    return tables.ApplyReplicated(op, absl::Seconds(5), [] { return true; });
  }

  std::mt19937 random_{3};
  std::vector<uint64_t> group0_;
  SparseTables head_;
  SparseTables replica_;
};

TEST_F(ReplicatedTableTest, AReplicaApplyingTheHeadsOperationsIsBitIdentical) {
  const std::vector<SparseOp> ops = Train(1, 12);
  ASSERT_EQ(head_.GroupOps(0), static_cast<int64_t>(ops.size()));
  for (const SparseOp& op : ops) {
    ASSERT_TRUE(Apply(replica_, op).ok());
    // A forward sent again (the chain changed under it) is skipped.
    ASSERT_TRUE(Apply(replica_, op).ok());
  }
  EXPECT_EQ(replica_.GroupOps(0), head_.GroupOps(0));
  EXPECT_EQ(replica_.GroupOps(1), 0);
  const std::string head = GroupRecords(head_);
  EXPECT_GT(head.size(), 40u * 8);
  EXPECT_EQ(GroupRecords(replica_), head) << "the replica's rows differ from the head's";
  // Status: each table's rows by group, the same on both members.
  StatusResponse head_status, replica_status;
  head_.FillStatus(&head_status);
  replica_.FillStatus(&replica_status);
  ASSERT_EQ(replica_status.tables_size(), 2);
  for (int t = 0; t < 2; ++t) {
    const TableState& state = replica_status.tables(t);
    ASSERT_EQ(state.groups_size(), 2);
    EXPECT_EQ(state.groups(0).group(), 1) << "the shard's own group first";
    EXPECT_EQ(state.groups(0).rows(), 0);
    EXPECT_EQ(state.groups(1).group(), 0);
    EXPECT_GT(state.groups(1).rows(), 0);
    EXPECT_EQ(state.groups(1).rows(), head_status.tables(t).groups(0).rows());
    EXPECT_EQ(state.rows(), state.groups(1).rows());
  }
}

TEST_F(ReplicatedTableTest, AJoiningMemberTakesTheGroupInTheMiddleOfASyncStep) {
  std::vector<SparseOp> ops = Train(1, 5);
  // Worker 0 is in the sync table's next step, worker 1 is not.
  ops.push_back(HeadLookup("sync", 0, 6, group0_));
  const PushSparseRequest pushed = PushRequestOf("sync", 0, 99, 6, group0_);
  ops.push_back(HeadPush(pushed));
  GroupStateResponse state;
  head_.ExportGroup(0, /*max_record_bytes=*/1, &state);  // a record per row
  ASSERT_GT(state.table_push_logs_size(), 0);
  ASSERT_TRUE(replica_.ImportGroup(0, state).ok());
  EXPECT_EQ(replica_.GroupOps(0), head_.GroupOps(0));
  // Forwards of operations the state holds are skipped; later ones apply.
  for (const SparseOp& op : ops) ASSERT_TRUE(Apply(replica_, op).ok());
  // Worker 1 completes the step the state held open, and training goes on.
  ops = {HeadLookup("sync", 1, 6, group0_), HeadPush(PushRequestOf("sync", 1, 100, 6, group0_))};
  for (const SparseOp& op : Train(7, 4)) ops.push_back(op);
  for (const SparseOp& op : ops) ASSERT_TRUE(Apply(replica_, op).ok());
  EXPECT_EQ(GroupRecords(replica_), GroupRecords(head_));
  // The push log came along: worker 0's push is a duplicate at the joiner.
  PushSparseResponse response;
  ASSERT_TRUE(replica_.PushSparse(pushed, &response).ok());
  EXPECT_TRUE(response.duplicate());
}

// A table's admission filter (8 MiB at the default 2^24 counters, and up to
// 512 MiB) is spread over its records like its rows, so that no record
// outgrows a message; a joining member and a restore put it back whole.
TEST_F(ReplicatedTableTest, TheAdmissionFilterTravelsInPiecesNoLargerThanARecord) {
  Train(1, 3);
  constexpr size_t kRecordBytes = 1 << 20;
  GroupStateResponse state;
  head_.ExportGroup(0, kRecordBytes, &state);
  int pieces = 0;
  for (const CheckpointRecord& record : state.records()) {
    EXPECT_LE(record.table_filter().size(), kRecordBytes);
    if (!record.table_filter().empty()) ++pieces;
  }
  EXPECT_EQ(pieces, 2 * 8);  // two tables' 8 MiB filters
  ASSERT_TRUE(replica_.ImportGroup(0, state).ok());
  const std::string head = GroupRecords(head_);
  EXPECT_EQ(GroupRecords(replica_), head);

  std::vector<CheckpointRecord> records;
  head_.Snapshot(kRecordBytes, &records);
  SparseTables restored(Options(0), {0, 1}, /*incarnation=*/3, nullptr);
  for (const CheckpointRecord& record : records) ASSERT_TRUE(restored.Restore(record).ok());
  EXPECT_EQ(GroupRecords(restored), head);
  // A piece that does not lie within the filter is refused, nothing changed.
  CheckpointRecord bad = records.front();
  ASSERT_GT(bad.table_filter_bytes(), 0);
  bad.set_table_filter_offset(bad.table_filter_bytes() - 8);
  EXPECT_EQ(restored.Restore(bad).code(), absl::StatusCode::kInvalidArgument);
  bad.set_table_filter_offset(0);
  bad.set_table_filter_bytes(bad.table_filter_bytes() * 2);
  EXPECT_EQ(restored.Restore(bad).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GroupRecords(restored), head);
}

TEST_F(ReplicatedTableTest, AnOperationWaitsForTheOnesBeforeIt) {
  const std::vector<SparseOp> ops = Train(1, 1);
  ASSERT_GE(ops.size(), 2u);
  // Nothing before it arrives: refused after the wait, nothing changed.
  const absl::Status alone =
      replica_.ApplyReplicated(ops[1], absl::Milliseconds(50), [] { return true; });
  EXPECT_EQ(alone.code(), absl::StatusCode::kUnavailable) << alone;
  EXPECT_EQ(replica_.GroupOps(0), 0);
  absl::Status later;
  std::thread waiting([&] { later = Apply(replica_, ops[1]); });
  absl::SleepFor(absl::Milliseconds(50));
  ASSERT_TRUE(Apply(replica_, ops[0]).ok());
  waiting.join();
  EXPECT_TRUE(later.ok()) << later;
  EXPECT_EQ(replica_.GroupOps(0), 2);
}

// An operation of a chain this shard has left, waiting for the one before
// it, is refused once the chain moved on, even when the count then reaches
// it: the new head's operation at that count may be another one.
TEST_F(ReplicatedTableTest, AnOperationOfAChainThatMovedOnIsNotAppliedAtItsTurn) {
  const std::vector<SparseOp> ops = Train(1, 1);
  std::atomic<bool> valid{true};
  absl::Status stale;
  std::thread waiting([&] {
    stale = replica_.ApplyReplicated(ops[1], absl::Seconds(10),
                                     [&valid] { return valid.load(); });
  });
  absl::SleepFor(absl::Milliseconds(50));  // it waits for operation 0
  valid = false;
  ASSERT_TRUE(Apply(replica_, ops[0]).ok());  // operation 0 under the new chain
  waiting.join();
  EXPECT_EQ(stale.code(), absl::StatusCode::kUnavailable) << stale;
  EXPECT_EQ(replica_.GroupOps(0), 1);
}

TEST_F(ReplicatedTableTest, BadOperationsAreRefusedAndChangeNothing) {
  const std::vector<SparseOp> ops = Train(1, 1);
  SparseOp both = ops[0];
  *both.mutable_push() = ops[1].push();
  EXPECT_EQ(Apply(replica_, both).code(), absl::StatusCode::kInvalidArgument);
  SparseOp neither = ops[0];
  neither.clear_lookup();
  EXPECT_EQ(Apply(replica_, neither).code(), absl::StatusCode::kInvalidArgument);
  SparseOp other_group = ops[1];
  other_group.set_group(1);
  other_group.mutable_push()->set_group(1);
  EXPECT_EQ(Apply(replica_, other_group).code(), absl::StatusCode::kInvalidArgument);
  SparseOp nan = ops[1];
  std::string grads = nan.push().grads();
  const float bad = std::nanf("");
  std::memcpy(grads.data(), &bad, sizeof(bad));
  nan.mutable_push()->set_grads(grads);
  EXPECT_EQ(Apply(replica_, nan).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(replica_.GroupOps(0), 0);
  EXPECT_EQ(replica_.GroupOps(1), 0);
  SparseTables unreplicated(ShardOptions(), {0}, 4, nullptr);
  EXPECT_EQ(Apply(unreplicated, ops[0]).code(), absl::StatusCode::kFailedPrecondition);
}

// A table whose TTL counts seconds (ttl_in_seconds) drops rows unused for
// that long, whatever the clocks the workers send: ids 1 and 2, untouched
// for 2 s with a TTL of 1 s, are gone after the next training lookup;
// id 3, just looked up, stays, and id 1 comes back as a fresh row.
TEST(TableTtlTest, RowsUnusedForTheTtlInSecondsAreEvicted) {
  ShardOptions options;
  options.num_workers = 1;
  SparseTables tables(options, {0}, /*incarnation=*/1, /*metrics=*/nullptr);
  RegisterTablesRequest request;
  TableSpec* spec = request.add_tables();
  spec->set_name("t");
  spec->set_dim(kDim);
  spec->set_optimizer("sgd");
  spec->set_learning_rate(0.1f);
  spec->set_ttl(1);
  spec->set_ttl_in_seconds(true);
  const absl::Status registered = tables.Register(request);
  ASSERT_TRUE(registered.ok()) << registered;
  const auto lookup = [&tables](std::vector<uint64_t> ids, int64_t clock) {
    LookupRequest lookup;
    lookup.set_table("t");
    lookup.set_ids(Bytes(ids.data(), ids.size() * 8));
    lookup.set_train(true);
    lookup.set_clock(clock);
    wire::LookupResponseBuilder builder;
    EXPECT_TRUE(tables.Lookup(lookup, &builder).ok());
  };
  const auto rows = [&tables] {
    StatusResponse status;
    tables.FillStatus(&status);
    return status.tables(0).rows();
  };
  lookup({1, 2}, /*clock=*/1);
  ASSERT_EQ(rows(), 2);
  // Steps would not expire them: the clock stays at 1.
  absl::SleepFor(absl::Milliseconds(2200));
  lookup({3}, /*clock=*/1);
  EXPECT_EQ(rows(), 1) << "ids 1 and 2 were unused for 2 s with a TTL of 1 s";
  lookup({1}, /*clock=*/1);
  EXPECT_EQ(rows(), 2);
}

// Training lookups of stored rows run under the table's shared lock,
// beside each other (--replicas 1), while lookups of new ids create rows
// and evict others under the exclusive one. Every lookup must read each
// id's own row, and the table must stay within its capacity.
TEST(TableConcurrencyTest, TrainingLookupsBesideEvictionsReadEachIdsOwnRow) {
  constexpr int kRowDim = 4;
  constexpr uint64_t kIds = 512;
  SparseTables tables(ShardOptions(), {0}, /*incarnation=*/1, /*metrics=*/nullptr);
  RegisterTablesRequest request;
  TableSpec* spec = request.add_tables();
  spec->set_name("t");
  spec->set_dim(kRowDim);
  spec->set_optimizer("sgd");
  spec->set_learning_rate(0.1f);
  spec->set_capacity(128);  // evicts as ids beyond it come in
  const absl::Status registered = tables.Register(request);
  ASSERT_TRUE(registered.ok()) << registered;
  std::atomic<int64_t> clock{1};
  // Each id's rows as a training lookup at the next clock reads them.
  const auto lookup = [&](const std::vector<uint64_t>& ids, bool train) {
    LookupRequest lookup;
    lookup.set_table("t");
    lookup.set_ids(Bytes(ids.data(), ids.size() * 8));
    lookup.set_train(train);
    lookup.set_clock(clock.fetch_add(1));
    wire::LookupResponseBuilder builder;
    EXPECT_TRUE(tables.Lookup(lookup, &builder).ok());
    grpc::ByteBuffer buffer;
    builder.Finish(&buffer);
    LookupResponse response;
    EXPECT_TRUE(response.ParseFromString(wire::Flatten(buffer)));
    std::vector<float> rows(ids.size() * kRowDim);
    EXPECT_EQ(response.rows().size(), rows.size() * sizeof(float));
    std::memcpy(rows.data(), response.rows().data(),
                std::min(response.rows().size(), rows.size() * sizeof(float)));
    return rows;
  };
  // Nothing is pushed: every row holds its id's initial value, which a
  // read-only lookup of an empty table gives.
  std::vector<uint64_t> all(kIds);
  for (uint64_t id = 0; id < kIds; ++id) all[id] = id;
  const std::vector<float> initial = lookup(all, /*train=*/false);
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      for (int call = 0; call < 1500; ++call) {
        // Threads 0 and 1 look up 16 of 96 ids (often all stored: the
        // shared path), 2 and 3 any of the 512 (creating rows, evicting).
        const uint64_t range = t < 2 ? 96 : kIds;
        std::vector<uint64_t> ids;
        while (ids.size() < 16) {
          const uint64_t id = rng() % range;
          if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
        }
        const std::vector<float> rows = lookup(ids, /*train=*/true);
        for (size_t i = 0; i < ids.size(); ++i) {
          if (!std::equal(rows.begin() + i * kRowDim, rows.begin() + (i + 1) * kRowDim,
                          initial.begin() + ids[i] * kRowDim)) {
            ++wrong;
          }
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(wrong.load(), 0) << "rows read for another id";
  StatusResponse status;
  tables.FillStatus(&status);
  EXPECT_LE(status.tables(0).rows(), 128);
}

}  // namespace
}  // namespace shardtrain::server
