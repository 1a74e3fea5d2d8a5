#include "common/elastic_thread_pool.h"

#include <atomic>
#include <memory>
#include <thread>

#include <gtest/gtest.h>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace shardtrain::common {
namespace {

TEST(ElasticThreadPoolTest, ATaskWaitingForALaterOneDoesNotHoldItUp) {
  ElasticThreadPool pool(4);
  absl::Notification second_ran;
  absl::Notification first_done;
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<bool> on_caller{false};
  // The first task waits for the second, given after it (as a forward
  // waits for the one before it that arrived later).
  ASSERT_TRUE(pool.TryRun([&] {
    on_caller = std::this_thread::get_id() == caller;
    if (second_ran.WaitForNotificationWithTimeout(absl::Seconds(30))) first_done.Notify();
  }));
  ASSERT_TRUE(pool.TryRun([&] { second_ran.Notify(); }));
  ASSERT_TRUE(first_done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_FALSE(on_caller);
  EXPECT_EQ(pool.threads(), 2);
}

TEST(ElasticThreadPoolTest, RefusesATaskWhileAllItsThreadsAreBusyAndReusesThem) {
  ElasticThreadPool pool(2);
  absl::Notification release;
  std::atomic<int> ran{0};
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(pool.TryRun([&] {
      release.WaitForNotification();
      ++ran;
    }));
  }
  EXPECT_EQ(pool.busy(), 2);
  bool refused_ran = false;
  EXPECT_FALSE(pool.TryRun([&] { refused_ran = true; }));
  release.Notify();
  // Once a thread is free again, a task runs on it: no third thread.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (pool.busy() > 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_EQ(pool.busy(), 0);
  absl::Notification later_ran;
  ASSERT_TRUE(pool.TryRun([&] { later_ran.Notify(); }));
  ASSERT_TRUE(later_ran.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(ran.load(), 2);
  EXPECT_FALSE(refused_ran);
  EXPECT_EQ(pool.threads(), 2);
}

TEST(ElasticThreadPoolTest, TheDestructorWaitsForTheTasksRunning) {
  std::atomic<int> finished{0};
  {
    ElasticThreadPool pool(3);
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(pool.TryRun([&] {
        absl::SleepFor(absl::Milliseconds(50));
        ++finished;
      }));
    }
  }
  EXPECT_EQ(finished.load(), 3);
}

}  // namespace
}  // namespace shardtrain::common
