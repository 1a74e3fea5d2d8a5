#include "client/shard_channel.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include <glog/logging.h>
#include <grpcpp/alarm.h>

#include "absl/random/distributions.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "common/grpc_status.h"
#include "common/reconnect.h"
#include "wire/frame_listener.h"

namespace shardtrain::client {

absl::Duration BackoffCeiling(const RetryPolicy& policy, int retry) {
  absl::Duration ceiling = policy.initial_backoff;
  for (int r = 0; r < retry && ceiling < policy.max_backoff; ++r) ceiling *= 2;
  return std::min(ceiling, policy.max_backoff);
}

absl::Duration Backoff(const RetryPolicy& policy, int retry, absl::BitGenRef gen) {
  const int64_t ceiling_us = absl::ToInt64Microseconds(BackoffCeiling(policy, retry));
  if (ceiling_us <= 0) return absl::ZeroDuration();
  return absl::Microseconds(absl::Uniform<int64_t>(absl::IntervalClosed, gen, 0, ceiling_us));
}

absl::Time AttemptDeadline(absl::Time now, absl::Duration attempt_timeout,
                           absl::Time first_failure, absl::Duration reconnect_timeout) {
  const absl::Time deadline = now + attempt_timeout;
  if (first_failure == absl::InfinitePast()) return deadline;
  return std::min(deadline, first_failure + reconnect_timeout);
}

bool IsRetryable(const grpc::Status& status) {
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return true;
    case grpc::StatusCode::UNKNOWN:
    case grpc::StatusCode::INTERNAL: {
      // A peer that went away mid-call can surface as a reset stream.
      const std::string& message = status.error_message();
      return absl::StrContains(message, "Stream removed") ||
             absl::StrContains(message, "Socket closed") ||
             absl::StrContains(message, "Connection reset") ||
             absl::StrContains(message, "Broken pipe");
    }
    default:
      return false;
  }
}

bool IsChainRefusal(const grpc::Status& status) {
  if (status.error_code() != grpc::StatusCode::UNAVAILABLE) return false;
  const std::string& message = status.error_message();
  return absl::StartsWith(message, "stale chain epoch") ||
         absl::StartsWith(message, "not serving group");
}

// A refusal that ends within milliseconds: the shard has not read the
// chain's newest epoch from etcd yet, or a head is handing its place over
// (the new chain follows at once).
bool IsMomentaryRefusal(const grpc::Status& status) {
  if (!IsChainRefusal(status)) return false;
  const std::string& message = status.error_message();
  return absl::StrContains(message, "behind the request's") ||
         absl::StrContains(message, "handing its head over");
}

// The wait before the n-th retry of momentary refusals in a row.
constexpr absl::Duration kMomentaryRetry = absl::Milliseconds(5);
// How long a routed attempt waits for a connection it restarted.
constexpr absl::Duration kReconnectWait = absl::Milliseconds(50);
// How often a routed call waiting out a backoff looks for a newer chain.
constexpr absl::Duration kRoutePoll = absl::Milliseconds(20);

struct ShardChannel::PendingCall {
  ShardRpc rpc;
  std::function<void(absl::Status)> done;
  absl::Duration reconnect_timeout;
  // Shared with AbandonDeparted, which may cancel them outside the lock:
  // the attempt's context, and its data-port call if it went there.
  std::shared_ptr<grpc::ClientContext> context;
  std::shared_ptr<wire::AttemptCancel> cancel;
  // Fires the next attempt after a backoff; kept until the call ends.
  std::unique_ptr<grpc::Alarm> alarm;
  absl::Time first_failure = absl::InfinitePast();
  int retries = 0;
  uint64_t sent_incarnation = 0;
  uint64_t sent_epoch = 0;  // routed: the chain epoch of the last attempt
  int momentary_retries = 0;  // IsMomentaryRefusal retries in a row
  absl::Time retry_at;        // the end of the backoff being waited out
  // Routed by the chain of the channel's replica group (ShardRpc::role).
  bool routed = false;
  // The shard the last attempt went to; null when a routed attempt found
  // no chain configuration.
  ShardChannel* target = nullptr;
  grpc::Status last_error;
  // Set by AbandonDeparted (under the channel's mu_) while the attempt is
  // in flight: its target left the chain; the CANCELLED it ends with is
  // retried on the new chain.
  bool abandoned = false;
};

ShardChannel::ShardChannel(int index, std::string address,
                           std::vector<std::shared_ptr<grpc::Channel>> connections,
                           const RetryPolicy& policy, PsClientMetrics* metrics)
    : index_(index),
      address_(std::move(address)),
      connections_(std::move(connections)),
      stub_(ParameterServer::NewStub(connections_.at(0))),
      policy_(policy),
      metrics_(metrics) {
  for (const std::shared_ptr<grpc::Channel>& connection : connections_) {
    generic_.push_back(std::make_unique<grpc::GenericStub>(connection));
  }
}

void ShardChannel::EnableFrames(uint64_t max_message_bytes,
                                std::shared_ptr<const wire::TlsContext> tls) {
  const std::optional<std::string> host = wire::DataPortHost(address_);
  if (!host) return;  // the data path stays on gRPC
  for (size_t c = 0; c < connections_.size(); ++c) {
    frames_.push_back(std::make_unique<wire::FrameChannel>(*host, 0, max_message_bytes,
                                                           absl::Seconds(5), tls));
  }
}

void ShardChannel::set_data_port(int port) {
  if (frames_.empty() || data_port_.exchange(port) == port) return;
  for (const auto& frames : frames_) frames->set_port(port);
}

wire::FrameChannel* ShardChannel::frames(int connection) {
  if (frames_.empty() || data_port_.load() == 0) return nullptr;
  if (absl::GetCurrentTimeNanos() < frames_paused_until_ns_.load()) return nullptr;
  return frames_[connection].get();
}

void ShardChannel::FramesUnreachable() {
  const int64_t until = absl::GetCurrentTimeNanos() + absl::ToInt64Nanoseconds(kFramesPause);
  if (frames_paused_until_ns_.exchange(until) < absl::GetCurrentTimeNanos()) {
    LOG(WARNING) << "shard " << index_ << " (" << address_ << "): its data port "
                 << data_port_.load() << " did not take a call; the data path uses gRPC for "
                 << kFramesPause;
  }
}

void ShardChannel::Call(ShardRpc rpc, std::function<void(absl::Status)> done) {
  auto* call = new PendingCall;
  call->reconnect_timeout = std::min(rpc.reconnect_timeout, policy_.reconnect_timeout);
  call->routed = routes_ != nullptr && rpc.role != ChainRole::kNone;
  call->rpc = std::move(rpc);
  call->done = std::move(done);
  StartAttempt(call);
}

void ShardChannel::StartAttempt(PendingCall* call) {
  call->context = std::make_shared<grpc::ClientContext>();
  // Only a routed attempt is ever abandoned (AbandonDeparted).
  call->cancel = call->routed ? std::make_shared<wire::AttemptCancel>() : nullptr;
  const absl::Time now = absl::Now();
  call->context->set_deadline(absl::ToChronoTime(AttemptDeadline(
      now, call->rpc.attempt_timeout, call->first_failure, call->reconnect_timeout)));
  ShardAttempt attempt;
  attempt.context = call->context.get();
  attempt.cancel = call->cancel;
  if (call->routed) {
    // No shard_incarnation (the chain carries the state across restarts)
    // and no wait_for_ready: a retry must not wait for a dead member to come
    // back when the chain has moved on without it.
    call->sent_incarnation = 0;
    const absl::StatusOr<ChainRoute> route = routes_->Route(index_, call->rpc.role);
    if (!route.ok() || route->shard < 0 ||
        route->shard >= static_cast<int>(peers_.size()) || peers_[route->shard] == nullptr) {
      call->target = nullptr;
      OnAttemptDone(call, grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                       route.ok() ? absl::StrFormat(
                                                        "the chain names shard %d, which "
                                                        "this client does not know",
                                                        route->shard)
                                                  : std::string(route.status().message())));
      return;
    }
    call->target = peers_[route->shard];
    attempt.chain_epoch = route->epoch;
    call->sent_epoch = route->epoch;
    // A member that came back (it rejoined, or got its head back) may
    // still sit in gRPC's reconnect backoff from when it was down: connect
    // now, and let this attempt wait briefly for that instead of failing
    // (briefly: the member may be the one that is down).
    if (call->target->Reconnect()) {
      call->context->set_wait_for_ready(true);
      call->context->set_deadline(absl::ToChronoTime(
          std::min(absl::FromChrono(call->context->deadline()), now + kReconnectWait)));
    }
  } else {
    call->target = this;
    // The first attempt fails fast when the channel is known to be down,
    // so the outage clock starts; retries wait for the reconnect.
    if (call->retries > 0) call->context->set_wait_for_ready(true);
    call->sent_incarnation = incarnation_.load();
  }
  attempt.shard_incarnation = call->sent_incarnation;
  attempt.target = call->target;
  if (call->routed) {
    absl::MutexLock lock(&mu_);
    call->abandoned = false;
    in_flight_.insert(call);
  }
  call->rpc.start(attempt, [this, call](grpc::Status status) {
    OnAttemptDone(call, std::move(status));
  });
}

bool ShardChannel::Reconnect() {
  bool any = false;
  for (const std::shared_ptr<grpc::Channel>& connection : connections_) {
    any = common::ReconnectIfBackingOff(*connection) || any;
  }
  return any;
}

void ShardChannel::Finish(PendingCall* call, absl::Status status) {
  std::function<void(absl::Status)> done = std::move(call->done);
  delete call;
  done(std::move(status));
}

std::string ShardChannel::Describe(const PendingCall& call) const {
  if (!call.routed) {
    return absl::StrFormat("%s to shard %d (%s)", call.rpc.method, index_, address_);
  }
  if (call.target == nullptr) {
    return absl::StrFormat("%s of group %d", call.rpc.method, index_);
  }
  return absl::StrFormat("%s of group %d to shard %d (%s)", call.rpc.method, index_,
                         call.target->index(), call.target->address());
}

int ShardChannel::AbandonDeparted(uint64_t epoch, const std::vector<int>& members) {
  std::vector<std::pair<std::shared_ptr<grpc::ClientContext>, std::shared_ptr<wire::AttemptCancel>>>
      cancel;
  {
    absl::MutexLock lock(&mu_);
    for (PendingCall* call : in_flight_) {
      if (call->abandoned || call->sent_epoch >= epoch || call->target == nullptr ||
          std::find(members.begin(), members.end(), call->target->index()) != members.end()) {
        continue;
      }
      call->abandoned = true;
      cancel.emplace_back(call->context, call->cancel);
    }
  }
  // Outside the lock: the attempt may end (and run OnAttemptDone) at once.
  for (const auto& [context, frames_call] : cancel) {
    context->TryCancel();
    frames_call->Cancel();
  }
  if (!cancel.empty()) {
    LOG(INFO) << "group " << index_ << ": chain epoch " << epoch << " dropped the shard of "
              << cancel.size() << " call(s) in flight; sending them to the new chain";
  }
  return static_cast<int>(cancel.size());
}

void ShardChannel::OnAttemptDone(PendingCall* call, grpc::Status status) {
  ShardChannel* const target = call->target;
  if (call->routed) {
    absl::MutexLock lock(&mu_);
    in_flight_.erase(call);
    if (call->abandoned && status.error_code() == grpc::StatusCode::CANCELLED) {
      status = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                            absl::StrFormat("cancelled: the chain of group %d dropped shard %d "
                                            "while the call waited for it",
                                            index_, target != nullptr ? target->index() : -1));
    }
    call->abandoned = false;
  }
  if (status.ok()) {
    target->NoteAnswer();
    Finish(call, absl::OkStatus());
    return;
  }
  // A routed call never resynchronises: its ABORTED is an answer like any other.
  const bool aborted = !call->routed && status.error_code() == grpc::StatusCode::ABORTED;
  if (!aborted && !IsRetryable(status)) {
    // The shard answered: it is reachable, the request is what failed.
    if (status.error_code() != grpc::StatusCode::CANCELLED && target != nullptr) {
      target->NoteAnswer();
    }
    const absl::Status error = common::FromGrpcStatus(status);
    Finish(call, absl::Status(error.code(), absl::StrFormat("%s: %s", Describe(*call),
                                                            error.message())));
    return;
  }
  const absl::Time now = absl::Now();
  if (call->first_failure == absl::InfinitePast()) call->first_failure = now;
  // An attempt cut short by the end of the retry budget says only "Deadline
  // Exceeded"; the shard's own answer before it (e.g. UNAVAILABLE "waiting
  // for worker 0 ...") says why the call failed.
  if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED &&
      !call->last_error.ok() &&
      call->last_error.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
    status = call->last_error;
  }
  call->last_error = status;
  if (now - call->first_failure >= call->reconnect_timeout) {
    Finish(call, absl::Status(
                     common::FromGrpcStatus(status).code(),
                     absl::StrFormat("%s failed for %s (%d "
                                     "retries, giving up after %s): %s",
                                     Describe(*call),
                                     absl::FormatDuration(absl::Trunc(
                                         now - call->first_failure, absl::Milliseconds(1))),
                                     call->retries,
                                     absl::FormatDuration(call->reconnect_timeout),
                                     status.error_message())));
    return;
  }
  if (metrics_ != nullptr) metrics_->retries(call->rpc.method).Increment();
  if (aborted) {
    RequestResync(call->sent_incarnation, [this, call](absl::Status resynced) {
      if (!resynced.ok()) {
        Finish(call, std::move(resynced));
        return;
      }
      ScheduleRetry(call);
    });
    return;
  }
  if (target != nullptr) {
    if (IsChainRefusal(status)) {
      // The shard is alive; this client's chain configuration was old.
      target->NoteAnswer();
      VLOG(1) << Describe(*call) << " refused: " << status.error_message();
    } else {
      target->NoteFailure(call->rpc.method, status, call->reconnect_timeout);
    }
  }
  Retry(call);
}

void ShardChannel::Retry(PendingCall* call) {
  if (!call->routed) {
    ScheduleRetry(call);
    return;
  }
  // The chain may have changed (a member died or joined, a head handed its
  // place back): the retry goes where the configuration read now says, at
  // once if that is a newer one than the attempt's (no backoff: the chain
  // moved on, nothing is overloaded).
  // A momentary refusal is retried after a few milliseconds, doubling.
  routes_->Refresh(index_, [this, call] {
    const absl::StatusOr<ChainRoute> route = routes_->Route(index_, call->rpc.role);
    if (route.ok() && route->epoch > call->sent_epoch) {
      call->momentary_retries = 0;
      StartAttempt(call);
    } else if (IsMomentaryRefusal(call->last_error)) {
      const absl::Duration wait =
          std::min(policy_.routed_max_backoff,
                   kMomentaryRetry * (1 << std::min(call->momentary_retries, 10)));
      ++call->momentary_retries;
      ScheduleRetryAfter(call, wait);
    } else {
      call->momentary_retries = 0;
      ScheduleRetry(call);
    }
  });
}

absl::Duration ShardChannel::Jitter(int retry, bool routed) {
  RetryPolicy policy = policy_;
  if (routed) policy.max_backoff = std::min(policy.max_backoff, policy.routed_max_backoff);
  absl::MutexLock lock(&mu_);
  return Backoff(policy, retry, gen_);
}

void ShardChannel::ScheduleRetry(PendingCall* call) {
  const absl::Duration backoff = Jitter(call->retries, call->routed);
  ++call->retries;
  ScheduleRetryAfter(call, backoff);
}

void ShardChannel::ScheduleRetryAfter(PendingCall* call, absl::Duration backoff) {
  const absl::Time now = absl::Now();
  const absl::Duration left =
      call->first_failure + call->reconnect_timeout - now;
  call->retry_at = now + std::max(absl::ZeroDuration(), std::min(backoff, left));
  ArmRetry(call);
}

void ShardChannel::ArmRetry(PendingCall* call) {
  // A routed call looks every kRoutePoll whether its chain moved on (a dead
  // head replaced, say): then the retry goes at once, not after the backoff.
  absl::Time at = call->retry_at;
  if (call->routed) at = std::min(at, absl::Now() + kRoutePoll);
  // Replacing the alarm from its own callback is safe: gRPC keeps the
  // firing alarm's state alive until the callback returns.
  call->alarm = std::make_unique<grpc::Alarm>();
  call->alarm->Set(absl::ToChronoTime(at), [this, call](bool fired) {
    if (!fired) {
      Finish(call, absl::CancelledError(
                       absl::StrFormat("%s: retry cancelled", Describe(*call))));
      return;
    }
    if (call->routed && absl::Now() < call->retry_at) {
      const absl::StatusOr<ChainRoute> route = routes_->Route(index_, call->rpc.role);
      if (!route.ok() || route->epoch <= call->sent_epoch) {
        ArmRetry(call);
        return;
      }
      call->momentary_retries = 0;
    }
    StartAttempt(call);
  });
}

void ShardChannel::RequestResync(uint64_t sent_incarnation,
                                 std::function<void(absl::Status)> then) {
  bool already_done = false;
  {
    absl::MutexLock lock(&mu_);
    if (!resyncing_ && incarnation_.load() != sent_incarnation) {
      // Another call resynchronised the shard since this attempt was sent.
      already_done = true;
    } else {
      resync_waiters_.push_back(std::move(then));
      if (resyncing_) return;
      resyncing_ = true;
    }
  }
  if (already_done) {
    then(absl::OkStatus());
    return;
  }
  if (!resync_) {
    // Nothing to resynchronise with: the ABORTED stands.
    std::vector<std::function<void(absl::Status)>> waiters;
    {
      absl::MutexLock lock(&mu_);
      waiters.swap(resync_waiters_);
      resyncing_ = false;
    }
    for (auto& waiter : waiters) {
      waiter(absl::AbortedError(absl::StrFormat(
          "shard %d (%s) restarted and this client cannot re-register", index_,
          address_)));
    }
    return;
  }
  resync_(this, [this](absl::Status status) {
    std::vector<std::function<void(absl::Status)>> waiters;
    {
      absl::MutexLock lock(&mu_);
      waiters.swap(resync_waiters_);
      resyncing_ = false;
    }
    for (auto& waiter : waiters) waiter(status);
  });
}

void ShardChannel::NoteFailure(const char* method, const grpc::Status& status,
                               absl::Duration budget) {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  if (in_outage_) return;
  in_outage_ = true;
  outage_start_ = now;
  // Rate-limited: a flapping link logs at most one warning per 10 s.
  if (now - last_warning_ < absl::Seconds(10)) return;
  last_warning_ = now;
  LOG(WARNING) << "shard " << index_ << " (" << address_ << ") did not answer "
               << method << " (" << status.error_message()
               << "); retrying for up to " << absl::FormatDuration(budget);
}

void ShardChannel::NoteAnswer() {
  absl::MutexLock lock(&mu_);
  if (!in_outage_) return;
  in_outage_ = false;
  LOG(INFO) << "shard " << index_ << " (" << address_ << ") answers again after "
            << absl::FormatDuration(
                   absl::Trunc(absl::Now() - outage_start_, absl::Milliseconds(1)));
}

}  // namespace shardtrain::client
