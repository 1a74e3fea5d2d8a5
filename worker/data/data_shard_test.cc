#include "worker/data/data_shard.h"

#include <algorithm>
#include <memory>
#include <set>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardtrain::worker {
namespace {

std::unique_ptr<DataShard> MakeShard(int n, int worker, int workers,
                                     uint64_t seed) {
  auto shard = DataShard::Create(n, worker, workers, seed);
  EXPECT_TRUE(shard.ok()) << shard.status();
  return std::move(shard).value();
}

std::vector<int> Sorted(std::vector<int> v) {
  std::sort(v.begin(), v.end());
  return v;
}

TEST(DataShardTest, BlocksAreDisjointBalancedAndCoverAll) {
  for (int n : {0, 1, 7, 100, 101}) {
    for (int workers : {1, 2, 3, 5}) {
      std::vector<int> seen(n, 0);
      size_t min_size = n, max_size = 0;
      for (int w = 0; w < workers; ++w) {
        auto shard = MakeShard(n, w, workers, 42);
        shard->BeginEpoch(3);
        for (int i : shard->indices()) {
          ASSERT_GE(i, 0);
          ASSERT_LT(i, n);
          ++seen[i];
        }
        min_size = std::min(min_size, shard->indices().size());
        max_size = std::max(max_size, shard->indices().size());
      }
      for (int i = 0; i < n; ++i) {
        EXPECT_EQ(seen[i], 1) << "n=" << n << " W=" << workers << " i=" << i;
      }
      EXPECT_LE(max_size - min_size, 1u) << "n=" << n << " W=" << workers;
    }
  }
}

TEST(DataShardTest, PermutationIsDeterministicFromSeed) {
  auto a = MakeShard(1000, 1, 3, 7);
  auto b = MakeShard(1000, 1, 3, 7);
  auto c = MakeShard(1000, 1, 3, 8);
  EXPECT_EQ(a->indices(), b->indices());
  EXPECT_NE(Sorted(a->indices()), Sorted(c->indices()));
  // Blocks come from a shuffle, not from 0..N-1 in order.
  EXPECT_NE(Sorted(a->indices()).front(), 333);
  a->BeginEpoch(5);
  b->BeginEpoch(5);
  EXPECT_EQ(a->indices(), b->indices());
}

TEST(DataShardTest, EpochsReorderTheSameExamples) {
  auto shard = MakeShard(1000, 0, 2, 9);
  const std::vector<int> block = Sorted(shard->indices());
  shard->BeginEpoch(0);
  const std::vector<int> epoch0 = shard->indices();
  shard->BeginEpoch(1);
  const std::vector<int> epoch1 = shard->indices();
  EXPECT_NE(epoch0, epoch1);
  EXPECT_EQ(Sorted(epoch0), block);
  EXPECT_EQ(Sorted(epoch1), block);
  // An epoch's order depends on the epoch number only, not on history.
  shard->BeginEpoch(0);
  EXPECT_EQ(shard->indices(), epoch0);
}

TEST(DataShardTest, StepsPerEpochIsEqualForAllWorkers) {
  // 103 / 5 = 20 examples at least per worker; 20 / 6 = 3 steps.
  for (int w = 0; w < 5; ++w) {
    EXPECT_EQ(MakeShard(103, w, 5, 1)->StepsPerEpoch(6), 3);
  }
  EXPECT_EQ(MakeShard(103, 0, 5, 1)->StepsPerEpoch(0), 0);
  EXPECT_EQ(MakeShard(10, 0, 1, 1)->StepsPerEpoch(10), 1);
  EXPECT_EQ(MakeShard(10, 0, 1, 1)->StepsPerEpoch(11), 0);
}

Dataset TinyDataset(int n, int dim) {
  Dataset d;
  d.num_examples = n;
  d.feature_dim = dim;
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < dim; ++j) d.features.push_back(i * 100 + j);
    d.labels.push_back(i % 10);
  }
  return d;
}

TEST(DataShardTest, NextBatchCopiesExamplesInEpochOrder) {
  const Dataset data = TinyDataset(11, 3);
  auto shard = MakeShard(11, 1, 2, 5);
  std::vector<float> x(2 * 3);
  std::vector<int32_t> labels(2);
  EXPECT_EQ(shard->NextBatch(data, 2, x.data(), labels.data()).code(),
            absl::StatusCode::kFailedPrecondition);
  shard->BeginEpoch(0);
  const std::vector<int> order = shard->indices();  // 6 examples (5.5 up).
  ASSERT_EQ(order.size(), 6u);
  std::set<int> seen;
  for (int step = 0; step < 3; ++step) {
    ASSERT_TRUE(shard->NextBatch(data, 2, x.data(), labels.data()).ok());
    for (int b = 0; b < 2; ++b) {
      const int example = order[step * 2 + b];
      EXPECT_EQ(labels[b], example % 10);
      for (int j = 0; j < 3; ++j) EXPECT_EQ(x[b * 3 + j], example * 100 + j);
      seen.insert(example);
    }
  }
  EXPECT_EQ(seen.size(), 6u);
  EXPECT_EQ(shard->NextBatch(data, 2, x.data(), labels.data()).code(),
            absl::StatusCode::kOutOfRange);
  shard->BeginEpoch(1);
  EXPECT_TRUE(shard->NextBatch(data, 2, x.data(), labels.data()).ok());
}

TEST(DataShardTest, RejectsBadArguments) {
  EXPECT_EQ(DataShard::Create(10, 2, 2, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DataShard::Create(10, -1, 2, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DataShard::Create(10, 0, 0, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DataShard::Create(-1, 0, 1, 0).status().code(),
            absl::StatusCode::kInvalidArgument);

  auto shard = MakeShard(11, 0, 1, 5);
  shard->BeginEpoch(0);
  std::vector<float> x(3);
  int32_t label;
  EXPECT_EQ(shard->NextBatch(TinyDataset(12, 3), 1, x.data(), &label).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(shard->NextBatch(TinyDataset(11, 3), 0, x.data(), &label).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(shard->NextBatch(TinyDataset(11, 3), 1, nullptr, &label).code(),
            absl::StatusCode::kInvalidArgument);
  Dataset short_features = TinyDataset(11, 3);
  short_features.features.resize(5);
  EXPECT_EQ(shard->NextBatch(short_features, 1, x.data(), &label).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardtrain::worker

namespace shardtrain::worker {
namespace {

// A worker that resumes at batch b of an epoch (BeginEpoch + Seek) reads
// exactly what a worker that never stopped reads from there on.
TEST(DataShardTest, SeekEqualsReplay) {
  const Dataset data = TinyDataset(103, 2);
  constexpr int kBatch = 4;
  for (int epoch : {1, 3}) {
    auto replay = MakeShard(103, 1, 3, 9);
    replay->BeginEpoch(epoch);
    const int steps = replay->StepsPerEpoch(kBatch);
    std::vector<std::vector<int32_t>> labels(steps, std::vector<int32_t>(kBatch));
    std::vector<std::vector<float>> x(steps, std::vector<float>(kBatch * 2));
    for (int s = 0; s < steps; ++s) {
      ASSERT_TRUE(replay->NextBatch(data, kBatch, x[s].data(), labels[s].data()).ok());
    }
    for (int start : {0, 1, steps / 2, steps - 1, steps}) {
      auto resumed = MakeShard(103, 1, 3, 9);
      resumed->BeginEpoch(epoch);
      ASSERT_TRUE(resumed->Seek(start, kBatch).ok());
      for (int s = start; s < steps; ++s) {
        std::vector<int32_t> got_labels(kBatch);
        std::vector<float> got_x(kBatch * 2);
        ASSERT_TRUE(resumed->NextBatch(data, kBatch, got_x.data(), got_labels.data()).ok());
        EXPECT_EQ(got_labels, labels[s]) << "epoch " << epoch << " from " << start;
        EXPECT_EQ(got_x, x[s]);
      }
    }
  }
}

TEST(DataShardTest, SeekRejectsBadPositions) {
  auto shard = MakeShard(20, 0, 1, 1);
  EXPECT_EQ(shard->Seek(0, 2).code(), absl::StatusCode::kFailedPrecondition);
  shard->BeginEpoch(1);
  EXPECT_EQ(shard->Seek(-1, 2).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(shard->Seek(1, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(shard->Seek(11, 2).code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(shard->Seek(10, 2).ok());
  std::vector<float> x(2);
  int32_t label;
  EXPECT_EQ(shard->NextBatch(TinyDataset(20, 1), 1, x.data(), &label).code(),
            absl::StatusCode::kOutOfRange);
}

}  // namespace
}  // namespace shardtrain::worker
