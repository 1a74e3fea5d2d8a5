#include "server/request_checks.h"

#include <string>

#include "absl/strings/str_format.h"
#include "server/membership.h"

namespace shardtrain::server {

absl::Status CheckWorker(const ShardOptions& options, uint32_t worker) {
  if (worker >= static_cast<uint32_t>(options.num_workers)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("worker %d is not in [0, %d)", worker, options.num_workers));
  }
  return absl::OkStatus();
}

absl::Status CheckIncarnation(const ShardOptions& options, uint64_t incarnation,
                              uint64_t named) {
  if (named != 0 && named != incarnation) {
    return absl::AbortedError(absl::StrFormat(
        "shard %d restarted (request names incarnation %d, shard is %d): re-register",
        options.shard_index, named, incarnation));
  }
  return absl::OkStatus();
}

absl::Status CheckClock(int64_t clock, absl::string_view what) {
  if (clock < 0 || clock > kMaxClock) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s %d is not in [0, %d]", what, clock, kMaxClock));
  }
  return absl::OkStatus();
}

absl::Status CheckClockParts(uint32_t clock_parts) {
  if (clock_parts > kMaxClockParts) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "clock_parts %d: a push is split into at most %d calls", clock_parts, kMaxClockParts));
  }
  return absl::OkStatus();
}

absl::Status Refuse(ShardMetrics* metrics, absl::string_view limit, absl::Status status) {
  if (metrics != nullptr) metrics->requests_refused(std::string(limit)).Increment();
  return status;
}

}  // namespace shardtrain::server
