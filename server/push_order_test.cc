#include "server/push_order.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace shardtrain::server {
namespace {

std::unique_ptr<PushOrder> Make(const std::string& kind, int workers, uint64_t seed = 1) {
  PushOrderOptions options;
  options.kind = kind;
  options.num_workers = workers;
  options.seed = seed;
  options.skip_after = absl::Seconds(1);
  options.start_wait = absl::Seconds(5);
  return PushOrder::Create(options).value();
}

// Enters a push of `worker` that, once admitted, appends it to *applied.
void Push(PushOrder& order, uint32_t worker, std::vector<uint32_t>* applied) {
  order.Enter(worker, [&order, applied, worker](bool admitted) {
    EXPECT_TRUE(admitted);
    applied->push_back(worker);
    order.Leave();
  });
}

// Pushes that arrive in any order are applied in the order's turns.
std::vector<uint32_t> Admissions(PushOrder& order, const std::vector<uint32_t>& arrivals) {
  std::vector<uint32_t> applied;
  for (uint32_t worker : arrivals) Push(order, worker, &applied);
  return applied;
}

TEST(PushOrderTest, RoundRobinAppliesInWorkerOrderWhateverTheArrival) {
  auto order = Make("round_robin", 3);
  EXPECT_TRUE(order->ordered());
  EXPECT_EQ(Admissions(*order, {2, 1, 0, 1, 0, 2, 2, 0, 1}),
            (std::vector<uint32_t>{0, 1, 2, 0, 1, 2, 0, 1, 2}));
}

TEST(PushOrderTest, RandomRoundsArePermutationsTheSameForTheSameSeed) {
  std::vector<uint32_t> arrivals;
  for (int round = 0; round < 20; ++round) {
    for (uint32_t w : {3u, 2u, 1u, 0u}) arrivals.push_back(w);
  }
  auto a = Make("random", 4, 7), b = Make("random", 4, 7), c = Make("random", 4, 8);
  const std::vector<uint32_t> first = Admissions(*a, arrivals);
  ASSERT_EQ(first.size(), arrivals.size());
  EXPECT_EQ(first, Admissions(*b, arrivals));
  EXPECT_NE(first, Admissions(*c, arrivals));
  bool differs_from_round_robin = false;
  for (size_t round = 0; round < 20; ++round) {
    std::vector<uint32_t> turns(first.begin() + 4 * round, first.begin() + 4 * round + 4);
    differs_from_round_robin |= turns != std::vector<uint32_t>{0, 1, 2, 3};
    std::sort(turns.begin(), turns.end());
    EXPECT_EQ(turns, (std::vector<uint32_t>{0, 1, 2, 3})) << "round " << round;
  }
  EXPECT_TRUE(differs_from_round_robin);
}

TEST(PushOrderTest, AStartingWorkerIsWaitedForUpToStartWait) {
  auto order = Make("round_robin", 3);
  std::vector<uint32_t> applied;
  Push(*order, 1, &applied);
  Push(*order, 2, &applied);
  EXPECT_TRUE(applied.empty());  // worker 0 holds the turn
  order->Tick(absl::Now());
  order->Tick(absl::Now() + absl::Seconds(2));  // past skip_after
  EXPECT_TRUE(applied.empty());  // worker 0 has not pushed yet: start_wait
  order->Tick(absl::Now() + absl::Seconds(6));
  EXPECT_EQ(applied, (std::vector<uint32_t>{1, 2}));
  EXPECT_EQ(order->skipped(), 1);
  EXPECT_EQ(order->turn(), 0u);
}

TEST(PushOrderTest, ASilentWorkersTurnIsPassedOnAfterSkipAfter) {
  auto order = Make("round_robin", 3);
  std::vector<uint32_t> applied;
  for (uint32_t worker : {0u, 1u, 2u}) Push(*order, worker, &applied);
  Push(*order, 1, &applied);
  Push(*order, 2, &applied);
  EXPECT_EQ(applied.size(), 3u);  // worker 0 holds the turn again
  order->Tick(absl::Now());
  EXPECT_EQ(applied.size(), 3u);  // not yet silent for skip_after
  order->Tick(absl::Now() + absl::Seconds(2));
  EXPECT_EQ(applied, (std::vector<uint32_t>{0, 1, 2, 1, 2}));
  EXPECT_EQ(order->skipped(), 1);
  EXPECT_EQ(order->turn(), 0u);
}

TEST(PushOrderTest, CancelAllFinishesParkedPushesUnapplied) {
  auto order = Make("round_robin", 2);
  int cancelled = 0;
  order->Enter(1, [&](bool admitted) {
    EXPECT_FALSE(admitted);
    ++cancelled;
    order->Leave();
  });
  order->CancelAll();
  EXPECT_EQ(cancelled, 1);
}

TEST(PushOrderTest, ArrivalRunsEveryPushAtOnce) {
  auto order = Make("arrival", 3);
  EXPECT_FALSE(order->ordered());
  EXPECT_EQ(Admissions(*order, {2, 2, 1}), (std::vector<uint32_t>{2, 2, 1}));
}

TEST(PushOrderTest, RejectsBadOptions) {
  PushOrderOptions options;
  options.kind = "fifo";
  EXPECT_EQ(PushOrder::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
  options.kind = "round_robin";
  options.num_workers = 0;
  EXPECT_EQ(PushOrder::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardtrain::server
