// The gRPC channel and stubs to one etcd endpoint, shared by EtcdClient,
// its LeaseKeepers and Watchers, and the mapping of gRPC errors to
// absl::Status with the endpoint in the message. Immutable, thread-safe.
//
//   auto conn = std::make_shared<const Connection>(endpoint, channel, timeout);
//   grpc::ClientContext context;
//   conn->SetDeadline(&context);
//   grpc::Status s = conn->kv->Range(&context, request, &response);
//   RETURN_IF_ERROR(conn->ToStatus("Range", s));
#ifndef SHARDTRAIN_COMMON_ETCD_INTERNAL_CONNECTION_H_
#define SHARDTRAIN_COMMON_ETCD_INTERNAL_CONNECTION_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/etcd/etcd_rpc.grpc.pb.h"

namespace shardtrain::etcd::internal {

struct Connection {
  Connection(std::string endpoint_in, std::shared_ptr<grpc::Channel> channel_in,
             absl::Duration rpc_timeout_in);

  // Sets the context's deadline to now + timeout (rpc_timeout by default).
  void SetDeadline(grpc::ClientContext* context) const;
  void SetDeadline(grpc::ClientContext* context, absl::Duration timeout) const;

  // OK stays OK; otherwise the same code with "etcd <endpoint> <method>: "
  // in front of the message.
  absl::Status ToStatus(absl::string_view method, const grpc::Status& status) const;

  const std::string endpoint;
  const absl::Duration rpc_timeout;
  const std::shared_ptr<grpc::Channel> channel;
  const std::unique_ptr<etcdserverpb::KV::Stub> kv;
  const std::unique_ptr<etcdserverpb::Lease::Stub> lease;
  const std::unique_ptr<etcdserverpb::Watch::Stub> watch;
};

}  // namespace shardtrain::etcd::internal

#endif  // SHARDTRAIN_COMMON_ETCD_INTERNAL_CONNECTION_H_
