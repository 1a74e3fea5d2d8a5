// ResolveUpdateRule: the update rule a shard runs, given the optimizer the
// user named and the shard's consistency mode.
//
// Asynchronous training changes what a rule does: a gradient is one or more
// updates stale when it arrives, and N workers' pushes each take a step of
// their own where a synchronous step averages them. Heavy-ball momentum with
// gradients one update stale is stable only for a ~38x smaller learning rate
// than in sync (Mitliagkas et al. 2016; issue 27), so by default an async
// shard runs "momentum" and "nesterov" as Delayed Nesterov with a period of
// N pushes, under which async --lr means what sync --lr means:
//
//   ShardOptions shard = ...;  // mode, num_workers, optimizer from flags
//   ASSIGN_OR_RETURN(std::vector<std::string> warnings,
//                    ResolveUpdateRule(UpdateRuleChoice{}, &shard));
//   for (const std::string& w : warnings) LOG(WARNING) << w;
//
// Thread-safety: a pure function of its arguments.
#ifndef SHARDTRAIN_SERVER_UPDATE_RULE_H_
#define SHARDTRAIN_SERVER_UPDATE_RULE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/shard_options.h"

namespace shardtrain::server {

struct UpdateRuleChoice {
  // How an async shard with more than one worker runs "momentum" and
  // "nesterov": "delayed_nesterov" (stable at the sync learning rate) or
  // "heavy_ball" (the rule as named, as in sync mode).
  std::string async_momentum = "delayed_nesterov";
  // Delayed Nesterov's period in pushes; 0: the job's number of workers.
  int64_t period = 0;
};

// Rewrites shard->optimizer for shard->mode and shard->num_workers:
// - async, "momentum" or "nesterov", async_momentum "delayed_nesterov", more
//   than one worker: the rule becomes "delayed_nesterov" with period
//   choice.period (or num_workers);
// - "delayed_nesterov" named directly: that period in async mode, 1 (plain
//   Nesterov) in sync mode;
// - async "noam" schedule: one schedule step per num_workers pushes.
// Returns warnings for combinations known to train badly (async heavy ball
// with several workers, the staleness-aware rate with two or fewer);
// INVALID_ARGUMENT, naming the alternative, for an unknown async_momentum, a
// negative period, and delay compensation in sync mode.
absl::StatusOr<std::vector<std::string>> ResolveUpdateRule(const UpdateRuleChoice& choice,
                                                           ShardOptions* shard);

}  // namespace shardtrain::server

#endif  // SHARDTRAIN_SERVER_UPDATE_RULE_H_
