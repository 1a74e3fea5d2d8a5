#include "server/parked_lot.h"

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include <prometheus/registry.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardtrain::server {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

struct Call {
  int id = 0;
  absl::Time deadline_at = absl::InfiniteFuture();
  bool ready = false;
  absl::Time deadline() const { return deadline_at; }
};

class ParkedLotTest : public ::testing::Test {
 protected:
  prometheus::Registry registry_;
  prometheus::Gauge& gauge_ =
      prometheus::BuildGauge().Name("parked").Help("parked calls").Register(registry_).Add({});
  ParkedLot<Call> lot_{&gauge_};
};

TEST_F(ParkedLotTest, ACallThatNeedNotWaitIsNotParked) {
  Call call{1};
  EXPECT_FALSE(lot_.Park(&call, [] { return false; }));
  EXPECT_EQ(lot_.size(), 0u);
  EXPECT_EQ(gauge_.Value(), 0);
}

TEST_F(ParkedLotTest, TakeHandsOutTheReadyCallsInParkingOrderAndKeepsTheRest) {
  Call a{1}, b{2}, c{3};
  for (Call* call : {&a, &b, &c}) EXPECT_TRUE(lot_.Park(call, [] { return true; }));
  EXPECT_EQ(gauge_.Value(), 3);
  a.ready = true;
  c.ready = true;
  EXPECT_THAT(lot_.Take([](const Call* call) { return call->ready; }), ElementsAre(&a, &c));
  EXPECT_EQ(lot_.size(), 1u);
  EXPECT_EQ(gauge_.Value(), 1);
  EXPECT_THAT(lot_.Take([](const Call* call) { return call->ready; }), IsEmpty());
}

TEST_F(ParkedLotTest, TakeExpiredHandsOutTheCallsAtOrPastTheirDeadline) {
  const absl::Time now = absl::Now();
  Call early{1, now - absl::Seconds(1)}, exact{2, now}, later{3, now + absl::Seconds(1)};
  for (Call* call : {&early, &exact, &later}) lot_.Park(call, [] { return true; });
  EXPECT_THAT(lot_.TakeExpired(now), ElementsAre(&early, &exact));
  EXPECT_THAT(lot_.TakeExpired(now), IsEmpty());
  EXPECT_THAT(lot_.TakeExpired(now + absl::Seconds(1)), ElementsAre(&later));
  EXPECT_EQ(gauge_.Value(), 0);
}

TEST_F(ParkedLotTest, OnlyOneOfRemoveAndTakeGetsACall) {
  Call a{1}, b{2};
  lot_.Park(&a, [] { return true; });
  lot_.Park(&b, [] { return true; });
  EXPECT_TRUE(lot_.Remove(&a));
  EXPECT_FALSE(lot_.Remove(&a));  // the client went away twice: answered once
  EXPECT_THAT(lot_.Take([](const Call*) { return true; }), ElementsAre(&b));
  EXPECT_FALSE(lot_.Remove(&b));  // taken by a wake-up, which answers it
  EXPECT_EQ(gauge_.Value(), 0);
}

TEST_F(ParkedLotTest, TakeAllEmptiesTheLot) {
  Call a{1}, b{2};
  lot_.Park(&a, [] { return true; });
  lot_.Park(&b, [] { return true; });
  EXPECT_THAT(lot_.TakeAll(), ElementsAre(&a, &b));
  EXPECT_EQ(lot_.size(), 0u);
  EXPECT_EQ(gauge_.Value(), 0);
  EXPECT_THAT(lot_.TakeAll(), IsEmpty());
}

TEST(ParkedLotWithoutGaugeTest, Works) {
  ParkedLot<Call> lot;
  Call a{1};
  EXPECT_TRUE(lot.Park(&a, [] { return true; }));
  EXPECT_THAT(lot.TakeAll(), ElementsAre(&a));
}

// Calls parked while another thread opens their steps and wakes the lot:
// each is answered exactly once, by its parker or by a wake-up, and none is
// left parked once every step is open (no wake-up is missed).
TEST(ParkedLotRaceTest, NoWakeUpIsMissed) {
  constexpr int kCalls = 20000;
  ParkedLot<Call> lot;
  std::vector<Call> calls(kCalls);
  std::unique_ptr<std::atomic<int>[]> answered(new std::atomic<int>[kCalls]);
  std::atomic<int> open_steps{0};  // call i waits for step i
  for (int i = 0; i < kCalls; ++i) {
    calls[i].id = i;
    answered[i] = 0;
  }
  std::thread parker([&] {
    for (int i = 0; i < kCalls; ++i) {
      if (!lot.Park(&calls[i], [&] { return open_steps.load() <= i; })) ++answered[i];
    }
  });
  std::thread opener([&] {
    for (int step = 1; step <= kCalls; ++step) {
      open_steps.store(step);
      for (Call* call : lot.Take([&](const Call* c) { return c->id < open_steps.load(); })) {
        ++answered[call->id];
      }
    }
  });
  parker.join();
  opener.join();
  EXPECT_EQ(lot.size(), 0u);
  for (int i = 0; i < kCalls; ++i) ASSERT_EQ(answered[i].load(), 1) << "call " << i;
}

}  // namespace
}  // namespace shardtrain::server
