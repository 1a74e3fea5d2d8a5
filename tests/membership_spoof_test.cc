// MembershipSpoof: a real ps-server in async mode with a staleness bound.
// Heartbeats naming another worker — an absurd clock, or a spoofed `done`
// under a made-up incarnation — must not switch the bound off for good: the
// absurd clock is refused, the spoof lasts only until the real worker's next
// heartbeat, and a pull that cannot be answered ends at the server's
// --max_pull_wait_s instead of waiting forever.
#include <cstdint>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "common/payload.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/metrics_scrape.h"
#include "testing/shard_process.h"

namespace shardtrain {
namespace {

constexpr int64_t kMaxClock = int64_t{1} << 40;  // server/membership.h
constexpr uint64_t kWorker0 = 0x1111, kWorker1 = 0x2222, kSpoof = 0x3333;
constexpr int kElements = 100;

class MembershipSpoof : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(shard_
                    .Start(SHARDTRAIN_BIN_DIR,
                           {"--mode=async", "--num_workers=2", "--max_staleness=2",
                            "--max_pull_wait_s=3", "--heartbeat_timeout_s=60"})
                    .ok());
    RegisterRequest request;
    TensorSpec* spec = request.add_tensors();
    spec->set_name("w");
    spec->add_shape(kElements);
    spec->set_dtype(DTYPE_F32);
    request.set_worker(0);
    request.set_num_workers(2);
    request.set_worker_incarnation(kWorker0);
    RegisterResponse response;
    ASSERT_TRUE(shard_.Call(&ParameterServer::Stub::Register, request, &response).ok());
    incarnation_ = response.incarnation();
    ASSERT_NE(incarnation_, 0u);
  }

  grpc::Status Beat(uint64_t incarnation, int64_t clock, bool done,
                    HeartbeatResponse* response) {
    HeartbeatRequest request;
    request.set_worker(1);
    request.set_worker_incarnation(incarnation);
    request.set_clock(clock);
    request.set_done(done);
    return shard_.Call(&ParameterServer::Stub::Heartbeat, request, response);
  }

  grpc::Status PushFrom(uint32_t worker, uint64_t incarnation, uint64_t sequence,
                        int64_t clock) {
    PushRequest request;
    request.set_worker(worker);
    request.set_worker_incarnation(incarnation);
    request.set_sequence(sequence);
    request.set_clock(clock);
    request.set_shard_incarnation(incarnation_);
    GradientPart* part = request.add_parts();
    part->mutable_key()->set_tensor("w");
    part->set_version(0);
    std::vector<float> grad(kElements, 0.0f);
    part->mutable_grad()->set_dtype(DTYPE_F32);
    common::EncodeDense(grad, DTYPE_F32, part->mutable_grad()->mutable_data());
    PushResponse response;
    return shard_.Call(&ParameterServer::Stub::Push, request, &response);
  }

  // Pulls for `worker` at `clock`, waiting at most `timeout` on the client.
  grpc::Status PullAt(uint32_t worker, int64_t clock, absl::Duration timeout) {
    PullRequest request;
    request.set_worker(worker);
    request.set_clock(clock);
    request.add_parts()->set_tensor("w");
    request.set_shard_incarnation(incarnation_);
    PullResponse response;
    return shard_.Call(&ParameterServer::Stub::Pull, request, &response, timeout);
  }

  testutil::ShardProcess shard_;
  uint64_t incarnation_ = 0;
};

TEST_F(MembershipSpoof, SpoofsDoNotDisableTheStalenessBound) {
  HeartbeatResponse beat;
  ASSERT_TRUE(Beat(kWorker1, 0, false, &beat).ok());
  for (int clock = 1; clock <= 3; ++clock) {
    ASSERT_TRUE(PushFrom(0, kWorker0, clock, clock).ok());
  }
  // Worker 0 at clock 3 is more than 2 ahead of worker 1 (clock 0): it waits.
  EXPECT_EQ(PullAt(0, 3, absl::Seconds(1)).error_code(),
            grpc::StatusCode::DEADLINE_EXCEEDED);

  // An absurd clock is refused and changes nothing.
  EXPECT_EQ(Beat(kSpoof, std::numeric_limits<int64_t>::max(), true, &beat).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(PullAt(0, 3, absl::Seconds(1)).error_code(),
            grpc::StatusCode::DEADLINE_EXCEEDED);

  // A spoofed `done` under another incarnation takes worker 1's record over
  // for a while...
  ASSERT_TRUE(Beat(kSpoof, kMaxClock, true, &beat).ok());
  EXPECT_TRUE(PullAt(0, 3, absl::Seconds(5)).ok());
  // ...until the real worker 1 is heard from: the bound holds again.
  HeartbeatResponse healed;
  ASSERT_TRUE(Beat(kWorker1, 0, false, &healed).ok());
  ASSERT_EQ(healed.workers_size(), 2);
  EXPECT_FALSE(healed.workers(1).done());
  EXPECT_EQ(healed.workers(1).clock(), 0);
  EXPECT_EQ(healed.workers(1).incarnation(), kWorker1);
  EXPECT_EQ(PullAt(0, 3, absl::Seconds(1)).error_code(),
            grpc::StatusCode::DEADLINE_EXCEEDED);

  // The bound still moves with the real worker: a parked pull is answered
  // when worker 1 catches up.
  grpc::Status parked;
  std::thread waiter([&] { parked = PullAt(0, 3, absl::Seconds(20)); });
  absl::SleepFor(absl::Milliseconds(300));
  ASSERT_TRUE(PushFrom(1, kWorker1, 1, 1).ok());
  waiter.join();
  EXPECT_TRUE(parked.ok()) << parked.error_message();

  // A pull with the largest clock allowed waits, but not forever: the server
  // ends it at --max_pull_wait_s (3 s), before the client's deadline.
  const absl::Time start = absl::Now();
  const grpc::Status far = PullAt(1, kMaxClock, absl::Seconds(30));
  EXPECT_EQ(far.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));

  absl::StatusOr<std::string> metrics = testutil::HttpGet(shard_.metrics_port(), "/metrics");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_THAT(*metrics, ::testing::HasSubstr("shardtrain_worker_joins_total{kind=\"restart\"} 2"));
}

}  // namespace
}  // namespace shardtrain
