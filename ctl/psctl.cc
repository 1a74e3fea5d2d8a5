// psctl: the shardtrain operator's command line.
//
//   psctl status --servers=host:7000,host:7001     shards, workers, staleness
//   psctl checkpoint --servers=host:7000,...       checkpoint every shard now
//   psctl health --server=host:7000                exit 0 iff SERVING
#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/client_security_flags.h"
#include "common/flags_usage.h"
#include "common/metrics.h"
#include "ctl/status_table.h"
#include "proto/health.grpc.pb.h"
#include "proto/shardtrain.grpc.pb.h"

ABSL_FLAG(std::string, servers, "", "Shard addresses host:port, comma-separated, in shard order");
ABSL_FLAG(std::string, server, "", "health: the address to check");
ABSL_FLAG(std::string, service, "", "health: service name; empty for the whole server");
ABSL_FLAG(double, timeout_s, 10, "Deadline of each RPC");
ABSL_FLAG(int, max_partitions, 20,
          "status: list at most this many partitions per shard (0: none; the "
          "summary always covers every partition)");
ABSL_FLAG(int, max_message_mb, 256, "Largest gRPC message psctl receives, in MiB");

namespace {

using namespace shardtrain;  // NOLINT: a binary's main file

std::unique_ptr<grpc::ClientContext> Context() {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(
                            absl::GetFlag(FLAGS_timeout_s) * 1000)));
  return context;
}

std::vector<std::string> Servers() {
  return absl::StrSplit(absl::GetFlag(FLAGS_servers), ',', absl::SkipEmpty());
}

// A channel secured as the --tls_*/--auth_token_file flags say; exits with
// status 2 if they are inconsistent or their files unreadable.
std::shared_ptr<grpc::Channel> Channel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(absl::GetFlag(FLAGS_max_message_mb) << 20);
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      common::MakeChannelCredentials(common::ClientSecurityFromFlags(), &args);
  if (!credentials.ok()) {
    std::cerr << credentials.status() << "\n";
    std::exit(2);
  }
  return grpc::CreateCustomChannel(address, *credentials, args);
}

std::unique_ptr<ParameterServer::Stub> Stub(const std::string& address) {
  return ParameterServer::NewStub(Channel(address));
}

int Status() {
  const std::vector<std::string> servers = Servers();
  if (servers.empty()) {
    std::cerr << "status needs --servers\n";
    return 2;
  }
  const int max_partitions = absl::GetFlag(FLAGS_max_partitions);
  if (max_partitions < 0 || absl::GetFlag(FLAGS_max_message_mb) <= 0) {
    std::cerr << "--max_partitions must be >= 0 and --max_message_mb > 0\n";
    return 2;
  }
  StatusRequest request;
  // 0 would mean the shard's default (100); ask for the fewest instead.
  request.set_max_partitions(static_cast<uint32_t>(std::max(max_partitions, 1)));
  // Every shard at once: a slow or dead shard costs one timeout, not one each.
  std::vector<StatusResponse> statuses(servers.size());
  std::vector<grpc::Status> results(servers.size());
  {
    std::vector<std::unique_ptr<ParameterServer::Stub>> stubs;
    for (const std::string& server : servers) stubs.push_back(Stub(server));
    std::vector<std::thread> calls;
    for (size_t s = 0; s < servers.size(); ++s) {
      calls.emplace_back([&, s] {
        results[s] = stubs[s]->Status(Context().get(), request, &statuses[s]);
      });
    }
    for (std::thread& call : calls) call.join();
  }
  int failures = 0;
  for (size_t s = 0; s < servers.size(); ++s) {
    const grpc::Status& status = results[s];
    if (!status.ok()) {
      statuses[s].Clear();
      std::cerr << absl::StrFormat("shard at %s: %s\n", servers[s], status.error_message());
      statuses[s].set_shard(static_cast<uint32_t>(s));
      statuses[s].set_mode("DOWN");
      ++failures;
    }
  }
  std::cout << ctl::FormatClusterStatus(servers, statuses, max_partitions);
  return failures == 0 ? 0 : 1;
}

int Checkpoint() {
  const std::vector<std::string> servers = Servers();
  if (servers.empty()) {
    std::cerr << "checkpoint needs --servers\n";
    return 2;
  }
  int failures = 0;
  for (const std::string& server : servers) {
    CheckpointResponse response;
    const grpc::Status status =
        Stub(server)->Checkpoint(Context().get(), CheckpointRequest(), &response);
    if (status.ok()) {
      std::cout << absl::StrFormat("%-21s %s (%d partitions, %d bytes)\n", server,
                                   response.path(), response.partitions(),
                                   response.bytes());
    } else {
      std::cout << absl::StrFormat("%-21s FAILED: %s\n", server, status.error_message());
      ++failures;
    }
  }
  return failures == 0 ? 0 : 1;
}

int Health() {
  const std::string server = absl::GetFlag(FLAGS_server);
  if (server.empty()) {
    std::cerr << "health needs --server\n";
    return 2;
  }
  auto stub = grpc::health::v1::Health::NewStub(Channel(server));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(absl::GetFlag(FLAGS_service));
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status status = stub->Check(Context().get(), request, &response);
  if (!status.ok()) {
    // e.g. UNAVAILABLE (not listening, or a failed TLS handshake) or
    // UNAUTHENTICATED (no or a wrong auth token).
    std::cout << common::StatusCodeName(status.error_code()) << ": "
              << status.error_message() << "\n";
    return 1;
  }
  std::cout << grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status())
            << "\n";
  return response.status() == grpc::health::v1::HealthCheckResponse::SERVING ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<char*> args = common::ParseFlags(
      argc, argv,
      "psctl status|checkpoint --servers=a:7000,b:7000 | psctl health --server=a:7000");
  const std::string command = args.size() > 1 ? args[1] : "";
  if (command == "status") return Status();
  if (command == "checkpoint") return Checkpoint();
  if (command == "health") return Health();
  std::cerr << "usage: " << absl::ProgramUsageMessage() << "\n";
  return 2;
}
