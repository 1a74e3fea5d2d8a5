#include "client/chain_control.h"

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include <glog/logging.h>
#include <grpcpp/client_context.h>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/batch_call.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"

namespace shardtrain::client {
namespace {

// Whether a call that ShardChannel gave up on failed for want of an
// answer (the shard is down or cut off), not by the shard's refusal.
bool Unreachable(const absl::Status& status) {
  return IsRetryable(common::ToGrpcStatus(status));
}

}  // namespace

absl::StatusOr<std::unique_ptr<ChainControl>> ChainControl::Create(
    const PsClientOptions& options, const ShardCalls* calls, PsClientMetrics* fault_metrics) {
  const int groups = calls->num_shards();
  ChainRouter::Options router_options;
  router_options.etcd_endpoints = options.etcd_endpoints;
  router_options.etcd_credentials = options.etcd_credentials;
  router_options.job = options.job;
  router_options.num_groups = groups;
  ASSIGN_OR_RETURN(std::unique_ptr<ChainRouter> router,
                   ChainRouter::Create(router_options, fault_metrics));
  RETURN_IF_ERROR(router->WaitForGroups(groups, options.reconnect_timeout));
  for (int g = 0; g < groups; ++g) {
    const std::optional<chain::ChainConfig> config = router->Config(g);
    if (config.has_value() && config->replicas != options.replicas) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "the chain of group %d in etcd (job %s) keeps %d replicas, but this worker "
          "was started for %d: do --replicas and --job match the shards'?",
          g, options.job, config->replicas, options.replicas));
    }
  }
  std::vector<ShardChannel*> channels;
  for (int s = 0; s < groups; ++s) channels.push_back(calls->channel(s));
  RouteChannels(router.get(), channels);
  return std::unique_ptr<ChainControl>(new ChainControl(options, calls, std::move(router)));
}

ChainControl::ChainControl(const PsClientOptions& options, const ShardCalls* calls,
                           std::unique_ptr<ChainRouter> router)
    : rpc_timeout_(options.rpc_timeout),
      member_timeout_(options.member_timeout),
      reconnect_timeout_(options.reconnect_timeout),
      calls_(*calls),
      router_(std::move(router)),
      skip_warned_(calls->num_shards(), absl::InfinitePast()) {}

void ChainControl::WarnSkipped(int shard, const char* method, const absl::Status& status) {
  {
    absl::MutexLock lock(&warn_mu_);
    const absl::Time now = absl::Now();
    if (now - skip_warned_[shard] < absl::Seconds(30)) return;
    skip_warned_[shard] = now;
  }
  LOG(WARNING) << "shard " << shard << " (" << calls_.channel(shard)->address()
               << ") did not answer " << method << " within "
               << absl::FormatDuration(member_timeout_)
               << "; going on without it (its chains drop it once its etcd lease "
                  "expires): "
               << status.message();
}

absl::Status ChainControl::CallReachable(const std::vector<int>& shards, const char* method,
                                         absl::Duration retry_for,
                                         const ShardCalls::StartFn& start,
                                         std::vector<bool>* answered) {
  const absl::Duration budget = std::min(retry_for, member_timeout_);
  const std::vector<absl::Status> statuses =
      calls_.Call(shards, method, std::min(rpc_timeout_, member_timeout_),
                  std::max(budget, absl::ZeroDuration()), start);
  answered->assign(shards.size(), false);
  absl::Status first;
  for (size_t i = 0; i < shards.size(); ++i) {
    if (statuses[i].ok()) {
      (*answered)[i] = true;
    } else if (Unreachable(statuses[i])) {
      WarnSkipped(shards[i], method, statuses[i]);
    } else {
      KeepFirstError(&first, statuses[i]);
    }
  }
  return first;
}

absl::Status ChainControl::Register(const RegisterRequest& request,
                                    std::vector<RegisterResponse>* responses,
                                    std::vector<int>* source) {
  const ShardCalls::StartFn start = calls_.Register(request, *responses);
  const absl::Time give_up = absl::Now() + reconnect_timeout_;
  std::vector<bool> registered(calls_.num_shards(), false);
  while (true) {
    // Every member holds the tensors of its groups; a shard in no chain
    // (dead, drained) gets them from its chain when it joins.
    std::vector<int> ask;
    for (int s : router_->MemberShards()) {
      if (!registered[s]) ask.push_back(s);
    }
    std::vector<bool> answered;
    RETURN_IF_ERROR(CallReachable(ask, "Register", give_up - absl::Now(), start, &answered));
    for (size_t i = 0; i < ask.size(); ++i) {
      if (answered[i]) registered[ask[i]] = true;
    }
    // A group's committed versions are its tail's.
    std::vector<int> missing;
    std::vector<int> missing_tails;
    for (int g = 0; g < calls_.num_shards(); ++g) {
      const absl::StatusOr<ChainRoute> tail = router_->Route(g, ChainRole::kTail);
      if (tail.ok() && registered[tail->shard]) {
        (*source)[g] = tail->shard;
        continue;
      }
      missing.push_back(g);
      if (tail.ok()) missing_tails.push_back(tail->shard);
    }
    if (missing.empty()) return absl::OkStatus();
    if (absl::Now() >= give_up) {
      return absl::UnavailableError(absl::StrFormat(
          "Register: the tail of group(s) %s (shard(s) %s) did not answer within %s",
          absl::StrJoin(missing, ", "), absl::StrJoin(missing_tails, ", "),
          absl::FormatDuration(reconnect_timeout_)));
    }
    // A dead tail leaves its chains within the shards' lease TTL.
    router_->RefreshAll();
    absl::SleepFor(absl::Milliseconds(100));
  }
}

absl::StatusOr<HeartbeatResponse> ChainControl::Heartbeat(const HeartbeatRequest& request,
                                                          absl::Duration retry_for) {
  std::vector<HeartbeatResponse> responses(calls_.num_shards());
  const ShardCalls::StartFn start = calls_.Heartbeat(request, responses);
  const absl::Duration budget = std::min(retry_for, reconnect_timeout_);
  const absl::Time give_up = absl::Now() + budget;
  while (true) {
    const std::vector<int> members = router_->MemberShards();
    std::vector<bool> answered;
    RETURN_IF_ERROR(
        CallReachable(members, "Heartbeat", give_up - absl::Now(), start, &answered));
    for (size_t i = 0; i < members.size(); ++i) {
      if (answered[i]) return responses[members[i]];
    }
    if (absl::Now() >= give_up) {
      return absl::UnavailableError(absl::StrFormat(
          "Heartbeat: none of the member shards %s answered within %s",
          absl::StrJoin(members, ", "), absl::FormatDuration(budget)));
    }
    router_->RefreshAll();
  }
}

absl::Status ChainControl::AdvanceClock(const HeartbeatRequest& request,
                                        const std::vector<int>& deferred) {
  (void)deferred;  // every member: wherever the groups' calls go
  return Heartbeat(request, absl::InfiniteDuration()).status();
}

absl::StatusOr<std::vector<StatusResponse>> ChainControl::Status(
    std::vector<int>* unreachable) {
  if (unreachable != nullptr) unreachable->clear();
  StatusRequest request;
  std::vector<StatusResponse> responses(calls_.num_shards());
  const ShardCalls::StartFn start = calls_.Status(request, responses);
  std::vector<int> shards(calls_.num_shards());
  std::iota(shards.begin(), shards.end(), 0);
  const absl::Time give_up = absl::Now() + reconnect_timeout_;
  while (true) {
    std::vector<bool> answered;
    RETURN_IF_ERROR(CallReachable(shards, "Status", give_up - absl::Now(), start, &answered));
    std::vector<StatusResponse> reachable;
    std::vector<int> failed;
    for (size_t s = 0; s < shards.size(); ++s) {
      if (answered[s]) {
        reachable.push_back(std::move(responses[s]));
      } else {
        failed.push_back(static_cast<int>(s));
      }
    }
    if (!reachable.empty()) {
      if (unreachable != nullptr) *unreachable = std::move(failed);
      return reachable;
    }
    if (absl::Now() >= give_up) {
      return absl::UnavailableError(
          absl::StrFormat("Status: no shard answered within %s",
                          absl::FormatDuration(reconnect_timeout_)));
    }
  }
}

}  // namespace shardtrain::client
