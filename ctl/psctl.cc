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
#include <vector>

#include <grpcpp/client_context.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/channels.h"
#include "client/cluster_status.h"
#include "common/client_security_flags.h"
#include "common/flags_usage.h"
#include "common/metrics.h"
#include "ctl/status_table.h"
#include "proto/health.grpc.pb.h"
#include "proto/shardtrain.pb.h"

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

absl::Duration Timeout() { return absl::Seconds(absl::GetFlag(FLAGS_timeout_s)); }

std::unique_ptr<grpc::ClientContext> Context() {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + Timeout()));
  return context;
}

std::vector<std::string> Servers() {
  return absl::StrSplit(absl::GetFlag(FLAGS_servers), ',', absl::SkipEmpty());
}

// The channels the workers open (client/channels.h), secured as the
// --tls_*/--auth_token_file flags say; exits with status 2 if they are
// inconsistent or their files unreadable.
client::ChannelFactory Channels() {
  client::ChannelOptions options;
  options.max_message_bytes = absl::GetFlag(FLAGS_max_message_mb) << 20;
  options.security = common::ClientSecurityFromFlags();
  absl::StatusOr<client::ChannelFactory> channels = client::ChannelFactory::Create(options);
  if (!channels.ok()) {
    std::cerr << channels.status() << "\n";
    std::exit(2);
  }
  return *std::move(channels);
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
  std::vector<absl::StatusOr<StatusResponse>> answers =
      client::QueryStatus(Channels(), servers, request, Timeout());
  std::vector<StatusResponse> statuses(servers.size());
  int failures = 0;
  for (size_t s = 0; s < servers.size(); ++s) {
    if (answers[s].ok()) {
      statuses[s] = *std::move(answers[s]);
      continue;
    }
    std::cerr << absl::StrFormat("shard at %s: %s\n", servers[s], answers[s].status().message());
    statuses[s].set_shard(static_cast<uint32_t>(s));
    statuses[s].set_mode("DOWN");
    ++failures;
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
  const std::vector<absl::StatusOr<CheckpointResponse>> answers =
      client::CheckpointAll(Channels(), servers, Timeout());
  int failures = 0;
  for (size_t s = 0; s < servers.size(); ++s) {
    if (answers[s].ok()) {
      const CheckpointResponse& response = *answers[s];
      std::cout << absl::StrFormat("%-21s %s (%d partitions, %d bytes)\n", servers[s],
                                   response.path(), response.partitions(),
                                   response.bytes());
    } else {
      std::cout << absl::StrFormat("%-21s FAILED: %s\n", servers[s],
                                   answers[s].status().message());
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
  auto stub = grpc::health::v1::Health::NewStub(Channels().Make(server));
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
