// Optimizer: the update rule a parameter-server shard applies to each
// parameter partition when a gradient arrives.
//
// The rules reproduce PyTorch's torch.optim.SGD (momentum, dampening 0,
// optional Nesterov), Adam, AdamW and Adagrad (lr_decay 0) so results can be
// compared against a PyTorch run. Two rules exist for asynchronous training:
// Delayed Nesterov ("delayed_nesterov", Liu, Douillard et al. 2024,
// "Asynchronous Local-SGD Training for Language Modeling", Algorithm 3), the
// momentum rule that stays stable when every gradient is a few updates
// stale, and delay compensation (DC-ASGD, Zheng et al. 2017) on top of the
// momentum-free rules. Per-parameter state ("slots", e.g. Adam's
// first and second moments) is owned by the caller, which lets the shard keep
// it next to the parameters, checkpoint it and split it across threads.
//
//   OptimizerOptions options;
//   options.name = "adam";
//   options.learning_rate = 1e-3f;
//   ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> optimizer,
//                    Optimizer::Create(options));
//   std::vector<std::vector<float>> slots(optimizer->num_slots());
//   for (int s = 0; s < optimizer->num_slots(); ++s)
//     slots[s].assign(params.size(), optimizer->InitialSlotValue(s));
//   std::vector<float*> slot_ptrs = ...;  // slots[s].data()
//   optimizer->Apply(step++, /*lr_scale=*/1.0f, params, grad, slot_ptrs);
//   // or, with the gradient as received (f32, f16 or bf16, in pieces):
//   optimizer->ApplyPayload(step++, 1.0f, part.grad, params, slot_ptrs);
#ifndef SHARDTRAIN_SERVER_OPTIMIZER_H_
#define SHARDTRAIN_SERVER_OPTIMIZER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "server/lr_schedule.h"
#include "wire/message_views.h"

namespace shardtrain::server {

struct OptimizerOptions {
  // "sgd" | "momentum" | "nesterov" | "adam" | "adamw" | "adagrad" |
  // "delayed_nesterov".
  std::string name = "sgd";
  // "delayed_nesterov": updates per momentum step (an async shard uses its
  // number of workers). Every update applies lr * g / period and adds g to
  // a buffer; every period-th update (the partition's step + 1 a multiple
  // of period) also takes a Nesterov momentum step with the buffer's mean:
  //   buf = momentum * buf + sum(g) / period;  p -= lr * momentum * buf.
  // So period updates move the parameters as one Nesterov step on their
  // mean gradient does, and period 1 is torch's Nesterov SGD exactly. >= 1.
  int64_t period = 1;
  // DC-ASGD's lambda: > 0 compensates each gradient for the update made
  // since the previous one, g += lambda * g * g * (p - p_before_last_update),
  // as MXNet's DCASGD optimizer does, before the rule ("sgd", "adam",
  // "adamw", "adagrad"; not the momentum rules) applies it. 0 disables it;
  // MXNet's default is 0.04. >= 0.
  float delay_compensation = 0.0f;
  // Base learning rate before the schedule and lr_scale; > 0.
  float learning_rate = 0.01f;
  // Momentum factor for "momentum", "nesterov" and "delayed_nesterov", in
  // [0, 1); "nesterov" and "delayed_nesterov" need it > 0 (as in PyTorch, Nesterov without momentum is plain SGD and
  // almost certainly a configuration mistake).
  float momentum = 0.9f;
  // Adam/AdamW decay of the first moment estimate, in [0, 1).
  float beta1 = 0.9f;
  // Adam/AdamW decay of the second moment estimate, in [0, 1).
  float beta2 = 0.999f;
  // Added to the denominator by Adam, AdamW and Adagrad; > 0.
  float epsilon = 1e-8f;
  // >= 0. For every rule except "adamw" this is L2 regularisation added to the
  // gradient (g += wd * p). For "adamw" it is decoupled weight decay as in
  // the AdamW paper and torch.optim.AdamW: p -= lr * wd * p.
  float weight_decay = 0.0f;
  // Starting value of Adagrad's sum of squared gradients, >= 0. PyTorch's
  // default is 0; 0.1 (TensorFlow's default) keeps the first steps bounded.
  float adagrad_initial_accumulator = 0.1f;
  // Schedule applied to learning_rate as a function of the partition's step.
  LrScheduleOptions schedule;
};

// Immutable after Create. Apply, ApplyRun and ApplyPayload are thread-safe
// when concurrent calls touch disjoint parameter and slot ranges.
class Optimizer {
 public:
  // INVALID_ARGUMENT for an unknown name or any out-of-range field (see
  // OptimizerOptions), including schedule fields and min_lr > learning_rate
  // for a cosine schedule. Every numeric field is checked regardless of
  // name, so a bad value is reported even if the chosen rule ignores it.
  static absl::StatusOr<std::unique_ptr<Optimizer>> Create(
      const OptimizerOptions& options);

  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;
  virtual ~Optimizer();

  // Number of state vectors per parameter: sgd 0, momentum/nesterov 1,
  // adam/adamw 2 (first, second moment), adagrad 1 (sum of squares),
  // delayed_nesterov 2 (momentum buffer, gradient sum of the period); one
  // more (the last update) with delay compensation.
  virtual int num_slots() const = 0;

  // Value a fresh slot must be filled with: adagrad_initial_accumulator for
  // Adagrad's accumulator, 0 otherwise.
  // REQUIRES: 0 <= slot < num_slots().
  virtual float InitialSlotValue(int slot) const;

  // The most slots any rule has (Adam's two plus delay compensation's).
  static constexpr int kMaxSlots = 3;

  // The constants of one update of a partition (its rate under the schedule
  // and lr_scale, Adam's bias corrections): computed once by PrepareStep and
  // used for every run of the partition's elements.
  struct Step {
    float lr = 0.0f;            // LearningRate(step) * lr_scale
    float step_size = 0.0f;     // Adam: lr / (1 - beta1^t)
    float bc2_sqrt = 0.0f;      // Adam: sqrt(1 - beta2^t)
    float decay_factor = 0.0f;  // AdamW: 1 - lr * weight_decay
    bool momentum_step = false; // delayed_nesterov: the period's last update
    bool period_start = false;  // delayed_nesterov: the period's first update
  };

  // `step` is the number of updates already applied to the partition (0 for
  // the first); it drives the schedule and Adam's bias correction. The rate
  // used is LearningRate(step) * lr_scale (the server scales it down for
  // stale gradients); for AdamW it also scales the decoupled decay, exactly
  // as PyTorch's lr does. REQUIRES: lr_scale finite and >= 0.
  virtual Step PrepareStep(int64_t step, float lr_scale) const;

  // Applies elements [0, n) of an update in place to params[0, n) and
  // slots[s][0, n), reading the gradient as n little-endian elements of
  // `dtype` at `grad`, at any alignment (the bytes of a received payload).
  // One vectorised pass over params, slots and gradient. The update is
  // element-wise, so a partition may be applied in any number of runs (each
  // slot pointer offset like `params`), on different threads, with one Step.
  //
  // REQUIRES: DTypeSize(dtype) > 0; slots.size() == num_slots(); no range
  //           overlaps another.
  virtual void ApplyRun(const Step& step, int dtype, const char* grad, int64_t n,
                        float* params, absl::Span<float* const> slots) const = 0;

  // Applies one update to `params` and the slots with the gradient in the
  // received pieces of `dense` (any dtype), run by run (ApplyRun).
  // REQUIRES: wire::CheckDense(dense, params.size()).ok(); the slots as for
  //           Apply.
  void ApplyPayload(int64_t step, float lr_scale, const wire::PayloadView& dense,
                    absl::Span<float> params, absl::Span<float* const> slots) const;

  // Applies one update in place to `params` and the slots with a float
  // gradient. slots[s] points at params.size() floats of slot s aligned with
  // `params`.
  //
  // REQUIRES: grad.size() == params.size(); slots.size() == num_slots();
  //           each slot pointer addresses params.size() floats; none of the
  //           ranges overlap; lr_scale finite and >= 0.
  void Apply(int64_t step, float lr_scale, absl::Span<float> params,
             absl::Span<const float> grad, absl::Span<float* const> slots) const;

  // options().learning_rate under options().schedule, without lr_scale.
  float LearningRate(int64_t step) const;

  const OptimizerOptions& options() const { return options_; }

 protected:
  explicit Optimizer(const OptimizerOptions& options);

 private:
  // The rule `options.name` names, without delay compensation.
  static absl::StatusOr<std::unique_ptr<Optimizer>> CreateRule(
      const OptimizerOptions& options);

  const OptimizerOptions options_;
};

}  // namespace shardtrain::server

#endif  // SHARDTRAIN_SERVER_OPTIMIZER_H_
