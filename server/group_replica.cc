#include "server/group_replica.h"

#include <algorithm>
#include <utility>
#include <vector>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/float_env.h"
#include "common/partition.h"
#include "common/status_macros.h"
#include "server/internal/partition_locks.h"
#include "server/partition_record.h"
#include "server/replication/group_state_parts.h"
#include "server/request_checks.h"

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

// The one replica group every key `key_of(i)`, i < n, names (`what`: the
// request, for messages). Placement is a pure function of the key, so this
// needs no lookup: a shard that has not registered the tensor yet (a tail
// still copying the group's state) still knows which group is asked for.
template <typename KeyOf>
absl::StatusOr<int> CommonGroup(int num_shards, size_t n, KeyOf key_of, const char* what) {
  if (n == 0) return absl::InvalidArgumentError(absl::StrCat(what, " names no partitions"));
  int group = -1;
  for (size_t i = 0; i < n; ++i) {
    const auto [tensor, partition] = key_of(i);
    const int of = common::ReplicaGroupFor(tensor, partition, num_shards);
    if (group >= 0 && of != group) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "a replicated %s names partitions of replica groups %d and %d; send one "
          "per group",
          what, group, of));
    }
    group = of;
  }
  return group;
}

}  // namespace

GroupReplica::GroupReplica(const ShardOptions& options, uint64_t incarnation,
                           std::vector<int> groups, ShardParts parts,
                           std::function<void()> notify)
    : options_(options),
      incarnation_(incarnation),
      groups_(std::move(groups)),
      shard_(parts),
      notify_(std::move(notify)) {}


absl::StatusOr<int> GroupReplica::GroupOf(const wire::PushView& request) const {
  return CommonGroup(
      options_.partitioning.num_shards, request.parts.size(),
      [&](size_t i) {
        const wire::KeyView& key = request.parts[i].key;
        return std::pair<absl::string_view, uint32_t>(key.tensor, key.partition);
      },
      "push");
}

absl::StatusOr<int> GroupReplica::GroupOf(const PullRequest& request) const {
  return CommonGroup(
      options_.partitioning.num_shards, static_cast<size_t>(request.parts_size()),
      [&](size_t i) {
        const PartitionKey& key = request.parts(static_cast<int>(i));
        return std::pair<absl::string_view, uint32_t>(key.tensor(), key.partition());
      },
      "pull");
}

int GroupReplica::GroupOf(const PartitionKey& key) const {
  return common::ReplicaGroupFor(key.tensor(), key.partition(),
                                 options_.partitioning.num_shards);
}

bool GroupReplica::LockAtOp(Partition& p, int64_t op, absl::Duration wait,
                     const std::function<bool()>& still_valid) {
  const absl::Time deadline = absl::Now() + wait;
  OpWait condition{&p, op};
  p.mu.Lock();
  while (!ReachedOp(&condition)) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration() || !still_valid()) {
      p.mu.Unlock();
      return false;
    }
    p.mu.AwaitWithTimeout(absl::Condition(&ReachedOp, &condition),
                          std::min(left, absl::Milliseconds(20)));
  }
  // Reached, but perhaps by an operation of the chain that replaced this
  // one, whose head applied a worker's retry at this number (see
  // ApplyReachedParts): asked with the partition held.
  if (!still_valid()) {
    p.mu.Unlock();
    return false;
  }
  return true;
}

absl::Status GroupReplica::ApplyForwardedPart(Partition& p, const DecodedPart& part,
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
      shard_.updater->AddSyncGradient(p, ahead, worker, &op);
    } else {
      if (part.version != version || p.contributed[worker]) {
        return absl::InternalError(absl::StrFormat(
            "%s/%d: replica diverged: forwarded gradient of worker %d for step %d, "
            "but this replica is at step %d%s",
            p.tensor, p.index, worker, part.version, version,
            p.contributed[worker] ? " with its gradient already in" : ""));
      }
      shard_.updater->AddSyncGradient(p, part, worker, &op);
    }
  } else {
    *staleness = shard_.updater->ApplyAsyncGradient(p, part);
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

absl::Status GroupReplica::ApplyForwardedParts(const wire::PushView& request,
                                              const std::vector<DecodedPart>& parts,
                                              absl::Duration wait,
                                              const std::function<bool()>& still_valid,
                                              int64_t* max_staleness) {
  // A forward that arrives in turn finds every part's operation reached and
  // is applied at once.
  bool reached = false;
  RETURN_IF_ERROR(ApplyReachedParts(request, parts, still_valid, max_staleness, &reached));
  if (reached) return absl::OkStatus();
  // One that overtook an earlier forward waits, holding nothing (the
  // earlier one needs the worker's log and the partitions), until every
  // part's operation is reached: counts only grow, so each stays reached.
  for (const DecodedPart& part : parts) {
    Partition& p = *part.partition;
    const int64_t op = request.replicated[part.request_index].op();
    if (!LockAtOp(p, op, wait, still_valid)) {
      return absl::UnavailableError(absl::StrFormat(
          "%s/%d: operation %d is not next here (the chain changed, or an earlier forward "
          "is missing); retry",
          p.tensor, p.index, op));
    }
    p.mu.Unlock();
  }
  RETURN_IF_ERROR(ApplyReachedParts(request, parts, still_valid, max_staleness, &reached));
  if (!reached) {
    return absl::InternalError(
        "a partition's operation count went back while a forward waited");
  }
  return absl::OkStatus();
}

absl::Status GroupReplica::ApplyReachedParts(const wire::PushView& request,
                                            const std::vector<DecodedPart>& parts,
                                            const std::function<bool()>& still_valid,
                                            int64_t* max_staleness, bool* reached) {
  // The push is applied whole, as the head applies one (Shard::DedupedPush,
  // in the same lock order: the worker's log, then the partitions). The
  // log is recorded before it is released: this shard, heading the chain
  // next, answers the worker's retry as a duplicate.
  PushLog& log = shard_.push_logs->Of(parts.front().partition->group, request.worker);
  absl::MutexLock log_lock(&log.mu());
  std::vector<Partition*> to_lock;
  to_lock.reserve(parts.size());
  for (const DecodedPart& part : parts) to_lock.push_back(part.partition);
  internal::PartitionLocks locks(std::move(to_lock));
  for (const DecodedPart& part : parts) {
    part.partition->mu.AssertHeld();  // by `locks`
    if (part.partition->ops < request.replicated[part.request_index].op()) {
      *reached = false;
      return absl::OkStatus();
    }
  }
  *reached = true;
  // A forward of an older chain, whose head is gone: the new head may have
  // applied the worker's retry of this push (or another) at this push's
  // operation, so the count says nothing; the head's retry of the forward
  // goes under the new chain. Asked with the partitions held: an operation
  // of a newer chain is applied only after this shard adopted it.
  if (!still_valid()) {
    return absl::UnavailableError(absl::StrFormat(
        "a forward of push %d of worker %d comes from a chain this shard is no longer at; "
        "retry",
        request.sequence, request.worker));
  }
  for (const DecodedPart& part : parts) {
    Partition& p = *part.partition;
    p.mu.AssertHeld();  // by `locks`
    const ReplicatedOp& op = request.replicated[part.request_index];
    if (p.ops > op.op()) {  // applied by an earlier copy of this forward
      locks.Release(&p);
      continue;
    }
    int64_t staleness = 0;
    const absl::Status status = ApplyForwardedPart(p, part, op, request.worker, &staleness);
    locks.Release(&p);
    if (!status.ok()) {
      LOG(ERROR) << status;
      return status;
    }
    *max_staleness = std::max(*max_staleness, staleness);
  }
  if (request.sequence != 0) {
    log.Record(request.worker_incarnation, request.sequence, *max_staleness);
  }
  return absl::OkStatus();
}

absl::Status GroupReplica::ApplyForwarded(const wire::PushView& request, absl::Duration wait,
                                    const std::function<bool()>& still_valid,
                                    PushResponse* response, Applied* applied) {
  common::EnableFlushToZero();
  response->set_incarnation(incarnation_);
  response->set_duplicate(false);
  RETURN_IF_ERROR(CheckWorker(options_, request.worker));
  RETURN_IF_ERROR(CheckClock(request.clock, "clock"));
  const size_t num_parts = request.parts.size();
  if (request.replicated.size() < num_parts ||
      (num_parts == 0 && request.replicated.empty())) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a forwarded push needs one replicated op per part: %d parts, %d ops",
        num_parts, request.replicated.size()));
  }
  std::vector<DecodedPart> parts;
  if (num_parts > 0) {
    ASSIGN_OR_RETURN(parts, DecodePush(request, *shard_.store, options_.limits.max_parts_per_request, shard_.metrics));
  }
  bool progressed = false;
  const auto timed_out = [&](const Partition& p, int64_t op) {
    // The parts applied already stay (a copy sent again skips them).
    if (progressed) notify_();
    return absl::UnavailableError(absl::StrFormat(
        "%s/%d: operation %d is not next here (the chain changed, or an "
        "earlier forward is missing); retry",
        p.tensor, p.index, op));
  };
  int64_t max_staleness = 0;
  if (applied != nullptr) {
    applied->ops = request.replicated;
    applied->partitions.assign(request.replicated.size(), nullptr);
    for (const DecodedPart& part : parts) {
      applied->partitions[part.request_index] = part.partition;
    }
  }
  if (num_parts > 0) {
    RETURN_IF_ERROR(ApplyForwardedParts(request, parts, wait, still_valid, &max_staleness));
    progressed = true;
  }
  for (size_t i = num_parts; i < request.replicated.size(); ++i) {
    const ReplicatedOp& op = request.replicated[i];
    if (!op.has_close()) {
      return absl::InvalidArgumentError("a replicated op beyond the parts must close a step");
    }
    ASSIGN_OR_RETURN(Partition * found, shard_.store->Find(op.close()));
    Partition& p = *found;
    if (!LockAtOp(p, op.op(), wait, still_valid)) return timed_out(p, op.op());
    if (p.ops == op.op()) {
      shard_.updater->MaybeFinishStep(p, /*close=*/true);
      ++p.ops;
      progressed = true;
    }
    p.mu.Unlock();
  }
  response->set_max_staleness(max_staleness);
  if (num_parts > 0) {
    // The replica's membership follows the head's (its push log did in
    // ApplyForwardedParts).
    shard_.metrics->gradients_received().Increment(static_cast<double>(num_parts));
    const Membership::UpdateResult update =
        shard_.membership->Update(static_cast<int>(request.worker), request.worker_incarnation,
                           request.clock, false, absl::Now(), shard_.updater->RejoinStep());
    shard_.metrics->RecordMembership(*shard_.membership, update.join);
  }
  if (progressed) notify_();
  return absl::OkStatus();
}

GroupStateResponse GroupReplica::Export(int group) const {
  GroupStateResponse state;
  for (const Partition* part : shard_.store->All()) {
    if (part->group != group) continue;
    absl::ReaderMutexLock lock(&part->mu);
    WritePartitionRecord(*part, PartitionRecordContents::kReplica, state.add_records());
  }
  if (!shard_.push_logs->Holds(group)) return state;
  shard_.push_logs->Export(group, state.mutable_push_logs());
  shard_.tables->ExportGroup(group, GroupStateRecordBytes(options_.limits.max_response_bytes),
                      &state);
  return state;
}

absl::Status GroupReplica::Import(int group, const GroupStateResponse& state) {
  if (!shard_.push_logs->Holds(group)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("shard %d does not hold group %d", options_.shard_index, group));
  }
  RETURN_IF_ERROR(shard_.tables->ImportGroup(group, state));
  for (const CheckpointRecord& record : state.records()) {
    if (record.has_table()) continue;
    // This shard joins as the group's tail: what it holds, the tail holds.
    RETURN_IF_ERROR(LoadPartitionRecord(record, PartitionRecordContents::kReplica, "state",
                                        shard_.optimizer->options().name, group,
                                        shard_.store)
                        .status());
    shard_.updater->NoteVersion(record.version());
  }
  RETURN_IF_ERROR(shard_.push_logs->Import(group, state.push_logs(), "push log"));
  notify_();
  return absl::OkStatus();
}

int64_t GroupReplica::Ops(int group) const {
  int64_t ops = 0;
  for (const Partition* part : shard_.store->All()) {
    if (part->group != group) continue;
    absl::ReaderMutexLock lock(&part->mu);
    ops += part->ops;
  }
  return ops + shard_.tables->GroupOps(group);
}

void GroupReplica::MarkCommitted(const Applied& applied, bool wake) {
  for (size_t i = 0; i < applied.ops.size(); ++i) {
    const ReplicatedOp& op = applied.ops[i];
    Partition* part = i < applied.partitions.size() ? applied.partitions[i] : nullptr;
    if (part == nullptr && op.has_close()) {
      absl::StatusOr<Partition*> found = shard_.store->Find(op.close());
      if (found.ok()) part = *found;
    }
    if (part == nullptr) continue;
    int64_t seen = part->committed.load(std::memory_order_relaxed);
    while (op.version_after() > seen &&
           !part->committed.compare_exchange_weak(seen, op.version_after(),
                                                  std::memory_order_acq_rel)) {
    }
  }
  if (wake) notify_();
}

void GroupReplica::CommitGroup(int group) {
  bool changed = false;
  for (Partition* part : shard_.store->All()) {
    if (part->group != group) continue;
    const int64_t version = part->version.load(std::memory_order_acquire);
    int64_t seen = part->committed.load(std::memory_order_relaxed);
    while (version > seen &&
           !part->committed.compare_exchange_weak(seen, version, std::memory_order_acq_rel)) {
    }
    changed = changed || version > seen;
  }
  if (changed) notify_();
}

void GroupReplica::SetHooks(Hooks hooks) {
  absl::MutexLock lock(&hooks_mu_);
  hooks_ = std::move(hooks);
}

bool GroupReplica::Leads(int group) const {
  std::function<bool(int)> leads;
  {
    absl::MutexLock lock(&hooks_mu_);
    if (!hooks_.leads) return true;
    leads = hooks_.leads;
  }
  return leads(group);
}

void GroupReplica::Closed(int group, std::vector<ReplicatedOp> closes) const {
  std::function<void(int, std::vector<ReplicatedOp>)> on_closed;
  {
    absl::MutexLock lock(&hooks_mu_);
    on_closed = hooks_.on_closed;
  }
  if (on_closed) on_closed(group, std::move(closes));
}

}  // namespace shardtrain::server
