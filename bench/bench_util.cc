#include "bench/bench_util.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>

#include <glog/logging.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>
#include <grpcpp/support/channel_arguments.h>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "app/deadlock_detection.h"
#include "app/malloc_tuning.h"
#include "common/status_macros.h"

namespace shardtrain::bench {

constexpr int kWarmupCalls = 4;

EchoServiceImpl::EchoServiceImpl(int64_t max_reply_bytes)
    : source_(static_cast<size_t>(max_reply_bytes), '\x5a') {
  SetMessageAllocatorFor_Echo(&pool_);
}

grpc::ServerUnaryReactor* EchoServiceImpl::Echo(grpc::CallbackServerContext* context,
                                                const EchoRequest* request,
                                                EchoReply* reply) {
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

void ConfigureEchoBuilder(const std::string& address, grpc::ServerBuilder& builder, int* port) {
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), port);
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
}

absl::StatusOr<std::unique_ptr<grpc::Server>> BuildEchoServer(const std::string& address,
                                                              grpc::ServerBuilder& builder,
                                                              const int& port) {
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("echo server cannot listen on ", address));
  }
  return server;
}

std::unique_ptr<Echo::Stub> NewEchoStub(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  return Echo::NewStub(
      grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
}

absl::StatusOr<std::unique_ptr<EchoServer>> EchoServer::Start(int64_t max_reply_bytes,
                                                              const std::string& address) {
  std::unique_ptr<EchoServer> server(new EchoServer(max_reply_bytes));
  grpc::ServerBuilder builder;
  ConfigureEchoBuilder(address, builder, &server->port_);
  builder.RegisterService(&server->service_);
  ASSIGN_OR_RETURN(server->server_, BuildEchoServer(address, builder, server->port_));
  return server;
}

EchoServer::~EchoServer() {
  if (server_ != nullptr) server_->Shutdown();
}

EchoClient::EchoClient(const std::string& address) : stub_(NewEchoStub(address)) {}

absl::Status EchoClient::Call(const std::string& source, int64_t request_bytes,
                              int64_t reply_bytes) {
  request_.mutable_payload()->assign(source.data(), static_cast<size_t>(request_bytes));
  request_.set_reply_bytes(static_cast<uint64_t>(reply_bytes));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  absl::Notification done;
  grpc::Status status;
  stub_->async()->Echo(&context, &request_, &reply_, [&status, &done](grpc::Status s) {
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

double Percentile(const std::vector<double>& sorted, double q) {
  const size_t rank = static_cast<size_t>(q * static_cast<double>(sorted.size()) + 0.999999);
  return sorted[std::min(sorted.size(), std::max<size_t>(rank, 1)) - 1];
}

double Median(std::vector<double> values) {
  std::nth_element(values.begin(), values.begin() + values.size() / 2, values.end());
  return values[values.size() / 2];
}

absl::Status Sampler::RunBlock(const OpFn& op, double block_seconds) {
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

void Sampler::Merge(const Sampler& other) {
  samples_.insert(samples_.end(), other.samples_.begin(), other.samples_.end());
  total_seconds_ += other.total_seconds_;
}

Timing Sampler::Summary() const {
  Timing timing;
  timing.iterations = static_cast<int>(samples_.size());
  timing.total_seconds = total_seconds_;
  std::vector<double> sorted = samples_;
  std::sort(sorted.begin(), sorted.end());
  timing.p50_seconds = Percentile(sorted, 0.50);
  timing.p99_seconds = Percentile(sorted, 0.99);
  timing.max_seconds = sorted.back();
  return timing;
}

absl::Status WarmUp(const OpFn& op) {
  const Clock::time_point warm_start = Clock::now();
  for (int i = 0; i < kWarmupCalls || (i < 1000 && Clock::now() - warm_start <
                                                       std::chrono::milliseconds(100));
       ++i) {
    RETURN_IF_ERROR(op());
  }
  return absl::OkStatus();
}

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

std::string SizeName(int64_t bytes) {
  if (bytes >= (1 << 20)) return absl::StrCat(bytes >> 20, "M");
  return absl::StrCat(bytes >> 10, "K");
}

absl::StatusOr<std::unique_ptr<BenchTensor>> BenchTensor::Register(client::PsClient& client,
                                                                   int64_t payload_bytes) {
  const int64_t elements = payload_bytes / static_cast<int64_t>(sizeof(float));
  TensorSpec spec;
  spec.set_name(absl::StrCat("bench_", SizeName(payload_bytes)));
  spec.add_shape(elements);
  spec.set_dtype(DTYPE_F32);
  RETURN_IF_ERROR(client.Register({spec}));
  return std::unique_ptr<BenchTensor>(new BenchTensor(client, elements));
}

OpFn BenchTensor::MakeOp(Op op) {
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

BenchTensor::BenchTensor(client::PsClient& client, int64_t elements)
    : client_(client),
      // Small, finite gradients: SGD moves the parameters a little each push.
      grad_(static_cast<size_t>(elements), 1e-3f),
      params_(static_cast<size_t>(elements), 0.0f),
      grads_{grad_},
      outs_{absl::MakeSpan(params_)} {}

absl::Status ApplyClientSettings(absl::string_view settings,
                                 client::PsClientOptions* options) {
  for (absl::string_view setting : absl::StrSplit(settings, ',', absl::SkipEmpty())) {
    const std::vector<absl::string_view> kv = absl::StrSplit(setting, absl::MaxSplits('=', 1));
    int value = 0;
    if (kv.size() != 2 || !absl::SimpleAtoi(kv[1], &value) || value < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("client setting \"", setting, "\" is not key=non-negative integer"));
    }
    client::TransportTuning& transport = options->transport;
    const absl::string_view key = kv[0];
    if (key == "channels") {
      options->channels_per_shard = value;
    } else if (key == "write_buffer_kb") {
      transport.write_buffer_bytes = value << 10;
    } else if (key == "max_frame_kb") {
      transport.max_frame_bytes = value << 10;
    } else if (key == "lookahead_kb") {
      transport.lookahead_bytes = value << 10;
    } else if (key == "min_read_chunk_kb") {
      transport.min_read_chunk_bytes = value << 10;
    } else if (key == "max_read_chunk_kb") {
      transport.max_read_chunk_bytes = value << 10;
    } else if (key == "bdp") {
      transport.bdp_probe = value != 0;
    } else if (key == "frames") {
      options->use_data_port = value != 0;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown client setting \"", key, "\""));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ClientVariant>> ParseClientVariants(absl::string_view flag) {
  std::vector<ClientVariant> variants;
  for (absl::string_view item : absl::StrSplit(flag, ';', absl::SkipEmpty())) {
    const std::vector<absl::string_view> parts = absl::StrSplit(item, absl::MaxSplits(':', 1));
    if (parts.size() != 2 || parts[0].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("client variant \"", item, "\" is not name:settings"));
    }
    client::PsClientOptions check;
    RETURN_IF_ERROR(ApplyClientSettings(parts[1], &check));
    variants.push_back(ClientVariant{std::string(parts[0]), std::string(parts[1])});
  }
  return variants;
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
  return absl::StrFormat("machine: %s, %d online cores", cpu, sysconf(_SC_NPROCESSORS_ONLN));
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

std::string StartBenchmark(int argc, char** argv, const char* usage) {
  app::SkipDeadlockDetectionInRelease();
  absl::SetProgramUsageMessage(usage);
  std::string command_line = argv[0];
  for (int i = 1; i < argc; ++i) absl::StrAppend(&command_line, " ", argv[i]);
  absl::ParseCommandLine(argc, argv);
  // As ps-server and ps-worker do; applies to the baselines too.
  app::KeepLargeBuffersInHeap();
  FLAGS_logtostderr = true;
  FLAGS_minloglevel = google::WARNING;
  google::InitGoogleLogging(argv[0]);
  return command_line;
}

// Parses --scaling: "SxW,SxW,..." with S in [1, 64] and W in [1, 64].
absl::StatusOr<std::vector<std::pair<int, int>>> ParseScaling(absl::string_view text) {
  std::vector<std::pair<int, int>> configs;
  if (text.empty()) return configs;
  for (absl::string_view entry : absl::StrSplit(text, ',')) {
    const std::vector<std::string> parts = absl::StrSplit(entry, 'x');
    int shards = 0;
    int workers = 0;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &shards) ||
        !absl::SimpleAtoi(parts[1], &workers) || shards < 1 || shards > 64 || workers < 1 ||
        workers > 64) {
      return absl::InvalidArgumentError(absl::StrCat(
          "\"", entry, "\" is not SxW with 1 <= S, W <= 64 (shards x workers, e.g. 4x2)"));
    }
    configs.emplace_back(shards, workers);
  }
  return configs;
}

}  // namespace shardtrain::bench
