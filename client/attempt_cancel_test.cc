#include "client/attempt_cancel.h"

#include <atomic>
#include <thread>

#include "gtest/gtest.h"

namespace shardtrain::client {
namespace {

TEST(AttemptCancelTest, CancelRunsTheRegisteredCallbackOnce) {
  AttemptCancel cancel;
  int runs = 0;
  cancel.OnCancel([&runs] { ++runs; });
  EXPECT_EQ(runs, 0);
  cancel.Cancel();
  EXPECT_EQ(runs, 1);
  cancel.Cancel();
  EXPECT_EQ(runs, 1);
}

TEST(AttemptCancelTest, ARegistrationAfterTheCancelRunsAtOnce) {
  AttemptCancel cancel;
  cancel.Cancel();
  int runs = 0;
  cancel.OnCancel([&runs] { ++runs; });
  EXPECT_EQ(runs, 1);
  cancel.Cancel();
  EXPECT_EQ(runs, 1);
}

TEST(AttemptCancelTest, NothingRegisteredCancelsNothing) {
  AttemptCancel cancel;
  cancel.Cancel();  // an attempt that went over gRPC: its context is cancelled instead
  SUCCEED();
}

// Registration and cancellation racing from two threads: the callback runs
// exactly once whichever wins.
TEST(AttemptCancelTest, RacingRegistrationAndCancelRunTheCallbackOnce) {
  for (int round = 0; round < 200; ++round) {
    AttemptCancel cancel;
    std::atomic<int> runs{0};
    std::thread canceller([&cancel] { cancel.Cancel(); });
    cancel.OnCancel([&runs] { runs.fetch_add(1); });
    canceller.join();
    ASSERT_EQ(runs.load(), 1) << "round " << round;
  }
}

}  // namespace
}  // namespace shardtrain::client
