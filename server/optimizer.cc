#include "server/optimizer.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstddef>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/payload.h"
#include "common/status_macros.h"
#include "wire/element_load.h"
#include "wire/payload_pieces.h"

namespace shardtrain::server {
namespace {

// The kernels below are free functions over __restrict pointers with every
// per-step scalar hoisted out, so the compiler can vectorise the loops; the
// choice between variants (Nesterov or not, L2 or decoupled decay) and the
// gradient's wire dtype are template parameters rather than branches inside
// the loop, so f32, f16 and bf16 gradients each get their own loop that
// reads the received bytes directly (wire::LoadElement: an unaligned load,
// plus an inline conversion for 16-bit types). GCC vectorises the loops
// that call std::sqrt only under -fno-math-errno (otherwise it must keep a
// scalar errno path), so the server library is built with that flag. Those
// loops, bound by their divisions and square roots, also get an AVX-512
// version (wire/element_load.h).
//
// The arithmetic is exactly that of PyTorch's reference formulas as written
// below, in this order; changing it changes results in the last bit.

using wire::LoadElement;

// torch.optim.SGD, momentum 0:
//   d = g + wd * p
//   p = p - lr * d
template <int kDType>
SHARDTRAIN_VECTOR_CLONES
void SgdKernel(int64_t n, float lr, float wd, float* __restrict p,
               const char* __restrict g) {
  for (int64_t i = 0; i < n; ++i) {
    const float d = LoadElement<kDType>(g, i) + wd * p[i];
    p[i] -= lr * d;
  }
}

// torch.optim.SGD, momentum mu, dampening 0:
//   d = g + wd * p
//   buf = mu * buf + d          (PyTorch seeds buf = d; with buf starting at 0
//                                this is the same value)
//   d = nesterov ? d + mu * buf : buf
//   p = p - lr * d
template <int kDType, bool kNesterov>
SHARDTRAIN_VECTOR_CLONES
void MomentumKernel(int64_t n, float lr, float mu, float wd, float* __restrict p,
                    const char* __restrict g, float* __restrict buf) {
  for (int64_t i = 0; i < n; ++i) {
    const float d = LoadElement<kDType>(g, i) + wd * p[i];
    const float b = mu * buf[i] + d;
    buf[i] = b;
    p[i] -= lr * (kNesterov ? d + mu * b : b);
  }
}

// Delayed Nesterov with period N (after Liu, Douillard et al. 2024,
// Algorithm 3), the same weight decay as SGD. A Nesterov step on the mean
// gradient m of a period, p -= lr * (m + mu * (mu * buf + m)), is
// lr * mu^2 * buf, which the period's own gradients do not change, plus
// lr * (1 + mu) * m, which they make. The first part is applied at the
// period's first update, so every gradient computed during the period is
// taken at parameters that already have it (with the whole momentum step at
// the period's last update instead, Algorithm 3's order, N-1 of the N
// gradients of a period miss it: one step of delay in the momentum, which
// with 8 workers in strict push order cost 0.012-0.013 of accuracy against
// sync, 0.002-0.008 with this order; tests/async_convergence_test.cc); the
// second is spread over the period's updates as they come:
//   d = g + wd * p
//   the period's first:  p = p - lr * mu * mu * buf
//   every update:        p = p - lr * (1 + mu) * d / N;  sum = sum + d
//   the period's last:   buf = mu * buf + sum / N;  sum = 0
// Over a period p so moves by one Nesterov step on the period's mean
// gradient, as in sync mode. With N = 1 (first and last at once) the
// Nesterov kernel above runs, operation for operation.
template <int kDType, bool kFirst, bool kLast>
SHARDTRAIN_VECTOR_CLONES
void DelayedNesterovKernel(int64_t n, float lr, float inv_period, float mu, float wd,
                           float* __restrict p, const char* __restrict g,
                           float* __restrict buf, float* __restrict sum) {
  const float gradient_rate = lr * (1.0f + mu) * inv_period;
  const float momentum_rate = lr * mu * mu;
  for (int64_t i = 0; i < n; ++i) {
    const float d = LoadElement<kDType>(g, i) + wd * p[i];
    const float total = sum[i] + d;
    float delta = gradient_rate * d;
    if constexpr (kFirst) delta += momentum_rate * buf[i];
    if constexpr (kLast) {
      buf[i] = mu * buf[i] + total * inv_period;
      sum[i] = 0.0f;
    } else {
      sum[i] = total;
    }
    p[i] -= delta;
  }
}

// DC-ASGD's gradient, as MXNet's DCASGD computes it, with `last` the update
// the parameters received last (p - p_before_last_update):
//   c = g + lambda * g * g * last
// `before` keeps p so the caller can record this update's change.
template <int kDType>
SHARDTRAIN_VECTOR_CLONES
void CompensateKernel(int64_t n, float lambda, const char* __restrict g,
                      const float* __restrict p, const float* __restrict last,
                      float* __restrict c, float* __restrict before) {
  for (int64_t i = 0; i < n; ++i) {
    const float gi = LoadElement<kDType>(g, i);
    c[i] = gi + lambda * gi * gi * last[i];
    before[i] = p[i];
  }
}

// torch.optim.Adam / AdamW (amsgrad off), t = step + 1:
//   AdamW only: p = p * (1 - lr * wd)
//   d = g + wd * p              (Adam only; AdamW uses d = g)
//   m = b1 * m + (1 - b1) * d
//   v = b2 * v + (1 - b2) * d^2
//   p = p - (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
struct AdamScalars {
  float b1, one_minus_b1, b2, one_minus_b2;
  float step_size;     // lr / (1 - b1^t)
  float bc2_sqrt;      // sqrt(1 - b2^t)
  float eps;
  float l2;            // wd for Adam, unused for AdamW
  float decay_factor;  // 1 - lr * wd for AdamW, unused for Adam
};

template <int kDType, bool kDecoupled>
SHARDTRAIN_DIVIDING_VECTOR_CLONES
void AdamKernel(int64_t n, const AdamScalars& s, float* __restrict p,
                const char* __restrict g, float* __restrict m,
                float* __restrict v) {
  // Locals so the compiler knows the scalars do not alias the arrays.
  const float b1 = s.b1, c1 = s.one_minus_b1, b2 = s.b2, c2 = s.one_minus_b2;
  const float step_size = s.step_size, bc2_sqrt = s.bc2_sqrt, eps = s.eps;
  const float l2 = s.l2, decay_factor = s.decay_factor;
  for (int64_t i = 0; i < n; ++i) {
    float param = p[i];
    float d = LoadElement<kDType>(g, i);
    if constexpr (kDecoupled) {
      param *= decay_factor;
    } else {
      d += l2 * param;
    }
    const float mi = b1 * m[i] + c1 * d;
    const float vi = b2 * v[i] + c2 * d * d;
    m[i] = mi;
    v[i] = vi;
    p[i] = param - step_size * mi / (std::sqrt(vi) / bc2_sqrt + eps);
  }
}

// torch.optim.Adagrad, lr_decay 0 (so the clr of PyTorch equals lr):
//   d = g + wd * p
//   acc = acc + d^2             (acc starts at adagrad_initial_accumulator)
//   p = p - lr * d / (sqrt(acc) + eps)
template <int kDType>
SHARDTRAIN_DIVIDING_VECTOR_CLONES
void AdagradKernel(int64_t n, float lr, float wd, float eps, float* __restrict p,
                   const char* __restrict g, float* __restrict acc) {
  for (int64_t i = 0; i < n; ++i) {
    const float d = LoadElement<kDType>(g, i) + wd * p[i];
    const float a = acc[i] + d * d;
    acc[i] = a;
    p[i] -= lr * d / (std::sqrt(a) + eps);
  }
}

// Calls `kernel(std::integral_constant<int, dtype>())` for a wire dtype.
template <typename Kernel>
void ForDType(int dtype, Kernel&& kernel) {
  switch (dtype) {
    case DTYPE_F16:
      kernel(std::integral_constant<int, DTYPE_F16>());
      return;
    case DTYPE_BF16:
      kernel(std::integral_constant<int, DTYPE_BF16>());
      return;
    default:
      assert(dtype == DTYPE_F32);
      kernel(std::integral_constant<int, DTYPE_F32>());
      return;
  }
}

class SgdOptimizer final : public Optimizer {
 public:
  explicit SgdOptimizer(const OptimizerOptions& options)
      : Optimizer(options) {}
  int num_slots() const override { return 0; }
  void ApplyRun(const Step& step, int dtype, const char* grad, int64_t n,
                float* params, absl::Span<float* const> slots) const override {
    assert(slots.empty());
    const float lr = step.lr, wd = options().weight_decay;
    ForDType(dtype, [&](auto type) {
      SgdKernel<decltype(type)::value>(n, lr, wd, params, grad);
    });
  }
};

template <bool kNesterov>
class MomentumOptimizer final : public Optimizer {
 public:
  explicit MomentumOptimizer(const OptimizerOptions& options)
      : Optimizer(options) {}
  int num_slots() const override { return 1; }
  void ApplyRun(const Step& step, int dtype, const char* grad, int64_t n,
                float* params, absl::Span<float* const> slots) const override {
    assert(slots.size() == 1);
    const float lr = step.lr, mu = options().momentum, wd = options().weight_decay;
    ForDType(dtype, [&](auto type) {
      MomentumKernel<decltype(type)::value, kNesterov>(n, lr, mu, wd, params, grad,
                                                       slots[0]);
    });
  }
};

class DelayedNesterovOptimizer final : public Optimizer {
 public:
  explicit DelayedNesterovOptimizer(const OptimizerOptions& options)
      : Optimizer(options) {}
  int num_slots() const override { return 2; }  // momentum buffer, sum
  Step PrepareStep(int64_t step, float lr_scale) const override {
    Step s = Optimizer::PrepareStep(step, lr_scale);
    // The partition's step counts its updates, so the period's position
    // needs no state of its own: checkpoints, state copies and replicas
    // applying the same operations in order all agree on it.
    const int64_t position = std::max<int64_t>(step, 0) % options().period;
    s.period_start = position == 0;
    s.momentum_step = position + 1 == options().period;
    return s;
  }
  void ApplyRun(const Step& step, int dtype, const char* grad, int64_t n,
                float* params, absl::Span<float* const> slots) const override {
    assert(slots.size() == 2);
    const float lr = step.lr, mu = options().momentum, wd = options().weight_decay;
    const float inv_period = 1.0f / static_cast<float>(options().period);
    ForDType(dtype, [&](auto type) {
      constexpr int kType = decltype(type)::value;
      if (options().period == 1) {
        // Nesterov itself (its buffer is slot 0; the sum stays 0).
        MomentumKernel<kType, /*kNesterov=*/true>(n, lr, mu, wd, params, grad, slots[0]);
      } else if (step.period_start) {
        DelayedNesterovKernel<kType, true, false>(n, lr, inv_period, mu, wd, params, grad,
                                                  slots[0], slots[1]);
      } else if (step.momentum_step) {
        DelayedNesterovKernel<kType, false, true>(n, lr, inv_period, mu, wd, params, grad,
                                                  slots[0], slots[1]);
      } else {
        DelayedNesterovKernel<kType, false, false>(n, lr, inv_period, mu, wd, params, grad,
                                                   slots[0], slots[1]);
      }
    });
  }
};

// DC-ASGD around a momentum-free rule: its slots, then one slot holding the
// change of each parameter at the last update (0 before the first, so the
// first update is uncompensated, as MXNet's is).
class DelayCompensatedOptimizer final : public Optimizer {
 public:
  DelayCompensatedOptimizer(const OptimizerOptions& options, std::unique_ptr<Optimizer> rule)
      : Optimizer(options), rule_(std::move(rule)) {}
  int num_slots() const override { return rule_->num_slots() + 1; }
  float InitialSlotValue(int slot) const override {
    return slot < rule_->num_slots() ? rule_->InitialSlotValue(slot) : 0.0f;
  }
  Step PrepareStep(int64_t step, float lr_scale) const override {
    return rule_->PrepareStep(step, lr_scale);
  }
  void ApplyRun(const Step& step, int dtype, const char* grad, int64_t n,
                float* params, absl::Span<float* const> slots) const override {
    const int rule_slots = rule_->num_slots();
    assert(slots.size() == static_cast<size_t>(rule_slots + 1));
    const float lambda = options().delay_compensation;
    const int64_t width = common::DTypeSize(dtype);
    float* const last = slots[rule_slots];
    // Chunks small enough for the stack and the L1 cache.
    constexpr int64_t kChunk = 512;
    float compensated[kChunk];
    float before[kChunk];
    float* run_slots[kMaxSlots];
    for (int64_t first = 0; first < n; first += kChunk) {
      const int64_t count = std::min(kChunk, n - first);
      ForDType(dtype, [&](auto type) {
        CompensateKernel<decltype(type)::value>(count, lambda, grad + first * width,
                                                params + first, last + first,
                                                compensated, before);
      });
      for (int s = 0; s < rule_slots; ++s) run_slots[s] = slots[s] + first;
      rule_->ApplyRun(step, DTYPE_F32, reinterpret_cast<const char*>(compensated), count,
                      params + first, absl::MakeConstSpan(run_slots, rule_slots));
      for (int64_t i = 0; i < count; ++i) last[first + i] = params[first + i] - before[i];
    }
  }

 private:
  const std::unique_ptr<Optimizer> rule_;
};

template <bool kDecoupled>
class AdamOptimizer final : public Optimizer {
 public:
  explicit AdamOptimizer(const OptimizerOptions& options)
      : Optimizer(options) {}
  int num_slots() const override { return 2; }
  Step PrepareStep(int64_t step, float lr_scale) const override {
    const OptimizerOptions& o = options();
    // Bias corrections in double, as PyTorch computes them in Python floats;
    // in float, 1 - beta2^t loses most of its digits for small t.
    const double t = static_cast<double>(step < 0 ? 1 : step + 1);
    const double lr = static_cast<double>(LearningRate(step)) * lr_scale;
    const double bc1 = 1.0 - std::pow(static_cast<double>(o.beta1), t);
    const double bc2 = 1.0 - std::pow(static_cast<double>(o.beta2), t);
    Step s;
    s.lr = static_cast<float>(lr);
    s.step_size = static_cast<float>(lr / bc1);
    s.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
    s.decay_factor = static_cast<float>(1.0 - lr * o.weight_decay);
    return s;
  }
  void ApplyRun(const Step& step, int dtype, const char* grad, int64_t n,
                float* params, absl::Span<float* const> slots) const override {
    assert(slots.size() == 2);
    const OptimizerOptions& o = options();
    AdamScalars s;
    s.b1 = o.beta1;
    s.one_minus_b1 = static_cast<float>(1.0 - o.beta1);
    s.b2 = o.beta2;
    s.one_minus_b2 = static_cast<float>(1.0 - o.beta2);
    s.step_size = step.step_size;
    s.bc2_sqrt = step.bc2_sqrt;
    s.eps = o.epsilon;
    s.l2 = o.weight_decay;
    s.decay_factor = step.decay_factor;
    ForDType(dtype, [&](auto type) {
      AdamKernel<decltype(type)::value, kDecoupled>(n, s, params, grad, slots[0],
                                                    slots[1]);
    });
  }
};

class AdagradOptimizer final : public Optimizer {
 public:
  explicit AdagradOptimizer(const OptimizerOptions& options)
      : Optimizer(options) {}
  int num_slots() const override { return 1; }
  float InitialSlotValue(int slot) const override {
    return options().adagrad_initial_accumulator;
  }
  void ApplyRun(const Step& step, int dtype, const char* grad, int64_t n,
                float* params, absl::Span<float* const> slots) const override {
    assert(slots.size() == 1);
    const float lr = step.lr, wd = options().weight_decay, eps = options().epsilon;
    ForDType(dtype, [&](auto type) {
      AdagradKernel<decltype(type)::value>(n, lr, wd, eps, params, grad, slots[0]);
    });
  }
};

absl::Status Invalid(absl::string_view field, float value,
                     absl::string_view want) {
  return absl::InvalidArgumentError(absl::StrCat(
      "optimizer: ", field, " must be ", want, ", got ", value));
}

// Written as negated in-range tests so that NaN is rejected too.
absl::Status ValidateOptions(const OptimizerOptions& o) {
  if (!(o.learning_rate > 0.0f && std::isfinite(o.learning_rate))) {
    return Invalid("learning_rate", o.learning_rate, "finite and > 0");
  }
  if (!(o.momentum >= 0.0f && o.momentum < 1.0f)) {
    return Invalid("momentum", o.momentum, "in [0, 1)");
  }
  if ((o.name == "nesterov" || o.name == "delayed_nesterov") && o.momentum == 0.0f) {
    return Invalid("momentum", o.momentum, absl::StrCat("> 0 for ", o.name));
  }
  if (o.period < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer: period must be >= 1, got ", o.period));
  }
  if (!(o.delay_compensation >= 0.0f && std::isfinite(o.delay_compensation))) {
    return Invalid("delay_compensation", o.delay_compensation, "finite and >= 0");
  }
  if (o.delay_compensation > 0.0f &&
      (o.name == "momentum" || o.name == "nesterov" || o.name == "delayed_nesterov")) {
    // Compensating a gradient that momentum then repeats for many updates
    // diverged in every configuration tried (issue 27's simulation).
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer: delay compensation (DC-ASGD) applies to sgd, adam, adamw and "
        "adagrad, not to ", o.name,
        "; for momentum under asynchrony use delayed_nesterov without it"));
  }
  if (!(o.beta1 >= 0.0f && o.beta1 < 1.0f)) {
    return Invalid("beta1", o.beta1, "in [0, 1)");
  }
  if (!(o.beta2 >= 0.0f && o.beta2 < 1.0f)) {
    return Invalid("beta2", o.beta2, "in [0, 1)");
  }
  if (!(o.epsilon > 0.0f && std::isfinite(o.epsilon))) {
    return Invalid("epsilon", o.epsilon, "finite and > 0");
  }
  if (!(o.weight_decay >= 0.0f && std::isfinite(o.weight_decay))) {
    return Invalid("weight_decay", o.weight_decay, "finite and >= 0");
  }
  if (!(o.adagrad_initial_accumulator >= 0.0f &&
        std::isfinite(o.adagrad_initial_accumulator))) {
    return Invalid("adagrad_initial_accumulator",
                   o.adagrad_initial_accumulator, "finite and >= 0");
  }
  RETURN_IF_ERROR(ValidateLrSchedule(o.schedule));
  if (o.schedule.kind == "cosine" && o.schedule.min_lr > o.learning_rate) {
    return Invalid("schedule.min_lr", o.schedule.min_lr,
                   absl::StrCat("<= learning_rate (", o.learning_rate, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Optimizer>> Optimizer::Create(
    const OptimizerOptions& options) {
  RETURN_IF_ERROR(ValidateOptions(options));
  ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> rule, CreateRule(options));
  if (options.delay_compensation == 0.0f) return rule;
  return std::make_unique<DelayCompensatedOptimizer>(options, std::move(rule));
}

absl::StatusOr<std::unique_ptr<Optimizer>> Optimizer::CreateRule(
    const OptimizerOptions& options) {
  const std::string& name = options.name;
  if (name == "sgd") return std::make_unique<SgdOptimizer>(options);
  if (name == "momentum") {
    return std::make_unique<MomentumOptimizer</*kNesterov=*/false>>(options);
  }
  if (name == "nesterov") {
    return std::make_unique<MomentumOptimizer</*kNesterov=*/true>>(options);
  }
  if (name == "adam") {
    return std::make_unique<AdamOptimizer</*kDecoupled=*/false>>(options);
  }
  if (name == "adamw") {
    return std::make_unique<AdamOptimizer</*kDecoupled=*/true>>(options);
  }
  if (name == "adagrad") return std::make_unique<AdagradOptimizer>(options);
  if (name == "delayed_nesterov") return std::make_unique<DelayedNesterovOptimizer>(options);
  return absl::InvalidArgumentError(absl::StrCat(
      "optimizer: unknown name \"", name,
      "\" (want sgd, momentum, nesterov, adam, adamw, adagrad or delayed_nesterov)"));
}

Optimizer::Optimizer(const OptimizerOptions& options) : options_(options) {}

Optimizer::~Optimizer() = default;

float Optimizer::InitialSlotValue(int slot) const { return 0.0f; }

Optimizer::Step Optimizer::PrepareStep(int64_t step, float lr_scale) const {
  Step s;
  s.lr = LearningRate(step) * lr_scale;
  return s;
}

void Optimizer::Apply(int64_t step, float lr_scale, absl::Span<float> params,
                      absl::Span<const float> grad,
                      absl::Span<float* const> slots) const {
  assert(grad.size() == params.size());
  assert(slots.size() == static_cast<size_t>(num_slots()));
  ApplyRun(PrepareStep(step, lr_scale), DTYPE_F32,
           reinterpret_cast<const char*>(grad.data()),
           static_cast<int64_t>(params.size()), params.data(), slots);
}

void Optimizer::ApplyPayload(int64_t step, float lr_scale,
                             const wire::PayloadView& dense,
                             absl::Span<float> params,
                             absl::Span<float* const> slots) const {
  assert(slots.size() == static_cast<size_t>(num_slots()));
  assert(slots.size() <= static_cast<size_t>(kMaxSlots));
  const Step prepared = PrepareStep(step, lr_scale);
  const int dtype = dense.dtype;
  const size_t num_slots = slots.size();
  wire::ForEachRun(dense.data, common::DTypeSize(dtype),
                   [&](int64_t first, const char* bytes, int64_t count) {
                     float* run_slots[kMaxSlots];
                     for (size_t s = 0; s < num_slots; ++s) run_slots[s] = slots[s] + first;
                     ApplyRun(prepared, dtype, bytes, count, params.data() + first,
                              absl::MakeConstSpan(run_slots, num_slots));
                   });
}

float Optimizer::LearningRate(int64_t step) const {
  return ScheduledLearningRate(options_.schedule, options_.learning_rate,
                               step);
}

}  // namespace shardtrain::server
