#include "server/push_log.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace shardtrain::server {

absl::StatusOr<std::optional<int64_t>> PushLog::Find(uint64_t worker_incarnation,
                                                     uint64_t sequence) const {
  if (incarnation_ != worker_incarnation || applied_.empty() || sequence > highest_) {
    return std::nullopt;
  }
  if (highest_ - sequence >= static_cast<uint64_t>(kWindow)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "push sequence %d is older than the last %d applied; cannot tell if it was applied",
        sequence, kWindow));
  }
  const int64_t staleness = applied_[sequence % kWindow];
  if (staleness < 0) return std::nullopt;
  return staleness;
}

void PushLog::Reset(uint64_t worker_incarnation) {
  incarnation_ = worker_incarnation;
  highest_ = 0;
  applied_.assign(kWindow, -1);
}

void PushLog::Record(uint64_t worker_incarnation, uint64_t sequence, int64_t staleness) {
  if (incarnation_ != worker_incarnation || applied_.empty()) Reset(worker_incarnation);
  if (sequence > highest_) {
    const uint64_t cleared =
        std::min<uint64_t>(sequence - highest_, static_cast<uint64_t>(kWindow));
    // Counting down from `sequence` cannot wrap around at 2^64 - 1.
    for (uint64_t i = 0; i < cleared; ++i) applied_[(sequence - i) % kWindow] = -1;
    highest_ = sequence;
  }
  applied_[sequence % kWindow] = staleness;
}

bool PushLog::Export(PushLogState* out) const {
  if (applied_.empty()) return false;
  out->set_incarnation(incarnation_);
  out->set_highest(highest_);
  const uint64_t window = static_cast<uint64_t>(kWindow);
  const uint64_t lowest = highest_ >= window ? highest_ - window + 1 : 1;
  for (uint64_t s = lowest; s <= highest_; ++s) {
    const int64_t staleness = applied_[s % window];
    if (staleness < 0) continue;
    out->add_sequences(s);
    out->add_staleness(staleness);
  }
  return true;
}

absl::Status PushLog::Import(const PushLogState& in) {
  if (in.sequences_size() != in.staleness_size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "malformed push log: %d sequences, %d staleness values", in.sequences_size(),
        in.staleness_size()));
  }
  Reset(in.incarnation());
  highest_ = in.highest();
  for (int i = 0; i < in.sequences_size(); ++i) {
    applied_[in.sequences(i) % kWindow] = in.staleness(i);
  }
  return absl::OkStatus();
}

}  // namespace shardtrain::server
