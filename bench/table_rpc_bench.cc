// table_rpc_bench: a sparse table's Lookup and PushSparse on the shard's
// data port (frames on TCP, as workers send them by default) and over
// gRPC, one worker against one ps-server process, next to what the same
// bytes cost on the project's dense path and on a raw gRPC echo, in the
// same rounds.
//
// The table (dim --dim, f32, --optimizer) holds --rows rows; each call
// names --batch unique ids drawn at random from them (rows that exist: the
// steady state of a trained table; with --new_share, that share of a
// training lookup's ids are new, as in a table that still grows). Per
// round, in turn:
//   lookup      TableClient::Lookup(train) of the batch: ids out, rows back,
//               on the shard's data port
//   push_sparse TableClient::Push of the batch's row gradients (applied),
//               on the data port
//   lookup grpc, push_sparse grpc
//               the same calls over gRPC: a second PsClient (worker 1 of
//               the job's 2) with PsClientOptions::use_data_port false,
//               on the same shard and table
//   lookup eval TableClient::Lookup(eval) of the batch on the data port:
//               the rows as they are, under the table's shared lock,
//               marking nothing (a training lookup of stored rows also
//               marks them used; one that creates rows takes the
//               exclusive lock)
//   dense pull  PsClient::Pull of one tensor of batch x dim f32 (the rows'
//               bytes), registered on the same shard, on the data port
//   dense push  PsClient::Push of the same tensor's gradient (SGD)
//   echo pull   raw gRPC Echo (a `wire_bench --serve_echo` process): 8 bytes
//               per id out, batch x dim x 4 bytes back
//   echo push   raw gRPC Echo: 8 + dim x 4 bytes per id out, nothing back
// With --wire_dtype bf16 (or f16) the table's rows and gradients travel
// in 2 bytes a value, and so do the dense path's (PsClientOptions::
// wire_dtype) and the echo's.
// Figures: unique rows per second (wall time, median over rounds) and CPU
// ms per MB of row bytes (this process + the server process, over all
// rounds), and per-round ratios to the dense path, the echo and, for the
// data port's calls, the same call over gRPC.
//
//   table_rpc_bench --out=bench/results/table_rpc_cpu.txt
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/bench_util.h"
#include "bench/process_stats.h"
#include "client/ps_client.h"
#include "client/table_client.h"
#include "common/payload.h"
#include "common/status_macros.h"
#include "testing/files.h"
#include "testing/local_cluster.h"
#include "testing/port_file.h"
#include "testing/process_group.h"

ABSL_FLAG(std::string, order, "sorted",
          "Order of a call's unique ids: sorted (as SparseEmbedding sends them, from "
          "torch.unique; the client then skips its hash deduplication) or shuffled");
ABSL_FLAG(int64_t, rows, 1'000'000, "Rows in the table");
ABSL_FLAG(int, dim, 16, "Embedding dim");
ABSL_FLAG(int, batch, 65536, "Unique ids per call");
ABSL_FLAG(double, new_share, 0.0,
          "Share of each training lookup's ids that have no row yet (ids never sent "
          "before, which the lookup creates: a table that still grows); the other ids, and "
          "every push's and evaluation lookup's, have rows");
ABSL_FLAG(std::string, optimizer, "rowwise_adagrad", "The table's optimizer");
ABSL_FLAG(int, rounds, 5, "Rounds (medians reported)");
ABSL_FLAG(int, calls, 10, "Calls of each operation per round");
ABSL_FLAG(std::string, bin_dir, "", "Where ps-server and wire_bench are (default: beside this)");
ABSL_FLAG(std::string, out, "", "Also write the table to this file");
ABSL_FLAG(std::string, wire_dtype, "f32",
          "Rows and gradients on the wire: f32, bf16 or f16 (the dense path and the echo "
          "move the same bytes)");

namespace shardtrain::bench {
namespace {

using testutil::MakeTempDir;
using testutil::ProcessGroup;
using testutil::WaitForPorts;

struct Figures {
  std::vector<double> rows_per_s;  // per round
  double cpu_s = 0;
  double row_bytes = 0;
};

absl::Status Run(const std::string& command_line, const std::string& bin_dir) {
  const int64_t rows = absl::GetFlag(FLAGS_rows);
  const int dim = absl::GetFlag(FLAGS_dim);
  const int batch = absl::GetFlag(FLAGS_batch);
  const int rounds = absl::GetFlag(FLAGS_rounds);
  const int calls = absl::GetFlag(FLAGS_calls);
  const std::string order = absl::GetFlag(FLAGS_order);
  if (order != "sorted" && order != "shuffled") {
    return absl::InvalidArgumentError("--order must be sorted or shuffled");
  }
  const bool shuffled = order == "shuffled";
  if (rows < batch || dim < 1 || batch < 1 || rounds < 1 || calls < 1) {
    return absl::InvalidArgumentError("need --rows >= --batch >= 1, --dim, --rounds, --calls >= 1");
  }
  const double new_share = absl::GetFlag(FLAGS_new_share);
  if (!(new_share >= 0.0 && new_share < 1.0)) {
    return absl::InvalidArgumentError("--new_share must be in [0, 1)");
  }
  const size_t new_per_call = static_cast<size_t>(std::llround(new_share * batch));
  const std::string dir = MakeTempDir("table_rpc_bench");
  ProcessGroup group;
  testutil::LocalClusterOptions cluster_options;
  cluster_options.bin_dir = bin_dir;
  cluster_options.shards = 1;
  // Both workers are this process's PsClients: 0 on the data port, 1 on
  // gRPC (async, no staleness bound: neither waits for the other).
  cluster_options.workers = 2;
  cluster_options.start_workers = 0;
  cluster_options.data_port = true;
  cluster_options.dir = dir;
  cluster_options.server_flags = {"--metrics_listen=127.0.0.1:0", "--optimizer=sgd",
                                  "--max_message_mb=256", "--heartbeat_timeout_s=600"};
  ASSIGN_OR_RETURN(const testutil::LocalCluster cluster,
                   testutil::StartLocalCluster(group, cluster_options));
  const std::string echo_log = dir + "/echo.log";
  ASSIGN_OR_RETURN(const pid_t echo,
                   group.Start({bin_dir + "/wire_bench", "--serve_echo",
                                "--port_file=" + dir + "/echo.port", "--echo_max_mb=256"},
                               echo_log));
  ASSIGN_OR_RETURN(const std::vector<int> echo_ports,
                   WaitForPorts(group, echo, dir + "/echo.port", echo_log, absl::Seconds(30)));
  const int echo_port = echo_ports[0];
  const pid_t shard = cluster.shards[0];

  ASSIGN_OR_RETURN(const DType wire, common::ParseDTypeName(absl::GetFlag(FLAGS_wire_dtype)));
  const int width = common::DTypeSize(wire);
  client::PsClientOptions options;
  options.wire_dtype = wire;
  options.servers = cluster.servers;
  options.max_message_bytes = kMaxMessageBytes;
  options.num_workers = 2;
  ASSIGN_OR_RETURN(std::unique_ptr<client::PsClient> ps, client::PsClient::Create(options, nullptr));
  client::PsClientOptions grpc_options = options;
  grpc_options.worker_index = 1;
  grpc_options.use_data_port = false;
  ASSIGN_OR_RETURN(std::unique_ptr<client::PsClient> grpc_ps,
                   client::PsClient::Create(grpc_options, nullptr));
  client::TableClient tables(ps.get());
  client::TableClient grpc_tables(grpc_ps.get());
  TableSpec spec;
  spec.set_name("t");
  spec.set_dim(dim);
  spec.set_optimizer(absl::GetFlag(FLAGS_optimizer));
  spec.set_learning_rate(0.01f);
  for (client::TableClient* t : {&tables, &grpc_tables}) {
    RETURN_IF_ERROR(t->Register({spec}));
    RETURN_IF_ERROR(t->SetWireDType("t", wire));
  }
  const int64_t elements = int64_t{batch} * dim;
  TensorSpec tensor;
  tensor.set_name("dense");
  tensor.add_shape(elements);
  tensor.set_dtype(DTYPE_F32);
  RETURN_IF_ERROR(ps->Register({tensor}));
  std::unique_ptr<Echo::Stub> echo_stub = NewEchoStub(absl::StrCat("127.0.0.1:", echo_port));

  // Every row created once, in a random order, as ids arrive in training:
  // a row's place in the shard's memory says nothing of its id.
  std::mt19937_64 rng(1);
  std::vector<uint64_t> all(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) all[r] = static_cast<uint64_t>(r);
  std::vector<uint64_t> arrival = all;
  std::shuffle(arrival.begin(), arrival.end(), rng);
  std::vector<float> out(static_cast<size_t>(elements));
  std::vector<uint64_t> ids(static_cast<size_t>(batch));
  for (int64_t r = 0; r < rows; r += batch) {
    const int64_t n = std::min<int64_t>(batch, rows - r);
    RETURN_IF_ERROR(tables.Lookup("t", absl::MakeConstSpan(arrival.data() + r, n), true, 0,
                                  out.data()));
  }
  arrival = {};
  std::vector<float> grads(static_cast<size_t>(elements), 1e-3f);
  std::vector<float> params(static_cast<size_t>(elements));
  std::vector<std::vector<uint64_t>> batches(calls);

  const double row_bytes = static_cast<double>(elements) * width;
  EchoRequest pull_request, push_request;
  pull_request.set_payload(std::string(static_cast<size_t>(batch) * 8, 'i'));
  pull_request.set_reply_bytes(static_cast<uint64_t>(row_bytes));
  push_request.set_payload(std::string(static_cast<size_t>(batch) * 8 + row_bytes, 'g'));
  int64_t clock = 0, grpc_clock = 0;
  // A training lookup's ids, for each client (data port, gRPC): batch c's,
  // the last new_per_call of them replaced by ids above every row's (their
  // order kept when sorted). Built with the batches, outside the timing.
  uint64_t next_new = static_cast<uint64_t>(rows);
  std::vector<std::vector<uint64_t>> with_new[2];
  for (std::vector<std::vector<uint64_t>>& client : with_new) client.resize(calls);
  auto training = [&](int client, int c) -> const std::vector<uint64_t>& {
    return new_per_call == 0 ? batches[c] : with_new[client][c];
  };
  // What each operation is compared with, by index in `ops` (-1: nothing).
  struct Op {
    std::string name;
    std::function<absl::Status(int)> run;
    int dense = -1;  // the dense path's call of the same kind (pull, push)
    int echo = -1;   // the echo of the same kind
    int grpc = -1;   // the same call over gRPC
    bool on_echo = false;
  };
  const std::vector<Op> ops = {
      {"lookup", [&](int c) { return tables.Lookup("t", training(0, c), true, clock, out.data()); },
       5, 7, 2},
      {"push_sparse", [&](int c) { return tables.Push("t", batches[c], grads.data(), ++clock); },
       6, 8, 3},
      {"lookup grpc",
       [&](int c) {
         return grpc_tables.Lookup("t", training(1, c), true, grpc_clock, out.data());
       },
       5, 7},
      {"push_sparse grpc",
       [&](int c) { return grpc_tables.Push("t", batches[c], grads.data(), ++grpc_clock); },
       6, 8},
      {"lookup eval", [&](int c) { return tables.Lookup("t", batches[c], false, clock, out.data()); },
       5, 7},
      {"dense pull",
       [&](int) {
         std::vector<absl::Span<float>> p = {absl::MakeSpan(params)};
         client::PullStats stats;
         return ps->Pull(clock, 0, p, &stats);
       },
       -1, 7},
      {"dense push",
       [&](int) {
         std::vector<absl::Span<const float>> g = {absl::MakeConstSpan(grads)};
         client::PushStats stats;
         return ps->Push(++clock, g, &stats);
       },
       -1, 8},
      {"echo pull",
       [&](int) {
         grpc::ClientContext context;
         EchoReply reply;
         grpc::Status s = echo_stub->Echo(&context, pull_request, &reply);
         return s.ok() ? absl::OkStatus() : absl::UnavailableError(s.error_message());
       },
       -1, -1, -1, true},
      {"echo push",
       [&](int) {
         grpc::ClientContext context;
         EchoReply reply;
         grpc::Status s = echo_stub->Echo(&context, push_request, &reply);
         return s.ok() ? absl::OkStatus() : absl::UnavailableError(s.error_message());
       },
       -1, -1, -1, true},
  };
  std::vector<Figures> figures(ops.size());
  for (int round = -1; round < rounds; ++round) {  // round -1 warms up
    for (int c = 0; c < calls; ++c) {
      std::sample(all.begin(), all.end(), ids.begin(), batch, rng);
      if (shuffled) std::shuffle(ids.begin(), ids.end(), rng);
      batches[c] = ids;
      if (new_per_call == 0) continue;
      for (std::vector<std::vector<uint64_t>>& client : with_new) {
        client[c] = ids;
        for (size_t i = ids.size() - new_per_call; i < ids.size(); ++i) client[c][i] = next_new++;
      }
    }
    for (size_t k = 0; k < ops.size(); ++k) {
      const size_t o = (k + static_cast<size_t>(std::max(round, 0))) % ops.size();
      const double cpu0 = SelfCpuSeconds();
      ASSIGN_OR_RETURN(const double server0, ProcessCpuSeconds(ops[o].on_echo ? echo : shard));
      const auto start = Clock::now();
      for (int c = 0; c < calls; ++c) RETURN_IF_ERROR(ops[o].run(c));
      const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
      ASSIGN_OR_RETURN(const double server1, ProcessCpuSeconds(ops[o].on_echo ? echo : shard));
      if (round < 0) continue;
      figures[o].rows_per_s.push_back(static_cast<double>(batch) * calls / seconds);
      figures[o].cpu_s += SelfCpuSeconds() - cpu0 + server1 - server0;
      figures[o].row_bytes += row_bytes * calls;
    }
  }
  auto ratio = [&](size_t a, int b) -> std::string {
    if (b < 0) return "-";
    std::vector<double> r;
    for (int i = 0; i < rounds; ++i) r.push_back(figures[a].rows_per_s[i] / figures[b].rows_per_s[i]);
    return absl::StrFormat("%.2f", Median(r));
  };
  std::string text = absl::StrCat(
      CommonHeader(command_line),
      absl::StrFormat("# 2 workers (PsClients of this process: data port, gRPC), 1 ps-server "
                      "process; table of %d rows, dim %d f32 (%s on "
                      "the wire), %s; %d unique ids per call (%s of rows, %s), %d of a "
                      "training lookup's new; %d rounds of %d calls\n",
                      rows, dim, common::DTypeName(wire), absl::GetFlag(FLAGS_optimizer), batch,
                      SizeName(static_cast<int64_t>(row_bytes)), order, new_per_call, rounds,
                      calls),
      absl::StrFormat("%-16s %10s %10s %10s %8s %8s %8s\n", "operation", "M rows/s", "MB/s",
                      "CPU ms/MB", "x dense", "x echo", "x grpc"));
  for (size_t o = 0; o < ops.size(); ++o) {
    const double rate = Median(figures[o].rows_per_s);
    absl::StrAppendFormat(&text, "%-16s %10.2f %10.1f %10.2f %8s %8s %8s\n", ops[o].name,
                          rate / 1e6, rate * dim * width / 1e6,
                          1e3 * figures[o].cpu_s / (figures[o].row_bytes / 1e6),
                          ratio(o, ops[o].dense), ratio(o, ops[o].echo), ratio(o, ops[o].grpc));
  }
  absl::StrAppendFormat(&text,
                        "# lookup eval x lookup (the same ids on the data port, read "
                        "without marking them used): %s\n",
                        ratio(4, 0));
  std::printf("%s", text.c_str());
  if (!absl::GetFlag(FLAGS_out).empty()) RETURN_IF_ERROR(WriteTable(absl::GetFlag(FLAGS_out), text));
  return absl::OkStatus();
}

}  // namespace
}  // namespace shardtrain::bench

int main(int argc, char** argv) {
  const std::string command_line = shardtrain::bench::StartBenchmark(
      argc, argv,
      "table_rpc_bench: Lookup and PushSparse on the data port and over gRPC against the "
      "dense pull/push of the same bytes and a raw gRPC echo, in the same rounds");
  for (int s : {SIGINT, SIGTERM, SIGHUP}) std::signal(s, shardtrain::testutil::KillAllProcessesAndExit);
  std::string bin_dir = absl::GetFlag(FLAGS_bin_dir);
  if (bin_dir.empty()) {
    bin_dir = std::filesystem::path(shardtrain::bench::SelfPath()).parent_path().string();
  }
  const absl::Status status = shardtrain::bench::Run(command_line, bin_dir);
  if (!status.ok()) {
    std::fprintf(stderr, "table_rpc_bench: %s\n", std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}
