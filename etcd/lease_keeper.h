// LeaseKeeper: keeps one etcd lease alive from a thread of its own and
// reports when the lease is lost. Made by EtcdClient::KeepLeaseAlive:
//
//   ASSERT_OK_AND_ASSIGN(Lease lease, etcd->GrantLease(absl::Seconds(6)));
//   std::unique_ptr<LeaseKeeper> keeper = etcd->KeepLeaseAlive(
//       lease, [&](absl::Status why) { StepDownAsChainMember(why); });
//   ...                    // keys put with lease.id live while keeper does
//   keeper.reset();        // stops refreshing; etcd deletes them after the ttl
//
// Every ttl/3 the keeper sends one LeaseKeepAliveRequest on a LeaseKeepAlive
// stream and reads the answer, within a deadline. The lease is lost when etcd
// answers that it expired (NOT_FOUND), or when no refresh succeeded for a
// whole ttl, counted from when the last successful one was sent (UNAVAILABLE
// or DEADLINE_EXCEEDED: etcd may already have expired it). on_lost is then
// called once, on the keeper's thread, and the keeper stops.
//
// A round that fails on one etcd member as a dead or cut-off member's calls
// do moves the connection to the next member and is retried there at once;
// with more than one member a round waits at most ttl/3, so a stopped
// member costs one round, not the lease.
//
// Thread-safe; the destructor stops and joins the thread within about one
// rpc_timeout (an RPC in flight is cancelled).
#ifndef SHARDTRAIN_ETCD_LEASE_KEEPER_H_
#define SHARDTRAIN_ETCD_LEASE_KEEPER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace grpc {
class ClientContext;
}  // namespace grpc

namespace shardtrain::etcd {

namespace internal {
class Connection;
struct Member;
}  // namespace internal

// A granted lease: its id and the ttl etcd granted (at least the one asked for).
struct Lease {
  int64_t id = 0;
  absl::Duration ttl;
};

class LeaseKeeper {
 public:
  using LossCallback = std::function<void(absl::Status)>;

  // Made by EtcdClient::KeepLeaseAlive.
  ~LeaseKeeper();
  LeaseKeeper(const LeaseKeeper&) = delete;
  LeaseKeeper& operator=(const LeaseKeeper&) = delete;

  // False once the lease was reported lost.
  bool alive() const;
  // Number of successful refreshes so far.
  int64_t refreshes() const;

 private:
  friend class EtcdClient;
  // Starts the thread.
  LeaseKeeper(std::shared_ptr<internal::Connection> connection, Lease lease,
              LossCallback on_lost);

  void Run();
  // One keep-alive round trip to `member`; OK with the remaining ttl etcd
  // reported.
  absl::Status RefreshOnce(const internal::Member& member, absl::Duration timeout,
                           int64_t* ttl_seconds);

  const std::shared_ptr<internal::Connection> connection_;
  const Lease lease_;
  const LossCallback on_lost_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool alive_ ABSL_GUARDED_BY(mu_) = true;
  int64_t refreshes_ ABSL_GUARDED_BY(mu_) = 0;
  // The context of the round in flight (owned by Run's stack), so that the
  // destructor can cancel it.
  grpc::ClientContext* in_flight_ ABSL_GUARDED_BY(mu_) = nullptr;

  std::thread thread_;  // Last: starts after everything above is set.
};

}  // namespace shardtrain::etcd

#endif  // SHARDTRAIN_ETCD_LEASE_KEEPER_H_
