#include "client/tensor_exchange.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/grpc_status.h"
#include "common/payload.h"

namespace shardtrain::client {

// The reusable messages of one group, and where its answer goes.
struct TensorExchange::Call {
  Group group;
  PushRequest push;
  PushResponse push_response;
  PullRequest pull;
  PullResponse pull_response;
  absl::Span<float> params;  // destination of the pull
};

TensorExchange::TensorExchange(const Options& options,
                               std::vector<ShardChannel*> channels,
                               const std::vector<TensorSpec>& tensors,
                               std::vector<std::vector<Group>> groups,
                               VersionTable* versions, RpcRecorder recorder)
    : options_(options),
      channels_(std::move(channels)),
      calls_(groups.size()),
      versions_(versions),
      recorder_(std::move(recorder)) {
  for (size_t t = 0; t < groups.size(); ++t) {
    for (Group& group : groups[t]) {
      auto call = std::make_unique<Call>();
      call->push.set_worker(options.worker_index);
      call->push.set_worker_incarnation(options.worker_incarnation);
      call->pull.set_worker(options.worker_index);
      call->pull.set_worker_incarnation(options.worker_incarnation);
      call->pull.set_dtype(options.wire_dtype);
      for (const PartitionSlice& slice : group.slices) {
        PartitionKey key;
        key.set_tensor(tensors[t].name());
        key.set_partition(slice.partition);
        GradientPart* part = call->push.add_parts();
        *part->mutable_key() = key;
        part->mutable_grad()->set_dtype(options.wire_dtype);
        part->mutable_grad()->set_encoding(ENCODING_DENSE);
        *call->pull.add_parts() = std::move(key);
      }
      call->group = std::move(group);
      calls_[t].push_back(std::move(call));
    }
  }
  sender_ = std::thread([this] { SendLoop(); });
}

TensorExchange::~TensorExchange() {
  int64_t staleness;
  double wait;
  int64_t version;
  (void)Finish(&staleness, &wait, &version);
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  sender_.join();
}

void TensorExchange::Start(int tensor, int64_t clock, int64_t min_version,
                           absl::Span<const float> grad,
                           GradReady grad_ready,
                           absl::Span<float> params) {
  absl::MutexLock lock(&mu_);
  pending_ += static_cast<int>(calls_[tensor].size());
  queue_.push_back(
      Task{tensor, clock, min_version, grad, std::move(grad_ready), params});
}

void TensorExchange::SendLoop() {
  while (true) {
    Task task;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &TensorExchange::HasWorkOrStopping));
      if (queue_.empty()) return;  // stopping
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    Send(task);
  }
}

bool TensorExchange::HasWorkOrStopping() const {
  return stopping_ || !queue_.empty();
}

void TensorExchange::Send(Task& task) {
  // The gradient may still be on its way from the GPU; the compute thread
  // queues the next layers' backward meanwhile.
  if (task.grad_ready) {
    const absl::Status copied = task.grad_ready();
    if (!copied.ok()) {
      const absl::Status failed(
          copied.code(), absl::StrFormat("copying the gradient of tensor %d: %s",
                                         task.tensor, copied.message()));
      for (size_t i = 0; i < calls_[task.tensor].size(); ++i) Complete(failed);
      return;
    }
  }
  for (std::unique_ptr<Call>& owned : calls_[task.tensor]) {
    Call* call = owned.get();
    call->params = task.params;
    call->push.set_clock(task.clock);
    call->pull.set_clock(task.clock);
    call->pull.set_min_version(task.min_version);
    for (size_t i = 0; i < call->group.slices.size(); ++i) {
      const PartitionSlice& slice = call->group.slices[i];
      GradientPart* part = call->push.mutable_parts(static_cast<int>(i));
      part->set_version((*versions_)[slice.version_index].load());
      const absl::Span<const float> grad = task.grad.subspan(slice.offset, slice.size);
      if (options_.topk != nullptr) {
        options_.topk->Encode(slice.version_index, grad, options_.wire_dtype,
                              part->mutable_grad());
      } else {
        common::EncodeDense(grad, options_.wire_dtype, part->mutable_grad()->mutable_data());
      }
    }
    ShardChannel* channel = channels_[call->group.shard];
    // One sequence number per push, kept by its retries.
    call->push.set_sequence(channel->NextSequence());
    ShardRpc rpc;
    rpc.method = "Push";
    rpc.attempt_timeout = options_.push_timeout;
    rpc.start = [this, call, channel](grpc::ClientContext* context,
                                      uint64_t incarnation, auto done) {
      call->push.set_shard_incarnation(incarnation);
      if (!options_.sync) {
        // After a shard restart the gradient counts as computed from the
        // older of what it was computed from and what the shard has now.
        for (size_t i = 0; i < call->group.slices.size(); ++i) {
          GradientPart* part = call->push.mutable_parts(static_cast<int>(i));
          part->set_version(std::min(
              part->version(),
              (*versions_)[call->group.slices[i].version_index].load()));
        }
      }
      const absl::Time start = absl::Now();
      channel->stub()->async()->Push(
          context, &call->push, &call->push_response,
          [this, call, start, done = std::move(done)](grpc::Status status) {
            recorder_("Push", status, call->push.ByteSizeLong(),
                      call->push_response.ByteSizeLong(), start);
            done(std::move(status));
          });
    };
    channel->Call(std::move(rpc),
                  [this, call](absl::Status status) { OnPushed(call, status); });
  }
}

void TensorExchange::OnPushed(Call* call, const absl::Status& status) {
  if (!status.ok()) {
    Complete(status);
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    max_staleness_ = std::max(max_staleness_, call->push_response.max_staleness());
  }
  if (options_.replay != nullptr) options_.replay->Acked(call->group.shard, &call->push);
  StartPull(call);
}

void TensorExchange::StartPull(Call* call) {
  ShardChannel* channel = channels_[call->group.shard];
  ShardRpc rpc;
  rpc.method = "Pull";
  rpc.attempt_timeout = options_.pull_timeout;
  rpc.start = [this, call, channel](grpc::ClientContext* context,
                                    uint64_t incarnation, auto done) {
    call->pull.set_shard_incarnation(incarnation);
    const absl::Time start = absl::Now();
    channel->stub()->async()->Pull(
        context, &call->pull, &call->pull_response,
        [this, call, start, done = std::move(done)](grpc::Status status) {
          recorder_("Pull", status, call->pull.ByteSizeLong(),
                    call->pull_response.ByteSizeLong(), start);
          done(std::move(status));
        });
  };
  channel->Call(std::move(rpc),
                [this, call](absl::Status status) { OnPulled(call, status); });
}

void TensorExchange::OnPulled(Call* call, const absl::Status& status) {
  if (!status.ok()) {
    Complete(status);
    return;
  }
  const PullResponse& response = call->pull_response;
  if (response.parts_size() != static_cast<int>(call->group.slices.size())) {
    Complete(absl::InternalError(absl::StrFormat(
        "shard %d answered %d partitions for %d asked", call->group.shard,
        response.parts_size(), call->group.slices.size())));
    return;
  }
  int64_t min_version = INT64_MAX;
  for (size_t i = 0; i < call->group.slices.size(); ++i) {
    const PartitionSlice& slice = call->group.slices[i];
    const ParameterPart& part = response.parts(static_cast<int>(i));
    const absl::Status decoded = common::DecodeDense(
        part.value().dtype(), part.value().data(),
        call->params.subspan(slice.offset, slice.size));
    if (!decoded.ok()) {
      Complete(decoded);
      return;
    }
    (*versions_)[slice.version_index].store(part.version());
    min_version = std::min(min_version, part.version());
  }
  if (options_.replay != nullptr) options_.replay->Pulled(call->group.shard, &call->push);
  {
    absl::MutexLock lock(&mu_);
    max_wait_seconds_ = std::max(max_wait_seconds_, response.wait_seconds());
    min_version_ = std::min(min_version_, min_version);
  }
  Complete(absl::OkStatus());
}

void TensorExchange::Complete(const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  // A late gradient (FAILED_PRECONDITION) is recoverable; any other
  // error is reported in its place.
  if (!status.ok() &&
      (first_error_.ok() ||
       (first_error_.code() == absl::StatusCode::kFailedPrecondition &&
        status.code() != absl::StatusCode::kFailedPrecondition))) {
    first_error_ = status;
  }
  --pending_;
}

absl::Status TensorExchange::Finish(int64_t* max_staleness,
                                    double* max_wait_seconds,
                                    int64_t* min_version) {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* pending) { return *pending == 0; }, &pending_));
  *max_staleness = max_staleness_;
  *max_wait_seconds = max_wait_seconds_;
  *min_version = min_version_;
  absl::Status status = first_error_;
  first_error_ = absl::OkStatus();
  max_staleness_ = 0;
  max_wait_seconds_ = 0;
  min_version_ = INT64_MAX;
  return status;
}

}  // namespace shardtrain::client
