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
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
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

// Warms both ops up, then times them in alternating blocks of about a
// quarter of a case each, so that both see the same machine: on a shared
// 2-core VM the speed drifts by tens of percent within a minute.
absl::Status TimePair(const BenchOptions& options, const OpFn& shard_op,
                      const OpFn& echo_op, Timing* shard_timing,
                      Timing* echo_timing) {
  for (const OpFn* op : {&shard_op, &echo_op}) {
    // Grows every reused buffer to size and faults its pages in. One call
    // is not enough: the servers recycle request/response pairs from a
    // pool, and a call may start before the previous pair is back.
    const Clock::time_point warm_start = Clock::now();
    for (int i = 0; i < kWarmupCalls || (i < 1000 && Clock::now() - warm_start <
                                                         std::chrono::milliseconds(100));
         ++i) {
      RETURN_IF_ERROR((*op)());
    }
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

absl::StatusOr<std::unique_ptr<server::PsServer>> StartShard() {
  server::PsServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.metrics_address = "127.0.0.1:0";
  options.max_message_bytes = kMaxMessageBytes;
  options.shard.mode = server::ConsistencyMode::kAsync;
  options.shard.num_workers = 1;
  options.shard.optimizer.name = "sgd";
  return server::PsServer::Start(options);
}

// Measures every op for one payload size; appends a row per op.
absl::Status BenchSize(const BenchOptions& options, int64_t payload_bytes,
                       worker::PsClient& client, EchoClient& echo,
                       const std::string& echo_source, std::vector<Row>* rows) {
  const int64_t elements = payload_bytes / static_cast<int64_t>(sizeof(float));
  TensorSpec spec;
  spec.set_name(absl::StrCat("bench_", SizeName(payload_bytes)));
  spec.add_shape(elements);
  spec.set_dtype(DTYPE_F32);
  RETURN_IF_ERROR(client.Register({spec}));

  // Small, finite gradients: SGD moves the parameters a little each push.
  std::vector<float> grad(static_cast<size_t>(elements), 1e-3f);
  std::vector<float> params(static_cast<size_t>(elements), 0.0f);
  const absl::Span<const float> grads[] = {grad};
  const absl::Span<float> outs[] = {absl::MakeSpan(params)};
  int64_t clock = 0;
  worker::PushStats push_stats;
  worker::PullStats pull_stats;

  for (Op op : {Op::kPush, Op::kPull, Op::kPushPull}) {
    Row row;
    row.payload_bytes = payload_bytes;
    row.op = op;
    OpFn shard_op;
    int64_t echo_request_bytes = 0;
    int64_t echo_reply_bytes = 0;
    switch (op) {
      case Op::kPush:
        shard_op = [&] { return client.Push(++clock, grads, &push_stats); };
        echo_request_bytes = payload_bytes;
        break;
      case Op::kPull:
        shard_op = [&] { return client.Pull(clock, 0, outs, &pull_stats); };
        echo_reply_bytes = payload_bytes;
        break;
      case Op::kPushPull:
        shard_op = [&] {
          return client.PushPull(++clock, 0, grads, outs, &push_stats, &pull_stats);
        };
        echo_request_bytes = payload_bytes;
        echo_reply_bytes = payload_bytes;
        break;
    }
    RETURN_IF_ERROR(TimePair(
        options, shard_op,
        [&] { return echo.Call(echo_source, echo_request_bytes, echo_reply_bytes); },
        &row.shardtrain, &row.echo));
    rows->push_back(row);
    std::printf("%s", FormatRow(row).c_str());
    std::fflush(stdout);
  }
  return absl::OkStatus();
}

absl::Status Run(const BenchOptions& options, const std::string& command_line) {
  std::vector<int64_t> sizes;
  for (int64_t bytes : {int64_t{4} << 10, int64_t{64} << 10, int64_t{1} << 20,
                        int64_t{4} << 20, int64_t{16} << 20, int64_t{64} << 20}) {
    if (bytes <= options.max_payload_bytes) sizes.push_back(bytes);
  }
  if (sizes.empty()) return absl::InvalidArgumentError("--max_mb leaves no sizes");
  const int64_t largest = sizes.back();

  ASSIGN_OR_RETURN(std::unique_ptr<server::PsServer> shard, StartShard());
  ASSIGN_OR_RETURN(std::unique_ptr<EchoServer> echo_server, EchoServer::Start(largest));
  worker::PsClientOptions client_options;
  client_options.servers = {absl::StrCat("127.0.0.1:", shard->port())};
  client_options.max_message_bytes = kMaxMessageBytes;
  ASSIGN_OR_RETURN(std::unique_ptr<worker::PsClient> client,
                   worker::PsClient::Create(client_options, nullptr));
  EchoClient echo(absl::StrCat("127.0.0.1:", echo_server->port()));
  const std::string echo_source(static_cast<size_t>(largest), '\x3c');

  const std::string header = absl::StrCat(
      "# push_pull_bench: PsClient vs raw gRPC Echo, one shard in-process (async, sgd)\n",
      "# command: ", command_line, "\n",
      "# date: ", absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", absl::Now(), absl::UTCTimeZone()),
      "\n# ", MachineDescription(), "\n",
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
    std::ofstream out(options.out_path);
    out << header << TableHeader();
    for (const Row& row : rows) out << FormatRow(row);
    out.close();
    if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", options.out_path));
    std::printf("wrote %s\n", options.out_path.c_str());
  }
  shard->Shutdown();
  return absl::OkStatus();
}

}  // namespace
}  // namespace shardtrain::bench

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Times PsClient Push/Pull/PushPull against a raw gRPC echo baseline.");
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
  const absl::Status status = shardtrain::bench::Run(options, command_line);
  if (!status.ok()) {
    LOG(ERROR) << status;
    return 1;
  }
  return 0;
}
