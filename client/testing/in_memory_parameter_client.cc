#include "client/testing/in_memory_parameter_client.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/initializer.h"
#include "common/status_macros.h"

namespace shardtrain::client::testing {

InMemoryParameterClient::InMemoryParameterClient(uint32_t worker, int num_workers,
                                                 float learning_rate)
    : worker_(worker), num_workers_(num_workers), learning_rate_(learning_rate) {
  for (int w = 0; w < num_workers; ++w) {
    WorkerState state;
    state.set_worker(static_cast<uint32_t>(w));
    state.set_live(true);
    workers_.push_back(state);
  }
}

void InMemoryParameterClient::set_sync_mode(bool sync) {
  absl::MutexLock lock(&mu_);
  sync_ = sync;
}

absl::Status InMemoryParameterClient::Register(const std::vector<TensorSpec>& tensors) {
  absl::MutexLock lock(&mu_);
  for (const TensorSpec& spec : tensors) RETURN_IF_ERROR(common::ValidateTensorSpec(spec));
  if (!specs_.empty()) {
    // Registered before: the same tensors keep their state.
    bool same = specs_.size() == tensors.size();
    for (size_t t = 0; same && t < tensors.size(); ++t) {
      same = common::SameTensorSpec(specs_[t], tensors[t]);
    }
    if (!same) {
      return absl::FailedPreconditionError("other tensors are registered already");
    }
  } else {
    for (const TensorSpec& spec : tensors) {
      specs_.push_back(common::WithoutValues(spec));
      values_.emplace_back(common::NumElements(spec));
      common::FillInitialValues(spec, 0, absl::MakeSpan(values_.back()));
      versions_.push_back(0);
    }
  }
  known_ = versions_;
  registered_clock_ = worker_clock_;
  return absl::OkStatus();
}

absl::Status InMemoryParameterClient::CheckSizesLocked(size_t count,
                                                       const std::vector<size_t>& sizes) const {
  if (specs_.empty()) return absl::FailedPreconditionError("Register first");
  if (count != values_.size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%d tensors given, %d registered", count, values_.size()));
  }
  for (size_t t = 0; t < sizes.size(); ++t) {
    if (sizes[t] != values_[t].size()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "tensor %d has %d elements, %d given", t, values_[t].size(), sizes[t]));
    }
  }
  return absl::OkStatus();
}

std::optional<absl::Status> InMemoryParameterClient::TakeFailureLocked(bool* applied) {
  for (int64_t& version : versions_) version += advance_before_push_;
  advance_before_push_ = 0;
  if (!push_failure_.has_value()) return std::nullopt;
  std::optional<absl::Status> status = std::move(push_failure_->first);
  *applied = push_failure_->second;
  push_failure_.reset();
  return status;
}

absl::Status InMemoryParameterClient::CheckPushLocked(int tensor, int64_t clock) const {
  if (!sync_) return absl::OkStatus();
  int64_t version = versions_[tensor];
  // A tensor behind the step this client knows catches up on its push.
  if (version < clock - 1 && known_[tensor] >= clock - 1) version = clock - 1;
  if (version >= clock) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "step %d of %s finished without worker %d (at step %d now)", clock,
        specs_[tensor].name(), worker_, version));
  }
  if (version < clock - 1) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "a push for step %d of %s, which is at step %d", clock, specs_[tensor].name(),
        version));
  }
  return absl::OkStatus();
}

int64_t InMemoryParameterClient::ApplyLocked(int tensor, int64_t clock,
                                             absl::Span<const float> grad,
                                             int64_t computed_at) {
  int64_t& version = versions_[tensor];
  if (sync_) version = std::max(version, clock - 1);  // the catch-up CheckPushLocked allowed
  const int64_t staleness = std::max<int64_t>(0, version - computed_at);
  std::vector<float>& values = values_[tensor];
  for (size_t i = 0; i < values.size(); ++i) values[i] -= learning_rate_ * grad[i];
  ++version;
  ++pushes_applied_;
  WorkerState& me = workers_[worker_];
  me.set_clock(std::max(me.clock(), clock));
  worker_clock_ = std::max(worker_clock_, clock);
  return staleness;
}

absl::Status InMemoryParameterClient::PullTensorLocked(int tensor, int64_t min_version,
                                                       absl::Span<float> params) {
  if (versions_[tensor] < min_version) {
    return absl::DeadlineExceededError(absl::StrFormat(
        "%s is at version %d, below %d, and no other worker is there to move it on",
        specs_[tensor].name(), versions_[tensor], min_version));
  }
  std::copy(values_[tensor].begin(), values_[tensor].end(), params.begin());
  known_[tensor] = versions_[tensor];
  return absl::OkStatus();
}

absl::Status InMemoryParameterClient::Push(int64_t clock,
                                           absl::Span<const absl::Span<const float>> grads,
                                           PushStats* stats) {
  CountRoundTrip();
  return PushOnce(clock, grads, stats);
}

absl::Status InMemoryParameterClient::PushOnce(int64_t clock,
                                               absl::Span<const absl::Span<const float>> grads,
                                               PushStats* stats) {
  absl::MutexLock lock(&mu_);
  std::vector<int64_t> computed_at;
  computed_at.swap(computed_at_);  // for this push only
  if (computed_at.size() != known_.size()) computed_at = known_;
  std::vector<size_t> sizes;
  for (absl::Span<const float> grad : grads) sizes.push_back(grad.size());
  RETURN_IF_ERROR(CheckSizesLocked(grads.size(), sizes));
  bool applied = false;
  const std::optional<absl::Status> failure = TakeFailureLocked(&applied);
  if (failure.has_value() && !applied) return *failure;
  // Checked whole before any tensor changes, as one shard's push is.
  for (size_t t = 0; t < grads.size(); ++t) {
    RETURN_IF_ERROR(CheckPushLocked(static_cast<int>(t), clock));
  }
  stats->max_staleness = 0;
  for (size_t t = 0; t < grads.size(); ++t) {
    stats->max_staleness =
        std::max(stats->max_staleness,
                 ApplyLocked(static_cast<int>(t), clock, grads[t], computed_at[t]));
  }
  return failure.value_or(absl::OkStatus());
}

absl::Status InMemoryParameterClient::Pull(int64_t clock, int64_t min_version,
                                           absl::Span<const absl::Span<float>> params,
                                           PullStats* stats) {
  CountRoundTrip();
  return PullOnce(min_version, params, stats);
}

absl::Status InMemoryParameterClient::PullOnce(int64_t min_version,
                                               absl::Span<const absl::Span<float>> params,
                                               PullStats* stats) {
  absl::MutexLock lock(&mu_);
  std::vector<size_t> sizes;
  for (absl::Span<float> param : params) sizes.push_back(param.size());
  RETURN_IF_ERROR(CheckSizesLocked(params.size(), sizes));
  for (size_t t = 0; t < params.size(); ++t) {
    if (versions_[t] < min_version) {
      return PullTensorLocked(static_cast<int>(t), min_version, params[t]);
    }
  }
  for (size_t t = 0; t < params.size(); ++t) {
    RETURN_IF_ERROR(PullTensorLocked(static_cast<int>(t), min_version, params[t]));
  }
  stats->server_wait_seconds = 0;
  stats->min_version = *std::min_element(versions_.begin(), versions_.end());
  return absl::OkStatus();
}

absl::Status InMemoryParameterClient::PushPull(int64_t clock, int64_t min_version,
                                               absl::Span<const absl::Span<const float>> grads,
                                               absl::Span<const absl::Span<float>> params,
                                               PushStats* push_stats, PullStats* pull_stats) {
  CountRoundTrip();
  RETURN_IF_ERROR(PushOnce(clock, grads, push_stats));
  return PullOnce(min_version, params, pull_stats);
}

void InMemoryParameterClient::CountRoundTrip() {
  absl::MutexLock lock(&mu_);
  ++round_trips_;
}

void InMemoryParameterClient::StartExchange(int tensor, int64_t clock, int64_t min_version,
                                            absl::Span<const float> grad, GradReady grad_ready,
                                            absl::Span<float> params) {
  absl::Status status;
  if (grad_ready) status = grad_ready();
  absl::MutexLock lock(&mu_);
  if (status.ok() && (tensor < 0 || static_cast<size_t>(tensor) >= values_.size() ||
                      grad.size() != values_[tensor].size() ||
                      params.size() != values_[tensor].size())) {
    status = absl::InvalidArgumentError(absl::StrFormat("bad exchange of tensor %d", tensor));
  }
  bool applied = false;
  const std::optional<absl::Status> failure = TakeFailureLocked(&applied);
  if (status.ok() && failure.has_value() && !applied) status = *failure;
  if (status.ok()) status = CheckPushLocked(tensor, clock);
  if (status.ok()) {
    exchange_staleness_ =
        std::max(exchange_staleness_, ApplyLocked(tensor, clock, grad, known_[tensor]));
    if (failure.has_value()) status = *failure;
  }
  if (status.ok()) status = PullTensorLocked(tensor, min_version, params);
  if (exchange_status_.ok()) exchange_status_ = status;
}

absl::Status InMemoryParameterClient::FinishExchanges(PushStats* push_stats,
                                                      PullStats* pull_stats) {
  absl::MutexLock lock(&mu_);
  push_stats->max_staleness = exchange_staleness_;
  pull_stats->server_wait_seconds = 0;
  pull_stats->min_version =
      versions_.empty() ? 0 : *std::min_element(versions_.begin(), versions_.end());
  exchange_staleness_ = 0;
  return std::exchange(exchange_status_, absl::OkStatus());
}

absl::StatusOr<HeartbeatResponse> InMemoryParameterClient::Heartbeat(int64_t clock, bool done,
                                                                   absl::Duration retry_for) {
  (void)retry_for;
  absl::MutexLock lock(&mu_);
  ++heartbeats_;
  WorkerState& me = workers_[worker_];
  me.set_clock(clock);
  me.set_done(done);
  me.set_seen(true);
  worker_clock_ = std::max(worker_clock_, clock);
  HeartbeatResponse response;
  for (const WorkerState& state : workers_) *response.add_workers() = state;
  return response;
}

std::pair<int64_t, int64_t> InMemoryParameterClient::known_versions() const {
  absl::MutexLock lock(&mu_);
  if (known_.empty()) return {0, 0};
  const auto [lo, hi] = std::minmax_element(known_.begin(), known_.end());
  return {*lo, *hi};
}

std::vector<int64_t> InMemoryParameterClient::PulledVersions() const {
  absl::MutexLock lock(&mu_);
  return known_;
}

void InMemoryParameterClient::SetNextPushComputedAt(std::vector<int64_t> versions) {
  absl::MutexLock lock(&mu_);
  computed_at_ = std::move(versions);
}

int64_t InMemoryParameterClient::RaiseKnownVersions(int64_t step) {
  absl::MutexLock lock(&mu_);
  int64_t lost = 0;
  for (int64_t& known : known_) {
    if (known < step) {
      lost += step - known;
      known = step;
    }
  }
  return lost;
}

int64_t InMemoryParameterClient::registered_worker_clock() const {
  absl::MutexLock lock(&mu_);
  return registered_clock_;
}

void InMemoryParameterClient::AdvanceSteps(int64_t steps) {
  absl::MutexLock lock(&mu_);
  for (int64_t& version : versions_) version += steps;
}

void InMemoryParameterClient::AdvanceBeforeNextPush(int64_t steps) {
  absl::MutexLock lock(&mu_);
  advance_before_push_ += steps;
}

void InMemoryParameterClient::SetVersion(int tensor, int64_t version) {
  absl::MutexLock lock(&mu_);
  versions_[tensor] = version;
}

void InMemoryParameterClient::set_worker_clock(int64_t clock) {
  absl::MutexLock lock(&mu_);
  worker_clock_ = clock;
}

void InMemoryParameterClient::SetWorkerState(uint32_t worker, int64_t clock, bool done,
                                             bool live) {
  absl::MutexLock lock(&mu_);
  WorkerState& state = workers_[worker];
  state.set_clock(clock);
  state.set_done(done);
  state.set_live(live);
  state.set_seen(true);
}

void InMemoryParameterClient::FailNextPush(absl::Status status, bool applied) {
  absl::MutexLock lock(&mu_);
  push_failure_.emplace(std::move(status), applied);
}

std::vector<float> InMemoryParameterClient::values(int tensor) const {
  absl::MutexLock lock(&mu_);
  return values_[tensor];
}

int64_t InMemoryParameterClient::version(int tensor) const {
  absl::MutexLock lock(&mu_);
  return versions_[tensor];
}

int64_t InMemoryParameterClient::pushes_applied() const {
  absl::MutexLock lock(&mu_);
  return pushes_applied_;
}

int64_t InMemoryParameterClient::round_trips() const {
  absl::MutexLock lock(&mu_);
  return round_trips_;
}

int64_t InMemoryParameterClient::heartbeats() const {
  absl::MutexLock lock(&mu_);
  return heartbeats_;
}

}  // namespace shardtrain::client::testing
