#include "sparse/row_optimizer.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace shardtrain::sparse {
namespace {

constexpr int kDim = 4;

// Independent references, in double, from each method's paper or torch's
// documented update.
struct Reference {
  SparseOptimizerOptions o;
  std::vector<double> w, a, b;  // a, b: the method's state vectors
  double h = 0;                 // row-wise accumulator
  int t = 0;

  void Step(const std::vector<double>& g) {
    const double lr = o.learning_rate;
    switch (o.kind) {
      case SparseOptimizerKind::kSgd:
        for (int j = 0; j < kDim; ++j) w[j] -= lr * g[j];
        break;
      case SparseOptimizerKind::kAdagrad:  // torch.optim.Adagrad, lr_decay 0
        for (int j = 0; j < kDim; ++j) {
          a[j] += g[j] * g[j];
          w[j] -= lr * g[j] / (std::sqrt(a[j]) + o.eps);
        }
        break;
      case SparseOptimizerKind::kRowWiseAdagrad: {  // FBGEMM's rowwise Adagrad
        double mean_sq = 0;
        for (double x : g) mean_sq += x * x / kDim;
        h += mean_sq;
        for (int j = 0; j < kDim; ++j) w[j] -= lr * g[j] / (std::sqrt(h) + o.eps);
        break;
      }
      case SparseOptimizerKind::kAdam: {  // torch.optim.SparseAdam, per-row t
        ++t;
        const double bc1 = 1 - std::pow(double{o.beta1}, t);
        const double bc2 = 1 - std::pow(double{o.beta2}, t);
        for (int j = 0; j < kDim; ++j) {
          a[j] = o.beta1 * a[j] + (1 - o.beta1) * g[j];
          b[j] = o.beta2 * b[j] + (1 - o.beta2) * g[j] * g[j];
          w[j] -= lr * std::sqrt(bc2) / bc1 * a[j] / (std::sqrt(b[j]) + o.eps);
        }
        break;
      }
      case SparseOptimizerKind::kFtrl:  // McMahan et al. 2013, Algorithm 1
        for (int j = 0; j < kDim; ++j) {
          const double sigma = (std::sqrt(b[j] + g[j] * g[j]) - std::sqrt(b[j])) / lr;
          a[j] += g[j] - sigma * w[j];
          b[j] += g[j] * g[j];
          w[j] = std::fabs(a[j]) <= o.l1
                     ? 0.0
                     : -(a[j] - (a[j] > 0 ? 1 : -1) * o.l1) /
                           ((o.ftrl_beta + std::sqrt(b[j])) / lr + o.l2);
        }
        break;
    }
  }
};

void ExpectMatchesReference(const SparseOptimizerOptions& o) {
  RowOptimizer opt(o, kDim);
  std::vector<float> w = {0.1f, -0.2f, 0.3f, 0.0f};
  std::vector<uint32_t> state(opt.state_words() + 1);
  opt.InitState(state.data());
  Reference ref{o, {w.begin(), w.end()}, std::vector<double>(kDim, 0.0), std::vector<double>(kDim, 0.0)};
  if (o.kind == SparseOptimizerKind::kAdagrad) ref.a.assign(kDim, o.initial_accumulator);
  ref.h = o.initial_accumulator;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int step = 0; step < 50; ++step) {
    std::vector<float> g(kDim);
    for (float& x : g) x = normal(rng);
    opt.Apply(w.data(), state.data(), g.data(), 1.0f);
    ref.Step({g.begin(), g.end()});
    for (int j = 0; j < kDim; ++j) {
      ASSERT_NEAR(w[j], ref.w[j], 2e-5 * (1 + std::fabs(ref.w[j])))
          << SparseOptimizerName(o.kind) << " step " << step << " element " << j;
    }
  }
}

TEST(RowOptimizerTest, SgdMatchesReference) {
  SparseOptimizerOptions o;
  o.kind = SparseOptimizerKind::kSgd;
  o.learning_rate = 0.1f;
  ExpectMatchesReference(o);
}

TEST(RowOptimizerTest, AdagradMatchesTorch) {
  SparseOptimizerOptions o;
  o.kind = SparseOptimizerKind::kAdagrad;
  o.learning_rate = 0.1f;
  o.initial_accumulator = 0.1f;
  ExpectMatchesReference(o);
}

TEST(RowOptimizerTest, RowWiseAdagradMatchesReference) {
  SparseOptimizerOptions o;
  o.kind = SparseOptimizerKind::kRowWiseAdagrad;
  o.learning_rate = 0.1f;
  ExpectMatchesReference(o);
}

TEST(RowOptimizerTest, AdamMatchesSparseAdamWithRowSteps) {
  SparseOptimizerOptions o;
  o.kind = SparseOptimizerKind::kAdam;
  o.learning_rate = 0.01f;
  o.eps = 1e-8f;
  ExpectMatchesReference(o);
}

TEST(RowOptimizerTest, FtrlMatchesReference) {
  SparseOptimizerOptions o;
  o.kind = SparseOptimizerKind::kFtrl;
  o.learning_rate = 0.5f;
  o.l1 = 0.05f;
  o.l2 = 0.01f;
  ExpectMatchesReference(o);
}

TEST(RowOptimizerTest, AdamBiasCorrectionFollowsTheRowsOwnSteps) {
  // A row updated for the first time after another row's 100 updates takes
  // the same first step as a fresh row: lr * sign(g) (bias-corrected).
  SparseOptimizerOptions o;
  o.kind = SparseOptimizerKind::kAdam;
  o.learning_rate = 0.01f;
  o.eps = 1e-8f;
  RowOptimizer opt(o, kDim);
  std::vector<uint32_t> busy(opt.state_words()), fresh(opt.state_words());
  opt.InitState(busy.data());
  opt.InitState(fresh.data());
  std::vector<float> w_busy(kDim, 0.0f), w_fresh(kDim, 0.0f);
  const std::vector<float> g = {1.0f, -2.0f, 0.5f, 3.0f};
  for (int i = 0; i < 100; ++i) opt.Apply(w_busy.data(), busy.data(), g.data(), 1.0f);
  opt.Apply(w_fresh.data(), fresh.data(), g.data(), 1.0f);
  EXPECT_EQ(fresh[2 * kDim], 1u);
  EXPECT_EQ(busy[2 * kDim], 100u);
  for (int j = 0; j < kDim; ++j) EXPECT_NEAR(w_fresh[j], -0.01f * (g[j] > 0 ? 1 : -1), 1e-6);
}

TEST(RowOptimizerTest, FtrlL1KeepsSmallWeightsAtZero) {
  SparseOptimizerOptions o;
  o.kind = SparseOptimizerKind::kFtrl;
  o.learning_rate = 0.1f;
  o.l1 = 10.0f;
  RowOptimizer opt(o, kDim);
  std::vector<uint32_t> state(opt.state_words());
  opt.InitState(state.data());
  std::vector<float> w = {0.5f, 0.5f, 0.5f, 0.5f};
  const std::vector<float> g = {0.1f, -0.1f, 0.2f, -0.2f};
  opt.Apply(w.data(), state.data(), g.data(), 1.0f);
  for (float x : w) EXPECT_EQ(x, 0.0f);
}

TEST(RowOptimizerTest, LrScaleScalesTheStep) {
  SparseOptimizerOptions o;
  o.learning_rate = 0.1f;
  RowOptimizer opt(o, kDim);
  std::vector<float> w(kDim, 1.0f);
  const std::vector<float> g(kDim, 1.0f);
  opt.Apply(w.data(), nullptr, g.data(), 0.5f);
  for (float x : w) EXPECT_FLOAT_EQ(x, 0.95f);
}

}  // namespace
}  // namespace shardtrain::sparse
