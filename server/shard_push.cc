// Shard's push path: checking a push as received and applying it
// (server/shard.h).
#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/float_env.h"
#include "common/partition.h"
#include "common/payload.h"
#include "common/status_macros.h"
#include "server/internal/partition_locks.h"
#include "server/shard.h"
#include "wire/payload_pieces.h"

namespace shardtrain::server {
namespace {

// Scratch for decoded gradients, reused across requests on each gRPC thread
// so the hot path allocates nothing once warm.
std::vector<std::vector<float>>& GradScratch() {
  thread_local std::vector<std::vector<float>> scratch;
  return scratch;
}

}  // namespace

absl::Status Shard::Push(const PushRequest& request, PushResponse* response) {
  return Push(wire::ViewOf(request), response);
}

absl::Status Shard::Push(const wire::PushView& request, PushResponse* response) {
  return Push(request, response, nullptr);
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

absl::Status Shard::Push(const wire::PushView& request, PushResponse* response,
                         Applied* applied) {
  int group = options_.shard_index;
  if (groups_.size() > 1 && request.sequence != 0) {
    ASSIGN_OR_RETURN(group, GroupOf(request));
  }
  return Push(request, group, response, applied);
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
  PushLog& log = LogOf(group, request.worker);
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

absl::Status Shard::CheckPart(const Partition& p, DecodedPart& part, uint32_t worker) const {
  const bool sync = options_.mode == ConsistencyMode::kSync;
  const int64_t version = p.version.load(std::memory_order_relaxed);
  if (part.version > version) {
    // A resuming partition catches up (see shard.h): from any step when no
    // gradient is pending; with gradients pending (a step it redoes), only
    // from the next step, which workers one step ahead push.
    if (sync && p.resuming && (p.contributions == 0 || part.version == version + 1)) {
      part.ahead = true;
      return absl::OkStatus();
    }
    return absl::OutOfRangeError(absl::StrFormat(
        "%s/%d: gradient computed from version %d, but the partition is at "
        "version %d",
        p.tensor, p.index, part.version, version));
  }
  if (sync && part.version < version) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s/%d: step %d is finished (partition at version %d); late "
        "gradient dropped",
        p.tensor, p.index, part.version, version));
  }
  if (sync && p.contributed[worker]) {
    return absl::AlreadyExistsError(
        absl::StrFormat("%s/%d: worker %d already pushed a gradient for step %d",
                        p.tensor, p.index, worker, part.version));
  }
  return absl::OkStatus();
}

int64_t Shard::AddSyncGradient(Partition& p, const DecodedPart& part, uint32_t worker,
                               const ReplicatedOp* follow) {
  int64_t lost = 0;
  if (part.ahead) {
    // A restarted shard redoing a step (a worker sent again the gradient it
    // had pushed to the previous incarnation) is overtaken by a worker that
    // had that step's result before the restart: the step is closed with
    // the gradients it has.
    if (p.contributions > 0) MaybeFinishStep(p, /*close=*/true);
    const int64_t now = p.version.load(std::memory_order_relaxed);
    if (part.version > now) {
      p.version.store(part.version, std::memory_order_release);
      NoteVersion(part.version);
      if (p.version_gauge != nullptr) {
        p.version_gauge->Set(static_cast<double>(part.version));
      }
      lost = part.version - now;
    }
  }
  if (p.accum.empty()) p.accum.assign(p.params.size(), 0.0f);
  if (part.dense) {
    wire::AddInto(*part.payload, absl::MakeSpan(p.accum));
  } else {
    float* __restrict accum = p.accum.data();
    const float* __restrict g = part.decoded.data();
    for (size_t i = 0; i < part.decoded.size(); ++i) accum[i] += g[i];
  }
  p.contributed[worker] = true;
  ++p.contributions;
  if (follow == nullptr) {
    MaybeFinishStep(p);
  } else if (follow->version_after() > p.version.load(std::memory_order_relaxed)) {
    MaybeFinishStep(p, /*close=*/true);
  }
  return lost;
}

int64_t Shard::ApplyAsyncGradient(Partition& p, const DecodedPart& part) {
  const int64_t staleness = p.version.load(std::memory_order_relaxed) - part.version;
  metrics_->staleness().Observe(static_cast<double>(staleness));
  const float lr_scale = options_.staleness_aware_lr && staleness > 1
                             ? 1.0f / static_cast<float>(staleness)
                             : 1.0f;
  ApplyUpdate(p, part.dense ? part.payload : nullptr, part.decoded.data(), lr_scale);
  return staleness;
}

namespace {

// Large scratch is not kept past a request that needed it.
void TrimGradScratch() {
  std::vector<std::vector<float>>& scratch = GradScratch();
  size_t scratch_elements = 0;
  for (const std::vector<float>& buffer : scratch) scratch_elements += buffer.capacity();
  if (scratch_elements > (size_t{1} << 24)) scratch = {};
}

}  // namespace

absl::Status Shard::ApplyPush(const wire::PushView& request, PushResponse* response,
                              Applied* applied) {
  common::EnableFlushToZero();  // gRPC threads run the optimizer
  ASSIGN_OR_RETURN(std::vector<DecodedPart> parts, DecodePush(request));
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
      verdict = CheckPart(*part.partition, part, worker);
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
          const int64_t part_lost = AddSyncGradient(*part.partition, part, worker);
          lost += part_lost;
          if (part_lost > 0) ++fast_forwarded;
        } else {
          max_staleness =
              std::max(max_staleness, ApplyAsyncGradient(*part.partition, part));
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
  TrimGradScratch();

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
                         request.clock, false, absl::Now(), RejoinStep());
  CountJoin(update.join);
  UpdateMembershipMetrics();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Shard::DecodedPart>> Shard::DecodePush(
    const wire::PushView& request) const {
  if (request.parts.empty()) {
    return absl::InvalidArgumentError("push carries no gradients");
  }
  const size_t num_parts = request.parts.size();
  if (num_parts > static_cast<size_t>(options_.limits.max_parts_per_request)) {
    return Refuse("max_parts_per_request",
                  absl::ResourceExhaustedError(absl::StrFormat(
                      "push has %d parts; the limit is %d per request "
                      "(--max_parts_per_request)",
                      num_parts, options_.limits.max_parts_per_request)));
  }
  // Every key is looked up and checked for repeats before anything is
  // decoded, so a request naming one partition many times costs nothing.
  std::vector<DecodedPart> decoded;
  decoded.reserve(num_parts);
  int sparse_parts = 0;
  for (size_t i = 0; i < num_parts; ++i) {
    const wire::GradientPartView& part = request.parts[i];
    ASSIGN_OR_RETURN(Partition * partition,
                     store_.Find(part.key.tensor, part.key.partition));
    // Versions count updates, like clocks count steps: bounded, so that no
    // version (a sync fast-forward included) can overflow.
    if (part.version < 0 || part.version > kMaxClock) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s/%d: version %d is not in [0, %d]", partition->tensor,
          partition->index, part.version, kMaxClock));
    }
    DecodedPart& d = decoded.emplace_back();
    d.request_index = i;
    d.partition = partition;
    d.payload = &part.grad;
    d.version = part.version;
    if (part.grad.encoding == ENCODING_SPARSE) ++sparse_parts;
  }
  std::sort(decoded.begin(), decoded.end(),
            [](const DecodedPart& a, const DecodedPart& b) {
              return a.partition->id < b.partition->id;
            });
  for (size_t i = 1; i < decoded.size(); ++i) {
    if (decoded[i].partition == decoded[i - 1].partition) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s/%d appears twice in one push", decoded[i].partition->tensor,
          decoded[i].partition->index));
    }
  }
  // Dense payloads (any dtype) are checked here and applied later straight
  // from the received bytes: one read for the NaN/Inf check, one pass for
  // the update. Sparse ones are decoded into scratch.
  std::vector<std::vector<float>>& scratch = GradScratch();
  if (scratch.size() < static_cast<size_t>(sparse_parts)) scratch.resize(sparse_parts);
  int next_scratch = 0;
  for (DecodedPart& d : decoded) {
    const Partition& partition = *d.partition;
    const wire::PayloadView& payload = *d.payload;
    const size_t size = static_cast<size_t>(partition.range.size);
    absl::Status status;
    if (payload.encoding != ENCODING_SPARSE) {
      d.dense = true;
      status = wire::CheckDense(payload, partition.range.size);
      if (status.ok()) status = wire::CheckFinite(payload);
    } else if (payload.indices.size() / sizeof(uint32_t) > size) {
      // Refused before scratch is sized for it.
      status = absl::InvalidArgumentError(absl::StrFormat(
          "sparse payload names %d elements of a %d-element partition",
          payload.indices.size() / sizeof(uint32_t), size));
    } else {
      std::vector<float>& buffer = scratch[next_scratch++];
      buffer.resize(size);
      status = wire::DecodeInto(payload, absl::MakeSpan(buffer));
      // Checked after decoding: repeated indices add up, and may overflow.
      if (status.ok()) status = common::CheckFinite(buffer);
      d.decoded = buffer;
    }
    if (!status.ok()) {
      return absl::Status(status.code(),
                          absl::StrFormat("%s/%d: %s", partition.tensor,
                                          partition.index, status.message()));
    }
  }
  return decoded;
}

}  // namespace shardtrain::server
