// The members of one etcd cluster as gRPC channels and stubs, shared by
// EtcdClient, its LeaseKeepers and Watchers, and the mapping of gRPC errors
// to absl::Status with the member's endpoint in the message.
//
// Calls go to one member, the current one, until a call to it fails the way
// a dead, stopped or cut-off member's calls do (UNAVAILABLE or
// DEADLINE_EXCEEDED; watches ask etcd to end them with UNAVAILABLE when the
// member loses its leader). The next member listed then becomes the
// current one, so a cluster that keeps its quorum keeps serving when one
// member goes. The failed call itself is not repeated: its caller's retry
// goes to the new member.
//
//   const Connection::Member& member = conn->current();
//   grpc::ClientContext context;
//   conn->Prepare(&context);
//   grpc::Status s = member.kv->Range(&context, request, &response);
//   RETURN_IF_ERROR(conn->Check(member, "Range", s));
//
// Thread-safe.
#ifndef SHARDTRAIN_ETCD_INTERNAL_CONNECTION_H_
#define SHARDTRAIN_ETCD_INTERNAL_CONNECTION_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "etcd/etcd_rpc.grpc.pb.h"

namespace shardtrain::etcd::internal {

// One etcd member: its endpoint and the stubs on a channel to it.
struct Member {
  Member(std::string endpoint_in, std::shared_ptr<grpc::Channel> channel_in);

  const std::string endpoint;
  const std::shared_ptr<grpc::Channel> channel;
  const std::unique_ptr<etcdserverpb::KV::Stub> kv;
  const std::unique_ptr<etcdserverpb::Lease::Stub> lease;
  const std::unique_ptr<etcdserverpb::Watch::Stub> watch;
};

class Connection {
 public:
  using Member = internal::Member;

  // REQUIRES: first < members.size().
  Connection(std::vector<std::unique_ptr<Member>> members, size_t first,
             absl::Duration rpc_timeout);

  // The member calls go to now.
  const Member& current() const;
  // Number of members listed.
  size_t size() const { return members_.size(); }
  // Deadline of a unary call.
  absl::Duration rpc_timeout() const { return rpc_timeout_; }

  // Sets the context's deadline to now + timeout (rpc_timeout by default).
  // A call on a member without a leader waits for one within it.
  void Prepare(grpc::ClientContext* context) const;
  void Prepare(grpc::ClientContext* context, absl::Duration timeout) const;
  // Asks etcd to refuse a stream, or end it later, when the member has (or
  // loses) no leader, as etcd's own client does for watches
  // (clientv3.WithRequireLeader): a member cut off from the quorum would
  // otherwise keep a watch open and silent.
  static void RequireLeader(grpc::ClientContext* context);

  // OK stays OK; otherwise the same code with "etcd <endpoint> <method>: "
  // in front of the message, after MemberFailed.
  absl::Status Check(const Member& member, absl::string_view method, const grpc::Status& status);

  // A call to `member` failed with `why`. When `why` is UNAVAILABLE or
  // DEADLINE_EXCEEDED and `member` is still the current one, the next
  // member becomes current and every listener runs, on this thread.
  // Returns whether the current member changed.
  bool MemberFailed(const Member& member, const absl::Status& why);

  // `listener` runs each time the current member changes until
  // RemoveListener(id) returns. It must not call back into the connection.
  int AddListener(std::function<void()> listener);
  void RemoveListener(int id);

 private:
  const std::vector<std::unique_ptr<Member>> members_;
  const absl::Duration rpc_timeout_;
  std::atomic<size_t> current_;

  // Held while listeners run, so RemoveListener waits for a running one.
  absl::Mutex listeners_mu_;
  std::map<int, std::function<void()>> listeners_ ABSL_GUARDED_BY(listeners_mu_);
  int next_listener_ ABSL_GUARDED_BY(listeners_mu_) = 0;
};

}  // namespace shardtrain::etcd::internal

#endif  // SHARDTRAIN_ETCD_INTERNAL_CONNECTION_H_
