#include "server/push_logs.h"

#include <utility>

#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"

namespace shardtrain::server {

PushLogs::PushLogs(const std::vector<int>& groups, int num_workers)
    : num_workers_(num_workers) {
  for (size_t slot = 0; slot < groups.size(); ++slot) {
    const int group = groups[slot];
    if (group >= static_cast<int>(slot_of_.size())) slot_of_.resize(group + 1, -1);
    slot_of_[group] = static_cast<int>(slot);
  }
  logs_.reserve(groups.size() * static_cast<size_t>(num_workers));
  for (size_t i = 0; i < groups.size() * static_cast<size_t>(num_workers); ++i) {
    logs_.push_back(std::make_unique<PushLog>());
  }
}

void PushLogs::Export(int group,
                      google::protobuf::RepeatedPtrField<PushLogState>* out) const {
  for (int w = 0; w < num_workers_; ++w) {
    PushLog& log = Of(group, static_cast<uint32_t>(w));
    absl::MutexLock lock(&log.mu());
    PushLogState state;
    if (!log.Export(&state)) continue;
    state.set_worker(static_cast<uint32_t>(w));
    *out->Add() = std::move(state);
  }
}

absl::Status PushLogs::Import(int group,
                              const google::protobuf::RepeatedPtrField<PushLogState>& in,
                              absl::string_view what) {
  if (!Holds(group)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s of replica group %d, which this shard does not hold", what, group));
  }
  for (const PushLogState& state : in) {
    if (state.worker() >= static_cast<uint32_t>(num_workers_)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s of worker %d in group state; the job has %d workers", what,
                          state.worker(), num_workers_));
    }
    PushLog& log = Of(group, state.worker());
    absl::MutexLock lock(&log.mu());
    RETURN_IF_ERROR(log.Import(state));
  }
  return absl::OkStatus();
}

}  // namespace shardtrain::server
