#include "sparse/row_optimizer.h"

#include <cmath>
#include <cstring>

namespace shardtrain::sparse {
namespace {

float* AsFloats(uint32_t* words) { return reinterpret_cast<float*>(words); }

}  // namespace

RowOptimizer::RowOptimizer(const SparseOptimizerOptions& options, int32_t dim)
    : options_(options), dim_(dim), state_words_(OptimizerStateWords(options.kind, dim)) {}

void RowOptimizer::InitState(uint32_t* state) const {
  if (options_.kind == SparseOptimizerKind::kAdagrad ||
      options_.kind == SparseOptimizerKind::kRowWiseAdagrad) {
    float* h = AsFloats(state);
    for (int32_t j = 0; j < state_words_; ++j) h[j] = options_.initial_accumulator;
    return;
  }
  std::memset(state, 0, sizeof(uint32_t) * state_words_);
}

void RowOptimizer::Apply(float* w, uint32_t* state, const float* g, float lr_scale) const {
  const float lr = options_.learning_rate * lr_scale;
  const float eps = options_.eps;
  const int32_t d = dim_;
  switch (options_.kind) {
    case SparseOptimizerKind::kSgd:
      for (int32_t j = 0; j < d; ++j) w[j] -= lr * g[j];
      return;
    case SparseOptimizerKind::kAdagrad: {
      float* h = AsFloats(state);
      for (int32_t j = 0; j < d; ++j) {
        h[j] += g[j] * g[j];
        w[j] -= lr * g[j] / (std::sqrt(h[j]) + eps);
      }
      return;
    }
    case SparseOptimizerKind::kRowWiseAdagrad: {
      float sum_sq = 0.0f;
      for (int32_t j = 0; j < d; ++j) sum_sq += g[j] * g[j];
      float* h = AsFloats(state);
      h[0] += sum_sq / static_cast<float>(d);
      const float step = lr / (std::sqrt(h[0]) + eps);
      for (int32_t j = 0; j < d; ++j) w[j] -= step * g[j];
      return;
    }
    case SparseOptimizerKind::kAdam: {
      float* m = AsFloats(state);
      float* v = m + d;
      uint32_t& t = state[2 * d];
      if (t < UINT32_MAX) ++t;
      const float b1 = options_.beta1;
      const float b2 = options_.beta2;
      const double bias1 = 1.0 - std::pow(static_cast<double>(b1), static_cast<double>(t));
      const double bias2 = 1.0 - std::pow(static_cast<double>(b2), static_cast<double>(t));
      const float step = static_cast<float>(lr * std::sqrt(bias2) / bias1);
      for (int32_t j = 0; j < d; ++j) {
        m[j] = b1 * m[j] + (1.0f - b1) * g[j];
        v[j] = b2 * v[j] + (1.0f - b2) * g[j] * g[j];
        w[j] -= step * m[j] / (std::sqrt(v[j]) + eps);
      }
      return;
    }
    case SparseOptimizerKind::kFtrl: {
      float* z = AsFloats(state);
      float* n = z + d;
      const float l1 = options_.l1;
      const float l2 = options_.l2;
      const float beta = options_.ftrl_beta;
      for (int32_t j = 0; j < d; ++j) {
        const float n_new = n[j] + g[j] * g[j];
        const float sigma = (std::sqrt(n_new) - std::sqrt(n[j])) / lr;
        z[j] += g[j] - sigma * w[j];
        n[j] = n_new;
        if (std::fabs(z[j]) <= l1) {
          w[j] = 0.0f;
        } else {
          const float sign = z[j] > 0 ? 1.0f : -1.0f;
          w[j] = -(z[j] - sign * l1) / ((beta + std::sqrt(n[j])) / lr + l2);
        }
      }
      return;
    }
  }
}

}  // namespace shardtrain::sparse
