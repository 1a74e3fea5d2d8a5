// Learning-rate schedules: constant, step decay and cosine decay, each with an
// optional linear warmup, and Noam's (linear warmup, then the inverse square
// root of the step, as in "Attention Is All You Need").
//
// A schedule is a pure function of (options, base rate, step), so a shard can
// recompute the rate for any partition from its own step counter without
// keeping schedule state. Example:
//
//   LrScheduleOptions schedule;
//   schedule.kind = "cosine";
//   schedule.warmup_steps = 100;
//   schedule.total_steps = 10000;
//   RETURN_IF_ERROR(ValidateLrSchedule(schedule));
//   float lr = ScheduledLearningRate(schedule, /*base_lr=*/0.1f, step);
//
// Thread-safety: all functions are pure and safe to call concurrently.
#ifndef SHARDTRAIN_SERVER_LR_SCHEDULE_H_
#define SHARDTRAIN_SERVER_LR_SCHEDULE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace shardtrain::server {

struct LrScheduleOptions {
  // "constant" | "step" | "cosine" | "noam".
  std::string kind = "constant";
  // Updates that make one schedule step: the schedule sees
  // floor(update index / updates_per_step). An async shard sets it to the
  // number of workers for "noam", so N workers' pushes advance the schedule
  // as one synchronous step of N averaged gradients does. >= 1.
  int64_t updates_per_step = 1;
  // Linear warmup: for step < warmup_steps the rate is
  // base_lr * (step + 1) / warmup_steps, so the first step already moves the
  // parameters and step warmup_steps - 1 reaches base_lr. 0 disables warmup.
  // "noam" needs it > 0: after warmup its rate is
  // base_lr * sqrt(warmup_steps / (step + 1)), so base_lr is the peak.
  int64_t warmup_steps = 0;
  // Step decay ("step"): base_lr * gamma^floor((step - warmup_steps) /
  // step_size) once warmup is over. Must be > 0.
  int64_t step_size = 1000;
  // Step decay factor ("step"), in (0, 1].
  float gamma = 0.1f;
  // Cosine decay ("cosine"): from base_lr at step warmup_steps down to min_lr
  // at step total_steps, min_lr afterwards. Must be > warmup_steps.
  int64_t total_steps = 0;
  // Cosine floor ("cosine"), in [0, base_lr].
  float min_lr = 0.0f;
};

// INVALID_ARGUMENT for an unknown kind or an out-of-range field. Only the
// fields the kind uses are checked, so e.g. a constant schedule does not need
// total_steps. The relation min_lr <= base_lr needs the base rate and is
// checked by Optimizer::Create.
absl::Status ValidateLrSchedule(const LrScheduleOptions& options);

// The rate for the update with index `step` (0 for the first update).
// REQUIRES: ValidateLrSchedule(options).ok(). A negative step is treated as 0.
float ScheduledLearningRate(const LrScheduleOptions& options, float base_lr,
                            int64_t step);

}  // namespace shardtrain::server

#endif  // SHARDTRAIN_SERVER_LR_SCHEDULE_H_
