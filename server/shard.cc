#include "server/shard.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <random>

#include <glog/logging.h>
#include <grpcpp/support/proto_buffer_reader.h>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"
#include "chain/placement.h"
#include "common/initializer.h"
#include "common/payload.h"
#include "common/status_macros.h"
#include "server/partition_record.h"
#include "wire/payload_pieces.h"

namespace shardtrain::server {
namespace {

// Bytes of table rows per checkpoint record.
constexpr int64_t kMaxTableRecordBytes = int64_t{32} << 20;

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

// The replica groups a shard holds: its own, or with replicas > 1 every
// group whose initial chain holds it (common/partition.h).
std::vector<int> GroupsHeld(const ShardOptions& options) {
  if (options.replicas <= 1) return {options.shard_index};
  return chain::InitialGroupsOf(options.shard_index, options.partitioning.num_shards,
                                 options.replicas);
}

uint64_t NewIncarnation() {
  std::random_device random;
  uint64_t id = 0;
  while (id == 0) {
    id = (static_cast<uint64_t>(random()) << 32) ^ static_cast<uint64_t>(random());
  }
  return id;
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
  RETURN_IF_ERROR(
      chain::ValidateReplicas(options.partitioning.num_shards, options.replicas));
  if (options.join_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("join_timeout must be >= 0");
  }
  const ResourceLimits& limits = options.limits;
  if (limits.max_stored_elements < 1 || limits.max_tensors < 1 ||
      limits.max_tensors_per_request < 1 || limits.max_parts_per_request < 1 ||
      limits.max_partition_metrics < 0 || limits.max_response_bytes < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "resource limits must be >= 1 (--max_partition_metrics >= 0): "
        "max_stored_elements=%d max_tensors=%d max_tensors_per_request=%d "
        "max_parts_per_request=%d max_partition_metrics=%d max_response_bytes=%d",
        limits.max_stored_elements, limits.max_tensors,
        limits.max_tensors_per_request, limits.max_parts_per_request,
        limits.max_partition_metrics, limits.max_response_bytes));
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
      incarnation_(NewIncarnation()),
      start_time_(absl::Now()),
      store_(options.partitioning, options.shard_index, GroupsHeld(options),
             [this] {
               TensorStore::SlotSpec slots;
               slots.count = optimizer_->num_slots();
               for (int s = 0; s < slots.count; ++s) {
                 slots.initial_values.push_back(optimizer_->InitialSlotValue(s));
               }
               return slots;
             }(),
             options.num_workers),
      membership_(options.num_workers, options.heartbeat_timeout,
                  options.join_timeout, start_time_),
      groups_(GroupsHeld(options)) {
  store_.SetOnCreate([this](Partition* part) {
    // Per-partition series only for the first partitions: /metrics stays
    // bounded; the min/max gauges cover all.
    if (part->id < options_.limits.max_partition_metrics) {
      part->version_gauge = &metrics_->PartitionVersion(part->tensor, part->index);
    }
    metrics_->parameters().Increment(static_cast<double>(part->range.size));
    step_snapshot_.AddPartition();  // a step is complete when all are copied
  });
  metrics_->expected_workers().Set(options.num_workers);
  metrics_->start_time().Set(absl::ToDoubleSeconds(start_time_ - absl::UnixEpoch()));
  LOG(INFO) << "shard " << options.shard_index << " incarnation " << incarnation_;
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

absl::Status Shard::CheckIncarnation(uint64_t shard_incarnation) const {
  if (shard_incarnation != 0 && shard_incarnation != incarnation_) {
    return absl::AbortedError(absl::StrFormat(
        "shard %d restarted (request names incarnation %d, shard is %d): "
        "re-register",
        options_.shard_index, shard_incarnation, incarnation_));
  }
  return absl::OkStatus();
}

absl::Status Shard::Refuse(const char* limit, absl::Status status) const {
  metrics_->requests_refused(limit).Increment();
  return status;
}

void Shard::CountJoin(Membership::Join join) {
  switch (join) {
    case Membership::Join::kNone:
      break;
    case Membership::Join::kFirst:
      metrics_->worker_joins("first").Increment();
      break;
    case Membership::Join::kRejoin:
      metrics_->worker_joins("rejoin").Increment();
      break;
    case Membership::Join::kRestart:
      metrics_->worker_joins("restart").Increment();
      break;
  }
}

std::vector<int64_t> Shard::WorkerClocks() const { return membership_.Clocks(); }

std::vector<int64_t> Shard::WorkerClockOffsets() const { return membership_.ClockOffsets(); }

void Shard::RestoreWorkerClocks(const std::vector<int64_t>& clocks,
                                const std::vector<int64_t>& offsets) {
  membership_.SeedClocks(clocks, offsets);
  UpdateMembershipMetrics();
}

absl::Status Shard::CheckRegisterLimits(const RegisterRequest& request) const {
  const ResourceLimits& limits = options_.limits;
  int64_t new_tensors = 0;
  int64_t new_elements = 0;  // each tensor has at most 2^32: no overflow
  for (const TensorSpec& spec : request.tensors()) {
    if (store_.Contains(spec.name())) continue;
    ++new_tensors;
    new_elements += store_.LocalElements(spec);
  }
  const int64_t tensors = store_.num_tensors();
  if (new_tensors > limits.max_tensors - tensors) {
    return Refuse("max_tensors",
                  absl::ResourceExhaustedError(absl::StrFormat(
                      "registering %d new tensors would make %d on this shard; "
                      "the limit is %d (--max_tensors)",
                      new_tensors, tensors + new_tensors, limits.max_tensors)));
  }
  const int64_t stored = store_.stored_elements();
  if (new_elements > limits.max_stored_elements - stored) {
    return Refuse("max_stored_elements",
                  absl::ResourceExhaustedError(absl::StrFormat(
                      "registering would add %d elements to the %d this shard "
                      "stores; the limit is %d (--max_stored_elements)",
                      new_elements, stored, limits.max_stored_elements)));
  }
  return absl::OkStatus();
}

absl::Status Shard::CheckInitialValues(const RegisterRequest& request) const {
  for (const TensorSpec& spec : request.tensors()) {
    if (spec.init().kind() != Initializer::KIND_VALUES || store_.Contains(spec.name()) ||
        store_.LocalElements(spec) == 0) {
      continue;
    }
    if (request.worker() != 0) {
      return absl::UnavailableError(absl::StrFormat(
          "waiting for worker 0 to register the initial values of %s (worker %d's "
          "are not used)",
          spec.name(), request.worker()));
    }
    if (spec.values().empty()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "tensor %s has initializer KIND_VALUES but worker 0 sent no values; it "
          "must send all %d of them",
          spec.name(), common::NumElements(spec)));
    }
  }
  return absl::OkStatus();
}

absl::Status Shard::Register(const RegisterRequest& request,
                             RegisterResponse* response) {
  response->set_incarnation(incarnation_);
  if (request.num_workers() != 0 &&
      request.num_workers() != static_cast<uint32_t>(options_.num_workers)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "worker %d was started with --num_workers=%d but shard %d has "
        "--num_workers=%d; start every process of the job with the same value",
        request.worker(), request.num_workers(), options_.shard_index,
        options_.num_workers));
  }
  RETURN_IF_ERROR(CheckWorker(request.worker()));
  if (request.tensors().empty()) {
    return absl::InvalidArgumentError("register request names no tensors");
  }
  if (request.tensors_size() > options_.limits.max_tensors_per_request) {
    return Refuse("max_tensors_per_request",
                  absl::ResourceExhaustedError(absl::StrFormat(
                      "register request has %d tensors; the limit is %d per "
                      "request (--max_tensors_per_request)",
                      request.tensors_size(),
                      options_.limits.max_tensors_per_request)));
  }
  absl::flat_hash_set<absl::string_view> names;
  names.reserve(request.tensors_size());
  for (const TensorSpec& spec : request.tensors()) {
    if (!names.insert(spec.name()).second) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "tensor %s appears twice in one register request", spec.name()));
    }
    absl::Status valid = store_.CheckRegistrable(spec);
    if (!valid.ok()) {
      if (spec.shape_size() > kMaxTensorDims) return Refuse("max_dims", valid);
      return valid;
    }
  }
  {
    absl::MutexLock lock(&register_mu_);
    RETURN_IF_ERROR(CheckRegisterLimits(request));
    RETURN_IF_ERROR(CheckInitialValues(request));
    for (const TensorSpec& spec : request.tensors()) {
      ASSIGN_OR_RETURN(std::vector<Partition*> parts, store_.Register(spec));
      for (const Partition* part : parts) {
        DescribePartition(*part, response->add_partitions());
      }
    }
  }
  if (request.worker_incarnation() != 0) {
    Membership::Join join = Membership::Join::kNone;
    response->set_worker_clock(membership_.Register(
        static_cast<int>(request.worker()), request.worker_incarnation(),
        absl::Now(), &join, updater_.RejoinStep()));
    CountJoin(join);
    UpdateMembershipMetrics();
    if (join != Membership::Join::kNone) NotifyProgress();
  } else {
    response->set_worker_clock(membership_.Clock(static_cast<int>(request.worker())));
  }
  return absl::OkStatus();
}

absl::Status Shard::ValidatePull(const PullRequest& request) const {
  RETURN_IF_ERROR(CheckWorker(request.worker()));
  RETURN_IF_ERROR(CheckIncarnation(request.shard_incarnation()));
  if (request.parts().empty()) {
    return absl::InvalidArgumentError("pull names no partitions");
  }
  if (request.parts_size() > options_.limits.max_parts_per_request) {
    return Refuse("max_parts_per_request",
                  absl::ResourceExhaustedError(absl::StrFormat(
                      "pull names %d parts; the limit is %d per request "
                      "(--max_parts_per_request)",
                      request.parts_size(), options_.limits.max_parts_per_request)));
  }
  if (request.dtype() != DTYPE_UNSPECIFIED &&
      common::DTypeSize(request.dtype()) == 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "pull asks for dtype %d; use f32, f16 or bf16", request.dtype()));
  }
  if (request.clock() < 0 || request.clock() > kMaxClock ||
      request.min_version() < 0 || request.min_version() > kMaxClock) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "pull clock and min_version must be in [0, %d]", kMaxClock));
  }
  const int64_t width = common::DTypeSize(common::PayloadDType(request.dtype()));
  std::vector<const Partition*> found;
  found.reserve(request.parts_size());
  int64_t response_bytes = 0;
  for (const PartitionKey& key : request.parts()) {
    ASSIGN_OR_RETURN(Partition * part, store_.Find(key));
    found.push_back(part);
    // Payload plus a generous allowance for the key and framing.
    response_bytes += part->range.size * width +
                      static_cast<int64_t>(key.tensor().size()) + 64;
    const int64_t version = part->version.load(std::memory_order_acquire);
    if (request.min_version() > version + 1) {
      return absl::OutOfRangeError(absl::StrFormat(
          "%s/%d: min_version %d is more than one step ahead of version %d",
          part->tensor, part->index, request.min_version(), version));
    }
  }
  std::sort(found.begin(), found.end(),
            [](const Partition* a, const Partition* b) { return a->id < b->id; });
  for (size_t i = 1; i < found.size(); ++i) {
    if (found[i] == found[i - 1]) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s/%d appears twice in one pull", found[i]->tensor, found[i]->index));
    }
  }
  if (response_bytes > options_.limits.max_response_bytes) {
    return Refuse("max_response_bytes",
                  absl::ResourceExhaustedError(absl::StrFormat(
                      "pull asks for about %d bytes of parameters; a response "
                      "may have at most %d (--max_message_mb): pull fewer "
                      "partitions at a time",
                      response_bytes, options_.limits.max_response_bytes)));
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
    // Both on the bound's scale: a worker back after being dropped counts
    // from where the others were (see Membership). slowest <= 2 * kMaxClock;
    // the sum saturates instead of overflowing.
    if (slowest && options_.max_staleness <=
                       std::numeric_limits<int64_t>::max() - *slowest &&
        membership_.StalenessClock(static_cast<int>(request.worker()),
                                   request.clock()) >
            *slowest + options_.max_staleness) {
      return false;
    }
  }
  return true;
}

void Shard::FillPull(const PullRequest& request, wire::PullResponseBuilder* builder,
                     std::vector<int64_t>* versions) const {
  if (versions != nullptr) versions->assign(request.parts_size(), 0);
  int index = 0;
  const DType dtype = common::PayloadDType(request.dtype());
  const size_t width = static_cast<size_t>(common::DTypeSize(dtype));
  for (const PartitionKey& key : request.parts()) {
    absl::StatusOr<Partition*> found = store_.Find(key);
    if (!found.ok()) continue;  // unreachable after ValidatePull
    const Partition& part = **found;
    absl::ReaderMutexLock lock(&part.mu);
    const int64_t version = part.version.load(std::memory_order_relaxed);
    if (versions != nullptr) (*versions)[index] = version;
    ++index;
    char* out = builder->AddPart(key.tensor(), key.partition(), version, dtype,
                                 part.params.size() * width);
    wire::EncodeElements(part.params, dtype, out);
  }
}

bool Shard::PullCommitted(const PullRequest& request,
                          absl::Span<const int64_t> versions) const {
  for (int i = 0; i < request.parts_size(); ++i) {
    absl::StatusOr<Partition*> found = store_.Find(request.parts(i));
    if (!found.ok()) continue;  // unreachable after ValidatePull
    const int64_t wrote = static_cast<size_t>(i) < versions.size() ? versions[i] : 0;
    if ((*found)->committed.load(std::memory_order_acquire) < wrote) return false;
  }
  return true;
}

void Shard::MarkCommitted(const Applied& applied, bool wake) {
  for (size_t i = 0; i < applied.ops.size(); ++i) {
    const ReplicatedOp& op = applied.ops[i];
    Partition* part = i < applied.partitions.size() ? applied.partitions[i] : nullptr;
    if (part == nullptr && op.has_close()) {
      absl::StatusOr<Partition*> found = store_.Find(op.close());
      if (found.ok()) part = *found;
    }
    if (part == nullptr) continue;
    int64_t seen = part->committed.load(std::memory_order_relaxed);
    while (op.version_after() > seen &&
           !part->committed.compare_exchange_weak(seen, op.version_after(),
                                                  std::memory_order_acq_rel)) {
    }
  }
  if (wake) NotifyProgress();
}

void Shard::CommitGroup(int group) {
  bool changed = false;
  for (Partition* part : store_.All()) {
    if (part->group != group) continue;
    const int64_t version = part->version.load(std::memory_order_acquire);
    int64_t seen = part->committed.load(std::memory_order_relaxed);
    while (version > seen &&
           !part->committed.compare_exchange_weak(seen, version, std::memory_order_acq_rel)) {
    }
    changed = changed || version > seen;
  }
  if (changed) NotifyProgress();
}

void Shard::FillPull(const PullRequest& request, PullResponse* response) const {
  wire::PullResponseBuilder builder;
  FillPull(request, &builder);
  grpc::ByteBuffer buffer;
  builder.Finish(/*wait_seconds=*/0, incarnation_, &buffer);
  grpc::ProtoBufferReader reader(&buffer);
  // The encoder writes valid protobuf; a failure here is a broken invariant.
  CHECK(response->ParseFromZeroCopyStream(&reader)) << "pull response does not parse";
}

absl::Status Shard::Heartbeat(const HeartbeatRequest& request,
                              HeartbeatResponse* response) {
  response->set_incarnation(incarnation_);
  RETURN_IF_ERROR(CheckWorker(request.worker()));
  if (request.clock() < 0 || request.clock() > kMaxClock) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "heartbeat clock %d is not in [0, %d]", request.clock(), kMaxClock));
  }
  const absl::Time now = absl::Now();
  const Membership::UpdateResult update = membership_.Update(
      static_cast<int>(request.worker()), request.worker_incarnation(),
      request.clock(), request.done(), now, updater_.RejoinStep());
  CountJoin(update.join);
  for (WorkerState& state : membership_.Snapshot(now)) {
    *response->add_workers() = std::move(state);
  }
  UpdateMembershipMetrics();
  if (update.changed) {
    if (options_.mode == ConsistencyMode::kSync) Tick(now);
    NotifyProgress();
  }
  return absl::OkStatus();
}

void Shard::NotePull(const PullRequest& request) {
  if (options_.mode != ConsistencyMode::kSync || request.min_version() <= 0) return;
  if (!membership_.RaiseCountsFrom(static_cast<int>(request.worker()),
                                   request.min_version())) {
    return;
  }
  if (FinishSteps()) NotifyProgress();
}

bool Shard::FinishSteps() {
  bool finished = false;
  std::vector<std::vector<ReplicatedOp>> closes(groups_.size());
  // Asked once per group: a true is answered by one on_closed call below.
  enum class Lead : uint8_t { kUnasked, kYes, kNo };
  std::vector<Lead> leads(groups_.size(), Lead::kUnasked);
  for (Partition* part : store_.All()) {
    Lead& lead = leads[push_logs_.SlotOf(part->group)];
    if (lead == Lead::kUnasked) lead = Leads(part->group) ? Lead::kYes : Lead::kNo;
    if (lead == Lead::kNo) continue;  // followers close steps as told
    absl::MutexLock lock(&part->mu);
    const int64_t op = part->ops;
    if (!updater_.MaybeFinishStep(*part)) continue;
    finished = true;
    ++part->ops;
    ReplicatedOp& close = closes[push_logs_.SlotOf(part->group)].emplace_back();
    close.set_op(op);
    close.set_version_after(part->version.load(std::memory_order_relaxed));
    close.mutable_close()->set_tensor(part->tensor);
    close.mutable_close()->set_partition(static_cast<uint32_t>(part->index));
  }
  std::function<void(int, std::vector<ReplicatedOp>)> on_closed;
  {
    absl::MutexLock lock(&hooks_mu_);
    on_closed = hooks_.on_closed;
  }
  if (on_closed) {
    for (size_t slot = 0; slot < groups_.size(); ++slot) {
      if (leads[slot] == Lead::kYes) on_closed(groups_[slot], std::move(closes[slot]));
    }
  }
  return finished;
}

void Shard::SetReplicationHooks(ReplicationHooks hooks) {
  absl::MutexLock lock(&hooks_mu_);
  hooks_ = std::move(hooks);
}

bool Shard::Leads(int group) const {
  std::function<bool(int)> leads;
  {
    absl::MutexLock lock(&hooks_mu_);
    if (!hooks_.leads) return true;
    leads = hooks_.leads;
  }
  return leads(group);
}

void Shard::Tick(absl::Time now) {
  const Membership::ExpireResult expired = membership_.Expire(now);
  if (expired.silent > 0) {
    metrics_->worker_departures("silent").Increment(expired.silent);
  }
  if (expired.never_joined > 0) {
    metrics_->worker_departures("never_joined").Increment(expired.never_joined);
  }
  UpdateMembershipMetrics();
  const bool sync = options_.mode == ConsistencyMode::kSync;
  // Fewer contributors may complete steps that were waiting on the departed.
  const bool finished = sync && FinishSteps();
  int64_t min_version = std::numeric_limits<int64_t>::max();
  int64_t max_version = 0;
  const std::vector<Partition*> all = store_.All();
  for (Partition* part : all) {
    const int64_t version = part->version.load(std::memory_order_acquire);
    min_version = std::min(min_version, version);
    max_version = std::max(max_version, version);
  }
  if (!all.empty()) {
    metrics_->partition_version_min().Set(static_cast<double>(min_version));
    metrics_->partition_version_max().Set(static_cast<double>(max_version));
  }
  if (expired.any() || finished) NotifyProgress();
}

void Shard::UpdateMembershipMetrics() {
  metrics_->live_workers().Set(membership_.LiveCount());
  const std::optional<int64_t> slowest = membership_.SlowestActiveClock();
  if (slowest) metrics_->slowest_clock().Set(static_cast<double>(*slowest));
}

void Shard::FillStatus(const StatusRequest& request,
                       StatusResponse* response) const {
  const absl::Time now = absl::Now();
  response->set_shard(static_cast<uint32_t>(options_.shard_index));
  response->set_num_shards(static_cast<uint32_t>(options_.partitioning.num_shards));
  response->set_mode(options_.mode == ConsistencyMode::kSync ? "sync" : "async");
  response->set_optimizer(optimizer_->options().name);
  response->set_max_staleness_bound(options_.max_staleness);
  response->set_incarnation(incarnation_);
  response->set_num_workers(static_cast<uint32_t>(options_.num_workers));
  const size_t max_listed =
      request.max_partitions() == 0 ? 100 : request.max_partitions();
  const std::vector<Partition*> all = store_.All();
  int64_t elements = 0;
  int64_t min_version = 0;
  int64_t max_version = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    const Partition& part = *all[i];
    const int64_t version = part.version.load(std::memory_order_acquire);
    min_version = i == 0 ? version : std::min(min_version, version);
    max_version = std::max(max_version, version);
    elements += part.range.size;
    if (i < max_listed) DescribePartition(part, response->add_partitions());
  }
  response->set_num_tensors(store_.num_tensors());
  response->set_num_partitions(static_cast<int64_t>(all.size()));
  response->set_stored_elements(elements);
  response->set_min_version(min_version);
  response->set_max_version(max_version);
  response->set_partitions_truncated(all.size() > max_listed);
  for (WorkerState& state : membership_.Snapshot(now)) {
    *response->add_workers() = std::move(state);
  }
  response->set_updates_applied(updater_.updates_applied());
  response->set_dropped_gradients(dropped_gradients_.load());
  response->set_max_staleness_seen(max_staleness_seen_.load());
  response->set_uptime_seconds(absl::ToDoubleSeconds(now - start_time_));
  response->set_duplicate_pushes(duplicate_pushes_.load());
}

std::vector<CheckpointRecord> Shard::Snapshot() const {
  std::vector<CheckpointRecord> records;
  for (const Partition* part : store_.All()) {
    absl::ReaderMutexLock lock(&part->mu);
    WritePartitionRecord(*part, PartitionRecordContents::kModel, &records.emplace_back());
  }
  SnapshotTables(&records);
  return records;
}

void Shard::SnapshotTables(std::vector<CheckpointRecord>* records) const {
  tables_.Snapshot(kMaxTableRecordBytes, records);
}

absl::Status Shard::Restore(const std::vector<CheckpointRecord>& records) {
  for (const CheckpointRecord& record : records) {
    if (record.has_table()) {
      RETURN_IF_ERROR(tables_.Restore(record));
      continue;
    }
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
    RETURN_IF_ERROR(ReadPartitionRecord(record, PartitionRecordContents::kModel, "checkpoint",
                                        optimizer_->options().name, part));
    part.version.store(record.version());
    part.committed.store(record.version(), std::memory_order_release);
    updater_.NoteVersion(record.version());
    part.resuming = true;
    if (part.version_gauge != nullptr) {
      part.version_gauge->Set(static_cast<double>(record.version()));
    }
  }
  return absl::OkStatus();
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
