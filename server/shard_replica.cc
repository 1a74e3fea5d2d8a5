// Shard's replica side (server/shard.h): applying pushes forwarded down a
// chain, and the state transfer to a joining tail.
#include <algorithm>
#include <utility>
#include <vector>

#include <glog/logging.h>

#include "absl/strings/str_format.h"
#include "common/float_env.h"
#include "common/payload.h"
#include "common/status_macros.h"
#include "server/partition_record.h"
#include "server/replication/group_state_parts.h"
#include "server/shard.h"

namespace shardtrain::server {
namespace {

struct OpWait {
  const Partition* partition;
  int64_t op;
};

// Read under the partition's mutex by absl::Condition.
bool ReachedOp(OpWait* wait) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  return wait->partition->ops >= wait->op;
}

}  // namespace

bool Shard::LockAtOp(Partition& p, int64_t op, absl::Duration wait,
                     const std::function<bool()>& still_valid) {
  const absl::Time deadline = absl::Now() + wait;
  OpWait condition{&p, op};
  p.mu.Lock();
  while (!p.mu.AwaitWithTimeout(absl::Condition(&ReachedOp, &condition),
                                absl::Milliseconds(20))) {
    if (absl::Now() >= deadline || !still_valid()) {
      p.mu.Unlock();
      return false;
    }
  }
  return true;
}

absl::Status Shard::ApplyForwardedPart(Partition& p, const DecodedPart& part,
                                       const ReplicatedOp& op, uint32_t worker,
                                       int64_t* staleness) {
  const int64_t version = p.version.load(std::memory_order_relaxed);
  if (options_.mode == ConsistencyMode::kSync) {
    if (part.version > version && op.version_after() > version &&
        !p.contributed[worker]) {
      // The head let a resuming partition catch up to the worker's step
      // (PartitionUpdater::CheckPart); the replica does the same.
      DecodedPart ahead = part;
      ahead.ahead = true;
      updater_.AddSyncGradient(p, ahead, worker, &op);
    } else {
      if (part.version != version || p.contributed[worker]) {
        return absl::InternalError(absl::StrFormat(
            "%s/%d: replica diverged: forwarded gradient of worker %d for step %d, "
            "but this replica is at step %d%s",
            p.tensor, p.index, worker, part.version, version,
            p.contributed[worker] ? " with its gradient already in" : ""));
      }
      updater_.AddSyncGradient(p, part, worker, &op);
    }
  } else {
    *staleness = updater_.ApplyAsyncGradient(p, part);
  }
  ++p.ops;
  const int64_t now = p.version.load(std::memory_order_relaxed);
  if (now != op.version_after()) {
    return absl::InternalError(absl::StrFormat(
        "%s/%d: replica diverged: at version %d after operation %d, the head "
        "was at %d",
        p.tensor, p.index, now, op.op(), op.version_after()));
  }
  return absl::OkStatus();
}

absl::Status Shard::ApplyReplicated(const wire::PushView& request, absl::Duration wait,
                                    const std::function<bool()>& still_valid,
                                    PushResponse* response, Applied* applied) {
  common::EnableFlushToZero();
  response->set_incarnation(incarnation_);
  response->set_duplicate(false);
  RETURN_IF_ERROR(CheckWorker(request.worker));
  if (request.clock < 0 || request.clock > kMaxClock) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "clock %d is not in [0, %d]", request.clock, kMaxClock));
  }
  const size_t num_parts = request.parts.size();
  if (request.replicated.size() < num_parts ||
      (num_parts == 0 && request.replicated.empty())) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a forwarded push needs one replicated op per part: %d parts, %d ops",
        num_parts, request.replicated.size()));
  }
  std::vector<DecodedPart> parts;
  if (num_parts > 0) {
    ASSIGN_OR_RETURN(parts, DecodePush(request, store_, options_.limits.max_parts_per_request, metrics_));
  }
  const auto timed_out = [&](const Partition& p, int64_t op) {
    return absl::UnavailableError(absl::StrFormat(
        "%s/%d: operation %d is not next here (the chain changed, or an "
        "earlier forward is missing); retry",
        p.tensor, p.index, op));
  };
  int64_t max_staleness = 0;
  bool progressed = false;
  if (applied != nullptr) {
    applied->ops = request.replicated;
    applied->partitions.assign(request.replicated.size(), nullptr);
    for (const DecodedPart& part : parts) {
      applied->partitions[part.request_index] = part.partition;
    }
  }
  for (const DecodedPart& part : parts) {
    const ReplicatedOp& op = request.replicated[part.request_index];
    Partition& p = *part.partition;
    if (!LockAtOp(p, op.op(), wait, still_valid)) return timed_out(p, op.op());
    if (p.ops > op.op()) {  // applied by an earlier copy of this forward
      p.mu.Unlock();
      continue;
    }
    int64_t staleness = 0;
    const absl::Status applied = ApplyForwardedPart(p, part, op, request.worker, &staleness);
    p.mu.Unlock();
    if (!applied.ok()) {
      LOG(ERROR) << applied;
      return applied;
    }
    max_staleness = std::max(max_staleness, staleness);
    progressed = true;
  }
  for (size_t i = num_parts; i < request.replicated.size(); ++i) {
    const ReplicatedOp& op = request.replicated[i];
    if (!op.has_close()) {
      return absl::InvalidArgumentError("a replicated op beyond the parts must close a step");
    }
    ASSIGN_OR_RETURN(Partition * found, store_.Find(op.close()));
    Partition& p = *found;
    if (!LockAtOp(p, op.op(), wait, still_valid)) return timed_out(p, op.op());
    if (p.ops == op.op()) {
      updater_.MaybeFinishStep(p, /*close=*/true);
      ++p.ops;
      progressed = true;
    }
    p.mu.Unlock();
  }
  response->set_max_staleness(max_staleness);
  if (num_parts > 0) {
    // The replica's push log and membership follow the head's.
    if (request.sequence != 0) {
      PushLog& log = push_logs_.Of(parts.front().partition->group, request.worker);
      absl::MutexLock lock(&log.mu());
      log.Record(request.worker_incarnation, request.sequence, max_staleness);
    }
    metrics_->gradients_received().Increment(static_cast<double>(num_parts));
    const Membership::UpdateResult update =
        membership_.Update(static_cast<int>(request.worker), request.worker_incarnation,
                           request.clock, false, absl::Now(), updater_.RejoinStep());
    CountJoin(update.join);
    UpdateMembershipMetrics();
  }
  if (progressed) NotifyProgress();
  return absl::OkStatus();
}

GroupStateResponse Shard::ExportGroup(int group) const {
  GroupStateResponse state;
  for (const Partition* part : store_.All()) {
    if (part->group != group) continue;
    absl::ReaderMutexLock lock(&part->mu);
    WritePartitionRecord(*part, PartitionRecordContents::kReplica, state.add_records());
  }
  if (!push_logs_.Holds(group)) return state;
  push_logs_.Export(group, state.mutable_push_logs());
  tables_.ExportGroup(group, GroupStateRecordBytes(options_.limits.max_response_bytes),
                      &state);
  return state;
}

absl::Status Shard::ImportGroup(int group, const GroupStateResponse& state) {
  if (!push_logs_.Holds(group)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("shard %d does not hold group %d", options_.shard_index, group));
  }
  RETURN_IF_ERROR(tables_.ImportGroup(group, state));
  for (const CheckpointRecord& record : state.records()) {
    if (record.has_table()) continue;
    RETURN_IF_ERROR(store_.Register(record.spec()).status());
    ASSIGN_OR_RETURN(Partition * found,
                     store_.Find(record.spec().name(), record.partition()));
    Partition& part = *found;
    if (part.group != group) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s/%d is in group %d, not %d", part.tensor, part.index, part.group, group));
    }
    absl::MutexLock lock(&part.mu);
    RETURN_IF_ERROR(ReadPartitionRecord(record, PartitionRecordContents::kReplica, "state",
                                        optimizer_->options().name, part));
    part.version.store(record.version(), std::memory_order_release);
    // This shard joins as the group's tail: what it holds, the tail holds.
    part.committed.store(record.version(), std::memory_order_release);
    updater_.NoteVersion(record.version());
    if (part.version_gauge != nullptr) {
      part.version_gauge->Set(static_cast<double>(record.version()));
    }
  }
  RETURN_IF_ERROR(push_logs_.Import(group, state.push_logs(), "push log"));
  NotifyProgress();
  return absl::OkStatus();
}

int64_t Shard::GroupOps(int group) const {
  int64_t ops = 0;
  for (const Partition* part : store_.All()) {
    if (part->group != group) continue;
    absl::ReaderMutexLock lock(&part->mu);
    ops += part->ops;
  }
  return ops + tables_.GroupOps(group);
}

}  // namespace shardtrain::server
