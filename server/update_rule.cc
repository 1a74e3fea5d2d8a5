#include "server/update_rule.h"

#include "absl/strings/str_cat.h"

namespace shardtrain::server {

absl::StatusOr<std::vector<std::string>> ResolveUpdateRule(const UpdateRuleChoice& choice,
                                                           ShardOptions* shard) {
  if (choice.async_momentum != "delayed_nesterov" && choice.async_momentum != "heavy_ball") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--async_momentum must be delayed_nesterov or heavy_ball, got \"",
        choice.async_momentum, "\""));
  }
  if (choice.period < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--async_momentum_period must be >= 0 (0: --num_workers), got ", choice.period));
  }
  OptimizerOptions& optimizer = shard->optimizer;
  const bool async = shard->mode == ConsistencyMode::kAsync;
  const int workers = shard->num_workers;
  std::vector<std::string> warnings;
  if (!async) {
    if (optimizer.delay_compensation > 0.0f) {
      return absl::InvalidArgumentError(
          "--delay_compensation (DC-ASGD) compensates the staleness of asynchronous "
          "gradients; sync mode has none: drop the flag or use --mode=async");
    }
    // One synchronous step is one update of the averaged gradient.
    if (optimizer.name == "delayed_nesterov") optimizer.period = 1;
    return warnings;
  }
  const int64_t period = choice.period > 0 ? choice.period : workers;
  const bool momentum = optimizer.name == "momentum" || optimizer.name == "nesterov";
  if (momentum && workers > 1) {
    if (choice.async_momentum == "delayed_nesterov") {
      optimizer.name = "delayed_nesterov";
    } else {
      warnings.push_back(absl::StrCat(
          "async heavy-ball ", optimizer.name, " with ", workers,
          " workers: gradients arrive stale, and momentum with stale gradients is "
          "stable only at a learning rate about 38x below the synchronous one (--lr ",
          optimizer.learning_rate,
          " diverges where sync trains). --async_momentum=delayed_nesterov (the "
          "default) trains like sync at the same --lr"));
    }
  }
  if (optimizer.name == "delayed_nesterov") optimizer.period = period;
  if (optimizer.schedule.kind == "noam") optimizer.schedule.updates_per_step = workers;
  if (shard->staleness_aware_lr && workers <= 2) {
    warnings.push_back(absl::StrCat(
        "--staleness_aware_lr with ", workers,
        " workers changes nothing: pushes taking turns are one update stale, and "
        "the rate is divided only by a staleness above 1. For momentum use "
        "--async_momentum=delayed_nesterov; for delay compensation "
        "--delay_compensation"));
  }
  return warnings;
}

}  // namespace shardtrain::server
