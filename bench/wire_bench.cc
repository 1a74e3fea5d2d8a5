// wire_bench: how close PsClient gets to the wire, with every server in its
// own process, as in a real job.
//
//   wire_bench --out=bench/results/wire_cpu.txt       (about 4 minutes)
//   wire_bench --quick                                (under a minute)
//
// Systems, each measured for every payload (4K ... 64M of f32) and op
// (push, pull, pushpull):
//   st 1x1   one PsClient (one thread) against one ps-server process
//   st 2x2   two PsClients (worker 0 and 1, one thread each, at once)
//            against two ps-server processes (the tensor's partitions
//            spread over both shards)
//   echo     the raw gRPC Echo (bench/echo.proto) against a second
//            wire_bench process started with --serve_echo, carrying the same
//            payload bytes in the same direction(s); callback-API server
//            and client (a message is read on one thread and its reaction
//            runs on another)
//   echo sync the same on gRPC's synchronous API: a server process with
//            --echo_model=sync (a handler per call on gRPC's sync thread
//            pool) and a blocking stub (--systems=echo-sync)
//   echo cq  the same on the async API: a server process with
//            --echo_model=cq (--echo_cq_threads threads, each polling its
//            own completion queue and answering inline) and an async stub
//            whose completion queue the calling thread polls
//            (--systems=echo-cq)
//   echo tcp the same without gRPC: a server process with
//            --echo_model=tcp (bench/tcp_echo.h: a thread per connection
//            reading a call and writing its reply itself, a 16-byte header
//            each way) and a client writing and reading in the calling
//            thread (--systems=echo-tcp): what a plain TCP parameter
//            server's transport costs on request/response calls
//   echo tcp hop the same, but a thread of the client's writes and reads
//            each call and wakes the caller (--systems=echo-tcp-hop): what
//            one hand-off each way costs a client whose calls end in
//            callbacks
//   iperf3   a single-stream `iperf3 -c 127.0.0.1 -t N` (default settings)
//            against an `iperf3 -s` process: the reference for what one TCP
//            stream over loopback moves on this machine
//   1x1 NAME one more PsClient per --variants entry (client settings such as
//            channels=4 or write_buffer_kb=1024, bench::ApplyClientSettings)
//            against the st 1x1 shard, as another worker: channel settings
//            compared in the same rounds as everything else
// The ps-servers run async with sgd (--bin_dir/ps-server), each with a data
// port (server/data_port.h), which the PsClients use unless --client (or a
// variant) says frames=0. Each (size, op)
// case runs --rounds rounds after warm-up; a round times one block of
// --seconds_per_case / --rounds of each gRPC system and one iperf3 run, in an
// order that rotates from round to round, so that a shared machine's
// drifting speed touches every system alike. Figures:
//   MB/s       1e6 payload bytes per second of wall time (both directions for
//              pushpull; 2x2: both workers together), median over rounds
//   p50, p99   call latency in ms over all rounds' calls (2x2: both workers)
//   CPU ms/MB  (CPU time of the client process, from getrusage, + CPU time of
//              the server process(es), from /proc/PID/stat utime + stime)
//              over all timed blocks / MB moved: the least noisy figure on a
//              shared machine. iperf3: its client's (reaped child, from
//              getrusage) + its server's (/proc).
//   x iperf3   median over rounds of MB/s / the same round's iperf3 MB/s
//   x echo     median over rounds of MB/s / the same round's echo MB/s
//              (echo: the callback one)
// Without iperf3 on the PATH (or at --iperf3) its rows and column are left
// out with a note.
//
// Scaling mode (--scaling=1x1,2x2,4x4,8x4, instead of the systems above):
// for each SxW, S ps-server processes and W workers (one PsClient each, on
// its own thread of this process, all at once), every worker moving the
// whole tensor, whose partitions spread over the S shards. Every
// configuration's shards run from the start and a round times one block
// of each, in an order that rotates by round, as above. Figures: aggregate
// MB/s of all workers (median over rounds), p50/p99 over every call, and
// CPU ms per MB of this process and all S shard processes: whether a host
// with cores to spare feeds one GPU worker (more shards) or several.
//
//   wire_bench --scaling=1x1,2x1,4x1,8x1,4x4 --min_kb=1024 --out=... Every process the bench starts is stopped (by PID) when
// it ends, on error, and on SIGINT/SIGTERM/SIGHUP.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <glog/logging.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "app/malloc_tuning.h"
#include "bench/bench_util.h"
#include "bench/process_stats.h"
#include "bench/echo_models.h"
#include "bench/tcp_echo.h"
#include "client/ps_client.h"
#include "common/partition.h"
#include "common/status_macros.h"
#include "testing/files.h"
#include "testing/free_port.h"
#include "testing/local_cluster.h"
#include "testing/port_file.h"
#include "testing/process_group.h"

ABSL_FLAG(std::string, out, "", "If set, also write the results table to this file");
ABSL_FLAG(std::string, bin_dir, "",
          "Directory holding ps-server; default: this binary's own directory");
ABSL_FLAG(std::string, iperf3, "iperf3",
          "iperf3 binary (looked up on the PATH); its rows are skipped if absent");
ABSL_FLAG(int, iperf_seconds, 1, "Length of each iperf3 run (-t), in seconds");
ABSL_FLAG(double, seconds_per_case, 1.6,
          "Time each (size, op, gRPC system) case for about this long in all, "
          "split evenly over the rounds");
ABSL_FLAG(int, rounds, 4, "Rounds per case; figures are medians over rounds");
ABSL_FLAG(int, max_mb, 64, "Skip payloads larger than this many MiB");
ABSL_FLAG(int, min_kb, 0, "Skip payloads smaller than this many KiB");
ABSL_FLAG(bool, quick, false,
          "Payloads 4K, 1M and 16M only, --rounds=2, --seconds_per_case=0.6: "
          "under a minute");
ABSL_FLAG(std::string, systems, "st1x1,st2x2,echo,iperf3",
          "Systems to time, comma-separated (e.g. st1x1 alone while profiling): "
          "st1x1, st2x2, echo (or echo-cb: callback API), echo-sync (sync API), "
          "echo-cq (async API, completion queues polled inline), echo-tcp (no gRPC: "
          "framed calls on a TCP socket, bench/tcp_echo.h), echo-tcp-hop (the same, "
          "each call handed to a client thread), iperf3");
ABSL_FLAG(std::string, ops, "push,pull,pushpull", "Ops to time, comma-separated");
ABSL_FLAG(std::string, client, "",
          "Client settings of st 1x1 and st 2x2, key=value,...: channels, write_buffer_kb, "
          "max_frame_kb, lookahead_kb, min_read_chunk_kb, max_read_chunk_kb, bdp (0/1), "
          "frames (0/1: the shards' data port, server/data_port.h, or gRPC; default 1)");
ABSL_FLAG(std::string, variants, "",
          "More st 1x1 systems timed in the same rounds, name:settings;name:settings "
          "(settings as --client), e.g. \"c2:channels=2;c4:channels=4\"");
ABSL_FLAG(std::string, certs, "",
          "A directory made by scripts/make-certs.sh: the ps-servers serve mutual TLS with "
          "its certificates and token, on gRPC and on their data ports, and every PsClient "
          "uses them (the st 1x1 data port in TLS against a frames=0 variant: gRPC in TLS)");
ABSL_FLAG(double, start_timeout_s, 30, "Wait this long for a server to start");
ABSL_FLAG(bool, serve_echo, false,
          "Run the Echo baseline server instead (until SIGTERM), writing its "
          "port to --port_file");
ABSL_FLAG(std::string, port_file, "", "--serve_echo: write the port here");
ABSL_FLAG(int, echo_max_mb, 64, "--serve_echo: largest reply in MiB");
ABSL_FLAG(std::string, echo_model, "callback",
          "--serve_echo: gRPC API of the server: callback, sync (gRPC's sync thread "
          "pool) or cq (async API: --echo_cq_threads threads, each polling its own "
          "completion queue and answering inline) or tcp (no gRPC, bench/tcp_echo.h)");
ABSL_FLAG(std::string, scaling, "",
          "Scaling mode instead of --systems: SxW configurations, comma-separated "
          "(e.g. 1x1,2x2,4x4,8x4): S ps-server processes, W workers");
ABSL_FLAG(int, echo_cq_threads, 1,
          "Polling threads (one completion queue each) of the echo-cq server");

namespace shardtrain::bench {
namespace {

using testutil::PickFreePort;
using testutil::ProcessGroup;
using testutil::ReadFile;
using testutil::WaitForPorts;

// ---------------------------------------------------------------------------
// Measurements.

enum System {
  kSt1x1 = 0,
  kSt2x2,
  kEcho,
  kEchoSync,
  kEchoCq,
  kEchoTcp,
  kEchoTcpHop,
  kIperf,
  kNumSystems
};
const char* const kSystemNames[kNumSystems] = {
    "st 1x1", "st 2x2", "echo", "echo sync", "echo cq", "echo tcp", "echo tcp hop", "iperf3"};
// The --echo_model of each echo system's server process.
const char* EchoModelOf(int s) {
  return s == kEchoSync                        ? "sync"
         : s == kEchoCq                        ? "cq"
         : s == kEchoTcp || s == kEchoTcpHop ? "tcp"
                                               : "callback";
}

// What one system did in one (size, op) case, over all rounds.
struct CaseFigures {
  std::vector<double> rates;  // MB/s per round
  Sampler calls;              // every call's latency (not iperf3)
  double megabytes = 0;
  double client_cpu_seconds = 0;
  double server_cpu_seconds = 0;
  bool measured = false;
};

// One timed block: wall time, bytes and CPU.
struct Block {
  double seconds = 0;
  double megabytes = 0;
  double client_cpu_seconds = 0;
  double server_cpu_seconds = 0;
};

void Add(const Block& block, CaseFigures* figures) {
  figures->rates.push_back(block.megabytes / block.seconds);
  figures->megabytes += block.megabytes;
  figures->client_cpu_seconds += block.client_cpu_seconds;
  figures->server_cpu_seconds += block.server_cpu_seconds;
  figures->measured = true;
}

// Runs `ops` (one per thread, all at once) for `block_seconds` and measures
// the block; `servers` are the server processes whose CPU counts.
absl::Status TimeBlock(const std::vector<OpFn>& ops, double block_seconds,
                       double megabytes_per_call, const std::vector<pid_t>& servers,
                       Block* block, Sampler* calls) {
  std::vector<Sampler> samplers(ops.size());
  std::vector<absl::Status> statuses(ops.size());
  ASSIGN_OR_RETURN(const double server_before, ProcessesCpuSeconds(servers));
  const double client_before = SelfCpuSeconds();
  const Clock::time_point start = Clock::now();
  if (ops.size() == 1) {
    statuses[0] = samplers[0].RunBlock(ops[0], block_seconds);
  } else {
    absl::Notification go;
    std::vector<std::thread> threads;
    for (size_t i = 0; i < ops.size(); ++i) {
      threads.emplace_back([&, i] {
        go.WaitForNotification();
        statuses[i] = samplers[i].RunBlock(ops[i], block_seconds);
      });
    }
    go.Notify();
    for (std::thread& thread : threads) thread.join();
  }
  const Clock::time_point end = Clock::now();
  const double client_after = SelfCpuSeconds();
  ASSIGN_OR_RETURN(const double server_after, ProcessesCpuSeconds(servers));
  for (const absl::Status& status : statuses) RETURN_IF_ERROR(status);
  block->seconds = std::chrono::duration<double>(end - start).count();
  block->megabytes = 0;
  for (const Sampler& sampler : samplers) {
    block->megabytes += megabytes_per_call * sampler.calls();
    calls->Merge(sampler);
  }
  block->client_cpu_seconds = client_after - client_before;
  block->server_cpu_seconds = server_after - server_before;
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// iperf3.

// A running `iperf3 -s` and single-stream client runs against it.
class Iperf {
 public:
  static absl::StatusOr<std::unique_ptr<Iperf>> Start(ProcessGroup& group,
                                                      const std::string& binary,
                                                      const std::string& dir, int seconds) {
    ASSIGN_OR_RETURN(const int port, PickFreePort());
    std::unique_ptr<Iperf> iperf(new Iperf(group, binary, dir, seconds, port));
    ASSIGN_OR_RETURN(iperf->server_pid_,
                     group.Start({binary, "-s", "-p", absl::StrCat(port), "-B", "127.0.0.1"},
                                    absl::StrCat(dir, "/iperf3-server.log")));
    // The server has no port file: retry the first run until it listens.
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    Block ignored;
    while (true) {
      const absl::Status run = iperf->Run(&ignored);
      if (run.ok()) break;
      if (absl::Now() > deadline || group.Exited(iperf->server_pid_)) {
        return absl::UnavailableError(absl::StrCat("iperf3 does not run: ", run.message()));
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
    return iperf;
  }

  // One `iperf3 -c 127.0.0.1 -t N -J` run.
  absl::Status Run(Block* block) {
    // The client's output, its JSON, goes to a file of its own each run.
    const std::string json_path = absl::StrCat(dir_, "/iperf3-client.json");
    std::filesystem::remove(json_path);
    const double children_before = ReapedChildrenCpuSeconds();
    ASSIGN_OR_RETURN(const double server_before, ProcessCpuSeconds(server_pid_));
    ASSIGN_OR_RETURN(const pid_t pid,
                     group_.Start({binary_, "-c", "127.0.0.1", "-p", absl::StrCat(port_),
                                      "-t", absl::StrCat(seconds_), "-J"},
                                     json_path));
    ASSIGN_OR_RETURN(const int code, group_.Wait(pid, absl::Seconds(seconds_ + 20)));
    ASSIGN_OR_RETURN(const double server_after, ProcessCpuSeconds(server_pid_));
    const double children_after = ReapedChildrenCpuSeconds();
    const std::string json = ReadFile(json_path);
    if (code != 0) return absl::UnavailableError(absl::StrCat("iperf3 client exited ", code));
    google::protobuf::Struct result;
    if (!google::protobuf::util::JsonStringToMessage(json, &result).ok()) {
      return absl::InternalError("iperf3 -J output is not JSON");
    }
    const auto& fields = result.fields();
    if (!fields.contains("end")) return absl::InternalError("iperf3 JSON has no end");
    const auto& end = fields.at("end").struct_value().fields();
    if (!end.contains("sum_received")) {
      return absl::InternalError("iperf3 JSON has no end.sum_received");
    }
    const auto& received = end.at("sum_received").struct_value().fields();
    if (!received.contains("bytes") || !received.contains("seconds")) {
      return absl::InternalError("iperf3 JSON end.sum_received lacks bytes or seconds");
    }
    block->megabytes = received.at("bytes").number_value() / 1e6;
    block->seconds = received.at("seconds").number_value();
    if (block->seconds <= 0) return absl::InternalError("iperf3 ran for no time");
    block->client_cpu_seconds = children_after - children_before;
    block->server_cpu_seconds = server_after - server_before;
    return absl::OkStatus();
  }

 private:
  Iperf(ProcessGroup& group, std::string binary, std::string dir, int seconds, int port)
      : group_(group),
        binary_(std::move(binary)),
        dir_(std::move(dir)),
        seconds_(seconds),
        port_(port) {}

  ProcessGroup& group_;
  const std::string binary_;
  const std::string dir_;
  const int seconds_;
  const int port_;
  pid_t server_pid_ = 0;
};

// ---------------------------------------------------------------------------
// The benchmark.

struct BenchOptions {
  std::string bin_dir;
  std::string iperf3;
  int iperf_seconds = 1;
  double seconds_per_case = 1.6;
  int rounds = 4;
  std::vector<int64_t> sizes;
  absl::Duration start_timeout = absl::Seconds(30);
  std::string out_path;
  bool systems[kNumSystems] = {true, true, true, false, false, true};
  // Polling threads of the echo cq server.
  int echo_cq_threads = 1;
  std::vector<Op> ops = {Op::kPush, Op::kPull, Op::kPushPull};
  // Client settings of st 1x1 and st 2x2 (bench::ApplyClientSettings).
  std::string client_settings;
  // More st 1x1 systems, each one client with its own settings against
  // the same shard, timed in the same rounds.
  std::vector<ClientVariant> variants;
  // Scaling mode: (shards, workers) per configuration; empty: the systems.
  std::vector<std::pair<int, int>> scaling;
  // make-certs.sh's directory: everything in mutual TLS with the token.
  std::string certs;
};

// Systems timed: the four above, then one st 1x1 per client variant.
int NumSystems(const BenchOptions& options) {
  return kNumSystems + static_cast<int>(options.variants.size());
}

std::string SystemName(const BenchOptions& options, int s) {
  return s < kNumSystems ? kSystemNames[s] : absl::StrCat("1x1 ", options.variants[s - kNumSystems].name);
}

// ps-server processes (async, sgd) of one bench system, with their PIDs.
struct Shards {
  std::vector<pid_t> pids;
  std::vector<std::string> addresses;
  std::string certs;  // make-certs.sh's directory when they serve TLS
};

absl::StatusOr<Shards> StartShards(ProcessGroup& group, const BenchOptions& options,
                                   const std::string& dir, const std::string& name,
                                   int count, int num_workers) {
  testutil::LocalClusterOptions cluster_options;
  cluster_options.bin_dir = options.bin_dir;
  cluster_options.shards = count;
  cluster_options.workers = num_workers;
  cluster_options.start_workers = 0;  // the workers are this process's PsClients
  cluster_options.dir = absl::StrCat(dir, "/", name);
  cluster_options.start_timeout = options.start_timeout;
  cluster_options.server_flags = {"--metrics_listen=127.0.0.1:0", "--optimizer=sgd",
                                  "--max_message_mb=256", "--heartbeat_timeout_s=600",
                                  "--data_listen=127.0.0.1:0"};
  if (!options.certs.empty()) {
    for (const std::string& flag :
         {"--tls_cert=" + options.certs + "/server.pem", "--tls_key=" + options.certs + "/server.key",
          "--tls_client_ca=" + options.certs + "/ca.pem",
          "--auth_token_file=" + options.certs + "/token"}) {
      cluster_options.server_flags.push_back(flag);
    }
  }
  std::error_code error;
  if (!std::filesystem::create_directory(cluster_options.dir, error)) {
    return absl::InternalError(absl::StrCat("cannot make ", cluster_options.dir));
  }
  ASSIGN_OR_RETURN(testutil::LocalCluster cluster,
                   testutil::StartLocalCluster(group, cluster_options));
  return Shards{cluster.shards, cluster.servers, options.certs};
}

// A wire_bench --serve_echo process with the server of system `s` (an echo).
struct EchoProcess {
  pid_t pid = 0;
  std::string address;
  int port = 0;
};

absl::StatusOr<EchoProcess> StartEcho(ProcessGroup& group, const BenchOptions& options,
                                      const std::string& self, const std::string& dir,
                                      int s) {
  const std::string name = absl::StrCat("echo-", EchoModelOf(s), s == kEchoTcpHop ? "-hop" : "");
  const std::string port_file = absl::StrCat(dir, "/", name, ".port");
  const std::string log = absl::StrCat(dir, "/", name, ".log");
  EchoProcess echo;
  ASSIGN_OR_RETURN(
      echo.pid,
      group.Start({self, "--serve_echo", absl::StrCat("--echo_model=", EchoModelOf(s)),
                      absl::StrCat("--echo_cq_threads=", options.echo_cq_threads),
                      absl::StrCat("--port_file=", port_file),
                      absl::StrCat("--echo_max_mb=",
                                   (options.sizes.back() + (1 << 20) - 1) >> 20)},
                     log));
  ASSIGN_OR_RETURN(const std::vector<int> ports,
                   WaitForPorts(group, echo.pid, port_file, log, options.start_timeout));
  echo.port = ports[0];
  echo.address = absl::StrCat("127.0.0.1:", ports[0]);
  return echo;
}

// Worker `worker_index` of `num_workers`.
absl::StatusOr<std::unique_ptr<client::PsClient>> Connect(const Shards& shards,
                                                          int worker_index, int num_workers,
                                                          const std::string& settings) {
  client::PsClientOptions options;
  options.servers = shards.addresses;
  options.worker_index = static_cast<uint32_t>(worker_index);
  options.num_workers = static_cast<uint32_t>(num_workers);
  options.max_message_bytes = kMaxMessageBytes;
  if (!shards.certs.empty()) {
    options.security.ca_file = shards.certs + "/ca.pem";
    options.security.cert_file = shards.certs + "/client.pem";
    options.security.key_file = shards.certs + "/client.key";
    options.security.token_file = shards.certs + "/token";
  }
  RETURN_IF_ERROR(ApplyClientSettings(settings, &options));
  return client::PsClient::Create(options, nullptr);
}

struct Row {
  int64_t payload_bytes = 0;
  Op op = Op::kPush;
  explicit Row(int systems) : figures(systems), vs_iperf(systems), vs_echo(systems) {}
  std::vector<CaseFigures> figures;
  // Median over rounds of the round's rate / iperf3's and / echo's.
  std::vector<std::vector<double>> vs_iperf;
  std::vector<std::vector<double>> vs_echo;
};

std::string TableHeader() {
  return absl::StrFormat("%-7s %-8s %-12s %9s %8s %8s %7s %7s %7s %7s %7s\n", "payload", "op",
                         "system", "MB/s", "p50 ms", "p99 ms", "cpu/MB", "cli/MB",
                         "srv/MB", "x iperf", "x echo");
}

std::string FormatRows(const BenchOptions& options, const Row& row, bool with_iperf) {
  std::string text;
  for (int s = 0; s < NumSystems(options); ++s) {
    const CaseFigures& f = row.figures[s];
    if (!f.measured) continue;
    const std::string p50 = s == kIperf ? "-" : absl::StrFormat("%.3f", 1e3 * f.calls.Summary().p50_seconds);
    const std::string p99 = s == kIperf ? "-" : absl::StrFormat("%.3f", 1e3 * f.calls.Summary().p99_seconds);
    const std::string vs_iperf =
        with_iperf && !row.vs_iperf[s].empty() ? absl::StrFormat("%.2f", Median(row.vs_iperf[s])) : "-";
    const std::string vs_echo =
        !row.vs_echo[s].empty() ? absl::StrFormat("%.2f", Median(row.vs_echo[s])) : "-";
    text += absl::StrFormat(
        "%-7s %-8s %-12s %9.1f %8s %8s %7.3f %7.3f %7.3f %7s %7s\n", SizeName(row.payload_bytes),
        s == kIperf ? "tcp" : OpName(row.op), SystemName(options, s), Median(f.rates), p50, p99,
        1e3 * (f.client_cpu_seconds + f.server_cpu_seconds) / f.megabytes,
        1e3 * f.client_cpu_seconds / f.megabytes, 1e3 * f.server_cpu_seconds / f.megabytes,
        vs_iperf, vs_echo);
  }
  return text;
}

// What both modes need: sizes, rounds and time per case.
absl::Status CheckTiming(const BenchOptions& options) {
  if (options.sizes.empty()) return absl::InvalidArgumentError("--min_kb and --max_mb leave no sizes");
  if (options.rounds < 1) return absl::InvalidArgumentError("--rounds must be at least 1");
  if (options.seconds_per_case <= 0) {
    return absl::InvalidArgumentError("--seconds_per_case must be positive");
  }
  return absl::OkStatus();
}

absl::Status Run(const BenchOptions& options, const std::string& self,
                 const std::string& command_line, const std::string& dir) {
  RETURN_IF_ERROR(CheckTiming(options));
  if (options.iperf_seconds < 1) {
    return absl::InvalidArgumentError("--iperf_seconds must be at least 1");
  }
  ProcessGroup group;

  // Servers, each its own process.
  ASSIGN_OR_RETURN(const Shards one, StartShards(group, options, dir, "shard1x1", 1,
                                                       1 + options.variants.size()));
  ASSIGN_OR_RETURN(const Shards two, StartShards(group, options, dir, "shard2x2", 2, 2));
  // The echo servers, one process per selected model.
  EchoProcess echoes[kNumSystems];
  for (int s : {kEcho, kEchoSync, kEchoCq, kEchoTcp, kEchoTcpHop}) {
    if (options.systems[s]) {
      ASSIGN_OR_RETURN(echoes[s], StartEcho(group, options, self, dir, s));
    }
  }
  std::unique_ptr<Iperf> iperf;
  std::string iperf_note;
  if (options.systems[kIperf]) {
    absl::StatusOr<std::unique_ptr<Iperf>> started =
        Iperf::Start(group, options.iperf3, dir, options.iperf_seconds);
    if (started.ok()) {
      iperf = std::move(*started);
      iperf_note = absl::StrFormat("# iperf3: `%s -s` and `%s -c 127.0.0.1 -t %d -J` (one TCP "
                                   "stream, default settings), one run per round\n",
                                   options.iperf3, options.iperf3, options.iperf_seconds);
    } else {
      iperf_note = absl::StrCat("# iperf3 left out: ", started.status().message(), "\n");
    }
  } else {
    iperf_note = "# iperf3 not selected (--systems)\n";
  }

  // The 1x1 shard's workers: st 1x1, then each variant.
  const int workers1 = 1 + static_cast<int>(options.variants.size());
  ASSIGN_OR_RETURN(std::unique_ptr<client::PsClient> client1,
                   Connect(one, 0, workers1, options.client_settings));
  std::vector<std::unique_ptr<client::PsClient>> variant_clients;
  for (size_t v = 0; v < options.variants.size(); ++v) {
    ASSIGN_OR_RETURN(variant_clients.emplace_back(),
                     Connect(one, 1 + static_cast<int>(v), workers1,
                             options.variants[v].settings));
  }
  std::unique_ptr<client::PsClient> clients2[2];
  for (int w = 0; w < 2; ++w) {
    ASSIGN_OR_RETURN(clients2[w], Connect(two, w, 2, options.client_settings));
  }
  std::unique_ptr<EchoClient> echo_cb;
  std::unique_ptr<SyncEchoClient> echo_sync;
  std::unique_ptr<CqEchoClient> echo_cq;
  if (options.systems[kEcho]) echo_cb = std::make_unique<EchoClient>(echoes[kEcho].address);
  if (options.systems[kEchoSync]) {
    echo_sync = std::make_unique<SyncEchoClient>(echoes[kEchoSync].address);
  }
  if (options.systems[kEchoCq]) {
    echo_cq = std::make_unique<CqEchoClient>(echoes[kEchoCq].address);
  }
  std::unique_ptr<TcpEchoClient> echo_tcp;
  if (options.systems[kEchoTcp]) {
    ASSIGN_OR_RETURN(echo_tcp, TcpEchoClient::Connect(echoes[kEchoTcp].port, absl::Seconds(60)));
  }
  std::unique_ptr<TcpEchoClient> echo_tcp_hop;
  if (options.systems[kEchoTcpHop]) {
    ASSIGN_OR_RETURN(echo_tcp_hop, TcpEchoClient::Connect(echoes[kEchoTcpHop].port,
                                                          absl::Seconds(60), /*hand_off=*/true));
  }
  const std::string echo_source(static_cast<size_t>(options.sizes.back()), '\x3c');

  const std::string header = absl::StrCat(
      "# wire_bench: PsClient against ps-server processes (async, sgd), a raw gRPC echo in "
      "another process, and iperf3 single-stream loopback\n",
      CommonHeader(command_line), iperf_note,
      absl::StrFormat("# each case: %d rounds after warm-up; a round times a block of >= %.3f s "
                      "(>= 1 call) of each gRPC system and one iperf3 run, in an order "
                      "rotating by round\n",
                      options.rounds, options.seconds_per_case / options.rounds),
      absl::StrFormat("# echo: callback-API server and client; echo sync: sync-API server "
                      "(gRPC's sync thread pool, default sizes) and blocking stub; echo cq: "
                      "async-API server, %d thread(s) each polling its own completion queue "
                      "and answering inline, and an async stub whose completion queue the "
                      "calling thread polls; echo tcp: no gRPC, frames (wire/frame_socket.h) "
                      "on one TCP connection, a server thread per connection answering "
                      "inline, the client reading in the calling thread; echo tcp hop: the "
                      "same with a client thread that writes and reads each call and wakes "
                      "the caller; each server in its own process\n",
                      options.echo_cq_threads),
      "# MB/s = 1e6 payload bytes per second of wall time (both directions for pushpull; "
      "2x2 = both workers), median over rounds; p50/p99 in ms over all calls; cpu/MB = "
      "(client + server process CPU ms) / MB moved over all blocks, cli/MB and srv/MB its "
      "parts (iperf3: its client and server processes); x iperf, x echo = median over "
      "rounds of MB/s / that round's iperf3 (one direction) or echo MB/s\n",
      "# st 2x2 at 4K: the payload is one partition, which lives on one of the two shards\n",
      absl::StrCat("# client settings of st 1x1 and st 2x2: ",
                   options.client_settings.empty() ? "defaults" : options.client_settings,
                   "\n"),
      options.certs.empty()
          ? std::string()
          : "# TLS: the ps-servers serve mutual TLS with an auth token (--certs) on gRPC and "
            "their data ports, and every PsClient uses it; the echoes and iperf3 stay "
            "plaintext\n",
      [&] {
        std::string variants;
        for (const ClientVariant& variant : options.variants) {
          absl::StrAppend(&variants, "# 1x1 ", variant.name, ": st 1x1 with client settings ",
                          variant.settings, " (another worker of the same shard)\n");
        }
        return variants;
      }());
  std::printf("%s%s", header.c_str(), TableHeader().c_str());
  std::fflush(stdout);
  std::string table = header + TableHeader();

  const double block_seconds = options.seconds_per_case / options.rounds;
  for (int64_t bytes : options.sizes) {
    ASSIGN_OR_RETURN(std::unique_ptr<BenchTensor> tensor1, BenchTensor::Register(*client1, bytes));
    std::vector<std::unique_ptr<BenchTensor>> variant_tensors;
    for (const std::unique_ptr<client::PsClient>& client : variant_clients) {
      ASSIGN_OR_RETURN(variant_tensors.emplace_back(), BenchTensor::Register(*client, bytes));
    }
    // A tensor of one partition (4K) lives whole on one of the two shards.
    const bool spread = options.systems[kSt2x2];
    std::unique_ptr<BenchTensor> tensors2[2];
    for (int w = 0; w < 2 && spread; ++w) {
      ASSIGN_OR_RETURN(tensors2[w], BenchTensor::Register(*clients2[w], bytes));
    }
    for (Op op : options.ops) {
      const int num_systems = NumSystems(options);
      Row row(num_systems);
      row.payload_bytes = bytes;
      row.op = op;
      const double megabytes_per_call = bytes * (op == Op::kPushPull ? 2.0 : 1.0) / 1e6;
      const int64_t echo_request_bytes = op == Op::kPull ? 0 : bytes;
      const int64_t echo_reply_bytes = op == Op::kPush ? 0 : bytes;
      std::vector<OpFn> ops2;
      if (spread) ops2 = {tensors2[0]->MakeOp(op), tensors2[1]->MakeOp(op)};
      // An echo system's op: its client's call, none when it is not selected.
      const auto echo_ops = [&](auto* client) -> std::vector<OpFn> {
        if (client == nullptr) return {};
        return {[&, client] {
          return client->Call(echo_source, echo_request_bytes, echo_reply_bytes);
        }};
      };
      // By system; iperf3 (kIperf) has no ops.
      std::vector<std::vector<OpFn>> ops = {{tensor1->MakeOp(op)},
                                            ops2,
                                            echo_ops(echo_cb.get()),
                                            echo_ops(echo_sync.get()),
                                            echo_ops(echo_cq.get()),
                                            echo_ops(echo_tcp.get()),
                                            echo_ops(echo_tcp_hop.get()),
                                            {}};
      std::vector<std::vector<pid_t>> servers = {one.pids,
                                                 two.pids,
                                                 {echoes[kEcho].pid},
                                                 {echoes[kEchoSync].pid},
                                                 {echoes[kEchoCq].pid},
                                                 {echoes[kEchoTcp].pid},
                                                 {echoes[kEchoTcpHop].pid},
                                                 {}};
      for (const std::unique_ptr<BenchTensor>& tensor : variant_tensors) {
        ops.push_back({tensor->MakeOp(op)});
        servers.push_back(one.pids);
      }
      const auto selected = [&](int s) { return s >= kNumSystems || options.systems[s]; };
      for (int s = 0; s < num_systems; ++s) {
        if (!selected(s)) continue;
        for (const OpFn& fn : ops[s]) RETURN_IF_ERROR(WarmUp(fn));
      }
      for (int round = 0; round < options.rounds; ++round) {
        std::vector<double> rate(num_systems, 0);
        for (int turn = 0; turn < num_systems; ++turn) {
          const int s = (turn + round) % num_systems;
          Block block;
          if (!selected(s) || (s == kSt2x2 && !spread)) continue;
          if (s == kIperf) {
            if (iperf == nullptr) continue;
            RETURN_IF_ERROR(iperf->Run(&block));
          } else {
            RETURN_IF_ERROR(TimeBlock(ops[s], block_seconds, megabytes_per_call, servers[s],
                                      &block, &row.figures[s].calls));
          }
          Add(block, &row.figures[s]);
          rate[s] = block.megabytes / block.seconds;
        }
        for (int s = 0; s < num_systems; ++s) {
          if (rate[s] == 0) continue;
          if (iperf != nullptr && rate[kIperf] > 0) row.vs_iperf[s].push_back(rate[s] / rate[kIperf]);
          if (s != kEcho && rate[kEcho] > 0) row.vs_echo[s].push_back(rate[s] / rate[kEcho]);
        }
      }
      row.vs_iperf[kIperf].clear();
      row.vs_echo[kIperf].clear();
      const std::string lines = FormatRows(options, row, iperf != nullptr);
      table += lines;
      std::printf("%s", lines.c_str());
      std::fflush(stdout);
    }
  }
  if (!options.out_path.empty()) RETURN_IF_ERROR(WriteTable(options.out_path, table));
  return absl::OkStatus();
}

// Scaling mode: one configuration's shards and workers.
struct ScaleConfig {
  int num_shards = 0;
  int num_workers = 0;
  Shards shards;
  std::vector<std::unique_ptr<client::PsClient>> clients;
  std::string name() const { return absl::StrCat(num_shards, "x", num_workers); }
};

absl::Status RunScaling(const BenchOptions& options, const std::string& command_line,
                        const std::string& dir) {
  RETURN_IF_ERROR(CheckTiming(options));
  ProcessGroup group;
  std::vector<ScaleConfig> configs(options.scaling.size());
  for (size_t c = 0; c < configs.size(); ++c) {
    ScaleConfig& config = configs[c];
    std::tie(config.num_shards, config.num_workers) = options.scaling[c];
    ASSIGN_OR_RETURN(config.shards, StartShards(group, options, dir,
                                                absl::StrCat("scale", config.name()),
                                                config.num_shards, config.num_workers));
    for (int w = 0; w < config.num_workers; ++w) {
      ASSIGN_OR_RETURN(config.clients.emplace_back(),
                       Connect(config.shards, w, config.num_workers, options.client_settings));
    }
  }
  const std::string header = absl::StrCat(
      "# wire_bench scaling: S ps-server processes (async, sgd) x W workers (one PsClient "
      "each, a thread each in one process, all at once), each worker moving the whole "
      "tensor, its partitions spread over the S shards\n",
      CommonHeader(command_line),
      absl::StrFormat("# each case: %d rounds after warm-up; a round times a block of >= %.3f s "
                      "of each configuration, in an order rotating by round\n",
                      options.rounds, options.seconds_per_case / options.rounds),
      "# MB/s = 1e6 payload bytes per second of wall time of all workers together (both "
      "directions for pushpull), median over rounds; p50/p99 in ms over all calls; cpu/MB = "
      "(this process + the S shard processes' CPU ms) / MB moved, cli/MB and srv/MB its "
      "parts; x 1st = median over rounds of MB/s / that round's MB/s of the first "
      "configuration\n",
      absl::StrCat("# client settings: ",
                   options.client_settings.empty() ? "defaults" : options.client_settings,
                   "\n"));
  const std::string columns =
      absl::StrFormat("%-7s %-8s %-7s %9s %8s %8s %7s %7s %7s %7s\n", "payload", "op", "SxW",
                      "MB/s", "p50 ms", "p99 ms", "cpu/MB", "cli/MB", "srv/MB", "x 1st");
  std::printf("%s%s", header.c_str(), columns.c_str());
  std::fflush(stdout);
  std::string table = header + columns;
  const double block_seconds = options.seconds_per_case / options.rounds;
  for (int64_t bytes : options.sizes) {
    // By configuration, by worker.
    std::vector<std::vector<std::unique_ptr<BenchTensor>>> tensors(configs.size());
    for (size_t c = 0; c < configs.size(); ++c) {
      for (const std::unique_ptr<client::PsClient>& client : configs[c].clients) {
        ASSIGN_OR_RETURN(tensors[c].emplace_back(), BenchTensor::Register(*client, bytes));
      }
    }
    for (Op op : options.ops) {
      const double megabytes_per_call = bytes * (op == Op::kPushPull ? 2.0 : 1.0) / 1e6;
      std::vector<std::vector<OpFn>> ops(configs.size());
      for (size_t c = 0; c < configs.size(); ++c) {
        for (const std::unique_ptr<BenchTensor>& tensor : tensors[c]) {
          ops[c].push_back(tensor->MakeOp(op));
          RETURN_IF_ERROR(WarmUp(ops[c].back()));
        }
      }
      std::vector<CaseFigures> figures(configs.size());
      std::vector<std::vector<double>> vs_first(configs.size());
      for (int round = 0; round < options.rounds; ++round) {
        std::vector<double> rate(configs.size(), 0);
        for (size_t turn = 0; turn < configs.size(); ++turn) {
          const size_t c = (turn + static_cast<size_t>(round)) % configs.size();
          Block block;
          RETURN_IF_ERROR(TimeBlock(ops[c], block_seconds, megabytes_per_call,
                                    configs[c].shards.pids, &block, &figures[c].calls));
          Add(block, &figures[c]);
          rate[c] = block.megabytes / block.seconds;
        }
        for (size_t c = 0; c < configs.size(); ++c) vs_first[c].push_back(rate[c] / rate[0]);
      }
      std::string lines;
      for (size_t c = 0; c < configs.size(); ++c) {
        const CaseFigures& f = figures[c];
        const Timing timing = f.calls.Summary();
        lines += absl::StrFormat(
            "%-7s %-8s %-7s %9.1f %8.3f %8.3f %7.3f %7.3f %7.3f %7.2f\n", SizeName(bytes),
            OpName(op), configs[c].name(), Median(f.rates), 1e3 * timing.p50_seconds,
            1e3 * timing.p99_seconds,
            1e3 * (f.client_cpu_seconds + f.server_cpu_seconds) / f.megabytes,
            1e3 * f.client_cpu_seconds / f.megabytes, 1e3 * f.server_cpu_seconds / f.megabytes,
            Median(vs_first[c]));
      }
      table += lines;
      std::printf("%s", lines.c_str());
      std::fflush(stdout);
    }
  }
  if (!options.out_path.empty()) RETURN_IF_ERROR(WriteTable(options.out_path, table));
  return absl::OkStatus();
}

// Moves a started server into `*kept`; returns its port.
template <typename Server>
absl::StatusOr<int> KeepServer(absl::StatusOr<std::unique_ptr<Server>> started,
                               std::unique_ptr<Server>* kept) {
  RETURN_IF_ERROR(started.status());
  *kept = *std::move(started);
  return (*kept)->port();
}

// --serve_echo: the Echo server as its own process.
int ServeEcho() {
  const std::string port_file = absl::GetFlag(FLAGS_port_file);
  if (port_file.empty()) {
    LOG(ERROR) << "--serve_echo needs --port_file";
    return 2;
  }
  sigset_t stop;
  sigemptyset(&stop);
  for (int s : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&stop, s);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);  // before gRPC starts threads
  const int64_t max_reply_bytes = int64_t{absl::GetFlag(FLAGS_echo_max_mb)} << 20;
  const std::string model = absl::GetFlag(FLAGS_echo_model);
  // The server of the chosen model, kept until the process ends.
  std::unique_ptr<EchoServer> callback;
  std::unique_ptr<SyncEchoServer> sync;
  std::unique_ptr<CqEchoServer> cq;
  std::unique_ptr<TcpEchoServer> tcp;
  absl::StatusOr<int> port = absl::InvalidArgumentError(
      absl::StrCat("--echo_model: \"", model, "\" is not callback, sync, cq or tcp"));
  if (model == "callback") {
    port = KeepServer(EchoServer::Start(max_reply_bytes), &callback);
  } else if (model == "sync") {
    port = KeepServer(SyncEchoServer::Start(max_reply_bytes), &sync);
  } else if (model == "cq") {
    port = KeepServer(
        CqEchoServer::Start(max_reply_bytes, absl::GetFlag(FLAGS_echo_cq_threads)), &cq);
  } else if (model == "tcp") {
    port = KeepServer(TcpEchoServer::Start(max_reply_bytes), &tcp);
  }
  if (!port.ok()) {
    LOG(ERROR) << port.status();
    return 1;
  }
  const std::string temp = absl::StrCat(port_file, ".tmp");
  {
    std::ofstream out(temp);
    out << *port << "\n";
  }
  if (std::rename(temp.c_str(), port_file.c_str()) != 0) {
    LOG(ERROR) << "cannot write " << port_file;
    return 1;
  }
  int signal = 0;
  sigwait(&stop, &signal);
  return 0;
}

}  // namespace
}  // namespace shardtrain::bench

int main(int argc, char** argv) {
  const std::string command_line = shardtrain::bench::StartBenchmark(
      argc, argv,
      "Times PsClient against ps-server processes next to a raw gRPC echo process and\n"
      "iperf3 over loopback: MB/s, p50/p99 and CPU ms per MB.");
  namespace b = shardtrain::bench;
  if (absl::GetFlag(FLAGS_serve_echo)) return b::ServeEcho();

  for (int s : {SIGINT, SIGTERM, SIGHUP}) std::signal(s, shardtrain::testutil::KillAllProcessesAndExit);
  const std::string self = b::SelfPath();
  if (self.empty()) {
    LOG(ERROR) << "cannot find this binary through /proc/self/exe";
    return 1;
  }
  b::BenchOptions options;
  options.bin_dir = absl::GetFlag(FLAGS_bin_dir);
  if (options.bin_dir.empty()) {
    options.bin_dir = std::filesystem::path(self).parent_path().string();
  }
  options.iperf3 = absl::GetFlag(FLAGS_iperf3);
  options.iperf_seconds = absl::GetFlag(FLAGS_iperf_seconds);
  options.seconds_per_case = absl::GetFlag(FLAGS_seconds_per_case);
  options.rounds = absl::GetFlag(FLAGS_rounds);
  options.start_timeout = absl::Seconds(absl::GetFlag(FLAGS_start_timeout_s));
  options.out_path = absl::GetFlag(FLAGS_out);
  options.client_settings = absl::GetFlag(FLAGS_client);
  options.certs = absl::GetFlag(FLAGS_certs);
  options.echo_cq_threads = absl::GetFlag(FLAGS_echo_cq_threads);
  if (options.echo_cq_threads < 1) {
    LOG(ERROR) << "--echo_cq_threads must be at least 1";
    return 2;
  }
  {
    shardtrain::client::PsClientOptions check;
    const absl::Status valid = b::ApplyClientSettings(options.client_settings, &check);
    if (!valid.ok()) {
      LOG(ERROR) << "--client: " << valid;
      return 2;
    }
  }
  absl::StatusOr<std::vector<b::ClientVariant>> variants =
      b::ParseClientVariants(absl::GetFlag(FLAGS_variants));
  if (!variants.ok()) {
    LOG(ERROR) << "--variants: " << variants.status();
    return 2;
  }
  options.variants = *std::move(variants);
  absl::StatusOr<std::vector<std::pair<int, int>>> scaling =
      b::ParseScaling(absl::GetFlag(FLAGS_scaling));
  if (!scaling.ok()) {
    LOG(ERROR) << "--scaling: " << scaling.status();
    return 2;
  }
  options.scaling = *std::move(scaling);
  std::vector<int64_t> candidates = {int64_t{4} << 10,  int64_t{64} << 10, int64_t{1} << 20,
                                     int64_t{4} << 20,  int64_t{16} << 20, int64_t{64} << 20};
  if (absl::GetFlag(FLAGS_quick)) {
    candidates = {int64_t{4} << 10, int64_t{1} << 20, int64_t{16} << 20};
    options.rounds = 2;
    options.seconds_per_case = 0.6;
  }
  const std::map<std::string, int> system_names = {
      {"st1x1", b::kSt1x1},        {"st2x2", b::kSt2x2},     {"echo", b::kEcho},
      {"echo-cb", b::kEcho},       {"echo-sync", b::kEchoSync}, {"echo-cq", b::kEchoCq},
      {"echo-tcp", b::kEchoTcp},   {"echo-tcp-hop", b::kEchoTcpHop}, {"iperf3", b::kIperf}};
  std::fill(std::begin(options.systems), std::end(options.systems), false);
  for (absl::string_view name : absl::StrSplit(absl::GetFlag(FLAGS_systems), ',')) {
    const auto it = system_names.find(std::string(name));
    if (it == system_names.end()) {
      LOG(ERROR) << "--systems: unknown system " << name;
      return 2;
    }
    options.systems[it->second] = true;
  }
  options.ops.clear();
  for (absl::string_view name : absl::StrSplit(absl::GetFlag(FLAGS_ops), ',')) {
    if (name == "push") {
      options.ops.push_back(shardtrain::bench::Op::kPush);
    } else if (name == "pull") {
      options.ops.push_back(shardtrain::bench::Op::kPull);
    } else if (name == "pushpull") {
      options.ops.push_back(shardtrain::bench::Op::kPushPull);
    } else {
      LOG(ERROR) << "--ops: unknown op " << name;
      return 2;
    }
  }
  for (int64_t bytes : candidates) {
    if (bytes <= int64_t{absl::GetFlag(FLAGS_max_mb)} << 20 &&
        bytes >= int64_t{absl::GetFlag(FLAGS_min_kb)} << 10) {
      options.sizes.push_back(bytes);
    }
  }
  const std::string dir = shardtrain::testutil::MakeTempDir("wire_bench");
  if (dir.empty()) {
    LOG(ERROR) << "cannot make a temporary directory";
    return 1;
  }
  const absl::Status status = options.scaling.empty()
                                  ? b::Run(options, self, command_line, dir)
                                  : b::RunScaling(options, command_line, dir);
  if (!status.ok()) {
    LOG(ERROR) << status << " (logs in " << dir << ")";
    return 1;
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  return 0;
}
