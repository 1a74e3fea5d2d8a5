#include "server/shard.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <random>

#include <glog/logging.h>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"
#include "chain/placement.h"
#include "common/float_env.h"
#include "common/initializer.h"
#include "common/status_macros.h"
#include "server/internal/partition_locks.h"
#include "server/partition_record.h"
#include "server/request_checks.h"

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
  // A step's tables are copied as its last partition is: no worker has all
  // of the step's parameters from this shard yet, so none has pushed its
  // table gradients of the next step; and where the workers push a
  // step's table gradients before its dense ones (shardtrain.torch does),
  // all of the step's are in.
  step_snapshot_.SetOnComplete([this](std::vector<CheckpointRecord>* records) {
    tables_.Snapshot(kMaxTableRecordBytes, records);
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

std::vector<int64_t> Shard::WorkerClocks() const { return membership_.Clocks(); }

std::vector<int64_t> Shard::WorkerClockOffsets() const { return membership_.ClockOffsets(); }

void Shard::RestoreWorkerClocks(const std::vector<int64_t>& clocks,
                                const std::vector<int64_t>& offsets) {
  membership_.SeedClocks(clocks, offsets);
  metrics_->RecordMembership(membership_);
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
    return Refuse(metrics_, "max_tensors",
                  absl::ResourceExhaustedError(absl::StrFormat(
                      "registering %d new tensors would make %d on this shard; "
                      "the limit is %d (--max_tensors)",
                      new_tensors, tensors + new_tensors, limits.max_tensors)));
  }
  const int64_t stored = store_.stored_elements();
  if (new_elements > limits.max_stored_elements - stored) {
    return Refuse(metrics_, "max_stored_elements",
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
  RETURN_IF_ERROR(CheckWorker(options_, request.worker()));
  if (request.tensors().empty()) {
    return absl::InvalidArgumentError("register request names no tensors");
  }
  if (request.tensors_size() > options_.limits.max_tensors_per_request) {
    return Refuse(metrics_, "max_tensors_per_request",
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
      if (spec.shape_size() > kMaxTensorDims) return Refuse(metrics_, "max_dims", valid);
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
    metrics_->RecordMembership(membership_, join);
    if (join != Membership::Join::kNone) NotifyProgress();
  } else {
    response->set_worker_clock(membership_.Clock(static_cast<int>(request.worker())));
  }
  // Replicas apply a push's clock as the head forwards it, without counting.
  response->set_counts_clock_parts(options_.replicas <= 1);
  return absl::OkStatus();
}

absl::Status Shard::Push(const PushRequest& request, PushResponse* response) {
  return Push(wire::ViewOf(request), response);
}

absl::Status Shard::Push(const wire::PushView& request, PushResponse* response) {
  int group = options_.shard_index;
  if (groups_.size() > 1 && request.sequence != 0) {
    ASSIGN_OR_RETURN(group, replica_.GroupOf(request));
  }
  return Push(request, group, response, /*applied=*/nullptr);
}

absl::Status Shard::Push(const wire::PushView& request, int group, PushResponse* response,
                         GroupReplica::Applied* applied) {
  response->set_incarnation(incarnation_);
  response->set_duplicate(false);
  RETURN_IF_ERROR(CheckWorker(options_, request.worker));
  RETURN_IF_ERROR(CheckIncarnation(options_, incarnation_, request.shard_incarnation));
  RETURN_IF_ERROR(CheckClock(request.clock, "clock"));
  RETURN_IF_ERROR(CheckClockParts(request.clock_parts));
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
                                PushResponse* response, GroupReplica::Applied* applied) {
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
                              GroupReplica::Applied* applied) {
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
      membership_.UpdateFromPush(static_cast<int>(worker), request.worker_incarnation,
                                 request.clock, request.clock_parts, absl::Now(),
                                 updater_.RejoinStep());
  metrics_->RecordMembership(membership_, update.join);
  return absl::OkStatus();
}

absl::Status Shard::Heartbeat(const HeartbeatRequest& request,
                              HeartbeatResponse* response) {
  response->set_incarnation(incarnation_);
  RETURN_IF_ERROR(CheckWorker(options_, request.worker()));
  RETURN_IF_ERROR(CheckClock(request.clock(), "heartbeat clock"));
  const absl::Time now = absl::Now();
  const Membership::UpdateResult update = membership_.Update(
      static_cast<int>(request.worker()), request.worker_incarnation(),
      request.clock(), request.done(), now, updater_.RejoinStep());
  metrics_->RecordMembership(membership_, update.join);
  for (WorkerState& state : membership_.Snapshot(now)) {
    *response->add_workers() = std::move(state);
  }
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
    if (lead == Lead::kUnasked) lead = replica_.Leads(part->group) ? Lead::kYes : Lead::kNo;
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
  for (size_t slot = 0; slot < groups_.size(); ++slot) {
    if (leads[slot] == Lead::kYes) replica_.Closed(groups_[slot], std::move(closes[slot]));
  }
  return finished;
}

void Shard::Tick(absl::Time now) {
  const Membership::ExpireResult expired = membership_.Expire(now);
  if (expired.silent > 0) {
    metrics_->worker_departures("silent").Increment(expired.silent);
  }
  if (expired.never_joined > 0) {
    metrics_->worker_departures("never_joined").Increment(expired.never_joined);
  }
  metrics_->RecordMembership(membership_);
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
  tables_.Snapshot(kMaxTableRecordBytes, &records);
  return records;
}

absl::Status Shard::Restore(const std::vector<CheckpointRecord>& records) {
  for (const CheckpointRecord& record : records) {
    if (record.has_table()) {
      RETURN_IF_ERROR(tables_.Restore(record));
      continue;
    }
    RETURN_IF_ERROR(LoadPartitionRecord(record, PartitionRecordContents::kModel, "checkpoint",
                                        optimizer_->options().name, /*group=*/-1, &store_)
                        .status());
    updater_.NoteVersion(record.version());
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
