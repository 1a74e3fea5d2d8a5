#include "client/tensor_exchange.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/partition.h"

namespace shardtrain::client {

TensorExchange::TensorExchange(std::vector<std::vector<BatchCall*>> batches,
                               VersionTable* versions, absl::Duration release_timeout,
                               std::vector<uint32_t> step_calls_by_shard)
    : batches_(std::move(batches)),
      versions_(versions),
      release_timeout_(release_timeout),
      step_calls_by_shard_(std::move(step_calls_by_shard)) {
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
                           absl::Span<const float> grad, GradReady grad_ready,
                           absl::Span<float> params) {
  absl::MutexLock lock(&mu_);
  pending_ += static_cast<int>(batches_[tensor].size());
  started_.push_back(tensor);
  queue_.push_back(Task{tensor, clock, min_version, grad, std::move(grad_ready), params});
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

bool TensorExchange::HasWorkOrStopping() const { return stopping_ || !queue_.empty(); }

void TensorExchange::Send(Task& task) {
  // The gradient may still be on its way from the GPU; the compute thread
  // queues the next layers' backward meanwhile.
  if (task.grad_ready) {
    const absl::Status copied = task.grad_ready();
    if (!copied.ok()) {
      const absl::Status failed(
          copied.code(), absl::StrFormat("copying the gradient of tensor %d: %s",
                                         task.tensor, copied.message()));
      for (size_t i = 0; i < batches_[task.tensor].size(); ++i) Complete(failed);
      return;
    }
  }
  const auto grad_of = [&task](int) { return task.grad; };
  const auto params_of = [&task](int) { return task.params; };
  for (BatchCall* call : batches_[task.tensor]) {
    // One sequence number per push, kept by its retries.
    call->requests().set_clock_parts(ClockParts(*call));
    call->requests().SetPush(task.clock, call->NextSequence(), grad_of, *versions_);
    call->requests().SetPull(task.clock, task.min_version, params_of);
    call->StartPushPull([this, call](absl::Status status) { OnPushPulled(call, status); });
  }
}

uint32_t TensorExchange::ClockParts(const BatchCall& call) const {
  if (step_calls_by_shard_.empty() || !call.ShardCountsClockParts()) return 0;
  const uint32_t calls = step_calls_by_shard_[call.shard()];
  return calls <= common::kMaxClockParts ? calls : 0;
}

void TensorExchange::OnPushPulled(BatchCall* call, const absl::Status& status) {
  if (status.ok()) {
    absl::MutexLock lock(&mu_);
    max_staleness_ = std::max(max_staleness_, call->push_result().max_staleness);
    max_wait_seconds_ = std::max(max_wait_seconds_, call->pull_result().wait_seconds);
    min_version_ = std::min(min_version_, call->pull_result().min_version);
  }
  Complete(status);
}

void TensorExchange::Complete(const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  KeepFirstError(&first_error_, status);
  --pending_;
}

absl::Status TensorExchange::Finish(int64_t* max_staleness, double* max_wait_seconds,
                                    int64_t* min_version) {
  std::vector<int> started;
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(+[](int* pending) { return *pending == 0; }, &pending_));
    *max_staleness = max_staleness_;
    *max_wait_seconds = max_wait_seconds_;
    *min_version = min_version_;
    status = first_error_;
    first_error_ = absl::OkStatus();
    max_staleness_ = 0;
    max_wait_seconds_ = 0;
    min_version_ = INT64_MAX;
    started.swap(started_);
  }
  // The caller may overwrite the gradients once this returns: gRPC may no
  // longer read them (a PushPull leaves nothing for the sync replay).
  const absl::Time deadline = absl::Now() + release_timeout_;
  for (int tensor : started) {
    for (BatchCall* call : batches_[tensor]) KeepFirstError(&status, call->Release(deadline));
  }
  return status;
}

}  // namespace shardtrain::client
