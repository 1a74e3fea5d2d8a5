// Registration with the model's own initial values (Initializer KIND_VALUES):
// worker 0's values create the partitions, each shard its slices; other
// workers wait (UNAVAILABLE) until then; bad values change nothing.
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include <prometheus/registry.h>

#include "common/partition.h"
#include "common/payload.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/shard.h"

namespace shardtrain::server {
namespace {

using ::testing::HasSubstr;

constexpr int kShards = 3;
constexpr int64_t kMaxPartition = 10;
constexpr int64_t kRows = 7;
constexpr int64_t kCols = 9;  // 63 elements: 9 partitions of 7, 3 per shard

std::vector<float> Values(int64_t n) {
  std::vector<float> values(n);
  for (int64_t i = 0; i < n; ++i) values[i] = 0.25f * static_cast<float>(i) - 3.0f;
  return values;
}

std::string Bytes(const std::vector<float>& values) {
  std::string bytes;
  common::EncodeDense(values, DTYPE_F32, &bytes);
  return bytes;
}

TensorSpec ValuesSpec(const std::vector<float>& values) {
  TensorSpec spec;
  spec.set_name("w");
  spec.add_shape(kRows);
  spec.add_shape(kCols);
  spec.set_dtype(DTYPE_F32);
  spec.mutable_init()->set_kind(Initializer::KIND_VALUES);
  spec.set_values(Bytes(values));
  return spec;
}

RegisterRequest Request(uint32_t worker, const TensorSpec& spec) {
  RegisterRequest request;
  request.set_worker(worker);
  request.set_num_workers(2);
  request.set_worker_incarnation(worker + 1);
  *request.add_tensors() = spec;
  return request;
}

class ShardValuesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int s = 0; s < kShards; ++s) {
      ShardOptions options;
      options.shard_index = s;
      options.partitioning.num_shards = kShards;
      options.partitioning.max_partition_elements = kMaxPartition;
      options.num_workers = 2;
      options.optimizer.name = "sgd";
      auto shard = Shard::Create(options, &metrics_);
      ASSERT_TRUE(shard.ok()) << shard.status();
      shards_.push_back(std::move(*shard));
    }
  }

  absl::Status Register(int shard, const RegisterRequest& request,
                        RegisterResponse* response = nullptr) {
    RegisterResponse ignored;
    return shards_[shard]->Register(request, response ? response : &ignored);
  }

  // The whole tensor "w" as the shards hold it, assembled from every
  // partition; NaN where no shard holds one.
  std::vector<float> Assemble() {
    std::vector<float> whole(kRows * kCols, std::numeric_limits<float>::quiet_NaN());
    for (const common::PlacedPartition& placed :
         common::PlaceTensor("w", kRows * kCols, {kMaxPartition, kShards})) {
      PullRequest request;
      PartitionKey* key = request.add_parts();
      key->set_tensor("w");
      key->set_partition(static_cast<uint32_t>(placed.partition));
      if (!shards_[placed.shard]->pulls().Validate(request).ok()) continue;
      PullResponse response;
      shards_[placed.shard]->pulls().Fill(request, &response);
      std::vector<float> part(placed.range.size);
      EXPECT_TRUE(common::DecodeDense(DTYPE_F32, response.parts(0).value().data(),
                                      absl::MakeSpan(part))
                      .ok());
      std::copy(part.begin(), part.end(), whole.begin() + placed.range.offset);
    }
    return whole;
  }

  int64_t StoredPartitions() {
    int64_t total = 0;
    for (auto& shard : shards_) {
      StatusResponse status;
      shard->FillStatus(StatusRequest(), &status);
      total += status.num_partitions();
    }
    return total;
  }

  prometheus::Registry registry_;
  ShardMetrics metrics_{registry_};
  std::vector<std::unique_ptr<Shard>> shards_;
};

TEST_F(ShardValuesTest, WorkerZerosValuesCreateEachShardsSlices) {
  const std::vector<float> values = Values(kRows * kCols);
  for (int s = 0; s < kShards; ++s) {
    RegisterResponse response;
    ASSERT_TRUE(Register(s, Request(0, ValuesSpec(values)), &response).ok());
    EXPECT_EQ(response.partitions_size(), 3) << "shard " << s;
  }
  EXPECT_EQ(Assemble(), values);
  // The spec is kept (and checkpointed) without its values.
  for (auto& shard : shards_) {
    for (const CheckpointRecord& record : shard->Snapshot()) {
      EXPECT_EQ(record.spec().init().kind(), Initializer::KIND_VALUES);
      EXPECT_TRUE(record.spec().values().empty());
    }
  }
}

TEST_F(ShardValuesTest, OtherWorkersWaitForWorkerZero) {
  const std::vector<float> values = Values(kRows * kCols);
  // Worker 1's own values are not used, whatever they are.
  std::vector<float> other = values;
  other[5] = 100.0f;
  absl::Status early = Register(1, Request(1, ValuesSpec(other)));
  EXPECT_EQ(early.code(), absl::StatusCode::kUnavailable) << early;
  EXPECT_THAT(early.message(), HasSubstr("waiting for worker 0"));
  EXPECT_THAT(early.message(), HasSubstr("w"));
  EXPECT_EQ(StoredPartitions(), 0);
  StatusResponse status;
  shards_[1]->FillStatus(StatusRequest(), &status);
  EXPECT_EQ(status.num_tensors(), 0);

  for (int s = 0; s < kShards; ++s) {
    ASSERT_TRUE(Register(s, Request(0, ValuesSpec(values))).ok());
  }
  // Once the tensor exists, any worker registers it: with other values
  // (ignored) or none.
  TensorSpec empty = ValuesSpec(values);
  empty.clear_values();
  for (int s = 0; s < kShards; ++s) {
    RegisterResponse response;
    ASSERT_TRUE(Register(s, Request(1, ValuesSpec(other)), &response).ok());
    EXPECT_EQ(response.partitions_size(), 3);
    ASSERT_TRUE(Register(s, Request(1, empty)).ok());
  }
  EXPECT_EQ(Assemble(), values);
  // The shape is still checked.
  TensorSpec reshaped = empty;
  reshaped.set_shape(0, kCols);
  reshaped.set_shape(1, kRows);
  EXPECT_EQ(Register(0, Request(1, reshaped)).code(), absl::StatusCode::kAlreadyExists);
}

TEST_F(ShardValuesTest, AShardHoldingNoneOfTheTensorDoesNotWait) {
  // One partition: it lives on one shard; the others hold nothing of it.
  TensorSpec small;
  small.set_name("b");
  small.add_shape(4);
  small.set_dtype(DTYPE_F32);
  small.mutable_init()->set_kind(Initializer::KIND_VALUES);
  const int holder = common::ShardFor("b", 0, kShards);
  for (int s = 0; s < kShards; ++s) {
    const absl::Status status = Register(s, Request(1, small));
    if (s == holder) {
      EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
    } else {
      EXPECT_TRUE(status.ok()) << status;
    }
  }
}

TEST_F(ShardValuesTest, BadValuesAreRefusedAndChangeNothing) {
  const std::vector<float> values = Values(kRows * kCols);
  TensorSpec short_values = ValuesSpec(values);
  short_values.mutable_values()->resize(short_values.values().size() - 4);
  TensorSpec odd_bytes = ValuesSpec(values);
  odd_bytes.mutable_values()->push_back('x');
  std::vector<float> with_nan = values;
  with_nan[17] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> with_inf = values;
  with_inf[62] = -std::numeric_limits<float>::infinity();
  TensorSpec none = ValuesSpec(values);
  none.clear_values();
  TensorSpec wrong_kind = ValuesSpec(values);
  wrong_kind.mutable_init()->set_kind(Initializer::KIND_ZEROS);
  struct Case {
    const char* what;
    TensorSpec spec;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"4 bytes short", short_values, "bytes of initial values"},
      {"one byte over", odd_bytes, "bytes of initial values"},
      {"a NaN", ValuesSpec(with_nan), "initial value 17 is nan"},
      {"an Inf", ValuesSpec(with_inf), "initial value 62 is -inf"},
      {"no values from worker 0", none, "sent no values"},
      {"values with another initializer", wrong_kind, "only sent with the KIND_VALUES"},
  };
  for (const Case& c : cases) {
    for (int s = 0; s < kShards; ++s) {
      const absl::Status status = Register(s, Request(0, c.spec));
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.what << ": " << status;
      EXPECT_THAT(status.message(), HasSubstr(c.message)) << c.what;
    }
  }
  EXPECT_EQ(StoredPartitions(), 0);

  // A good registration, then the bad ones again: refused, nothing changed.
  for (int s = 0; s < kShards; ++s) {
    ASSERT_TRUE(Register(s, Request(0, ValuesSpec(values))).ok());
  }
  std::vector<uint64_t> before;
  for (auto& shard : shards_) before.push_back(shard->Checksum());
  for (const Case& c : cases) {
    if (c.spec.values().empty()) continue;  // accepted once the tensor exists
    for (int s = 0; s < kShards; ++s) {
      EXPECT_EQ(Register(s, Request(0, c.spec)).code(), absl::StatusCode::kInvalidArgument)
          << c.what;
      EXPECT_EQ(Register(s, Request(1, c.spec)).code(), absl::StatusCode::kInvalidArgument)
          << c.what;
    }
  }
  for (int s = 0; s < kShards; ++s) EXPECT_EQ(shards_[s]->Checksum(), before[s]);
  EXPECT_EQ(Assemble(), values);
}

TEST_F(ShardValuesTest, ARequestIsAllOrNothing) {
  // Worker 1 names a tensor it may create and one it must wait for: the
  // refusal creates neither.
  const std::vector<float> values = Values(kRows * kCols);
  RegisterRequest request = Request(1, ValuesSpec(values));
  TensorSpec* zeros = request.add_tensors();
  zeros->set_name("z");
  zeros->add_shape(kRows * kCols);
  zeros->set_dtype(DTYPE_F32);
  for (int s = 0; s < kShards; ++s) {
    EXPECT_EQ(Register(s, request).code(), absl::StatusCode::kUnavailable);
  }
  EXPECT_EQ(StoredPartitions(), 0);
}

TEST_F(ShardValuesTest, RestoreCreatesValuesTensorsFromTheCheckpoint) {
  const std::vector<float> values = Values(kRows * kCols);
  for (int s = 0; s < kShards; ++s) {
    ASSERT_TRUE(Register(s, Request(0, ValuesSpec(values))).ok());
  }
  for (int s = 0; s < kShards; ++s) {
    const std::vector<CheckpointRecord> records = shards_[s]->Snapshot();
    auto fresh = Shard::Create(shards_[s]->options(), &metrics_);
    ASSERT_TRUE(fresh.ok());
    ASSERT_TRUE((*fresh)->Restore(records).ok());
    EXPECT_EQ((*fresh)->Checksum(), shards_[s]->Checksum());
    shards_[s] = std::move(*fresh);
  }
  EXPECT_EQ(Assemble(), values);
  // After a restore, the tensor exists: worker 1 need not wait.
  EXPECT_TRUE(Register(0, Request(1, ValuesSpec(values))).ok());
}

}  // namespace
}  // namespace shardtrain::server
