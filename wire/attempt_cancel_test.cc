#include "wire/attempt_cancel.h"

#include <atomic>
#include <thread>

#include "gtest/gtest.h"

namespace shardtrain::wire {
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

// An attempt registers how to end its wait for a connection, then how to
// cancel the sent call: the cancel runs the one registered last, and a
// registration after the cancel runs its own at once.
TEST(AttemptCancelTest, TheLastRegistrationIsTheOneCancelRuns) {
  AttemptCancel cancel;
  int waits = 0;
  int calls = 0;
  cancel.OnCancel([&waits] { ++waits; });
  cancel.OnCancel([&calls] { ++calls; });
  cancel.Cancel();
  EXPECT_EQ(waits, 0);
  EXPECT_EQ(calls, 1);

  AttemptCancel early;
  early.OnCancel([&waits] { ++waits; });
  early.Cancel();
  EXPECT_EQ(waits, 1);
  early.OnCancel([&calls] { ++calls; });  // the call, sent after the cancel
  EXPECT_EQ(calls, 2);
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
}  // namespace shardtrain::wire
