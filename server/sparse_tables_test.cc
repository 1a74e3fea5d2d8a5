#include "server/sparse_tables.h"

#include <cstring>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardtrain::server {
namespace {

using ::testing::HasSubstr;

constexpr int kDim = 2;

std::string Bytes(const void* data, size_t size) {
  return std::string(static_cast<const char*>(data), size);
}

class SyncTableTest : public ::testing::Test {
 protected:
  SyncTableTest() : tables_(Options(), /*incarnation=*/1, /*metrics=*/nullptr) {
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
    std::vector<grpc::Slice> slices;
    EXPECT_TRUE(buffer.Dump(&slices).ok());
    std::string bytes;
    for (const grpc::Slice& slice : slices) {
      bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
    }
    EXPECT_TRUE(response.ParseFromString(bytes));
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
  SparseTables restored(Options(), 2, nullptr);
  ASSERT_TRUE(restored.Restore(records[0]).ok());
  StatusResponse status;
  restored.FillStatus(&status);
  ASSERT_EQ(status.tables_size(), 1);
  EXPECT_TRUE(status.tables(0).sync());
  EXPECT_EQ(status.tables(0).steps(), 3);
  EXPECT_EQ(status.tables(0).rows(), 1);
  records[0].set_table_steps(-1);
  SparseTables bad(Options(), 3, nullptr);
  EXPECT_EQ(bad.Restore(records[0]).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(SyncTableTest, ALookupOfAWorkerOutsideTheJobIsRefused) {
  wire::LookupResponseBuilder builder;
  const absl::Status status = tables_.Lookup(Lookup(2, {1}), &builder);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_FALSE(tables_.LookupWaits(Lookup(2, {1})));
}

}  // namespace
}  // namespace shardtrain::server
