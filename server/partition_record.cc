#include "server/partition_record.h"

#include <algorithm>
#include <string>
#include <vector>

#include <prometheus/gauge.h>

#include "absl/strings/str_format.h"
#include "absl/types/span.h"
#include "common/payload.h"
#include "common/status_macros.h"

namespace shardtrain::server {
namespace {

// OK when `bytes` holds exactly `count` f32 values.
absl::Status CheckSize(const Partition& part, absl::string_view what, absl::string_view field,
                       const std::string& bytes, size_t count) {
  if (bytes.size() != count * sizeof(float)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s of %s/%d: %s has %d bytes; %d f32 values need %d", what,
                        part.tensor, part.index, field, bytes.size(), count,
                        count * sizeof(float)));
  }
  return absl::OkStatus();
}

}  // namespace

void WritePartitionRecord(const Partition& part, PartitionRecordContents contents,
                          CheckpointRecord* record) {
  record->Clear();
  *record->mutable_spec() = *part.spec;
  record->set_partition(static_cast<uint32_t>(part.index));
  record->set_version(part.version.load(std::memory_order_relaxed));
  common::EncodeDense(part.params, DTYPE_F32, record->mutable_params());
  for (const std::vector<float>& slot : part.slots) {
    common::EncodeDense(slot, DTYPE_F32, record->add_slots());
  }
  if (contents != PartitionRecordContents::kReplica) return;
  record->set_ops(part.ops);
  record->set_resuming(part.resuming);
  if (part.contributions > 0) {
    common::EncodeDense(part.accum, DTYPE_F32, record->mutable_accum());
    for (size_t w = 0; w < part.contributed.size(); ++w) {
      if (part.contributed[w]) record->add_contributors(static_cast<uint32_t>(w));
    }
  }
}

absl::Status ReadPartitionRecord(const CheckpointRecord& record,
                                 PartitionRecordContents contents, absl::string_view what,
                                 absl::string_view optimizer, Partition& part) {
  const bool replica = contents == PartitionRecordContents::kReplica;
  // Check everything first: a bad record changes nothing.
  if (record.slots_size() != static_cast<int>(part.slots.size())) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s of %s/%d has %d optimizer slots; optimizer %s needs %d", what, part.tensor,
        part.index, record.slots_size(), optimizer, part.slots.size()));
  }
  RETURN_IF_ERROR(CheckSize(part, what, "params", record.params(), part.params.size()));
  for (int s = 0; s < record.slots_size(); ++s) {
    RETURN_IF_ERROR(CheckSize(part, what, absl::StrFormat("slot %d", s), record.slots(s),
                              part.slots[s].size()));
  }
  if (replica && !record.accum().empty()) {
    RETURN_IF_ERROR(CheckSize(part, what, "accum", record.accum(), part.params.size()));
    for (uint32_t w : record.contributors()) {
      if (w >= part.contributed.size()) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s of %s/%d: contributor %d out of range", what, part.tensor, part.index, w));
      }
    }
  }
  // The sizes are right, so decoding cannot fail.
  RETURN_IF_ERROR(
      common::DecodeDense(DTYPE_F32, record.params(), absl::MakeSpan(part.params)));
  for (int s = 0; s < record.slots_size(); ++s) {
    RETURN_IF_ERROR(
        common::DecodeDense(DTYPE_F32, record.slots(s), absl::MakeSpan(part.slots[s])));
  }
  if (!replica) return absl::OkStatus();
  std::fill(part.contributed.begin(), part.contributed.end(), false);
  part.contributions = 0;
  part.accum.clear();
  if (!record.accum().empty()) {
    part.accum.assign(part.params.size(), 0.0f);
    RETURN_IF_ERROR(
        common::DecodeDense(DTYPE_F32, record.accum(), absl::MakeSpan(part.accum)));
    for (uint32_t w : record.contributors()) {
      if (!part.contributed[w]) ++part.contributions;
      part.contributed[w] = true;
    }
  }
  part.ops = record.ops();
  part.resuming = record.resuming();
  return absl::OkStatus();
}

absl::StatusOr<Partition*> LoadPartitionRecord(const CheckpointRecord& record,
                                               PartitionRecordContents contents,
                                               absl::string_view what,
                                               absl::string_view optimizer, int group,
                                               TensorStore* store) {
  RETURN_IF_ERROR(store->Register(record.spec()).status());
  absl::StatusOr<Partition*> found = store->Find(record.spec().name(), record.partition());
  if (!found.ok()) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%s partition %s/%d does not belong here: %s", what,
                        record.spec().name(), record.partition(), found.status().message()));
  }
  Partition& part = **found;
  if (group >= 0 && part.group != group) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s/%d is in group %d, not %d", part.tensor, part.index, part.group, group));
  }
  absl::MutexLock lock(&part.mu);
  RETURN_IF_ERROR(ReadPartitionRecord(record, contents, what, optimizer, part));
  if (contents == PartitionRecordContents::kModel) part.resuming = true;
  part.version.store(record.version(), std::memory_order_release);
  part.committed.store(record.version(), std::memory_order_release);
  if (part.version_gauge != nullptr) {
    part.version_gauge->Set(static_cast<double>(record.version()));
  }
  return &part;
}

}  // namespace shardtrain::server
