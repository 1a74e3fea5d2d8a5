// Shard's push path: checking a push as received and applying it
// (server/shard.h).
#include <algorithm>
#include <optional>
#include <vector>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/float_env.h"
#include "common/partition.h"
#include "common/status_macros.h"
#include "server/internal/partition_locks.h"
#include "server/shard.h"

namespace shardtrain::server {

absl::Status Shard::Push(const PushRequest& request, PushResponse* response) {
  return Push(wire::ViewOf(request), response);
}

namespace {

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

absl::StatusOr<int> Shard::GroupOf(const wire::PushView& request) const {
  return CommonGroup(
      options_.partitioning.num_shards, request.parts.size(),
      [&](size_t i) {
        const wire::KeyView& key = request.parts[i].key;
        return std::pair<absl::string_view, uint32_t>(key.tensor, key.partition);
      },
      "push");
}

absl::StatusOr<int> Shard::GroupOf(const PullRequest& request) const {
  return CommonGroup(
      options_.partitioning.num_shards, static_cast<size_t>(request.parts_size()),
      [&](size_t i) {
        const PartitionKey& key = request.parts(static_cast<int>(i));
        return std::pair<absl::string_view, uint32_t>(key.tensor(), key.partition());
      },
      "pull");
}

int Shard::GroupOf(const PartitionKey& key) const {
  return common::ReplicaGroupFor(key.tensor(), key.partition(),
                                 options_.partitioning.num_shards);
}

absl::Status Shard::Push(const wire::PushView& request, PushResponse* response) {
  int group = options_.shard_index;
  if (groups_.size() > 1 && request.sequence != 0) {
    ASSIGN_OR_RETURN(group, GroupOf(request));
  }
  return Push(request, group, response, /*applied=*/nullptr);
}

absl::Status Shard::Push(const wire::PushView& request, int group, PushResponse* response,
                         Applied* applied) {
  response->set_incarnation(incarnation_);
  response->set_duplicate(false);
  RETURN_IF_ERROR(CheckWorker(request.worker));
  RETURN_IF_ERROR(CheckIncarnation(request.shard_incarnation));
  if (request.clock < 0 || request.clock > kMaxClock) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "clock %d is not in [0, %d]", request.clock, kMaxClock));
  }
  const uint64_t sequence = request.sequence;
  if (sequence == 0) {
    RETURN_IF_ERROR(ApplyPush(request, response, applied));
    NotifyProgress();
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(DedupedPush(request, group, response, applied));
  if (!response->duplicate()) NotifyProgress();
  return absl::OkStatus();
}

absl::Status Shard::DedupedPush(const wire::PushView& request, int group,
                                PushResponse* response, Applied* applied) {
  const uint64_t sequence = request.sequence;
  // The worker's log stays locked from the duplicate check until the push
  // is recorded, so a retry arriving meanwhile waits and is then answered
  // as a duplicate. Taken before any partition lock.
  PushLog& log = push_logs_.Of(group, request.worker);
  absl::MutexLock lock(&log.mu());
  // A new worker incarnation starts a new log, but only once its push is
  // applied: a refused push changes nothing.
  ASSIGN_OR_RETURN(const std::optional<int64_t> staleness,
                   log.Find(request.worker_incarnation, sequence));
  if (staleness.has_value()) {
    response->set_duplicate(true);
    response->set_max_staleness(*staleness);
    metrics_->duplicate_pushes().Increment();
    duplicate_pushes_.fetch_add(1, std::memory_order_relaxed);
    VLOG(1) << "push " << sequence << " of worker " << request.worker
            << " is a duplicate; not applied again";
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(ApplyPush(request, response, applied));
  log.Record(request.worker_incarnation, sequence, response->max_staleness());
  return absl::OkStatus();
}

absl::Status Shard::ApplyPush(const wire::PushView& request, PushResponse* response,
                              Applied* applied) {
  common::EnableFlushToZero();  // gRPC threads run the optimizer
  ASSIGN_OR_RETURN(std::vector<DecodedPart> parts, DecodePush(request, store_, options_.limits.max_parts_per_request, metrics_));
  const bool sync = options_.mode == ConsistencyMode::kSync;
  const uint32_t worker = request.worker;

  // All partitions of the request are locked, in id order, for the checks
  // and the update together: either every part is applied or none is. Once
  // the checks have passed, each partition is released as soon as its
  // update is done, so a pull or push of it waits for that update only.
  absl::Status verdict;
  int64_t max_staleness = 0;
  int64_t lost = 0;
  int fast_forwarded = 0;
  {
    std::vector<Partition*> to_lock;
    to_lock.reserve(parts.size());
    for (const DecodedPart& part : parts) to_lock.push_back(part.partition);
    internal::PartitionLocks locks(std::move(to_lock));
    for (DecodedPart& part : parts) {
      part.partition->mu.AssertHeld();  // by `locks`
      verdict = updater_.CheckPart(*part.partition, part, worker);
      if (!verdict.ok()) break;
    }
    if (verdict.ok()) {
      if (applied != nullptr) {
        applied->ops.resize(parts.size());
        applied->partitions.resize(parts.size());
      }
      for (const DecodedPart& part : parts) {
        part.partition->mu.AssertHeld();  // by `locks`
        const int64_t op = part.partition->ops++;
        if (sync) {
          const int64_t part_lost = updater_.AddSyncGradient(*part.partition, part, worker);
          lost += part_lost;
          if (part_lost > 0) ++fast_forwarded;
        } else {
          max_staleness =
              std::max(max_staleness, updater_.ApplyAsyncGradient(*part.partition, part));
        }
        if (applied != nullptr) {
          ReplicatedOp& out = applied->ops[part.request_index];
          out.set_op(op);
          out.set_version_after(part.partition->version.load(std::memory_order_relaxed));
          applied->partitions[part.request_index] = part.partition;
        }
        locks.Release(part.partition);
      }
    }
  }  // unlocks the partitions (all of them if the checks failed)
  TrimDecodeScratch();

  if (!verdict.ok()) {
    if (verdict.code() == absl::StatusCode::kFailedPrecondition) {
      metrics_->dropped("late").Increment(static_cast<double>(parts.size()));
      dropped_gradients_.fetch_add(static_cast<int64_t>(parts.size()));
    }
    return verdict;
  }
  if (lost > 0) {
    metrics_->lost_updates().Increment(static_cast<double>(lost));
    LOG(WARNING) << "shard " << options_.shard_index << ": a push of worker " << worker
                 << " for step " << parts.front().version << " fast-forwarded "
                 << fast_forwarded << " partition(s) restored at an earlier step; "
                 << lost << " update(s) lost";
  }
  metrics_->gradients_received().Increment(static_cast<double>(parts.size()));
  int64_t seen = max_staleness_seen_.load();
  while (max_staleness > seen &&
         !max_staleness_seen_.compare_exchange_weak(seen, max_staleness)) {
  }
  response->set_max_staleness(max_staleness);
  const Membership::UpdateResult update =
      membership_.Update(static_cast<int>(worker), request.worker_incarnation,
                         request.clock, false, absl::Now(), updater_.RejoinStep());
  CountJoin(update.join);
  UpdateMembershipMetrics();
  return absl::OkStatus();
}

}  // namespace shardtrain::server
