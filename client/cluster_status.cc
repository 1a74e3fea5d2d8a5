#include "client/cluster_status.h"

#include <functional>
#include <memory>

#include <grpcpp/client_context.h>

#include "absl/synchronization/blocking_counter.h"
#include "common/grpc_status.h"
#include "proto/shardtrain.grpc.pb.h"

namespace shardtrain::client {
namespace {

// Calls `method(stub, context, response, done)` on every server at once and
// waits for all.
template <typename Response>
std::vector<absl::StatusOr<Response>> CallEach(
    const ChannelFactory& channels, const std::vector<std::string>& servers,
    absl::Duration timeout,
    const std::function<void(ParameterServer::Stub*, grpc::ClientContext*, Response*,
                             std::function<void(grpc::Status)>)>& method) {
  const size_t n = servers.size();
  std::vector<std::unique_ptr<ParameterServer::Stub>> stubs;
  std::vector<grpc::ClientContext> contexts(n);
  std::vector<Response> responses(n);
  std::vector<grpc::Status> results(n);
  absl::BlockingCounter pending(static_cast<int>(n));
  const auto deadline = absl::ToChronoTime(absl::Now() + timeout);
  for (size_t s = 0; s < n; ++s) {
    stubs.push_back(ParameterServer::NewStub(channels.Make(servers[s])));
    contexts[s].set_deadline(deadline);
    method(stubs[s].get(), &contexts[s], &responses[s], [&results, &pending, s](grpc::Status status) {
      results[s] = std::move(status);
      pending.DecrementCount();
    });
  }
  pending.Wait();
  std::vector<absl::StatusOr<Response>> answers;
  for (size_t s = 0; s < n; ++s) {
    if (results[s].ok()) {
      answers.push_back(std::move(responses[s]));
    } else {
      answers.push_back(common::FromGrpcStatus(results[s]));
    }
  }
  return answers;
}

}  // namespace

std::vector<absl::StatusOr<StatusResponse>> QueryStatus(
    const ChannelFactory& channels, const std::vector<std::string>& servers,
    const StatusRequest& request, absl::Duration timeout) {
  return CallEach<StatusResponse>(
      channels, servers, timeout,
      [&request](ParameterServer::Stub* stub, grpc::ClientContext* context,
                 StatusResponse* response, std::function<void(grpc::Status)> done) {
        stub->async()->Status(context, &request, response, std::move(done));
      });
}

std::vector<absl::StatusOr<CheckpointResponse>> CheckpointAll(
    const ChannelFactory& channels, const std::vector<std::string>& servers,
    absl::Duration timeout) {
  const CheckpointRequest request;
  return CallEach<CheckpointResponse>(
      channels, servers, timeout,
      [&request](ParameterServer::Stub* stub, grpc::ClientContext* context,
                 CheckpointResponse* response, std::function<void(grpc::Status)> done) {
        stub->async()->Checkpoint(context, &request, response, std::move(done));
      });
}

}  // namespace shardtrain::client
