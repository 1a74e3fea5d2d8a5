#include "server/partition_updater.h"

#include <algorithm>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_format.h"
#include "wire/payload_pieces.h"

namespace shardtrain::server {

PartitionUpdater::PartitionUpdater(const ShardOptions& options, const Optimizer* optimizer,
                                   const Membership* membership, ShardMetrics* metrics,
                                   StepSnapshot* step_snapshot)
    : options_(options),
      optimizer_(optimizer),
      membership_(membership),
      metrics_(metrics),
      step_snapshot_(step_snapshot) {}

int PartitionUpdater::RequiredGradients(const Partition& part) const {
  const int replicas = options_.replicas_to_aggregate > 0
                           ? options_.replicas_to_aggregate
                           : options_.num_workers;
  const int64_t step = part.version.load(std::memory_order_relaxed);
  return std::max(
      1, std::min(replicas, membership_->ContributorsForStep(step, part.contributed)));
}

void PartitionUpdater::NoteVersion(int64_t version) {
  int64_t seen = max_version_.load();
  while (version > seen && !max_version_.compare_exchange_weak(seen, version)) {
  }
}

void PartitionUpdater::ApplyUpdate(Partition& part, const wire::PayloadView* dense,
                        const float* grad, float lr_scale) {
  const int64_t step = part.version.load(std::memory_order_relaxed);
  absl::InlinedVector<float*, Optimizer::kMaxSlots> slots;
  for (std::vector<float>& slot : part.slots) slots.push_back(slot.data());
  if (dense != nullptr) {
    optimizer_->ApplyPayload(step, lr_scale, *dense, absl::MakeSpan(part.params), slots);
  } else {
    optimizer_->Apply(step, lr_scale, absl::MakeSpan(part.params),
                      absl::MakeConstSpan(grad, part.params.size()), slots);
  }
  part.version.store(step + 1, std::memory_order_release);
  NoteVersion(step + 1);
  if (part.version_gauge != nullptr) {
    part.version_gauge->Set(static_cast<double>(step + 1));
  }
  metrics_->updates_applied().Increment();
  updates_applied_.fetch_add(1, std::memory_order_relaxed);
}

bool PartitionUpdater::MaybeFinishStep(Partition& part, bool close) {
  if (part.contributions == 0 ||
      (!close && part.contributions < RequiredGradients(part))) {
    return false;
  }
  const float inverse = 1.0f / static_cast<float>(part.contributions);
  float* __restrict accum = part.accum.data();
  for (size_t i = 0; i < part.accum.size(); ++i) accum[i] *= inverse;
  ApplyUpdate(part, /*dense=*/nullptr, accum, 1.0f);
  // Coordinated step checkpoints: copy the partition at every N-th step.
  if (step_snapshot_->Due(part.version.load(std::memory_order_relaxed))) {
    step_snapshot_->Capture(part);
  }
  std::fill(part.accum.begin(), part.accum.end(), 0.0f);
  std::fill(part.contributed.begin(), part.contributed.end(), false);
  part.contributions = 0;
  part.resuming = false;
  return true;
}

absl::Status PartitionUpdater::CheckPart(const Partition& p, DecodedPart& part, uint32_t worker) const {
  const bool sync = options_.mode == ConsistencyMode::kSync;
  const int64_t version = p.version.load(std::memory_order_relaxed);
  if (part.version > version) {
    // A resuming partition catches up (see the file comment): from any step when no
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

int64_t PartitionUpdater::AddSyncGradient(Partition& p, const DecodedPart& part, uint32_t worker,
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

int64_t PartitionUpdater::ApplyAsyncGradient(Partition& p, const DecodedPart& part) {
  const int64_t staleness = p.version.load(std::memory_order_relaxed) - part.version;
  metrics_->staleness().Observe(static_cast<double>(staleness));
  const float lr_scale = options_.staleness_aware_lr && staleness > 1
                             ? 1.0f / static_cast<float>(staleness)
                             : 1.0f;
  ApplyUpdate(p, part.dense ? part.payload : nullptr, part.decoded.data(), lr_scale);
  return staleness;
}

}  // namespace shardtrain::server
