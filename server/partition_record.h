// The one writer and reader of a partition's state as a CheckpointRecord,
// for checkpoints (Shard::Snapshot and Restore), step checkpoints
// (StepSnapshot::Capture) and the state a replica copies to take a group
// over (GroupReplica::Export and Import).
//
//   {
//     absl::ReaderMutexLock lock(&part.mu);
//     WritePartitionRecord(part, PartitionRecordContents::kModel, &record);
//   }
//   ...
//   absl::MutexLock lock(&part.mu);
//   RETURN_IF_ERROR(ReadPartitionRecord(record, PartitionRecordContents::kModel,
//                                       "checkpoint", optimizer_name, part));
//
// Free functions; the caller of Write/ReadPartitionRecord holds the
// partition's lock.
#ifndef SHARDTRAIN_SERVER_PARTITION_RECORD_H_
#define SHARDTRAIN_SERVER_PARTITION_RECORD_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/shardtrain.pb.h"
#include "server/tensor_store.h"

namespace shardtrain::server {

enum class PartitionRecordContents {
  // What a checkpoint keeps: the tensor's spec, the partition's index and
  // version, its parameters and optimizer slots (f32).
  kModel,
  // The model and the sync step in flight, for a replica that takes the
  // group over: the operation count, `resuming`, and (while some gradients
  // of the step are in) the accumulator and its contributors.
  kReplica,
};

// Writes `part` into `*record` (cleared first).
void WritePartitionRecord(const Partition& part, PartitionRecordContents contents,
                          CheckpointRecord* record) ABSL_SHARED_LOCKS_REQUIRED(part.mu);

// Loads `record` (written with `contents`) into `part`: its parameters and
// optimizer slots, and with kReplica the step in flight. The version is the
// caller's to set (with what it means for `committed`). `what` names the
// record in errors ("checkpoint", "state"), `optimizer` the rule whose
// slots `part` has. Everything is checked before anything is written, so
// on error `part` is unchanged: FAILED_PRECONDITION when the record holds
// another number of slots than `part`; INVALID_ARGUMENT when a vector's
// byte count is not the partition's or a contributor is not a worker.
absl::Status ReadPartitionRecord(const CheckpointRecord& record,
                                 PartitionRecordContents contents, absl::string_view what,
                                 absl::string_view optimizer, Partition& part)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(part.mu);

// Loads `record` into its partition of `store`, registering the record's
// tensor there first: ReadPartitionRecord's contents, the version, and the
// committed mark at that version (what a checkpoint or a copied group
// holds, a chain's tail holds). A model record's partition resumes (a push
// from a later step may fast-forward it, server/partition_updater.h); a
// replica record says itself. `group` >= 0: the partition must be in that
// replica group (INVALID_ARGUMENT). FAILED_PRECONDITION for a partition
// this shard does not hold. Returns the partition, locked and unlocked
// here; on error nothing of it changed.
absl::StatusOr<Partition*> LoadPartitionRecord(const CheckpointRecord& record,
                                               PartitionRecordContents contents,
                                               absl::string_view what,
                                               absl::string_view optimizer, int group,
                                               TensorStore* store);

}  // namespace shardtrain::server

#endif  // SHARDTRAIN_SERVER_PARTITION_RECORD_H_
