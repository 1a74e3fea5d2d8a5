#include "client/shard_channel.h"

#include <grpcpp/support/status.h>

#include "absl/random/random.h"
#include "gtest/gtest.h"

namespace shardtrain::client {
namespace {

TEST(RetryPolicyTest, CeilingDoublesUpToTheMaximum) {
  RetryPolicy policy;
  policy.initial_backoff = absl::Milliseconds(50);
  policy.max_backoff = absl::Seconds(2);
  EXPECT_EQ(BackoffCeiling(policy, 0), absl::Milliseconds(50));
  EXPECT_EQ(BackoffCeiling(policy, 1), absl::Milliseconds(100));
  EXPECT_EQ(BackoffCeiling(policy, 5), absl::Milliseconds(1600));
  EXPECT_EQ(BackoffCeiling(policy, 6), absl::Seconds(2));
  EXPECT_EQ(BackoffCeiling(policy, 1000), absl::Seconds(2));  // no overflow
}

TEST(RetryPolicyTest, FullJitterStaysWithinBoundsAndSpreads) {
  RetryPolicy policy;
  absl::BitGen gen;
  for (int retry : {0, 3, 10}) {
    const absl::Duration ceiling = BackoffCeiling(policy, retry);
    absl::Duration lo = absl::InfiniteDuration(), hi = absl::ZeroDuration();
    for (int i = 0; i < 2000; ++i) {
      const absl::Duration wait = Backoff(policy, retry, gen);
      ASSERT_GE(wait, absl::ZeroDuration());
      ASSERT_LE(wait, ceiling);
      lo = std::min(lo, wait);
      hi = std::max(hi, wait);
    }
    // Full jitter: draws cover (nearly) all of [0, ceiling].
    EXPECT_LT(lo, ceiling / 10) << retry;
    EXPECT_GT(hi, ceiling * 9 / 10) << retry;
  }
}

TEST(RetryPolicyTest, AttemptDeadlineIsCappedByTheReconnectBudget) {
  const absl::Time now = absl::FromUnixSeconds(1000);
  // First attempt: only its own timeout.
  EXPECT_EQ(AttemptDeadline(now, absl::Seconds(30), absl::InfinitePast(), absl::Seconds(5)),
            now + absl::Seconds(30));
  // A retry ends with the budget, measured from the first failure.
  EXPECT_EQ(AttemptDeadline(now, absl::Seconds(30), now - absl::Seconds(2), absl::Seconds(5)),
            now + absl::Seconds(3));
  // ... or with its own timeout, whichever comes first.
  EXPECT_EQ(AttemptDeadline(now, absl::Seconds(1), now - absl::Seconds(2), absl::Seconds(5)),
            now + absl::Seconds(1));
}

TEST(RetryPolicyTest, RetriesTransportFailuresOnly) {
  EXPECT_TRUE(IsRetryable(grpc::Status(grpc::StatusCode::UNAVAILABLE, "connect failed")));
  EXPECT_TRUE(IsRetryable(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "")));
  EXPECT_TRUE(IsRetryable(grpc::Status(grpc::StatusCode::UNKNOWN, "Stream removed")));
  EXPECT_TRUE(IsRetryable(grpc::Status(grpc::StatusCode::INTERNAL, "Connection reset by peer")));
  EXPECT_FALSE(IsRetryable(grpc::Status(grpc::StatusCode::INTERNAL, "bad payload")));
  EXPECT_FALSE(IsRetryable(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "")));
  EXPECT_FALSE(IsRetryable(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "")));
  // ABORTED is handled apart: resync, then retry.
  EXPECT_FALSE(IsRetryable(grpc::Status(grpc::StatusCode::ABORTED, "")));
  EXPECT_FALSE(IsRetryable(grpc::Status::OK));
}

}  // namespace
}  // namespace shardtrain::client
