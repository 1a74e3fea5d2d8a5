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
#include "common/deadlock_detection.h"
#include "common/malloc_tuning.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/echo.grpc.pb.h"
#include "common/credentials.h"
#include "common/status_macros.h"
#include "server/internal/message_pool.h"
#include "server/ps_server.h"
#include "worker/ps_client.h"

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
ABSL_FLAG(int, rounds, 9,
          "--secure: rounds per case, each timing one block of each system; "
          "figures are medians over rounds");

namespace shardtrain::bench {
namespace {

constexpr int kMaxMessageBytes = 256 << 20;
constexpr int kWarmupCalls = 4;

using Clock = std::chrono::steady_clock;

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
// The Echo baseline server.

// Answers every Echo with `reply_bytes` bytes copied from a buffer filled at
// start-up. Request and reply messages are recycled, so their byte buffers
// keep their capacity from call to call. Thread-safe.
class EchoServiceImpl final : public Echo::CallbackService {
 public:
  explicit EchoServiceImpl(int64_t max_reply_bytes)
      : source_(static_cast<size_t>(max_reply_bytes), '\x5a') {
    SetMessageAllocatorFor_Echo(&pool_);
  }

  grpc::ServerUnaryReactor* Echo(grpc::CallbackServerContext* context,
                                 const EchoRequest* request,
                                 EchoReply* reply) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    if (request->reply_bytes() > source_.size()) {
      reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                   "reply_bytes is larger than the server's buffer"));
      return reactor;
    }
    reply->mutable_payload()->assign(source_.data(), request->reply_bytes());
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

 private:
  const std::string source_;
  server::internal::MessagePool<EchoRequest, EchoReply> pool_{4};
};

// The Echo service and its gRPC server on 127.0.0.1, port chosen free.
// Thread-safe.
class EchoServer {
 public:
  static absl::StatusOr<std::unique_ptr<EchoServer>> Start(int64_t max_reply_bytes) {
    std::unique_ptr<EchoServer> server(new EchoServer(max_reply_bytes));
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &server->port_);
    builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
    builder.SetMaxSendMessageSize(kMaxMessageBytes);
    builder.RegisterService(&server->service_);
    server->server_ = builder.BuildAndStart();
    if (server->server_ == nullptr || server->port_ == 0) {
      return absl::UnavailableError("echo server cannot listen on 127.0.0.1:0");
    }
    return server;
  }
  ~EchoServer() {
    if (server_ != nullptr) server_->Shutdown();
  }

  int port() const { return port_; }

 private:
  explicit EchoServer(int64_t max_reply_bytes) : service_(max_reply_bytes) {}

  EchoServiceImpl service_;  // outlives server_
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

// One Echo call at a time over the callback API, as PsClient makes its
// calls; the request and reply messages are reused. Thread-compatible.
class EchoClient {
 public:
  explicit EchoClient(const std::string& address) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(kMaxMessageBytes);
    args.SetMaxSendMessageSize(kMaxMessageBytes);
    stub_ = Echo::NewStub(grpc::CreateCustomChannel(
        address, grpc::InsecureChannelCredentials(), args));
  }

  // Sends `request_bytes` bytes copied from `source` and asks for
  // `reply_bytes` back. REQUIRES: request_bytes <= source.size().
  absl::Status Call(const std::string& source, int64_t request_bytes,
                    int64_t reply_bytes) {
    request_.mutable_payload()->assign(source.data(),
                                       static_cast<size_t>(request_bytes));
    request_.set_reply_bytes(static_cast<uint64_t>(reply_bytes));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    absl::Notification done;
    grpc::Status status;
    stub_->async()->Echo(&context, &request_, &reply_,
                         [&status, &done](grpc::Status s) {
                           status = std::move(s);
                           done.Notify();
                         });
    done.WaitForNotification();
    if (!status.ok()) {
      return absl::UnavailableError(absl::StrCat("echo: ", status.error_message()));
    }
    if (reply_.payload().size() != static_cast<size_t>(reply_bytes)) {
      return absl::InternalError("echo reply has the wrong size");
    }
    return absl::OkStatus();
  }

 private:
  std::unique_ptr<Echo::Stub> stub_;
  EchoRequest request_;
  EchoReply reply_;
};

// ---------------------------------------------------------------------------
// Timing.

struct Timing {
  int iterations = 0;
  double total_seconds = 0;
  double p50_seconds = 0;
  double p99_seconds = 0;
};

double Percentile(std::vector<double> sorted, double q) {
  // Nearest rank: with few samples p99 is the slowest call.
  const size_t rank = static_cast<size_t>(q * static_cast<double>(sorted.size()) + 0.999999);
  return sorted[std::min(sorted.size(), std::max<size_t>(rank, 1)) - 1];
}

using OpFn = std::function<absl::Status()>;

// Call-by-call times of one op.
class Sampler {
 public:
  // Calls `op` until `block_seconds` have passed (at least once).
  absl::Status RunBlock(const OpFn& op, double block_seconds) {
    const Clock::time_point block_start = Clock::now();
    while (true) {
      const Clock::time_point call_start = Clock::now();
      RETURN_IF_ERROR(op());
      const Clock::time_point call_end = Clock::now();
      const double seconds = std::chrono::duration<double>(call_end - call_start).count();
      samples_.push_back(seconds);
      total_seconds_ += seconds;
      if (std::chrono::duration<double>(call_end - block_start).count() >= block_seconds) {
        return absl::OkStatus();
      }
    }
  }

  bool Enough(const BenchOptions& options) const {
    return static_cast<int>(samples_.size()) >= options.min_iterations &&
           total_seconds_ >= options.seconds_per_case;
  }
  bool Capped(const BenchOptions& options) const {
    return samples_.size() >= 2 && total_seconds_ >= options.max_seconds_per_case;
  }

  int calls() const { return static_cast<int>(samples_.size()); }
  double total_seconds() const { return total_seconds_; }

  Timing Summary() const {
    Timing timing;
    timing.iterations = static_cast<int>(samples_.size());
    timing.total_seconds = total_seconds_;
    std::vector<double> sorted = samples_;
    std::sort(sorted.begin(), sorted.end());
    timing.p50_seconds = Percentile(sorted, 0.50);
    timing.p99_seconds = Percentile(sorted, 0.99);
    return timing;
  }

 private:
  std::vector<double> samples_;
  double total_seconds_ = 0;
};

// Grows every reused buffer to size and faults its pages in. One call is
// not enough: the servers recycle request/response pairs from a pool, and a
// call may start before the previous pair is back.
absl::Status WarmUp(const OpFn& op) {
  const Clock::time_point warm_start = Clock::now();
  for (int i = 0; i < kWarmupCalls || (i < 1000 && Clock::now() - warm_start <
                                                       std::chrono::milliseconds(100));
       ++i) {
    RETURN_IF_ERROR(op());
  }
  return absl::OkStatus();
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
  while (!(shard.Enough(options) && echo.Enough(options)) &&
         !(shard.Capped(options) || echo.Capped(options))) {
    RETURN_IF_ERROR(shard.RunBlock(shard_op, block_seconds));
    RETURN_IF_ERROR(echo.RunBlock(echo_op, block_seconds));
  }
  *shard_timing = shard.Summary();
  *echo_timing = echo.Summary();
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// The benchmark.

enum class Op { kPush, kPull, kPushPull };

const char* OpName(Op op) {
  switch (op) {
    case Op::kPush:
      return "push";
    case Op::kPull:
      return "pull";
    case Op::kPushPull:
      return "pushpull";
  }
  return "?";
}

struct Row {
  int64_t payload_bytes = 0;
  Op op = Op::kPush;
  Timing shardtrain;
  Timing echo;
};

std::string SizeName(int64_t bytes) {
  if (bytes >= (1 << 20)) return absl::StrCat(bytes >> 20, "M");
  return absl::StrCat(bytes >> 10, "K");
}

// Payload bytes moved per second, in MB/s (1e6 bytes).
double MegabytesPerSecond(int64_t payload_bytes, Op op, const Timing& timing) {
  const double bytes_per_call =
      static_cast<double>(payload_bytes) * (op == Op::kPushPull ? 2 : 1);
  return bytes_per_call * timing.iterations / timing.total_seconds / 1e6;
}

std::string MachineDescription() {
  std::string cpu = "unknown CPU";
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) cpu = line.substr(colon + 2);
      break;
    }
  }
  return absl::StrFormat("machine: %s, %d online cores", cpu,
                         sysconf(_SC_NPROCESSORS_ONLN));
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

absl::StatusOr<std::unique_ptr<worker::PsClient>> ConnectClient(
    const server::PsServer& shard, const common::ClientSecurity& security = {}) {
  worker::PsClientOptions client_options;
  client_options.servers = {absl::StrCat("127.0.0.1:", shard.port())};
  client_options.max_message_bytes = kMaxMessageBytes;
  client_options.security = security;
  return worker::PsClient::Create(client_options, nullptr);
}

// One f32 tensor of a payload size, registered through one client, with
// that client's gradient and parameter buffers and push clock: makes the
// calls that the benchmark times. Thread-compatible; must outlive the ops it
// makes.
class BenchTensor {
 public:
  static absl::StatusOr<std::unique_ptr<BenchTensor>> Register(worker::PsClient& client,
                                                                int64_t payload_bytes) {
    const int64_t elements = payload_bytes / static_cast<int64_t>(sizeof(float));
    TensorSpec spec;
    spec.set_name(absl::StrCat("bench_", SizeName(payload_bytes)));
    spec.add_shape(elements);
    spec.set_dtype(DTYPE_F32);
    RETURN_IF_ERROR(client.Register({spec}));
    return std::unique_ptr<BenchTensor>(new BenchTensor(client, elements));
  }

  // PsClient::Push, Pull or PushPull of the whole tensor.
  OpFn MakeOp(Op op) {
    switch (op) {
      case Op::kPush:
        return [this] { return client_.Push(++clock_, grads_, &push_stats_); };
      case Op::kPull:
        return [this] { return client_.Pull(clock_, 0, outs_, &pull_stats_); };
      case Op::kPushPull:
        return [this] {
          return client_.PushPull(++clock_, 0, grads_, outs_, &push_stats_, &pull_stats_);
        };
    }
    return [] { return absl::InternalError("unknown op"); };
  }

 private:
  BenchTensor(worker::PsClient& client, int64_t elements)
      : client_(client),
        // Small, finite gradients: SGD moves the parameters a little each push.
        grad_(static_cast<size_t>(elements), 1e-3f),
        params_(static_cast<size_t>(elements), 0.0f),
        grads_{grad_},
        outs_{absl::MakeSpan(params_)} {}

  worker::PsClient& client_;
  std::vector<float> grad_;
  std::vector<float> params_;
  const absl::Span<const float> grads_[1];
  const absl::Span<float> outs_[1];
  int64_t clock_ = 0;
  worker::PushStats push_stats_;
  worker::PullStats pull_stats_;
};

// Measures every op for one payload size; appends a row per op.
absl::Status BenchSize(const BenchOptions& options, int64_t payload_bytes,
                       worker::PsClient& client, EchoClient& echo,
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

std::string CommonHeader(const std::string& command_line) {
  return absl::StrCat(
      "# command: ", command_line, "\n",
      "# date: ", absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", absl::Now(), absl::UTCTimeZone()),
      "\n# ", MachineDescription(), "\n");
}

absl::Status WriteTable(const std::string& path, const std::string& table) {
  std::ofstream out(path);
  out << table;
  out.close();
  if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", path));
  std::printf("wrote %s\n", path.c_str());
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// --secure: the same PsClient calls over plaintext and over mutual TLS with
// the shared token.

double Median(std::vector<double> values) {
  std::nth_element(values.begin(), values.begin() + values.size() / 2, values.end());
  return values[values.size() / 2];
}

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
  ASSIGN_OR_RETURN(std::unique_ptr<worker::PsClient> plain_client, ConnectClient(*plain_shard));
  ASSIGN_OR_RETURN(std::unique_ptr<worker::PsClient> tls_client,
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
  ASSIGN_OR_RETURN(std::unique_ptr<worker::PsClient> client, ConnectClient(*shard));
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
  shardtrain::common::SkipDeadlockDetectionInRelease();
  absl::SetProgramUsageMessage(
      "Times PsClient Push/Pull/PushPull against a raw gRPC echo baseline, or with\n"
      "--secure over mutual TLS + token against plaintext.");
  std::string command_line = argv[0];
  for (int i = 1; i < argc; ++i) absl::StrAppend(&command_line, " ", argv[i]);
  absl::ParseCommandLine(argc, argv);
  // As ps-server and ps-worker do; applies to the baseline too.
  shardtrain::common::KeepLargeBuffersInHeap();
  FLAGS_logtostderr = true;
  FLAGS_minloglevel = google::WARNING;
  google::InitGoogleLogging(argv[0]);

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
