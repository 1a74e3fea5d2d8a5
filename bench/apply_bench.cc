// apply_bench: the server's CPU cost of applying one push (and of
// answering one pull), per MB.
//
// A shard (async, one worker) holds one tensor of --mb MiB of f32
// parameters in --partitions partitions. Each case pushes a gradient for
// every partition with an optimizer and a payload dtype; the request is
// encoded once with stock protobuf and handed to the shard as gRPC would
// hand it over: in --piece_kb KiB slices, the first one cut short so that
// every later cut falls at an odd offset. Timed per push:
//  - wire:  wire::ParsePush over the slices + Shard::Push(PushView): the
//           server's path (validation, NaN/Inf check, optimizer reading the
//           received bytes).
//  - stock: PushRequest::ParseFromString of the same bytes (a copy of every
//           payload) + Shard::Push(PushRequest): what a server that parses
//           with stock protobuf pays.
// Baselines measured in the same run, over the same number of parameters:
//  - loop:   `p[i] -= lr * g[i]` over aligned f32 arrays (the least an SGD
//            update can cost);
//  - memcpy: a copy of the payload's bytes.
// Each round times every path and baseline in turn (so a neighbour's load
// affects them alike); figures are medians over --rounds rounds, in ms per
// MB of f32 parameters updated (so f32 and bf16 payloads compare on the same
// work), and medians of the per-round ratios of the wire path to each
// baseline and of the stock path to the wire path.
// Pulls of the same tensor (each dtype): PullReader::Fill into a
// wire::PullResponseBuilder (each partition converted once, into the memory
// that is sent) and Finish, against a memcpy of the payload bytes.
//
//   apply_bench --out=bench/results/apply_cpu.txt
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <prometheus/registry.h>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "common/payload.h"
#include "common/status_macros.h"
#include "server/shard.h"
#include "wire/message_encoder.h"
#include "wire/message_views.h"

ABSL_FLAG(int, mb, 4, "MiB of f32 parameters pushed per request");
ABSL_FLAG(int, partitions, 256, "Partitions the tensor is split into");
ABSL_FLAG(int, piece_kb, 16, "Size of the received slices, KiB");
ABSL_FLAG(std::string, optimizers, "sgd,momentum,adam", "Optimizers to time");
ABSL_FLAG(std::string, dtypes, "f32,bf16", "Payload dtypes to time (f32, f16, bf16)");
ABSL_FLAG(int, rounds, 15, "Rounds per case (medians reported)");
ABSL_FLAG(int, iterations, 10, "Calls of each path and baseline per round");
ABSL_FLAG(bool, stock, true, "Also time the stock protobuf path (off: to profile the wire path)");
ABSL_FLAG(std::string, out, "", "Also write the table here");

namespace {

using namespace shardtrain;  // NOLINT: a benchmark's main file
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Mean seconds per call of `op` over `iterations` calls.
template <typename Op>
double Block(int iterations, Op&& op) {
  const Clock::time_point start = Clock::now();
  for (int i = 0; i < iterations; ++i) op();
  return Seconds(start) / iterations;
}

DType ParseDType(absl::string_view name) {
  absl::StatusOr<DType> dtype = common::ParseDTypeName(name);
  if (!dtype.ok()) {
    std::fprintf(stderr, "apply_bench: --dtypes: %s\n",
                 std::string(dtype.status().message()).c_str());
    std::exit(2);
  }
  return *dtype;
}

struct Case {
  std::unique_ptr<prometheus::Registry> registry;
  std::unique_ptr<server::ShardMetrics> metrics;
  std::unique_ptr<server::Shard> shard;
  std::string request_bytes;
  wire::ReceivedMessage message;
};

// A shard with "w" registered and a push of all its partitions, encoded.
absl::StatusOr<Case> MakeCase(const std::string& optimizer, DType dtype, int64_t elements,
                              int partitions, size_t piece_bytes) {
  Case c;
  c.registry = std::make_unique<prometheus::Registry>();
  c.metrics = std::make_unique<server::ShardMetrics>(*c.registry);
  server::ShardOptions options;
  options.mode = server::ConsistencyMode::kAsync;
  options.num_workers = 1;
  options.optimizer.name = optimizer;
  options.optimizer.learning_rate = 1e-4f;
  options.partitioning.max_partition_elements = (elements + partitions - 1) / partitions;
  options.limits.max_stored_elements = elements;
  options.limits.max_parts_per_request = partitions;
  ASSIGN_OR_RETURN(c.shard, server::Shard::Create(options, c.metrics.get()));
  RegisterRequest reg;
  TensorSpec* spec = reg.add_tensors();
  spec->set_name("w");
  spec->add_shape(elements);
  spec->set_dtype(DTYPE_F32);
  spec->mutable_init()->set_kind(Initializer::KIND_CONSTANT);
  spec->mutable_init()->set_scale(0.5f);
  RegisterResponse registered;
  RETURN_IF_ERROR(c.shard->Register(reg, &registered));

  std::mt19937 random(1);
  std::normal_distribution<float> noise(0.0f, 1e-3f);
  PushRequest push;
  push.set_worker(0);
  push.set_clock(1);
  for (const PartitionInfo& info : registered.partitions()) {
    GradientPart* part = push.add_parts();
    part->mutable_key()->set_tensor("w");
    part->mutable_key()->set_partition(info.partition());
    part->set_version(0);  // async: every later push is stale, and applied
    std::vector<float> grad(info.size());
    for (float& g : grad) g = noise(random);
    common::EncodeDense(grad, dtype, part->mutable_grad()->mutable_data());
    part->mutable_grad()->set_dtype(dtype);
  }
  c.request_bytes = push.SerializeAsString();
  std::vector<size_t> cuts;
  for (size_t cut = piece_bytes - 7; cut < c.request_bytes.size(); cut += piece_bytes) {
    cuts.push_back(cut);
  }
  c.message = wire::ReceivedMessage::FromPieces(c.request_bytes, cuts);
  return c;
}

absl::Status Run(const std::string& command_line) {
  const int64_t elements = int64_t{absl::GetFlag(FLAGS_mb)} << 18;  // 4-byte floats
  const double param_mb = static_cast<double>(elements) * 4 / (1 << 20);
  const int partitions = absl::GetFlag(FLAGS_partitions);
  const size_t piece_bytes = size_t{1024} * absl::GetFlag(FLAGS_piece_kb);
  const int rounds = absl::GetFlag(FLAGS_rounds);
  const int iterations = absl::GetFlag(FLAGS_iterations);

  // Baselines over the same number of parameters.
  std::vector<float> params(elements, 0.5f), grad(elements, 1e-3f);
  std::vector<char> copy_from(elements * 4, 1), copy_to(elements * 4);
  float* __restrict p = params.data();
  const float* __restrict g = grad.data();
  const float lr = 1e-4f;
  auto loop = [&] {
    for (int64_t i = 0; i < elements; ++i) p[i] -= lr * g[i];
    asm volatile("" : : "r"(p) : "memory");
  };

  std::string table = absl::StrCat(
      bench::CommonHeader(command_line),
      absl::StrFormat("# %d MiB of f32 parameters in %d partitions; request in %d KiB "
                      "slices at odd offsets; medians of %d rounds x %d pushes, each "
                      "round timing every path and baseline in turn\n",
                      absl::GetFlag(FLAGS_mb), partitions, absl::GetFlag(FLAGS_piece_kb),
                      rounds, iterations),
      "# ms/MB: per MB of f32 parameters updated. wire = ParsePush + Shard::Push(view);"
      " stock = protobuf parse + Shard::Push(PushRequest)\n"
      "# loop = p[i] -= lr*g[i] over aligned f32 (same parameter count); memcpy = copy "
      "of the payload bytes; ratios are medians of per-round ratios\n",
      absl::StrFormat("%-9s %-5s %9s %8s %8s %8s %8s %10s %10s %10s\n", "optimizer",
                      "dtype", "payloadMB", "wire", "stock", "loop", "memcpy", "wire/loop",
                      "wire/copy", "stock/wire"));
  std::printf("%s", table.c_str());
  const bool time_stock = absl::GetFlag(FLAGS_stock);

  for (absl::string_view optimizer : absl::StrSplit(absl::GetFlag(FLAGS_optimizers), ',')) {
    for (absl::string_view dtype_name : absl::StrSplit(absl::GetFlag(FLAGS_dtypes), ',')) {
      const DType dtype = ParseDType(dtype_name);
      ASSIGN_OR_RETURN(Case c, MakeCase(std::string(optimizer), dtype, elements, partitions,
                                        piece_bytes));
      const size_t payload_bytes = static_cast<size_t>(elements) * common::DTypeSize(dtype);
      auto copy = [&] {
        std::memcpy(copy_to.data(), copy_from.data(), payload_bytes);
        asm volatile("" : : "r"(copy_to.data()) : "memory");
      };
      absl::Status failed;
      wire::PushView view;
      PushResponse response;
      auto wire_push = [&] {
        absl::Status status = wire::ParsePush(c.message, &view);
        if (status.ok()) status = c.shard->Push(view, &response);
        if (!status.ok()) failed = status;
      };
      PushRequest stock;
      auto stock_push = [&] {
        absl::Status status = stock.ParseFromString(c.request_bytes)
                                  ? absl::OkStatus()
                                  : absl::InternalError("stock parse failed");
        if (status.ok()) status = c.shard->Push(stock, &response);
        if (!status.ok()) failed = status;
      };
      // Warm up: grow buffers, fault pages in.
      loop(), copy(), wire_push();
      if (time_stock) stock_push();
      std::vector<double> wire_s, stock_s, loop_s, copy_s, to_loop, to_copy, stock_to_wire;
      for (int r = 0; r < rounds; ++r) {
        loop_s.push_back(Block(iterations, loop));
        copy_s.push_back(Block(iterations, copy));
        wire_s.push_back(Block(iterations, wire_push));
        stock_s.push_back(time_stock ? Block(iterations, stock_push) : 0.0);
        to_loop.push_back(wire_s.back() / loop_s.back());
        to_copy.push_back(wire_s.back() / copy_s.back());
        stock_to_wire.push_back(stock_s.back() / wire_s.back());
      }
      RETURN_IF_ERROR(failed);
      const double ms_per_mb = 1e3 / param_mb;
      const std::string row = absl::StrFormat(
          "%-9s %-5s %9.2f %8.4f %8.4f %8.4f %8.4f %10.2f %10.2f %10.2f\n", optimizer,
          dtype_name, static_cast<double>(payload_bytes) / (1 << 20),
          bench::Median(wire_s) * ms_per_mb, bench::Median(stock_s) * ms_per_mb,
          bench::Median(loop_s) * ms_per_mb, bench::Median(copy_s) * ms_per_mb,
          bench::Median(to_loop), bench::Median(to_copy), bench::Median(stock_to_wire));
      std::printf("%s", row.c_str());
      std::fflush(stdout);
      table += row;
    }
  }
  // Pulls of the same tensor: PullReader::Fill writing each partition once
  // into a PullResponseBuilder, and the finished message.
  const std::string pull_header = absl::StrFormat(
      "# pull: PullReader::Fill into a wire::PullResponseBuilder + Finish, per MB of f32 "
      "parameters read\n%-9s %-5s %9s %8s %8s %10s\n",
      "pull", "dtype", "payloadMB", "pull", "memcpy", "pull/copy");
  std::printf("%s", pull_header.c_str());
  table += pull_header;
  for (absl::string_view dtype_name : absl::StrSplit(absl::GetFlag(FLAGS_dtypes), ',')) {
    const DType dtype = ParseDType(dtype_name);
    ASSIGN_OR_RETURN(Case c, MakeCase("sgd", DTYPE_F32, elements, partitions, piece_bytes));
    PullRequest request;
    request.set_worker(0);
    request.set_dtype(dtype);
    for (int p = 0; p < partitions; ++p) {
      PartitionKey* key = request.add_parts();
      key->set_tensor("w");
      key->set_partition(p);
    }
    RETURN_IF_ERROR(c.shard->pulls().Validate(request));
    const size_t payload_bytes = static_cast<size_t>(elements) * common::DTypeSize(dtype);
    auto copy = [&] {
      std::memcpy(copy_to.data(), copy_from.data(), payload_bytes);
      asm volatile("" : : "r"(copy_to.data()) : "memory");
    };
    grpc::ByteBuffer sent;
    auto pull = [&] {
      wire::PullResponseBuilder builder;
      c.shard->pulls().Fill(request, &builder);
      builder.Finish(0, c.shard->incarnation(), &sent);
      sent.Clear();  // as gRPC does once it has written the message
    };
    copy(), pull();
    std::vector<double> pull_s, copy_s, to_copy;
    for (int r = 0; r < rounds; ++r) {
      copy_s.push_back(Block(iterations, copy));
      pull_s.push_back(Block(iterations, pull));
      to_copy.push_back(pull_s.back() / copy_s.back());
    }
    const double ms_per_mb = 1e3 / param_mb;
    const std::string row = absl::StrFormat(
        "%-9s %-5s %9.2f %8.4f %8.4f %10.2f\n", "pull", dtype_name,
        static_cast<double>(payload_bytes) / (1 << 20), bench::Median(pull_s) * ms_per_mb,
        bench::Median(copy_s) * ms_per_mb, bench::Median(to_copy));
    std::printf("%s", row.c_str());
    table += row;
  }
  if (!absl::GetFlag(FLAGS_out).empty()) {
    RETURN_IF_ERROR(bench::WriteTable(absl::GetFlag(FLAGS_out), table));
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  const std::string command_line = shardtrain::bench::StartBenchmark(
      argc, argv,
      "apply_bench: a shard's CPU cost of applying a push (ms per MB) against a "
      "plain SGD loop and memcpy measured in the same run");
  const absl::Status status = Run(command_line);
  if (!status.ok()) {
    std::fprintf(stderr, "apply_bench: %s\n", std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}
