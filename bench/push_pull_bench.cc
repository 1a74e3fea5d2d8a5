// push_pull_bench: throughput and latency of PsClient Push, Pull and
// PushPull against one in-process shard, next to a raw gRPC Echo that
// carries the same payload bytes in the same direction(s), measured in the
// same run.
//
//   push_pull_bench --max_mb=64 --out=bench/results/push_pull_cpu.txt
//
// For each payload size one f32 tensor of that many bytes is registered
// (default partitioning) and each op is timed one call at a time:
//   push      PsClient::Push      vs  Echo(payload N bytes, reply 0 bytes)
//   pull      PsClient::Pull      vs  Echo(payload 0 bytes, reply N bytes)
//   pushpull  PsClient::PushPull  vs  Echo(payload N bytes, reply N bytes)
// The Echo side copies its payload into the message once per call on the
// sending side (as any protobuf user does) and ignores what it receives, so
// it is the floor for moving N bytes through gRPC and protobuf. Throughput
// counts payload bytes moved, both directions for pushpull.
//
// With --secure the table is instead PsClient over plaintext against
// PsClient over mutual TLS with the shared token (common/credentials.h), to
// show what securing the connections costs:
//
//   push_pull_bench --secure --max_mb=16 --seconds_per_case=6 --rounds=15
//
// Certificates and token come from scripts/make-certs.sh, run into a fresh
// temporary directory that is removed at the end. Two shards run
// in-process, one plaintext and one demanding a client certificate and the
// token on every call, each with its own PsClient; channels (and so TLS
// handshakes) are set up before timing, so the figures are the steady-state
// cost of encrypting, decrypting and authenticating calls. Each (size, op)
// case is --rounds rounds; a round times one block of about
// --seconds_per_case / --rounds of each system, plaintext first in even
// rounds and TLS first in odd ones, so that the VM's drifting speed affects
// both alike. Rates are medians over rounds of each block's rate, and the
// ratio is the median of the rounds' TLS/plaintext ratios, with their min
// and max beside it. --min_iterations and --max_seconds_per_case apply to
// the default mode only.
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <glog/logging.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>
#include <grpcpp/support/channel_arguments.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "app/deadlock_detection.h"
#include "app/malloc_tuning.h"
#include "bench/bench_util.h"
#include "bench/echo.grpc.pb.h"
#include "client/ps_client.h"
#include "common/credentials.h"
#include "common/status_macros.h"
#include "server/ps_server.h"

ABSL_FLAG(std::string, out, "",
          "If set, also write the results table to this file");
ABSL_FLAG(double, seconds_per_case, 1.0,
          "Time each (size, op, system) case for at least this long");
ABSL_FLAG(int, min_iterations, 5,
          "Time each case for at least this many calls of each system");
ABSL_FLAG(double, max_seconds_per_case, 4.0,
          "Stop a case after this long (per system) once it has 2 calls");
ABSL_FLAG(int, max_mb, 64, "Skip payloads larger than this many MiB");
ABSL_FLAG(bool, secure, false,
          "Compare PsClient over plaintext with PsClient over mutual TLS + "
          "token instead of PsClient with a raw gRPC echo");
ABSL_FLAG(std::string, client, "",
          "PsClient settings, key=value,...: channels, write_buffer_kb, max_frame_kb, "
          "lookahead_kb, min_read_chunk_kb, max_read_chunk_kb, bdp (0/1)");
ABSL_FLAG(int, rounds, 9,
          "--secure: rounds per case, each timing one block of each system; "
          "figures are medians over rounds");

namespace shardtrain::bench {
namespace {

struct BenchOptions {
  // Each case runs for at least `seconds_per_case` and `min_iterations`
  // calls, and stops after `max_seconds_per_case` once it has 2 calls.
  double seconds_per_case = 1.0;
  int min_iterations = 5;
  double max_seconds_per_case = 4.0;
  // Payloads up to this many bytes are measured.
  int64_t max_payload_bytes = int64_t{64} << 20;
  // Results are also written here when not empty.
  std::string out_path;
  // Plaintext against mutual TLS + token instead of shardtrain against
  // echo, in `rounds` rounds per case (see the top of the file).
  bool secure = false;
  int rounds = 9;
};

// ---------------------------------------------------------------------------
// Timing.

// A case has enough calls of a system, or has run long enough to stop.
bool Enough(const Sampler& sampler, const BenchOptions& options) {
  return sampler.calls() >= options.min_iterations &&
         sampler.total_seconds() >= options.seconds_per_case;
}
bool Capped(const Sampler& sampler, const BenchOptions& options) {
  return sampler.calls() >= 2 && sampler.total_seconds() >= options.max_seconds_per_case;
}

// Warms both ops up, then times them in alternating blocks of about a
// quarter of a case each, so that both see the same machine: on a shared
// 2-core VM the speed drifts by tens of percent within a minute.
absl::Status TimePair(const BenchOptions& options, const OpFn& shard_op,
                      const OpFn& echo_op, Timing* shard_timing,
                      Timing* echo_timing) {
  for (const OpFn* op : {&shard_op, &echo_op}) {
    RETURN_IF_ERROR(WarmUp(*op));
  }
  const double block_seconds = options.seconds_per_case / 4;
  Sampler shard;
  Sampler echo;
  while (!(Enough(shard, options) && Enough(echo, options)) &&
         !(Capped(shard, options) || Capped(echo, options))) {
    RETURN_IF_ERROR(shard.RunBlock(shard_op, block_seconds));
    RETURN_IF_ERROR(echo.RunBlock(echo_op, block_seconds));
  }
  *shard_timing = shard.Summary();
  *echo_timing = echo.Summary();
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// The benchmark.

struct Row {
  int64_t payload_bytes = 0;
  Op op = Op::kPush;
  Timing shardtrain;
  Timing echo;
};

// Payload bytes moved per second, in MB/s (1e6 bytes).
double MegabytesPerSecond(int64_t payload_bytes, Op op, const Timing& timing) {
  const double bytes_per_call =
      static_cast<double>(payload_bytes) * (op == Op::kPushPull ? 2 : 1);
  return bytes_per_call * timing.iterations / timing.total_seconds / 1e6;
}

std::string TableHeader() {
  return absl::StrFormat("%-8s %-9s %12s %9s %9s %12s %9s %7s\n", "payload",
                         "op", "shard MB/s", "p50 ms", "p99 ms", "echo MB/s",
                         "echo p50", "ratio");
}

std::string FormatRow(const Row& row) {
  const double shard_rate = MegabytesPerSecond(row.payload_bytes, row.op, row.shardtrain);
  const double echo_rate = MegabytesPerSecond(row.payload_bytes, row.op, row.echo);
  return absl::StrFormat("%-8s %-9s %12.1f %9.3f %9.3f %12.1f %9.3f %7.2f\n",
                         SizeName(row.payload_bytes), OpName(row.op), shard_rate,
                         row.shardtrain.p50_seconds * 1e3,
                         row.shardtrain.p99_seconds * 1e3, echo_rate,
                         row.echo.p50_seconds * 1e3, shard_rate / echo_rate);
}

absl::StatusOr<std::unique_ptr<server::PsServer>> StartShard(
    const common::ServerSecurity& security = {}) {
  server::PsServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.metrics_address = "127.0.0.1:0";
  options.max_message_bytes = kMaxMessageBytes;
  options.shard.mode = server::ConsistencyMode::kAsync;
  options.shard.num_workers = 1;
  options.shard.optimizer.name = "sgd";
  options.security = security;
  return server::PsServer::Start(options);
}

absl::StatusOr<std::unique_ptr<client::PsClient>> ConnectClient(
    const server::PsServer& shard, const common::ClientSecurity& security = {}) {
  client::PsClientOptions client_options;
  client_options.servers = {absl::StrCat("127.0.0.1:", shard.port())};
  client_options.max_message_bytes = kMaxMessageBytes;
  client_options.security = security;
  RETURN_IF_ERROR(ApplyClientSettings(absl::GetFlag(FLAGS_client), &client_options));
  return client::PsClient::Create(client_options, nullptr);
}

// Measures every op for one payload size; appends a row per op.
absl::Status BenchSize(const BenchOptions& options, int64_t payload_bytes,
                       client::PsClient& client, EchoClient& echo,
                       const std::string& echo_source, std::vector<Row>* rows) {
  ASSIGN_OR_RETURN(std::unique_ptr<BenchTensor> exchange,
                   BenchTensor::Register(client, payload_bytes));
  for (Op op : {Op::kPush, Op::kPull, Op::kPushPull}) {
    Row row;
    row.payload_bytes = payload_bytes;
    row.op = op;
    const int64_t echo_request_bytes = op == Op::kPull ? 0 : payload_bytes;
    const int64_t echo_reply_bytes = op == Op::kPush ? 0 : payload_bytes;
    RETURN_IF_ERROR(TimePair(
        options, exchange->MakeOp(op),
        [&] { return echo.Call(echo_source, echo_request_bytes, echo_reply_bytes); },
        &row.shardtrain, &row.echo));
    rows->push_back(row);
    std::printf("%s", FormatRow(row).c_str());
    std::fflush(stdout);
  }
  return absl::OkStatus();
}

std::vector<int64_t> PayloadSizes(const BenchOptions& options) {
  std::vector<int64_t> sizes;
  for (int64_t bytes : {int64_t{4} << 10, int64_t{64} << 10, int64_t{1} << 20,
                        int64_t{4} << 20, int64_t{16} << 20, int64_t{64} << 20}) {
    if (bytes <= options.max_payload_bytes) sizes.push_back(bytes);
  }
  return sizes;
}

// ---------------------------------------------------------------------------
// --secure: the same PsClient calls over plaintext and over mutual TLS with
// the shared token.

// A fresh temporary directory holding what scripts/make-certs.sh writes: a
// CA, a shard certificate for 127.0.0.1, a client certificate and a token.
// Removed, with its contents, on destruction. Thread-compatible.
class CertDir {
 public:
  static absl::StatusOr<std::unique_ptr<CertDir>> Make() {
    const char* base = std::getenv("TMPDIR");
    std::string path = absl::StrCat(base != nullptr && *base != '\0' ? base : "/tmp",
                                    "/push_pull_bench-certs-XXXXXX");
    if (mkdtemp(path.data()) == nullptr) {
      return absl::UnavailableError(absl::StrCat("cannot make a directory like ", path));
    }
    std::unique_ptr<CertDir> dir(new CertDir(path));
    const std::string command =
        absl::StrCat(SHARDTRAIN_SOURCE_DIR, "/scripts/make-certs.sh '", path, "' >/dev/null");
    if (std::system(command.c_str()) != 0) {
      return absl::UnavailableError(absl::StrCat("failed: ", command));
    }
    return dir;
  }
  ~CertDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }

  // Mutual TLS and the token, as run-local --secure sets up a shard.
  common::ServerSecurity Server() const {
    common::ServerSecurity security;
    security.cert_file = File("server.pem");
    security.key_file = File("server.key");
    security.client_ca_file = File("ca.pem");
    security.token_file = File("token");
    return security;
  }
  // A worker of that cluster.
  common::ClientSecurity Client() const {
    common::ClientSecurity security;
    security.ca_file = File("ca.pem");
    security.cert_file = File("client.pem");
    security.key_file = File("client.key");
    security.token_file = File("token");
    return security;
  }

 private:
  explicit CertDir(std::string path) : path_(std::move(path)) {}
  std::string File(const std::string& name) const { return absl::StrCat(path_, "/", name); }

  const std::string path_;
};

struct SecureRow {
  int64_t payload_bytes = 0;
  Op op = Op::kPush;
  // MB/s, medians over rounds of each block's rate.
  double plain_rate = 0;
  double tls_rate = 0;
  // Call times pooled over all rounds.
  Timing plain;
  Timing tls;
  // Median, min and max over rounds of the round's TLS / plaintext rate.
  double ratio = 0;
  double ratio_min = 0;
  double ratio_max = 0;
};

// Warms both ops up, then runs `options.rounds` rounds of one block of each,
// plaintext first in even rounds and TLS first in odd ones: the VM's speed
// drifts by tens of percent within a minute, and pairing the blocks of a
// round cancels most of it from their ratio.
absl::Status TimeSecurePair(const BenchOptions& options, const OpFn& plain_op,
                            const OpFn& tls_op, SecureRow* row) {
  RETURN_IF_ERROR(WarmUp(plain_op));
  RETURN_IF_ERROR(WarmUp(tls_op));
  const double bytes_per_call =
      static_cast<double>(row->payload_bytes) * (row->op == Op::kPushPull ? 2 : 1);
  const double block_seconds = options.seconds_per_case / options.rounds;
  const OpFn* ops[2] = {&plain_op, &tls_op};
  Sampler samplers[2];
  std::vector<double> rates[2];
  std::vector<double> ratios;
  for (int round = 0; round < options.rounds; ++round) {
    double rate[2] = {0, 0};
    for (int turn = 0; turn < 2; ++turn) {
      const int which = round % 2 == 0 ? turn : 1 - turn;  // 0 plaintext, 1 TLS
      Sampler& sampler = samplers[which];
      const int calls_before = sampler.calls();
      const double seconds_before = sampler.total_seconds();
      RETURN_IF_ERROR(sampler.RunBlock(*ops[which], block_seconds));
      rate[which] = bytes_per_call * (sampler.calls() - calls_before) /
                    (sampler.total_seconds() - seconds_before) / 1e6;
      rates[which].push_back(rate[which]);
    }
    ratios.push_back(rate[1] / rate[0]);
  }
  row->plain_rate = Median(rates[0]);
  row->tls_rate = Median(rates[1]);
  row->plain = samplers[0].Summary();
  row->tls = samplers[1].Summary();
  row->ratio = Median(ratios);
  row->ratio_min = *std::min_element(ratios.begin(), ratios.end());
  row->ratio_max = *std::max_element(ratios.begin(), ratios.end());
  return absl::OkStatus();
}

std::string SecureTableHeader() {
  return absl::StrFormat("%-8s %-9s %11s %11s %10s %10s %9s %6s %6s\n", "payload", "op",
                         "plain MB/s", "tls MB/s", "plain p50", "tls p50", "tls/plain",
                         "min", "max");
}

std::string FormatSecureRow(const SecureRow& row) {
  return absl::StrFormat("%-8s %-9s %11.1f %11.1f %10.3f %10.3f %9.2f %6.2f %6.2f\n",
                         SizeName(row.payload_bytes), OpName(row.op), row.plain_rate,
                         row.tls_rate, row.plain.p50_seconds * 1e3,
                         row.tls.p50_seconds * 1e3, row.ratio, row.ratio_min,
                         row.ratio_max);
}

absl::Status RunSecure(const BenchOptions& options, const std::string& command_line) {
  const std::vector<int64_t> sizes = PayloadSizes(options);
  if (sizes.empty()) return absl::InvalidArgumentError("--max_mb leaves no sizes");
  if (options.rounds < 1) return absl::InvalidArgumentError("--rounds must be at least 1");

  ASSIGN_OR_RETURN(std::unique_ptr<CertDir> certs, CertDir::Make());
  ASSIGN_OR_RETURN(std::unique_ptr<server::PsServer> plain_shard, StartShard());
  ASSIGN_OR_RETURN(std::unique_ptr<server::PsServer> tls_shard, StartShard(certs->Server()));
  ASSIGN_OR_RETURN(std::unique_ptr<client::PsClient> plain_client, ConnectClient(*plain_shard));
  ASSIGN_OR_RETURN(std::unique_ptr<client::PsClient> tls_client,
                   ConnectClient(*tls_shard, certs->Client()));

  const std::string header = absl::StrCat(
      "# push_pull_bench --secure: PsClient over plaintext vs over mutual TLS + bearer "
      "token, one shard each in-process (async, sgd)\n",
      CommonHeader(command_line),
      "# TLS: gRPC's default TLS, EC P-256 certificates from scripts/make-certs.sh, client "
      "certificate required, token checked on every call; channels set up before timing\n",
      absl::StrFormat("# each case: %d rounds after warm-up; a round times a block of "
                      ">= %.3f s (>= 1 call) of each system, plaintext first in even "
                      "rounds, TLS first in odd ones\n",
                      options.rounds, options.seconds_per_case / options.rounds),
      "# payload in KiB/MiB of f32; MB/s = 1e6 payload bytes per second (both directions "
      "for pushpull), median over rounds of each block's rate; p50 in ms over all calls; "
      "tls/plain = median over rounds of the round's TLS rate / plaintext rate, min and "
      "max over rounds beside it\n");
  std::printf("%s%s", header.c_str(), SecureTableHeader().c_str());
  std::fflush(stdout);

  std::string table = header + SecureTableHeader();
  for (int64_t bytes : sizes) {
    ASSIGN_OR_RETURN(std::unique_ptr<BenchTensor> plain,
                     BenchTensor::Register(*plain_client, bytes));
    ASSIGN_OR_RETURN(std::unique_ptr<BenchTensor> tls,
                     BenchTensor::Register(*tls_client, bytes));
    for (Op op : {Op::kPush, Op::kPull, Op::kPushPull}) {
      SecureRow row;
      row.payload_bytes = bytes;
      row.op = op;
      RETURN_IF_ERROR(TimeSecurePair(options, plain->MakeOp(op), tls->MakeOp(op), &row));
      const std::string line = FormatSecureRow(row);
      table += line;
      std::printf("%s", line.c_str());
      std::fflush(stdout);
    }
  }

  if (!options.out_path.empty()) RETURN_IF_ERROR(WriteTable(options.out_path, table));
  tls_client.reset();
  plain_client.reset();
  (void)tls_shard->Shutdown();  // no checkpoints here: cannot fail
  (void)plain_shard->Shutdown();  // no checkpoints here: cannot fail
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Default: shardtrain against the echo baseline.

absl::Status Run(const BenchOptions& options, const std::string& command_line) {
  if (options.secure) return RunSecure(options, command_line);
  const std::vector<int64_t> sizes = PayloadSizes(options);
  if (sizes.empty()) return absl::InvalidArgumentError("--max_mb leaves no sizes");
  const int64_t largest = sizes.back();

  ASSIGN_OR_RETURN(std::unique_ptr<server::PsServer> shard, StartShard());
  ASSIGN_OR_RETURN(std::unique_ptr<EchoServer> echo_server, EchoServer::Start(largest));
  ASSIGN_OR_RETURN(std::unique_ptr<client::PsClient> client, ConnectClient(*shard));
  EchoClient echo(absl::StrCat("127.0.0.1:", echo_server->port()));
  const std::string echo_source(static_cast<size_t>(largest), '\x3c');

  const std::string header = absl::StrCat(
      "# push_pull_bench: PsClient vs raw gRPC Echo, one shard in-process (async, sgd)\n",
      CommonHeader(command_line),
      absl::StrFormat("# each case: >= %.1f s and >= %d calls of each system (capped at "
                      "%.1f s), after warm-up, shard and echo in alternating blocks\n",
                      options.seconds_per_case, options.min_iterations,
                      options.max_seconds_per_case),
      "# payload in KiB/MiB of f32; MB/s = 1e6 payload bytes per second "
      "(both directions for pushpull); p99 is the slowest call below 100 calls; "
      "ratio = shard MB/s / echo MB/s\n");
  std::printf("%s%s", header.c_str(), TableHeader().c_str());
  std::fflush(stdout);

  std::vector<Row> rows;
  for (int64_t bytes : sizes) {
    RETURN_IF_ERROR(BenchSize(options, bytes, *client, echo, echo_source, &rows));
  }

  if (!options.out_path.empty()) {
    std::string table = header + TableHeader();
    for (const Row& row : rows) table += FormatRow(row);
    RETURN_IF_ERROR(WriteTable(options.out_path, table));
  }
  (void)shard->Shutdown();  // no checkpoints here: cannot fail
  return absl::OkStatus();
}

}  // namespace
}  // namespace shardtrain::bench

int main(int argc, char** argv) {
  const std::string command_line = shardtrain::bench::StartBenchmark(
      argc, argv,
      "Times PsClient Push/Pull/PushPull against a raw gRPC echo baseline, or with\n"
      "--secure over mutual TLS + token against plaintext.");

  shardtrain::bench::BenchOptions options;
  options.seconds_per_case = absl::GetFlag(FLAGS_seconds_per_case);
  options.min_iterations = std::max(1, absl::GetFlag(FLAGS_min_iterations));
  options.max_seconds_per_case = absl::GetFlag(FLAGS_max_seconds_per_case);
  options.max_payload_bytes = int64_t{absl::GetFlag(FLAGS_max_mb)} << 20;
  options.out_path = absl::GetFlag(FLAGS_out);
  options.secure = absl::GetFlag(FLAGS_secure);
  options.rounds = absl::GetFlag(FLAGS_rounds);
  const absl::Status status = shardtrain::bench::Run(options, command_line);
  if (!status.ok()) {
    LOG(ERROR) << status;
    return 1;
  }
  return 0;
}
