#include "server/replication/peer_tls_check.h"

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "proto/shardtrain.grpc.pb.h"

namespace shardtrain::server {
namespace {

// "host:port" or "[v6]:port" -> host.
std::string HostOf(const std::string& address) {
  std::string host = address.substr(0, address.rfind(':'));
  absl::string_view view = host;
  if (absl::ConsumePrefix(&view, "[") && absl::ConsumeSuffix(&view, "]")) {
    return std::string(view);
  }
  return host;
}

}  // namespace

absl::Status CheckPeerTls(const common::ClientSecurity& peer, const std::string& local_address,
                          const std::string& advertise_address, absl::Duration timeout) {
  common::ClientSecurity security = peer;
  security.server_name = HostOf(advertise_address);
  grpc::ChannelArguments args;
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials,
                   common::MakeChannelCredentials(security, &args));
  auto stub = ParameterServer::NewStub(
      grpc::CreateCustomChannel(local_address, credentials, args));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  StatusRequest request;
  StatusResponse response;
  const grpc::Status status = stub->Status(&context, request, &response);
  if (status.ok()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "--replicas > 1 with TLS: the shard before this one in a chain could not call it "
      "(checked by calling this shard at ", local_address, " as ", security.server_name,
      " with the peer credentials: ", status.error_message(),
      "). Its certificate (--tls_cert) must name ", security.server_name,
      ", be signed by the CA in --tls_peer_ca (default --tls_client_ca) and, with "
      "--tls_client_ca, allow client authentication too (extendedKeyUsage serverAuth,"
      "clientAuth: scripts/make-certs.sh makes such shard certificates)"));
}

}  // namespace shardtrain::server
