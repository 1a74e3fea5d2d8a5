// AsyncMomentumStability (issue 27): momentum under asynchrony on a
// quadratic, with the shard's own optimizer and no data. Workers take
// turns: each computes its gradient at the parameters it pulled, while the
// others' pushes land, so with N workers every gradient is N - 1 updates
// stale. At lr * curvature = 0.5 heavy-ball momentum (beta 0.9) is stable in
// sync mode but diverges with 2 workers (its delayed bound is ~0.1);
// Delayed Nesterov with period N converges.
#include <algorithm>
#include <cmath>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "server/optimizer.h"

namespace shardtrain::server {
namespace {

// f(x) = 0.5 * sum_i h_i * x_i^2, gradient h * x.
const std::vector<float> kCurvature = {1.0f, 0.5f, 0.1f};
const std::vector<float> kStart = {1.0f, -2.0f, 3.0f};

// Runs `updates` pushes of `workers` taking turns, each gradient computed at
// the parameters as they were `workers - 1` updates before; returns the
// largest |x_i| at the end (infinity once it overflows).
double RunTurns(OptimizerOptions options, int workers, int updates) {
  std::unique_ptr<Optimizer> optimizer = Optimizer::Create(options).value();
  std::vector<float> x = kStart;
  std::vector<std::vector<float>> slots(optimizer->num_slots());
  std::vector<float*> slot_ptrs;
  for (int s = 0; s < optimizer->num_slots(); ++s) {
    slots[s].assign(x.size(), optimizer->InitialSlotValue(s));
    slot_ptrs.push_back(slots[s].data());
  }
  // The parameters each worker pulled, oldest first: workers - 1 pulls of
  // the start before the first push, then one per update.
  std::deque<std::vector<float>> pulled(static_cast<size_t>(workers - 1), x);
  for (int t = 0; t < updates; ++t) {
    pulled.push_back(x);
    const std::vector<float> at = pulled.front();
    pulled.pop_front();
    std::vector<float> grad(x.size());
    for (size_t i = 0; i < x.size(); ++i) grad[i] = kCurvature[i] * at[i];
    optimizer->Apply(t, 1.0f, absl::MakeSpan(x), grad, slot_ptrs);
  }
  double largest = 0;
  for (float v : x) {
    if (!std::isfinite(v)) return INFINITY;
    largest = std::max(largest, std::abs(static_cast<double>(v)));
  }
  return largest;
}

OptimizerOptions Rule(const std::string& name, int64_t period = 1) {
  OptimizerOptions options;
  options.name = name;
  options.learning_rate = 0.5f;  // lr * h = 0.5 for the stiffest direction
  options.momentum = 0.9f;
  options.period = period;
  return options;
}

TEST(AsyncMomentumStability, HeavyBallDivergesWhereDelayedNesterovConverges) {
  // Sync (one worker, no staleness): heavy ball converges at this rate.
  EXPECT_LT(RunTurns(Rule("momentum"), 1, 400), 1e-3);
  // Two workers taking turns: it diverges.
  EXPECT_GT(RunTurns(Rule("momentum"), 2, 400), 1e3);
  // Delayed Nesterov with the period = workers converges.
  EXPECT_LT(RunTurns(Rule("delayed_nesterov", 2), 2, 400), 1e-3);
}

TEST(AsyncMomentumStability, DelayedNesterovStaysBoundedAsWorkersGrow) {
  for (int workers : {4, 8}) {
    EXPECT_GT(RunTurns(Rule("momentum"), workers, 400), 1e3) << workers << " workers";
    EXPECT_LT(RunTurns(Rule("delayed_nesterov", workers), workers, 500 * workers), 1e-2)
        << workers << " workers";
  }
}

// With one worker Delayed Nesterov is torch's Nesterov SGD, step for step:
//   buf = mu * buf + g (buf = g at the first step);  p -= lr * (g + mu * buf)
TEST(AsyncMomentumStability, OneWorkerDelayedNesterovIsNesterovStepForStep) {
  OptimizerOptions options = Rule("delayed_nesterov", 1);
  std::unique_ptr<Optimizer> optimizer = Optimizer::Create(options).value();
  std::vector<float> x = kStart;
  std::vector<float> buf(x.size(), 0.0f), sum(x.size(), 0.0f);
  std::vector<float*> slots = {buf.data(), sum.data()};
  std::vector<double> ref(kStart.begin(), kStart.end()), ref_buf(x.size(), 0.0);
  for (int t = 0; t < 50; ++t) {
    std::vector<float> grad(x.size());
    std::vector<double> ref_grad(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      grad[i] = kCurvature[i] * x[i];
      ref_grad[i] = kCurvature[i] * ref[i];
    }
    optimizer->Apply(t, 1.0f, absl::MakeSpan(x), grad, slots);
    for (size_t i = 0; i < x.size(); ++i) {
      ref_buf[i] = t == 0 ? ref_grad[i] : 0.9 * ref_buf[i] + ref_grad[i];
      ref[i] -= 0.5 * (ref_grad[i] + 0.9 * ref_buf[i]);
      EXPECT_NEAR(x[i], ref[i], 1e-5 * std::max(1.0, std::abs(ref[i])))
          << "step " << t << " element " << i;
    }
  }
}

}  // namespace
}  // namespace shardtrain::server
