// psctl: the shardtrain operator's command line.
//
//   psctl status --servers=host:7000,host:7001     shards, workers, staleness
//   psctl checkpoint --servers=host:7000,...       checkpoint every shard now
//   psctl health --server=host:7000                exit 0 iff SERVING
//
// A replicated job (shards run with --replicas > 1) keeps its chains in etcd:
//   psctl chains --etcd_endpoints=host:2379 --job=NAME
//       every replica group's chain, its shards' liveness and drained marks;
//       exit 0 iff every chain has all its replicas
//   psctl drain SHARD --etcd_endpoints=... --job=NAME
//       take SHARD out of every chain (e.g. before maintenance); it stays out
//       until undrained. Refused when SHARD holds a group's last copy.
//   psctl undrain SHARD --etcd_endpoints=... --job=NAME
//       let SHARD rejoin its groups (as tail, copying their state)
#include <pwd.h>
#include <unistd.h>

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
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "app/client_security_flags.h"
#include "app/etcd_flags.h"
#include "app/flags_usage.h"
#include "client/channel_factory.h"
#include "client/cluster_status.h"
#include "common/rpc_metrics.h"
#include "ctl/chain_admin.h"
#include "ctl/status_table.h"
#include "etcd/etcd_client.h"
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

// The channels the workers open (client/channel_factory.h), secured as the
// --tls_*/--auth_token_file flags say; exits with status 2 if they are
// inconsistent or their files unreadable.
client::ChannelFactory Channels() {
  client::ChannelOptions options;
  options.max_message_bytes = absl::GetFlag(FLAGS_max_message_mb) << 20;
  options.security = app::ClientSecurityFromFlags();
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

// The etcd the shards coordinate through; exits with status 2 without
// --etcd_endpoints and 1 when it cannot be reached.
std::unique_ptr<etcd::EtcdClient> Etcd(absl::string_view command) {
  etcd::EtcdClient::Options options;
  options.endpoints = app::EtcdFromFlags().endpoints;
  if (options.endpoints.empty()) {
    std::cerr << command << " needs --etcd_endpoints (and --job unless it is "
              << app::EtcdFromFlags().job << ")\n";
    std::exit(2);
  }
  options.rpc_timeout = Timeout();
  options.connect_timeout = std::min(Timeout(), absl::Seconds(5));
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      common::MakeEtcdCredentials(app::EtcdFromFlags().security);
  if (!credentials.ok()) {
    std::cerr << credentials.status().message() << "\n";
    std::exit(2);
  }
  options.credentials = *std::move(credentials);
  absl::StatusOr<std::unique_ptr<etcd::EtcdClient>> etcd = etcd::EtcdClient::Create(options);
  if (!etcd.ok()) {
    std::cerr << "etcd at " << options.endpoints << ": " << etcd.status().message() << "\n";
    std::exit(1);
  }
  return *std::move(etcd);
}

// The SHARD argument of drain and undrain; exits with status 2 without one.
int ShardArgument(const std::vector<char*>& args) {
  int shard = -1;
  if (args.size() != 3 || !absl::SimpleAtoi(args[2], &shard) || shard < 0) {
    std::cerr << "usage: psctl " << args[1]
              << " SHARD --etcd_endpoints=host:2379 [--job=NAME] (SHARD: a shard index)\n";
    std::exit(2);
  }
  return shard;
}

// Who drains, from where and when: the drained key's value.
std::string DrainNote() {
  const char* user = std::getenv("USER");
  if (user == nullptr || *user == '\0') {
    const struct passwd* entry = getpwuid(getuid());
    user = entry != nullptr ? entry->pw_name : nullptr;
  }
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  return absl::StrCat("drained by ", user != nullptr && *user != '\0' ? user : "?", "@",
                      *host != '\0' ? host : "?", " at ",
                      absl::FormatTime(absl::RFC3339_sec, absl::Now(), absl::UTCTimeZone()),
                      " (psctl drain)");
}

// Prints the job's chains; 0 when every chain has all its replicas.
int PrintChains(etcd::EtcdClient& etcd) {
  const std::string job = app::EtcdFromFlags().job;
  absl::StatusOr<ctl::ChainsView> view = ctl::ReadChains(etcd, job);
  if (!view.ok()) {
    std::cerr << "reading job " << job << " from etcd: " << view.status() << "\n";
    return 1;
  }
  std::cout << ctl::FormatChains(*view);
  const bool healthy =
      !view->chains.empty() && view->bad_keys.empty() &&
      std::none_of(view->chains.begin(), view->chains.end(), ctl::Degraded);
  return healthy ? 0 : 1;
}

int Chains() { return PrintChains(*Etcd("chains")); }

int Drain(const std::vector<char*>& args) {
  const int shard = ShardArgument(args);
  std::unique_ptr<etcd::EtcdClient> etcd = Etcd("drain");
  const std::string job = app::EtcdFromFlags().job;
  ctl::DrainOptions options;
  options.note = DrainNote();
  absl::StatusOr<ctl::DrainResult> result = ctl::DrainShard(*etcd, job, shard, options);
  if (!result.ok()) {
    std::cerr << "psctl drain " << shard << ": " << result.status() << "\n";
    return 1;
  }
  std::cout << absl::StrFormat("shard %d %s\n", shard,
                               result->already_drained ? "was already drained"
                                                       : "is drained");
  for (const ctl::ChainChange& change : result->changes) {
    std::vector<std::string> before, after;
    for (const auto& member : change.before.members) before.push_back(absl::StrCat(member.shard));
    for (const auto& member : change.after.members) after.push_back(absl::StrCat(member.shard));
    std::cout << absl::StrFormat("group %d: epoch %d -> %d, chain %s -> %s\n",
                                 change.after.group, change.before.epoch, change.after.epoch,
                                 absl::StrJoin(before, ","), absl::StrJoin(after, ","));
  }
  if (result->changes.empty()) {
    std::cout << absl::StrFormat("shard %d was in no chain\n", shard);
  }
  std::cout << "\n";
  PrintChains(*etcd);
  return 0;
}

int Undrain(const std::vector<char*>& args) {
  const int shard = ShardArgument(args);
  std::unique_ptr<etcd::EtcdClient> etcd = Etcd("undrain");
  absl::StatusOr<bool> existed = ctl::UndrainShard(*etcd, app::EtcdFromFlags().job, shard);
  if (!existed.ok()) {
    std::cerr << "psctl undrain " << shard << ": " << existed.status() << "\n";
    return 1;
  }
  if (*existed) {
    std::cout << absl::StrFormat(
        "shard %d is undrained: it rejoins its groups as tail by itself, copying their "
        "state (watch with psctl chains)\n", shard);
  } else {
    std::cout << absl::StrFormat("shard %d was not drained; nothing changed\n", shard);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<char*> args = app::ParseFlags(
      argc, argv,
      "psctl status|checkpoint --servers=a:7000,b:7000 | psctl health --server=a:7000 |\n"
      "  psctl chains | drain SHARD | undrain SHARD --etcd_endpoints=a:2379 --job=NAME");
  const std::string command = args.size() > 1 ? args[1] : "";
  if (command == "status") return Status();
  if (command == "checkpoint") return Checkpoint();
  if (command == "health") return Health();
  if (command == "chains") return Chains();
  if (command == "drain") return Drain(args);
  if (command == "undrain") return Undrain(args);
  std::cerr << "usage: " << absl::ProgramUsageMessage() << "\n";
  return 2;
}
