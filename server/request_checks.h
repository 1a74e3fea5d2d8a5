// The checks every request to a shard shares, in one place for the dense
// partitions (Shard, PullReader, GroupReplica) and the sparse tables
// (SparseTables): the worker index, the shard incarnation a request names,
// a clock's range, and the refusal of a request over a resource limit,
// counted by the limit's name.
//
//   RETURN_IF_ERROR(CheckWorker(options, request.worker()));
//   RETURN_IF_ERROR(CheckIncarnation(options, incarnation, request.shard_incarnation()));
//   if (too_many) return Refuse(metrics, "max_parts_per_request", ResourceExhaustedError(...));
//
// Pure functions but for Refuse's counter; thread-safe.
#ifndef SHARDTRAIN_SERVER_REQUEST_CHECKS_H_
#define SHARDTRAIN_SERVER_REQUEST_CHECKS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "server/shard_metrics.h"
#include "server/shard_options.h"

namespace shardtrain::server {

// INVALID_ARGUMENT unless `worker` is in [0, options.num_workers).
absl::Status CheckWorker(const ShardOptions& options, uint32_t worker);

// ABORTED when a request names a shard incarnation (`named` != 0) other than
// this shard's `incarnation`: the shard restarted, and the worker must
// register again before its versions mean anything here.
absl::Status CheckIncarnation(const ShardOptions& options, uint64_t incarnation,
                              uint64_t named);

// INVALID_ARGUMENT unless `clock` is in [0, kMaxClock] (server/membership.h);
// `what` names it in the message ("clock", "heartbeat clock").
absl::Status CheckClock(int64_t clock, absl::string_view what);

// INVALID_ARGUMENT unless `clock_parts` (PushRequest.clock_parts) is at most
// kMaxClockParts (common/partition.h).
absl::Status CheckClockParts(uint32_t clock_parts);

// Counts a refusal for going over `limit` (a ResourceLimits field, or
// "max_dims") in `metrics` (if not null) and returns `status`.
absl::Status Refuse(ShardMetrics* metrics, absl::string_view limit, absl::Status status);

}  // namespace shardtrain::server

#endif  // SHARDTRAIN_SERVER_REQUEST_CHECKS_H_
