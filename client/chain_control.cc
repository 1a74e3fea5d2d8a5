// PsClient's control RPCs with replicated shards (replicas > 1): routing
// set-up, Register on the chain members, Heartbeat and Status on the shards
// that answer. See client/ps_client.h.
#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include <glog/logging.h>
#include <grpcpp/client_context.h>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/ps_client.h"
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

absl::Status PsClient::StartRouting() {
  ChainRouter::Options options;
  options.etcd_endpoints = options_.etcd_endpoints;
  options.etcd_credentials = options_.etcd_credentials;
  options.job = options_.job;
  options.num_groups = num_shards();
  ASSIGN_OR_RETURN(router_, ChainRouter::Create(options, fault_metrics_));
  RETURN_IF_ERROR(router_->WaitForGroups(num_shards(), options_.reconnect_timeout));
  for (int g = 0; g < num_shards(); ++g) {
    const std::optional<chain::ChainConfig> config = router_->Config(g);
    if (config.has_value() && config->replicas != options_.replicas) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "the chain of group %d in etcd (job %s) keeps %d replicas, but this worker "
          "was started for %d: do --replicas and --job match the shards'?",
          g, options_.job, config->replicas, options_.replicas));
    }
  }
  std::vector<ShardChannel*> channels;
  for (const std::unique_ptr<ShardChannel>& channel : channels_) {
    channels.push_back(channel.get());
  }
  RouteChannels(router_.get(), channels);  // router_ goes before channels_
  absl::MutexLock lock(&warn_mu_);
  skip_warned_.assign(channels_.size(), absl::InfinitePast());
  return absl::OkStatus();
}

void PsClient::WarnSkipped(int shard, const char* method, const absl::Status& status) {
  {
    absl::MutexLock lock(&warn_mu_);
    const absl::Time now = absl::Now();
    if (now - skip_warned_[shard] < absl::Seconds(30)) return;
    skip_warned_[shard] = now;
  }
  LOG(WARNING) << "shard " << shard << " (" << channels_[shard]->address()
               << ") did not answer " << method << " within "
               << absl::FormatDuration(options_.member_timeout)
               << "; going on without it (its chains drop it once its etcd lease "
                  "expires): "
               << status.message();
}

absl::Status PsClient::CallReachable(const std::vector<int>& shards, const char* method,
                                     absl::Duration retry_for, const StartFn& start,
                                     std::vector<bool>* answered) {
  const absl::Duration budget = std::min(retry_for, options_.member_timeout);
  const std::vector<absl::Status> statuses =
      CallShards(shards, method, std::min(options_.rpc_timeout, options_.member_timeout),
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

absl::Status PsClient::RegisterOnMembers(const RegisterRequest& request,
                                         std::vector<RegisterResponse>* responses,
                                         std::vector<int>* source) {
  const StartFn start = [&](int s, grpc::ClientContext* context, uint64_t, auto done) {
    const absl::Time started = absl::Now();
    (*responses)[s].Clear();
    channels_[s]->stub()->async()->Register(
        context, &request, &(*responses)[s],
        [this, &request, responses, s, started, done = std::move(done)](grpc::Status status) {
          RecordRpc("Register", status, request.ByteSizeLong(),
                    (*responses)[s].ByteSizeLong(), started);
          done(std::move(status));
        });
  };
  const absl::Time give_up = absl::Now() + options_.reconnect_timeout;
  std::vector<bool> registered(channels_.size(), false);
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
    for (int g = 0; g < num_shards(); ++g) {
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
          absl::FormatDuration(options_.reconnect_timeout)));
    }
    // A dead tail leaves its chains within the shards' lease TTL.
    router_->RefreshAll();
    absl::SleepFor(absl::Milliseconds(100));
  }
}

absl::StatusOr<HeartbeatResponse> PsClient::HeartbeatMembers(const HeartbeatRequest& request,
                                                             absl::Duration retry_for) {
  std::vector<HeartbeatResponse> responses(channels_.size());
  const StartFn start = [&](int s, grpc::ClientContext* context, uint64_t, auto done) {
    const absl::Time started = absl::Now();
    responses[s].Clear();
    channels_[s]->stub()->async()->Heartbeat(
        context, &request, &responses[s],
        [this, &request, &responses, s, started, done = std::move(done)](grpc::Status status) {
          RecordRpc("Heartbeat", status, request.ByteSizeLong(), responses[s].ByteSizeLong(),
                    started);
          done(std::move(status));
        });
  };
  const absl::Duration budget = std::min(retry_for, options_.reconnect_timeout);
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

absl::StatusOr<std::vector<StatusResponse>> PsClient::ReachableStatus(
    std::vector<int>* unreachable) {
  StatusRequest request;
  std::vector<StatusResponse> responses(channels_.size());
  const StartFn start = [&](int s, grpc::ClientContext* context, uint64_t, auto done) {
    responses[s].Clear();
    channels_[s]->stub()->async()->Status(context, &request, &responses[s], std::move(done));
  };
  std::vector<int> shards(channels_.size());
  std::iota(shards.begin(), shards.end(), 0);
  const absl::Time give_up = absl::Now() + options_.reconnect_timeout;
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
                          absl::FormatDuration(options_.reconnect_timeout)));
    }
  }
}

}  // namespace shardtrain::client
