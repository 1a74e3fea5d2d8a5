// ChainControl: the ControlCalls (client/control_calls.h) of replicated
// shards (replicas > 1). It owns the ChainRouter (client/chain_router.h)
// that every shard channel routes by, read from etcd at Create.
//  - Register goes to every shard that is a member of some chain (a shard
//    in none gets the tensors from its chain when it joins) until each
//    group's tail has answered: a group's committed versions are its
//    tail's.
//  - Heartbeat goes to every member and returns the first answer;
//    AdvanceClock the same (the clock matters wherever a group's pushes
//    and pulls go).
//  - Status asks every shard and returns those that answered.
// A member that cannot be reached within member_timeout is skipped with a
// warning (at most every 30 s per shard): its chains drop it within the
// shards' lease TTL, so one dead shard never stops the worker.
//
// `calls` is not owned and must outlive this. Thread-safe.
#ifndef SHARDTRAIN_CLIENT_CHAIN_CONTROL_H_
#define SHARDTRAIN_CLIENT_CHAIN_CONTROL_H_

#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/chain_router.h"
#include "client/ps_client_metrics.h"
#include "client/control_calls.h"
#include "client/ps_client_options.h"
#include "client/shard_calls.h"

namespace shardtrain::client {

class ChainControl final : public ControlCalls {
 public:
  // Reads the chains of `options.job` (waiting up to reconnect_timeout for
  // every group's), checks that they keep `options.replicas` replicas, and
  // routes every channel of `calls` through them. `fault_metrics` may be
  // null.
  static absl::StatusOr<std::unique_ptr<ChainControl>> Create(const PsClientOptions& options,
                                                              const ShardCalls* calls,
                                                              PsClientMetrics* fault_metrics);

  absl::Status Register(const RegisterRequest& request,
                        std::vector<RegisterResponse>* responses,
                        std::vector<int>* source) override;
  absl::StatusOr<HeartbeatResponse> Heartbeat(const HeartbeatRequest& request,
                                              absl::Duration retry_for) override;
  absl::Status AdvanceClock(const HeartbeatRequest& request,
                            const std::vector<int>& deferred) override;
  absl::StatusOr<std::vector<StatusResponse>> Status(std::vector<int>* unreachable) override;

  // The chains the channels route by.
  ChainRouter* router() const { return router_.get(); }

 private:
  ChainControl(const PsClientOptions& options, const ShardCalls* calls,
               std::unique_ptr<ChainRouter> router);

  // ShardCalls::Call on `shards`, each retried for at most member_timeout
  // (and retry_for); one still unreachable then is skipped with a warning.
  // (*answered)[i]: shards[i] answered OK. The first error a shard
  // answered with, if any.
  absl::Status CallReachable(const std::vector<int>& shards, const char* method,
                             absl::Duration retry_for, const ShardCalls::StartFn& start,
                             std::vector<bool>* answered);
  // Logs that `shard` was skipped, at most every 30 s per shard.
  void WarnSkipped(int shard, const char* method, const absl::Status& status);

  const absl::Duration rpc_timeout_;
  const absl::Duration member_timeout_;
  const absl::Duration reconnect_timeout_;
  const ShardCalls& calls_;
  const std::unique_ptr<ChainRouter> router_;

  absl::Mutex warn_mu_;
  std::vector<absl::Time> skip_warned_ ABSL_GUARDED_BY(warn_mu_);  // by shard
};

}  // namespace shardtrain::client

#endif  // SHARDTRAIN_CLIENT_CHAIN_CONTROL_H_
