#include "server/pull_reader.h"

#include <vector>

#include <prometheus/registry.h>

#include "absl/time/clock.h"
#include "common/payload.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardtrain::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr uint64_t kIncarnation = 77;

// Tensor "w" of 8 elements in two partitions of 4, on the only shard, read
// by two async workers with a staleness bound of 1.
class PullReaderTest : public ::testing::Test {
 protected:
  static ShardOptions Options() {
    ShardOptions options;
    options.num_workers = 2;
    options.mode = ConsistencyMode::kAsync;
    options.max_staleness = 1;
    options.partitioning.max_partition_elements = 4;
    options.limits.max_parts_per_request = 3;
    options.limits.max_response_bytes = 1000;
    return options;
  }

  PullReaderTest() {
    TensorSpec spec;
    spec.set_name("w");
    spec.add_shape(8);
    spec.set_dtype(DTYPE_F32);
    auto parts = store_.Register(spec);
    EXPECT_TRUE(parts.ok()) << parts.status();
    parts_ = *parts;
    for (size_t p = 0; p < parts_.size(); ++p) {
      absl::MutexLock lock(&parts_[p]->mu);
      for (size_t i = 0; i < 4; ++i) parts_[p]->params[i] = static_cast<float>(4 * p + i) + 0.5f;
    }
  }

  static PullRequest Pull(uint32_t worker, int64_t clock, int64_t min_version,
                          std::vector<uint32_t> partitions = {0, 1}) {
    PullRequest request;
    request.set_worker(worker);
    request.set_clock(clock);
    request.set_min_version(min_version);
    for (uint32_t p : partitions) {
      PartitionKey* key = request.add_parts();
      key->set_tensor("w");
      key->set_partition(p);
    }
    return request;
  }

  ShardOptions options_ = Options();
  prometheus::Registry registry_;
  ShardMetrics metrics_{registry_};
  TensorStore store_{options_.partitioning, 0, {0}, TensorStore::SlotSpec{},
                     options_.num_workers};
  std::vector<Partition*> parts_;
  Membership membership_{2, absl::Seconds(10)};
  PullReader reader_{options_, kIncarnation, &store_, &membership_, &metrics_};
};

TEST_F(PullReaderTest, ValidateNamesWhatIsWrong) {
  EXPECT_TRUE(reader_.Validate(Pull(1, 0, 0)).ok());
  EXPECT_EQ(reader_.Validate(Pull(2, 0, 0)).code(), absl::StatusCode::kInvalidArgument);
  PullRequest other_incarnation = Pull(0, 0, 0);
  other_incarnation.set_shard_incarnation(kIncarnation + 1);
  const absl::Status aborted = reader_.Validate(other_incarnation);
  EXPECT_EQ(aborted.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(aborted.message(), HasSubstr("re-register"));
  EXPECT_EQ(reader_.Validate(Pull(0, 0, 0, {})).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(reader_.Validate(Pull(0, 0, 0, {2})).code(), absl::StatusCode::kNotFound);
  const absl::Status twice = reader_.Validate(Pull(0, 0, 0, {1, 1}));
  EXPECT_EQ(twice.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(twice.message(), HasSubstr("twice"));
  PullRequest bad_dtype = Pull(0, 0, 0);
  bad_dtype.set_dtype(static_cast<DType>(9));
  EXPECT_EQ(reader_.Validate(bad_dtype).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(reader_.Validate(Pull(0, -1, 0)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(reader_.Validate(Pull(0, kMaxClock + 1, 0)).code(),
            absl::StatusCode::kInvalidArgument);
  // One step ahead may wait; two cannot be reached by waiting.
  EXPECT_TRUE(reader_.Validate(Pull(0, 0, 1)).ok());
  EXPECT_EQ(reader_.Validate(Pull(0, 0, 2)).code(), absl::StatusCode::kOutOfRange);
}

TEST_F(PullReaderTest, RequestsOverALimitAreRefusedAndCountedByLimit) {
  const absl::Status parts = reader_.Validate(Pull(0, 0, 0, {0, 1, 0, 1}));
  EXPECT_EQ(parts.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(parts.message(), HasSubstr("--max_parts_per_request"));
  EXPECT_EQ(metrics_.requests_refused("max_parts_per_request").Value(), 1);

  options_.limits.max_response_bytes = 100;  // two parts of 16 bytes + framing > 100
  const absl::Status bytes = reader_.Validate(Pull(0, 0, 0));
  EXPECT_EQ(bytes.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(metrics_.requests_refused("max_response_bytes").Value(), 1);
  EXPECT_TRUE(reader_.Validate(Pull(0, 0, 0, {0})).ok());
}

TEST_F(PullReaderTest, ReadyWaitsForTheVersionAndForTheSlowestWorker) {
  EXPECT_TRUE(reader_.Ready(Pull(0, 0, 0)));
  EXPECT_FALSE(reader_.Ready(Pull(0, 0, 1)));
  {
    absl::MutexLock lock(&parts_[0]->mu);
    parts_[0]->version.store(1);
  }
  EXPECT_FALSE(reader_.Ready(Pull(0, 0, 1)));  // partition 1 is still at 0
  {
    absl::MutexLock lock(&parts_[1]->mu);
    parts_[1]->version.store(1);
  }
  EXPECT_TRUE(reader_.Ready(Pull(0, 0, 1)));

  // Worker 1 is at clock 1: worker 0 may start step 2 (1 ahead), not 3.
  const absl::Time now = absl::Now();
  membership_.Update(0, 2, false, now);
  membership_.Update(1, 1, false, now);
  EXPECT_TRUE(reader_.Ready(Pull(0, 2, 0)));
  EXPECT_FALSE(reader_.Ready(Pull(0, 3, 0)));
  membership_.Update(1, 2, false, now);
  EXPECT_TRUE(reader_.Ready(Pull(0, 3, 0)));
  // A finished worker holds nobody back.
  membership_.Update(0, 5, false, now);
  EXPECT_FALSE(reader_.Ready(Pull(0, 6, 0)));
  membership_.Update(1, 2, /*done=*/true, now);
  EXPECT_TRUE(reader_.Ready(Pull(0, 6, 0)));
}

TEST_F(PullReaderTest, FillWritesEachPartOnceInTheDtypeAskedFor) {
  {
    absl::MutexLock lock(&parts_[1]->mu);
    parts_[1]->version.store(3);
  }
  PullRequest request = Pull(0, 0, 0, {1, 0});
  request.set_dtype(DTYPE_BF16);
  ASSERT_TRUE(reader_.Validate(request).ok());
  PullResponse response;
  reader_.Fill(request, &response);
  EXPECT_EQ(response.incarnation(), kIncarnation);
  ASSERT_EQ(response.parts_size(), 2);
  EXPECT_EQ(response.parts(0).key().partition(), 1u);
  EXPECT_EQ(response.parts(0).version(), 3);
  EXPECT_EQ(response.parts(1).version(), 0);
  EXPECT_EQ(response.parts(0).value().dtype(), DTYPE_BF16);
  EXPECT_EQ(response.parts(0).value().data().size(), 8u);
  std::vector<float> values(4);
  ASSERT_TRUE(common::DecodePayload(response.parts(0).value(), absl::MakeSpan(values)).ok());
  EXPECT_THAT(values, ElementsAre(4.5f, 5.5f, 6.5f, 7.5f));  // exact in bf16

  wire::PullResponseBuilder builder;
  std::vector<int64_t> versions;
  reader_.Fill(request, &builder, &versions);
  EXPECT_THAT(versions, ElementsAre(3, 0));
}

TEST_F(PullReaderTest, CommittedOnceTheTailHoldsEveryVersionRead) {
  const PullRequest request = Pull(0, 0, 0);
  parts_[0]->committed.store(2);
  parts_[1]->committed.store(1);
  EXPECT_TRUE(reader_.Committed(request, {2, 1}));
  EXPECT_FALSE(reader_.Committed(request, {2, 2}));
  EXPECT_FALSE(reader_.Committed(request, {3, 0}));
  parts_[1]->committed.store(2);
  EXPECT_TRUE(reader_.Committed(request, {2, 2}));
}

}  // namespace
}  // namespace shardtrain::server
