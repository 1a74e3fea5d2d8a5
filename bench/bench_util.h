// Pieces shared by push_pull_bench and wire_bench: the raw-gRPC Echo
// baseline (service, server, client), call-by-call timing, one f32 tensor
// whose Push/Pull/PushPull the benchmarks time, and table helpers.
#ifndef SHARDTRAIN_BENCH_BENCH_UTIL_H_
#define SHARDTRAIN_BENCH_BENCH_UTIL_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/server.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "bench/echo.grpc.pb.h"
#include "bench/message_pool.h"
#include "client/ps_client.h"

namespace shardtrain::bench {

// Largest gRPC message the benchmarks' servers and clients accept.
inline constexpr int kMaxMessageBytes = 256 << 20;

using Clock = std::chrono::steady_clock;
using OpFn = std::function<absl::Status()>;

// ---------------------------------------------------------------------------
// The Echo baseline.

// Sets `builder` to listen on `address` (the bound port into *port when
// built) with the benchmarks' message limits.
void ConfigureEchoBuilder(const std::string& address, grpc::ServerBuilder& builder, int* port);

// builder.BuildAndStart(); UNAVAILABLE naming `address` when the server
// cannot listen (`port` as ConfigureEchoBuilder left it: 0).
absl::StatusOr<std::unique_ptr<grpc::Server>> BuildEchoServer(const std::string& address,
                                                              grpc::ServerBuilder& builder,
                                                              const int& port);

// A stub on a new channel to an echo server, with the benchmarks' limits.
std::unique_ptr<Echo::Stub> NewEchoStub(const std::string& address);

// Answers every Echo with `reply_bytes` bytes copied from a buffer filled at
// start-up. Request and reply messages are recycled, so their byte buffers
// keep their capacity from call to call. Thread-safe.
class EchoServiceImpl final : public Echo::CallbackService {
 public:
  explicit EchoServiceImpl(int64_t max_reply_bytes);

  grpc::ServerUnaryReactor* Echo(grpc::CallbackServerContext* context,
                                 const EchoRequest* request,
                                 EchoReply* reply) override;

 private:
  const std::string source_;
  MessagePool<EchoRequest, EchoReply> pool_{4};
};

// The Echo service and its gRPC server on `address` (port 0: chosen free).
// Thread-safe.
class EchoServer {
 public:
  static absl::StatusOr<std::unique_ptr<EchoServer>> Start(
      int64_t max_reply_bytes, const std::string& address = "127.0.0.1:0");
  ~EchoServer();

  int port() const { return port_; }
  // Blocks until the server shuts down.
  void Wait() { server_->Wait(); }

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
  explicit EchoClient(const std::string& address);

  // Sends `request_bytes` bytes copied from `source` and asks for
  // `reply_bytes` back. REQUIRES: request_bytes <= source.size().
  absl::Status Call(const std::string& source, int64_t request_bytes,
                    int64_t reply_bytes);

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
  double max_seconds = 0;
};

// Nearest rank: with few samples p99 is the slowest call.
// REQUIRES: `sorted` is sorted and not empty.
double Percentile(const std::vector<double>& sorted, double q);

// REQUIRES: `values` is not empty.
double Median(std::vector<double> values);

// Call-by-call times of one op. Thread-compatible.
class Sampler {
 public:
  // Calls `op` until `block_seconds` have passed (at least once).
  absl::Status RunBlock(const OpFn& op, double block_seconds);
  // Adds the samples of `other`.
  void Merge(const Sampler& other);

  int calls() const { return static_cast<int>(samples_.size()); }
  double total_seconds() const { return total_seconds_; }
  // REQUIRES: calls() > 0.
  Timing Summary() const;

 private:
  std::vector<double> samples_;
  double total_seconds_ = 0;
};

// Grows every reused buffer to size and faults its pages in. One call is
// not enough: the servers recycle request/response pairs from a pool, and a
// call may start before the previous pair is back.
absl::Status WarmUp(const OpFn& op);

// ---------------------------------------------------------------------------
// What is timed.

enum class Op { kPush, kPull, kPushPull };

const char* OpName(Op op);

// "4K", "64M".
std::string SizeName(int64_t bytes);

// One f32 tensor of a payload size, registered through one client, with
// that client's gradient and parameter buffers and push clock: makes the
// calls that the benchmarks time. Thread-compatible; must outlive the ops it
// makes.
class BenchTensor {
 public:
  static absl::StatusOr<std::unique_ptr<BenchTensor>> Register(client::PsClient& client,
                                                                int64_t payload_bytes);

  // PsClient::Push, Pull or PushPull of the whole tensor.
  OpFn MakeOp(Op op);

 private:
  BenchTensor(client::PsClient& client, int64_t elements);

  client::PsClient& client_;
  std::vector<float> grad_;
  std::vector<float> params_;
  const absl::Span<const float> grads_[1];
  const absl::Span<float> outs_[1];
  int64_t clock_ = 0;
  client::PushStats push_stats_;
  client::PullStats pull_stats_;
};

// ---------------------------------------------------------------------------
// Client settings.

// Applies "key=value,key=value" to `options`: channels (channels_per_shard),
// write_buffer_kb, max_frame_kb, lookahead_kb, min_read_chunk_kb,
// max_read_chunk_kb (client/channel_factory.h; 0 keeps gRPC's default), bdp (0 or
// 1), frames (0 or 1: PsClientOptions::use_data_port). Empty: nothing changes. INVALID_ARGUMENT names an unknown key or bad
// value.
absl::Status ApplyClientSettings(absl::string_view settings,
                                 client::PsClientOptions* options);

// A named set of client settings, as ApplyClientSettings takes them.
struct ClientVariant {
  std::string name;
  std::string settings;
};

// "name:settings;name:settings", e.g. "c2:channels=2;wb:write_buffer_kb=1024".
absl::StatusOr<std::vector<ClientVariant>> ParseClientVariants(absl::string_view flag);

// ---------------------------------------------------------------------------
// Tables.

// "machine: <cpu model>, <n> online cores".
std::string MachineDescription();

// "# command: ...", "# date: ...", "# machine: ..." lines.
std::string CommonHeader(const std::string& command_line);

absl::Status WriteTable(const std::string& path, const std::string& table);

// A benchmark's start, as ps-server and ps-worker start: no deadlock
// detection in release builds, large buffers kept in the heap, flags parsed
// (with `usage`), glog to stderr from WARNING up. Returns the command line
// as given, for the results file.
std::string StartBenchmark(int argc, char** argv, const char* usage);

// Parses a scaling mode's configurations: "SxW,SxW,..." (S shards x W
// workers, each in [1, 64]); none for "".
absl::StatusOr<std::vector<std::pair<int, int>>> ParseScaling(absl::string_view text);

}  // namespace shardtrain::bench

#endif  // SHARDTRAIN_BENCH_BENCH_UTIL_H_
