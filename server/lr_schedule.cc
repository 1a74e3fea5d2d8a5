#include "server/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace shardtrain::server {
namespace {

constexpr double kPi = 3.14159265358979323846;

absl::Status Invalid(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("lr schedule: ", what));
}

}  // namespace

absl::Status ValidateLrSchedule(const LrScheduleOptions& options) {
  if (options.warmup_steps < 0) {
    return Invalid(absl::StrCat("warmup_steps must be >= 0, got ",
                                options.warmup_steps));
  }
  if (options.updates_per_step < 1) {
    return Invalid(absl::StrCat("updates_per_step must be >= 1, got ",
                                options.updates_per_step));
  }
  if (options.kind == "constant") return absl::OkStatus();
  if (options.kind == "noam") {
    if (options.warmup_steps <= 0) {
      return Invalid(absl::StrCat("noam needs warmup_steps > 0, got ",
                                  options.warmup_steps));
    }
    return absl::OkStatus();
  }
  if (options.kind == "step") {
    if (options.step_size <= 0) {
      return Invalid(
          absl::StrCat("step_size must be > 0, got ", options.step_size));
    }
    // The negated comparison also rejects NaN.
    if (!(options.gamma > 0.0f && options.gamma <= 1.0f)) {
      return Invalid(absl::StrCat("gamma must be in (0, 1], got ",
                                  options.gamma));
    }
    return absl::OkStatus();
  }
  if (options.kind == "cosine") {
    if (options.total_steps <= options.warmup_steps) {
      return Invalid(absl::StrCat("total_steps (", options.total_steps,
                                  ") must be > warmup_steps (",
                                  options.warmup_steps, ")"));
    }
    if (!(options.min_lr >= 0.0f && std::isfinite(options.min_lr))) {
      return Invalid(
          absl::StrCat("min_lr must be finite and >= 0, got ", options.min_lr));
    }
    return absl::OkStatus();
  }
  return Invalid(absl::StrCat("unknown kind \"", options.kind,
                              "\" (want constant, step, cosine or noam)"));
}

float ScheduledLearningRate(const LrScheduleOptions& options, float base_lr,
                            int64_t step) {
  step = std::max<int64_t>(step, 0) / std::max<int64_t>(options.updates_per_step, 1);
  const double lr = base_lr;
  const int64_t warmup = options.warmup_steps;
  if (step < warmup) {
    return static_cast<float>(lr * static_cast<double>(step + 1) /
                              static_cast<double>(warmup));
  }
  const int64_t since_warmup = step - warmup;
  if (options.kind == "noam") {
    return static_cast<float>(lr * std::sqrt(static_cast<double>(warmup) /
                                             static_cast<double>(step + 1)));
  }
  if (options.kind == "step") {
    const int64_t decays = since_warmup / options.step_size;
    return static_cast<float>(
        lr * std::pow(static_cast<double>(options.gamma),
                      static_cast<double>(decays)));
  }
  if (options.kind == "cosine") {
    const double min_lr = options.min_lr;
    if (step >= options.total_steps) return static_cast<float>(min_lr);
    const double progress = static_cast<double>(since_warmup) /
                            static_cast<double>(options.total_steps - warmup);
    return static_cast<float>(min_lr + (lr - min_lr) * 0.5 *
                                           (1.0 + std::cos(kPi * progress)));
  }
  return base_lr;
}

}  // namespace shardtrain::server
