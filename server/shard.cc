#include "server/shard.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_format.h"
#include "common/float_env.h"
#include "common/payload.h"
#include "common/status_macros.h"

namespace shardtrain::server {
namespace {

// Scratch for decoded gradients, reused across requests on each gRPC thread
// so the hot path allocates nothing once warm.
std::vector<std::vector<float>>& GradScratch() {
  thread_local std::vector<std::vector<float>> scratch;
  return scratch;
}

void HashBytes(uint64_t* hash, const void* data, size_t bytes) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) {
    *hash ^= p[i];
    *hash *= 1099511628211ull;
  }
}

void DescribePartition(const Partition& part, PartitionInfo* info) {
  info->set_tensor(part.tensor);
  info->set_partition(static_cast<uint32_t>(part.index));
  info->set_offset(part.range.offset);
  info->set_size(part.range.size);
  info->set_version(part.version.load());
}

}  // namespace

absl::StatusOr<std::unique_ptr<Shard>> Shard::Create(const ShardOptions& options,
                                                     ShardMetrics* metrics) {
  if (options.num_workers < 1 || options.num_workers > 4096) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "num_workers must be in [1, 4096], got %d", options.num_workers));
  }
  if (options.partitioning.num_shards < 1 || options.shard_index < 0 ||
      options.shard_index >= options.partitioning.num_shards) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "shard index %d is not in [0, %d)", options.shard_index,
        options.partitioning.num_shards));
  }
  if (options.partitioning.max_partition_elements < 1) {
    return absl::InvalidArgumentError("max_partition_elements must be >= 1");
  }
  if (options.replicas_to_aggregate < 0 ||
      options.replicas_to_aggregate > options.num_workers) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "replicas_to_aggregate must be in [0, num_workers=%d], got %d",
        options.num_workers, options.replicas_to_aggregate));
  }
  if (metrics == nullptr) return absl::InvalidArgumentError("metrics is null");
  ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> optimizer,
                   Optimizer::Create(options.optimizer));
  return std::unique_ptr<Shard>(new Shard(options, std::move(optimizer), metrics));
}

Shard::Shard(const ShardOptions& options, std::unique_ptr<Optimizer> optimizer,
             ShardMetrics* metrics)
    : options_(options),
      optimizer_(std::move(optimizer)),
      metrics_(metrics),
      store_(options.partitioning, options.shard_index,
             [this] {
               TensorStore::SlotSpec slots;
               slots.count = optimizer_->num_slots();
               for (int s = 0; s < slots.count; ++s) {
                 slots.initial_values.push_back(optimizer_->InitialSlotValue(s));
               }
               return slots;
             }(),
             options.num_workers),
      membership_(options.num_workers, options.heartbeat_timeout),
      start_time_(absl::Now()) {
  store_.SetOnCreate([this](Partition* part) {
    part->version_gauge = &metrics_->PartitionVersion(part->tensor, part->index);
    metrics_->parameters().Increment(static_cast<double>(part->range.size));
    step_snapshot_.AddPartition();  // a step is complete when all are copied
  });
}

void Shard::SetProgressCallback(std::function<void()> callback) {
  absl::MutexLock lock(&callback_mu_);
  progress_callback_ = std::move(callback);
}

void Shard::NotifyProgress() {
  std::function<void()> callback;
  {
    absl::MutexLock lock(&callback_mu_);
    callback = progress_callback_;
  }
  if (callback) callback();
}

absl::Status Shard::CheckWorker(uint32_t worker) const {
  if (worker >= static_cast<uint32_t>(options_.num_workers)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "worker %d is not in [0, %d)", worker, options_.num_workers));
  }
  return absl::OkStatus();
}

absl::Status Shard::Register(const RegisterRequest& request,
                             RegisterResponse* response) {
  if (request.tensors().empty()) {
    return absl::InvalidArgumentError("register request names no tensors");
  }
  std::set<std::string> names;
  for (const TensorSpec& spec : request.tensors()) {
    if (!names.insert(spec.name()).second) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "tensor %s appears twice in one register request", spec.name()));
    }
    RETURN_IF_ERROR(store_.CheckRegistrable(spec));
  }
  for (const TensorSpec& spec : request.tensors()) {
    ASSIGN_OR_RETURN(std::vector<Partition*> parts, store_.Register(spec));
    for (const Partition* part : parts) {
      DescribePartition(*part, response->add_partitions());
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Shard::DecodedPart>> Shard::DecodePush(
    const PushRequest& request) const {
  RETURN_IF_ERROR(CheckWorker(request.worker()));
  if (request.clock() < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("clock %d is negative", request.clock()));
  }
  if (request.parts().empty()) {
    return absl::InvalidArgumentError("push carries no gradients");
  }
  std::vector<std::vector<float>>& scratch = GradScratch();
  if (scratch.size() < static_cast<size_t>(request.parts_size())) {
    scratch.resize(request.parts_size());
  }
  std::vector<DecodedPart> decoded;
  decoded.reserve(request.parts_size());
  for (int i = 0; i < request.parts_size(); ++i) {
    const GradientPart& part = request.parts(i);
    ASSIGN_OR_RETURN(Partition * partition, store_.Find(part.key()));
    if (part.version() < 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s/%d: version %d is negative", partition->tensor, partition->index,
          part.version()));
    }
    // Dense f32 is used where it lies in the request (which outlives the
    // push); other encodings are decoded into scratch.
    const Payload& payload = part.grad();
    const std::string& bytes = payload.data();
    absl::Span<const float> grad;
    absl::Status status;
    if (payload.encoding() == ENCODING_DENSE && payload.dtype() == DTYPE_F32 &&
        payload.indices().empty() &&
        bytes.size() == static_cast<size_t>(partition->range.size) * sizeof(float) &&
        reinterpret_cast<uintptr_t>(bytes.data()) % alignof(float) == 0) {
      grad = absl::MakeConstSpan(reinterpret_cast<const float*>(bytes.data()),
                                 static_cast<size_t>(partition->range.size));
    } else {
      std::vector<float>& buffer = scratch[i];
      buffer.resize(partition->range.size);
      status = common::DecodePayload(payload, absl::MakeSpan(buffer));
      grad = buffer;
    }
    if (status.ok()) status = common::CheckFinite(grad);
    if (!status.ok()) {
      return absl::Status(status.code(),
                          absl::StrFormat("%s/%d: %s", partition->tensor,
                                          partition->index, status.message()));
    }
    decoded.push_back(DecodedPart{partition, part.version(), grad});
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
  return decoded;
}

int Shard::RequiredGradients(int64_t step) const {
  const int replicas = options_.replicas_to_aggregate > 0
                           ? options_.replicas_to_aggregate
                           : options_.num_workers;
  return std::max(1, std::min(replicas, membership_.ContributorsForStep(step)));
}

void Shard::ApplyUpdate(Partition& part, const float* grad, float lr_scale) {
  const int64_t step = part.version.load(std::memory_order_relaxed);
  absl::InlinedVector<float*, 4> slots;
  for (std::vector<float>& slot : part.slots) slots.push_back(slot.data());
  optimizer_->Apply(step, lr_scale, absl::MakeSpan(part.params),
                    absl::MakeConstSpan(grad, part.params.size()), slots);
  part.version.store(step + 1, std::memory_order_release);
  part.version_gauge->Set(static_cast<double>(step + 1));
  metrics_->updates_applied().Increment();
  updates_applied_.fetch_add(1, std::memory_order_relaxed);
}

bool Shard::MaybeFinishStep(Partition& part) {
  const int64_t step = part.version.load(std::memory_order_relaxed);
  if (part.contributions == 0 || part.contributions < RequiredGradients(step)) {
    return false;
  }
  const float inverse = 1.0f / static_cast<float>(part.contributions);
  float* __restrict accum = part.accum.data();
  for (size_t i = 0; i < part.accum.size(); ++i) accum[i] *= inverse;
  ApplyUpdate(part, accum, 1.0f);
  // Coordinated step checkpoints: copy the partition at every N-th step.
  if (step_snapshot_.Due(part.version.load(std::memory_order_relaxed))) {
    step_snapshot_.Capture(part);
  }
  std::fill(part.accum.begin(), part.accum.end(), 0.0f);
  std::fill(part.contributed.begin(), part.contributed.end(), false);
  part.contributions = 0;
  return true;
}

absl::Status Shard::Push(const PushRequest& request, PushResponse* response)
    ABSL_NO_THREAD_SAFETY_ANALYSIS {
  common::EnableFlushToZero();  // gRPC threads run the optimizer
  ASSIGN_OR_RETURN(std::vector<DecodedPart> parts, DecodePush(request));
  const bool sync = options_.mode == ConsistencyMode::kSync;
  const uint32_t worker = request.worker();

  // All partitions of the request are locked, in id order, for the checks
  // and the update together: either every part is applied or none is.
  for (DecodedPart& part : parts) part.partition->mu.Lock();
  absl::Status verdict;
  for (const DecodedPart& part : parts) {
    const Partition& p = *part.partition;
    const int64_t version = p.version.load(std::memory_order_relaxed);
    if (part.version > version) {
      verdict = absl::OutOfRangeError(absl::StrFormat(
          "%s/%d: gradient computed from version %d, but the partition is at "
          "version %d",
          p.tensor, p.index, part.version, version));
      break;
    }
    if (sync && part.version < version) {
      verdict = absl::FailedPreconditionError(absl::StrFormat(
          "%s/%d: step %d is finished (partition at version %d); late "
          "gradient dropped",
          p.tensor, p.index, part.version, version));
      break;
    }
    if (sync && p.contributed[worker]) {
      verdict = absl::AlreadyExistsError(absl::StrFormat(
          "%s/%d: worker %d already pushed a gradient for step %d", p.tensor,
          p.index, worker, part.version));
      break;
    }
  }
  int64_t max_staleness = 0;
  if (verdict.ok()) {
    for (DecodedPart& part : parts) {
      Partition& p = *part.partition;
      const absl::Span<const float> grad = part.grad;
      if (sync) {
        if (p.accum.empty()) p.accum.assign(p.params.size(), 0.0f);
        float* __restrict accum = p.accum.data();
        const float* __restrict g = grad.data();
        for (size_t i = 0; i < grad.size(); ++i) accum[i] += g[i];
        p.contributed[worker] = true;
        ++p.contributions;
        MaybeFinishStep(p);
      } else {
        const int64_t staleness = p.version.load(std::memory_order_relaxed) - part.version;
        max_staleness = std::max(max_staleness, staleness);
        metrics_->staleness().Observe(static_cast<double>(staleness));
        const float lr_scale =
            options_.staleness_aware_lr && staleness > 1
                ? 1.0f / static_cast<float>(staleness)
                : 1.0f;
        ApplyUpdate(p, grad.data(), lr_scale);
      }
    }
  }
  for (auto it = parts.rbegin(); it != parts.rend(); ++it) it->partition->mu.Unlock();

  if (!verdict.ok()) {
    if (verdict.code() == absl::StatusCode::kFailedPrecondition) {
      metrics_->dropped("late").Increment(static_cast<double>(parts.size()));
      dropped_gradients_.fetch_add(static_cast<int64_t>(parts.size()));
    }
    return verdict;
  }
  metrics_->gradients_received().Increment(static_cast<double>(parts.size()));
  int64_t seen = max_staleness_seen_.load();
  while (max_staleness > seen &&
         !max_staleness_seen_.compare_exchange_weak(seen, max_staleness)) {
  }
  response->set_max_staleness(max_staleness);
  membership_.Update(static_cast<int>(worker), request.clock(), false, absl::Now());
  UpdateMembershipMetrics();
  NotifyProgress();
  return absl::OkStatus();
}

absl::Status Shard::ValidatePull(const PullRequest& request) const {
  RETURN_IF_ERROR(CheckWorker(request.worker()));
  if (request.parts().empty()) {
    return absl::InvalidArgumentError("pull names no partitions");
  }
  if (request.dtype() != DTYPE_UNSPECIFIED &&
      common::DTypeSize(request.dtype()) == 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "pull asks for dtype %d; use f32, f16 or bf16", request.dtype()));
  }
  if (request.clock() < 0 || request.min_version() < 0) {
    return absl::InvalidArgumentError("pull clock and min_version must be >= 0");
  }
  for (const PartitionKey& key : request.parts()) {
    ASSIGN_OR_RETURN(Partition * part, store_.Find(key));
    const int64_t version = part->version.load(std::memory_order_acquire);
    if (request.min_version() > version + 1) {
      return absl::OutOfRangeError(absl::StrFormat(
          "%s/%d: min_version %d is more than one step ahead of version %d",
          part->tensor, part->index, request.min_version(), version));
    }
  }
  return absl::OkStatus();
}

bool Shard::PullReady(const PullRequest& request) const {
  if (request.min_version() > 0) {
    for (const PartitionKey& key : request.parts()) {
      absl::StatusOr<Partition*> part = store_.Find(key);
      if (!part.ok()) return true;  // answered with the error by FillPull
      if ((*part)->version.load(std::memory_order_acquire) < request.min_version()) {
        return false;
      }
    }
  }
  if (options_.mode == ConsistencyMode::kAsync && options_.max_staleness >= 0) {
    const std::optional<int64_t> slowest = membership_.SlowestActiveClock();
    if (slowest && request.clock() > *slowest + options_.max_staleness) {
      return false;
    }
  }
  return true;
}

void Shard::FillPull(const PullRequest& request, PullResponse* response) const {
  const DType dtype =
      request.dtype() == DTYPE_UNSPECIFIED ? DTYPE_F32 : request.dtype();
  // Reuse the response's existing part messages and their byte buffers.
  while (response->parts_size() > request.parts_size()) {
    response->mutable_parts()->RemoveLast();
  }
  for (int i = 0; i < request.parts_size(); ++i) {
    const PartitionKey& key = request.parts(i);
    ParameterPart* out =
        i < response->parts_size() ? response->mutable_parts(i) : response->add_parts();
    *out->mutable_key() = key;
    absl::StatusOr<Partition*> found = store_.Find(key);
    if (!found.ok()) continue;  // unreachable after ValidatePull
    const Partition& part = **found;
    Payload* value = out->mutable_value();
    value->set_dtype(dtype);
    value->set_encoding(ENCODING_DENSE);
    absl::ReaderMutexLock lock(&part.mu);
    out->set_version(part.version.load(std::memory_order_relaxed));
    common::EncodeDense(part.params, dtype, value->mutable_data());
  }
}

absl::Status Shard::Heartbeat(const HeartbeatRequest& request,
                              HeartbeatResponse* response) {
  RETURN_IF_ERROR(CheckWorker(request.worker()));
  if (request.clock() < 0) {
    return absl::InvalidArgumentError("heartbeat clock must be >= 0");
  }
  const absl::Time now = absl::Now();
  const bool changed = membership_.Update(static_cast<int>(request.worker()),
                                          request.clock(), request.done(), now);
  for (WorkerState& state : membership_.Snapshot(now)) {
    *response->add_workers() = std::move(state);
  }
  UpdateMembershipMetrics();
  if (changed) {
    if (options_.mode == ConsistencyMode::kSync) Tick(now);
    NotifyProgress();
  }
  return absl::OkStatus();
}

void Shard::Tick(absl::Time now) {
  const bool expired = membership_.Expire(now);
  UpdateMembershipMetrics();
  if (options_.mode != ConsistencyMode::kSync) {
    if (expired) NotifyProgress();
    return;
  }
  // Fewer contributors may complete steps that were waiting on the departed.
  bool finished = false;
  for (Partition* part : store_.All()) {
    absl::MutexLock lock(&part->mu);
    finished = MaybeFinishStep(*part) || finished;
  }
  if (expired || finished) NotifyProgress();
}

void Shard::UpdateMembershipMetrics() {
  metrics_->live_workers().Set(membership_.LiveCount());
  const std::optional<int64_t> slowest = membership_.SlowestActiveClock();
  if (slowest) metrics_->slowest_clock().Set(static_cast<double>(*slowest));
}

void Shard::FillStatus(StatusResponse* response) const {
  const absl::Time now = absl::Now();
  response->set_shard(static_cast<uint32_t>(options_.shard_index));
  response->set_num_shards(static_cast<uint32_t>(options_.partitioning.num_shards));
  response->set_mode(options_.mode == ConsistencyMode::kSync ? "sync" : "async");
  response->set_optimizer(optimizer_->options().name);
  response->set_max_staleness_bound(options_.max_staleness);
  for (const Partition* part : store_.All()) {
    DescribePartition(*part, response->add_partitions());
  }
  for (WorkerState& state : membership_.Snapshot(now)) {
    *response->add_workers() = std::move(state);
  }
  response->set_updates_applied(updates_applied_.load());
  response->set_dropped_gradients(dropped_gradients_.load());
  response->set_max_staleness_seen(max_staleness_seen_.load());
  response->set_uptime_seconds(absl::ToDoubleSeconds(now - start_time_));
}

std::vector<CheckpointRecord> Shard::Snapshot() const {
  std::vector<CheckpointRecord> records;
  for (const Partition* part : store_.All()) {
    CheckpointRecord record;
    *record.mutable_spec() = *part->spec;
    record.set_partition(static_cast<uint32_t>(part->index));
    absl::ReaderMutexLock lock(&part->mu);
    record.set_version(part->version.load());
    common::EncodeDense(part->params, DTYPE_F32, record.mutable_params());
    for (const std::vector<float>& slot : part->slots) {
      common::EncodeDense(slot, DTYPE_F32, record.add_slots());
    }
    records.push_back(std::move(record));
  }
  return records;
}

absl::Status Shard::Restore(const std::vector<CheckpointRecord>& records) {
  for (const CheckpointRecord& record : records) {
    RETURN_IF_ERROR(store_.Register(record.spec()).status());
    PartitionKey key;
    key.set_tensor(record.spec().name());
    key.set_partition(record.partition());
    absl::StatusOr<Partition*> found = store_.Find(key);
    if (!found.ok()) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "checkpoint partition %s/%d does not belong here: %s",
          key.tensor(), key.partition(), found.status().message()));
    }
    Partition& part = **found;
    absl::MutexLock lock(&part.mu);
    if (record.slots_size() != static_cast<int>(part.slots.size())) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "checkpoint of %s/%d has %d optimizer slots; optimizer %s needs %d",
          part.tensor, part.index, record.slots_size(),
          optimizer_->options().name, part.slots.size()));
    }
    RETURN_IF_ERROR(common::DecodeDense(DTYPE_F32, record.params(),
                                        absl::MakeSpan(part.params)));
    for (int s = 0; s < record.slots_size(); ++s) {
      RETURN_IF_ERROR(common::DecodeDense(DTYPE_F32, record.slots(s),
                                          absl::MakeSpan(part.slots[s])));
    }
    part.version.store(record.version());
    part.version_gauge->Set(static_cast<double>(record.version()));
  }
  return absl::OkStatus();
}

std::vector<int64_t> Shard::WorkerClocks() const {
  std::vector<int64_t> clocks(static_cast<size_t>(options_.num_workers), 0);
  for (const WorkerState& state : membership_.Snapshot(absl::Now())) {
    if (state.worker() < clocks.size()) clocks[state.worker()] = state.clock();
  }
  return clocks;
}

void Shard::RestoreWorkerClocks(const std::vector<int64_t>& clocks) {
  const absl::Time now = absl::Now();
  for (size_t w = 0; w < clocks.size() && w < static_cast<size_t>(options_.num_workers); ++w) {
    if (clocks[w] > 0) membership_.Update(static_cast<int>(w), clocks[w], false, now);
  }
}

uint64_t Shard::Checksum() const {
  uint64_t hash = 14695981039346656037ull;
  for (const Partition* part : store_.All()) {
    absl::ReaderMutexLock lock(&part->mu);
    const int64_t version = part->version.load();
    HashBytes(&hash, &version, sizeof(version));
    HashBytes(&hash, part->params.data(), part->params.size() * sizeof(float));
    for (const auto& slot : part->slots) {
      HashBytes(&hash, slot.data(), slot.size() * sizeof(float));
    }
    HashBytes(&hash, part->accum.data(), part->accum.size() * sizeof(float));
    HashBytes(&hash, &part->contributions, sizeof(part->contributions));
  }
  return hash;
}

}  // namespace shardtrain::server
