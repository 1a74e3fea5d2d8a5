// step_bench: where a worker's training step goes — compute, push, pull,
// wait — with and without overlapped communication, against one or more
// in-process shards on loopback.
//
// Baselines measured in the same run: the step's compute alone (forward +
// backward, no parameter server) and its communication alone (push then
// pull of every tensor, no compute). Overlap is working when a step takes
// about max(compute, communication) rather than their sum; the table prints
// step / max(compute, communication). The baselines and both kinds of step
// run in rounds, one of each per round, and every figure is the median over
// --steps rounds, so a machine whose speed drifts during the run (shared
// cores) still compares like with like.
//
//   step_bench --model=mlp:784-4096-4096-10 --batch=64 --shards=1,2 --steps=20
//       [--device=cuda --pageable]
//
// Scaling mode (--scaling=1x1,2x1,4x2,8x4 instead of --shards): S in-process
// shards (async, sgd) x W workers, each a Trainer (overlap on) with its own
// PsClient and thread, all stepping at once. Every configuration's shards
// and workers are up from the start and run --steps steps each per round,
// in an order rotating by round (--rounds rounds); each figure is the
// median over rounds. Aggregate samples/s, the GB/s the workers' pushes and
// pulls moved (f32: 2 x parameters x 4 bytes per worker step), this
// process's CPU (workers and shards) per MB moved, and two ratios: to the
// first configuration, and to compute alone (W workers each at the
// compute1 baseline's rate, as if the parameter server cost nothing).
//
//   step_bench --scaling=1x1,2x1,4x1,2x2,4x4 --steps=10 --rounds=3
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "app/deadlock_detection.h"
#include "app/malloc_tuning.h"
#include "bench/process_stats.h"
#include "bench/bench_util.h"
#include "client/ps_client.h"
#include "common/status_macros.h"
#include "server/ps_server.h"
#include "worker/device/cpu/cpu_backend.h"
#include "worker/model/model_factory.h"
#include "worker/model/tensor_specs.h"
#include "worker/trainer.h"

ABSL_FLAG(std::string, model, "mlp:784-4096-4096-10", "Model spec");
ABSL_FLAG(int, batch, 64, "Examples per step");
ABSL_FLAG(std::string, shards, "1,2", "Shard counts to try");
ABSL_FLAG(int, steps, 12, "Measured steps per case (after 3 warm-up steps)");
ABSL_FLAG(std::string, device, "cpu", "cpu or cuda");
ABSL_FLAG(int, cpu_threads, 1, "OpenBLAS threads (cpu)");
ABSL_FLAG(std::string, out, "", "Also write the table here");
ABSL_FLAG(std::string, scaling, "",
          "Scaling mode instead of --shards: SxW,... (S in-process shards x W workers "
          "stepping at once, async, overlap on), e.g. 1x1,2x1,4x2,8x4");
ABSL_FLAG(int, rounds, 3, "Scaling mode: rounds (each runs every configuration once)");
ABSL_FLAG(bool, data_port, true,
          "The shards serve the data path on a data port (ps-server --data_listen, "
          "run-local's default) and the workers use it; false: gRPC only");
ABSL_FLAG(bool, pageable, false,
          "Also step both ways with the parameters in pageable host memory "
          "(TrainerOptions::pin_params off), to show what page-locking them saves on a GPU");

namespace {

using namespace shardtrain;  // NOLINT: a benchmark's main file

template <typename Fn>
double TimeSeconds(Fn run) {
  const absl::Time start = absl::Now();
  run();
  return absl::ToDoubleSeconds(absl::Now() - start);
}

struct Cluster {
  std::vector<std::unique_ptr<server::PsServer>> servers;
  std::vector<std::string> addresses;
};

// One way of stepping (sequential or overlapped): a trainer, its client and
// shards of its own, and its timings. Members are destroyed bottom-up, so
// the trainer goes before its client and shards.
struct Arm {
  bool overlap = false;
  bool pinned = true;
  Cluster cluster;
  std::unique_ptr<client::PsClient> client;
  std::unique_ptr<worker::Trainer> trainer;
  worker::EpochResult before;  // Phase totals before the measured steps.
  std::vector<double> step_s;
  double drain_s = 0;  // Overlap: waiting for exchanges after each step.
};

Cluster StartShards(int shards, int workers = 1) {
  Cluster cluster;
  for (int s = 0; s < shards; ++s) {
    server::PsServerOptions options;
    options.metrics_address = "";
    options.shard.shard_index = s;
    options.shard.num_workers = workers;
    options.shard.partitioning.num_shards = shards;
    options.shard.optimizer.name = "sgd";
    options.shard.optimizer.learning_rate = 1e-4f;
    if (absl::GetFlag(FLAGS_data_port)) options.data_listen = "127.0.0.1:0";
    auto server = server::PsServer::Start(options);
    if (!server.ok()) {
      std::cerr << server.status() << "\n";
      std::exit(1);
    }
    cluster.addresses.push_back(absl::StrCat("127.0.0.1:", (*server)->port()));
    cluster.servers.push_back(std::move(*server));
  }
  return cluster;
}

// Scaling mode: one configuration's shards and workers.
struct ScaleConfig {
  int shards = 0;
  int workers = 0;
  Cluster cluster;
  std::vector<std::unique_ptr<client::PsClient>> clients;
  std::vector<std::unique_ptr<worker::Trainer>> trainers;  // after their clients
  std::vector<double> wall_s, cpu_s;                       // per round
};

// Every worker of `config` runs `steps` steps (and drains) on its own
// thread; the wall time and this process's CPU time.
absl::StatusOr<std::pair<double, double>> RunSteps(ScaleConfig& config, int steps, int batch,
                                                   const std::vector<float>& x,
                                                   const std::vector<int32_t>& labels) {
  std::vector<absl::Status> statuses(config.workers);
  const double cpu_before = bench::SelfCpuSeconds();
  const absl::Time start = absl::Now();
  std::vector<std::thread> threads;
  for (int w = 0; w < config.workers; ++w) {
    threads.emplace_back([&, w] {
      worker::Trainer& trainer = *config.trainers[w];
      for (int i = 0; i < steps && statuses[w].ok(); ++i) {
        statuses[w] = trainer.Step(x.data(), labels.data(), batch).status();
      }
      if (statuses[w].ok()) statuses[w] = trainer.Drain();
    });
  }
  for (std::thread& thread : threads) thread.join();
  const double wall = absl::ToDoubleSeconds(absl::Now() - start);
  const double cpu = bench::SelfCpuSeconds() - cpu_before;
  for (const absl::Status& status : statuses) RETURN_IF_ERROR(status);
  return std::make_pair(wall, cpu);
}

absl::Status StartConfig(const worker::ModelFactory& make_model, int batch,
                         const std::vector<float>& x, const std::vector<int32_t>& labels,
                         ScaleConfig& config) {
  config.cluster = StartShards(config.shards, config.workers);
  for (int w = 0; w < config.workers; ++w) {
    client::PsClientOptions options;
    options.servers = config.cluster.addresses;
    options.worker_index = static_cast<uint32_t>(w);
    options.num_workers = config.workers;
    ASSIGN_OR_RETURN(std::unique_ptr<client::PsClient> client,
                     client::PsClient::Create(options, nullptr));
    worker::TrainerOptions trainer_options;
    trainer_options.worker_index = static_cast<uint32_t>(w);
    trainer_options.num_workers = config.workers;
    trainer_options.batch = batch;
    trainer_options.overlap = true;
    ASSIGN_OR_RETURN(std::unique_ptr<worker::Trainer> trainer,
                     worker::Trainer::Create(trainer_options, make_model, client.get(), nullptr));
    RETURN_IF_ERROR(trainer->Initialize());
    config.clients.push_back(std::move(client));
    config.trainers.push_back(std::move(trainer));
  }
  // Warm-up: every worker at once, as measured.
  return RunSteps(config, 3, batch, x, labels).status();
}

absl::StatusOr<std::string> RunScaling(const std::vector<std::pair<int, int>>& shapes,
                                       const worker::ModelFactory& make_model, int batch,
                                       int steps, int rounds, double compute_alone,
                                       int64_t parameters, const std::vector<float>& x,
                                       const std::vector<int32_t>& labels) {
  std::vector<ScaleConfig> configs(shapes.size());
  for (size_t c = 0; c < shapes.size(); ++c) {
    std::tie(configs[c].shards, configs[c].workers) = shapes[c];
    RETURN_IF_ERROR(StartConfig(make_model, batch, x, labels, configs[c]));
  }
  for (int round = 0; round < rounds; ++round) {
    for (size_t i = 0; i < configs.size(); ++i) {
      ScaleConfig& config = configs[(i + round) % configs.size()];
      ASSIGN_OR_RETURN(const auto measured, RunSteps(config, steps, batch, x, labels));
      config.wall_s.push_back(measured.first);
      config.cpu_s.push_back(measured.second);
    }
  }
  std::string table = absl::StrFormat(
      "scaling: S in-process shards (async, sgd) x W workers (Trainer, overlap, own PsClient "
      "and thread), %d steps per worker per round, %d rounds, medians over rounds\n"
      "%-6s %10s %8s %9s %9s %10s %7s %9s\n",
      steps, rounds, "SxW", "samples/s", "step ms", "GB/s", "CPU ms/MB", "x compute", "x 1st",
      "cpu/step");
  const double bytes_per_step = 2.0 * static_cast<double>(parameters) * sizeof(float);
  double first_rate = 0;
  for (size_t c = 0; c < configs.size(); ++c) {
    ScaleConfig& config = configs[c];
    const double wall = bench::Median(config.wall_s);
    const double cpu = bench::Median(config.cpu_s);
    const double worker_steps = static_cast<double>(config.workers) * steps;
    const double rate = worker_steps * batch / wall;
    if (c == 0) first_rate = rate;
    const double megabytes = worker_steps * bytes_per_step / 1e6;
    // W workers each at compute alone's rate: the parameter server free.
    const double compute_rate = config.workers * batch / compute_alone;
    absl::StrAppendFormat(&table, "%-6s %10.0f %8.1f %9.3f %9.3f %10.2f %7.2f %9.1f\n",
                          absl::StrCat(config.shards, "x", config.workers), rate,
                          wall / steps * 1e3, megabytes / 1e3 / wall, cpu * 1e3 / megabytes,
                          rate / compute_rate, rate / first_rate, cpu / worker_steps * 1e3);
  }
  table +=
      "samples/s: all workers; step ms: a round's wall time / steps (the workers step at\n"
      "once); GB/s: the workers' f32 pushes and pulls (2 x parameters x 4 B per worker step)\n"
      "per second of wall time; CPU ms/MB: this process (the workers' compute and the\n"
      "shards) per MB moved; x compute: samples/s / (W x batch / compute1); x 1st:\n"
      "samples/s / the first configuration's; cpu/step: CPU ms per worker step.\n";
  return table;
}

}  // namespace

int main(int argc, char** argv) {
  shardtrain::app::SkipDeadlockDetectionInRelease();
  absl::SetProgramUsageMessage("Splits a worker step into compute/push/pull/wait.");
  absl::ParseCommandLine(argc, argv);
  // As ps-server and ps-worker do; applies to the baseline too.
  shardtrain::app::KeepLargeBuffersInHeap();
  const auto spec = worker::ModelSpec::Parse(absl::GetFlag(FLAGS_model));
  if (!spec.ok()) {
    std::cerr << spec.status() << "\n";
    return 2;
  }
  worker::ModelOptions model_options;
  model_options.spec = *spec;
  const auto device = worker::ParseDeviceKind(absl::GetFlag(FLAGS_device));
  if (!device.ok()) {
    std::cerr << "--device " << device.status().message() << "\n";
    return 2;
  }
  model_options.device = *device;
  model_options.cpu_threads = absl::GetFlag(FLAGS_cpu_threads);
  const auto make_model = worker::MakeModelFactory(model_options);
  if (!make_model.ok()) {
    std::cerr << make_model.status() << "\n";
    return 2;
  }
  const int batch = absl::GetFlag(FLAGS_batch);
  const int steps = absl::GetFlag(FLAGS_steps);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  const int features = spec->layer_sizes.front();
  std::vector<float> x(static_cast<size_t>(batch) * features);
  for (float& v : x) v = normal(rng);
  std::vector<int32_t> labels(batch);
  for (int32_t& l : labels) l = static_cast<int32_t>(rng() % spec->layer_sizes.back());

  const absl::StatusOr<std::vector<std::pair<int, int>>> scaling =
      bench::ParseScaling(absl::GetFlag(FLAGS_scaling));
  if (!scaling.ok()) {
    std::cerr << "--scaling: " << scaling.status().message() << "\n";
    return 2;
  }
  if (steps < 1 || absl::GetFlag(FLAGS_rounds) < 1) {
    std::cerr << "--steps and --rounds must be >= 1\n";
    return 2;
  }
  std::string report = absl::StrFormat(
      "step_bench  model %s  batch %d  device %s  (%s, %d OpenBLAS threads, %s kernels)  "
      "data path: %s\n",
      spec->ToString(), batch, worker::DeviceKindName(model_options.device),
      bench::MachineDescription(), absl::GetFlag(FLAGS_cpu_threads), worker::CpuMathKernels(),
      absl::GetFlag(FLAGS_data_port) ? "data port" : "gRPC");

  // Baseline 1: compute alone, gradients copied back to the host as a
  // step without overlap does.
  auto model = (*make_model)(batch).value();
  int64_t parameters = 0;
  for (const worker::ParamInfo& p : model->params()) {
    parameters += worker::NumElements(p);
  }
  auto compute_step = [&] {
    (void)model->ForwardBackward(x.data(), labels.data(), batch, nullptr);
    std::vector<worker::PendingGrad> grads;
    for (size_t i = 0; i < model->params().size(); ++i) {
      auto grad = model->StartGradCopy(static_cast<int>(i));
      if (grad.ok()) grads.push_back(std::move(grad).value());
    }
    for (worker::PendingGrad& grad : grads) (void)grad.ready->Wait();
  };
  for (int i = 0; i < 2; ++i) compute_step();
  absl::StrAppendFormat(&report, "%.1fM parameters\n", parameters / 1e6);
  if (!scaling->empty()) {
    std::vector<double> compute_s;
    for (int i = 0; i < std::max(steps, 5); ++i) compute_s.push_back(TimeSeconds(compute_step));
    const double compute_alone = bench::Median(compute_s);
    absl::StrAppendFormat(&report,
                          "compute1 (forward+backward+gradient copies alone): %.1f ms\n",
                          compute_alone * 1e3);
    model.reset();
    absl::StatusOr<std::string> table =
        RunScaling(*scaling, *make_model, batch, steps, absl::GetFlag(FLAGS_rounds),
                   compute_alone, parameters, x, labels);
    if (!table.ok()) {
      std::cerr << table.status() << "\n";
      return 1;
    }
    report += *table;
    std::cout << report;
    if (!absl::GetFlag(FLAGS_out).empty()) std::ofstream(absl::GetFlag(FLAGS_out)) << report;
    return 0;
  }
  absl::StrAppendFormat(&report, "%-7s %-20s %9s %9s | %9s %9s %9s %9s %9s | %8s\n", "shards",
                        "mode", "compute1", "comm1", "compute", "push", "pull", "wait",
                        "step", "step/max");

  for (absl::string_view count : absl::StrSplit(absl::GetFlag(FLAGS_shards), ',')) {
    const int shards = std::stoi(std::string(count));
    // Baseline 2: communication alone, against shards of its own.
    Cluster comm_cluster = StartShards(shards);
    client::PsClientOptions client_options;
    client_options.servers = comm_cluster.addresses;
    auto client = client::PsClient::Create(client_options, nullptr).value();
    if (!client->Register(worker::TensorSpecsFor(model->params(), 1)).ok()) return 1;
    std::vector<std::vector<float>> params, grads;
    std::vector<absl::Span<float>> param_spans;
    std::vector<absl::Span<const float>> grad_spans;
    for (const worker::ParamInfo& p : model->params()) {
      params.emplace_back(worker::NumElements(p));
      grads.emplace_back(worker::NumElements(p), 1e-6f);
    }
    for (size_t i = 0; i < params.size(); ++i) {
      param_spans.push_back(absl::MakeSpan(params[i]));
      grad_spans.push_back(grads[i]);
    }
    client::PushStats push_stats;
    client::PullStats pull_stats;
    int64_t comm_clock = 0;
    auto comm_step = [&] {
      ++comm_clock;
      (void)client->Push(comm_clock, grad_spans, &push_stats);
      (void)client->Pull(comm_clock, 0, param_spans, &pull_stats);
    };
    for (int i = 0; i < 2; ++i) comm_step();

    // The two ways of stepping, each a trainer with shards of its own.
    std::vector<Arm> arms(absl::GetFlag(FLAGS_pageable) ? 4 : 2);
    for (size_t a = 0; a < arms.size(); ++a) {
      Arm& arm = arms[a];
      arm.overlap = a % 2 == 1;
      arm.pinned = a < 2;
      arm.cluster = StartShards(shards);
      client::PsClientOptions options;
      options.servers = arm.cluster.addresses;
      arm.client = client::PsClient::Create(options, nullptr).value();
      worker::TrainerOptions trainer_options;
      trainer_options.batch = batch;
      trainer_options.overlap = arm.overlap;
      trainer_options.pin_params = arm.pinned;
      arm.trainer =
          worker::Trainer::Create(trainer_options, *make_model, arm.client.get(), nullptr)
              .value();
      if (!arm.trainer->Initialize().ok()) return 1;
      for (int i = 0; i < 3; ++i) (void)arm.trainer->Step(x.data(), labels.data(), batch);
      if (!arm.trainer->Drain().ok()) return 1;
      arm.before = arm.trainer->PhaseTotals();
    }

    // Round robin, one of each per round, so that drift in the machine's
    // speed affects every column alike.
    std::vector<double> compute_s, comm_s;
    for (int i = 0; i < steps; ++i) {
      compute_s.push_back(TimeSeconds(compute_step));
      comm_s.push_back(TimeSeconds(comm_step));
      for (Arm& arm : arms) {
        absl::Status status;
        arm.step_s.push_back(TimeSeconds([&] {
          status = arm.trainer->Step(x.data(), labels.data(), batch).status();
          // What overlap left in flight is part of this step: the next one
          // would wait for it before computing.
          if (status.ok() && arm.overlap) {
            const absl::Time drain_start = absl::Now();
            status = arm.trainer->Drain();
            arm.drain_s += absl::ToDoubleSeconds(absl::Now() - drain_start);
          }
        }));
        if (!status.ok()) {
          std::cerr << status << "\n";
          return 1;
        }
      }
    }
    const double compute_alone = bench::Median(compute_s);
    const double comm_alone = bench::Median(comm_s);
    for (Arm& arm : arms) {
      const worker::EpochResult after = arm.trainer->PhaseTotals();
      auto per_step_ms = [&](double total) { return total / steps * 1e3; };
      const double step = bench::Median(arm.step_s);
      absl::StrAppendFormat(
          &report, "%-7d %-20s %9.2f %9.2f | %9.2f %9.2f %9.2f %9.2f %9.2f | %8.2f\n", shards,
          absl::StrCat(arm.overlap ? "overlap" : "sequential", arm.pinned ? "" : " pageable"),
          compute_alone * 1e3, comm_alone * 1e3,
          per_step_ms(after.compute_seconds - arm.before.compute_seconds),
          per_step_ms(after.push_seconds - arm.before.push_seconds),
          per_step_ms(after.pull_seconds - arm.before.pull_seconds + arm.drain_s),
          per_step_ms(after.wait_seconds - arm.before.wait_seconds), step * 1e3,
          step / std::max(compute_alone, comm_alone));
    }
  }
  report +=
      "times in ms per step. compute1 = forward+backward+gradient copies alone,\n"
      "comm1 = push+pull of every tensor alone; step = a trainer step (overlap: until\n"
      "its exchanges have landed); all three medians over rounds that run one of\n"
      "each. compute/push/pull/wait = means of the trainer's phases (overlap: pull\n"
      "is what was still in flight after compute). step/max = step / max(compute1,\n"
      "comm1): 1.0 is perfect overlap, (compute1+comm1)/max is none. Where the\n"
      "shards and the worker share the cores, compute and communication also\n"
      "compete for CPU. The trainer's compute phase also copies the pulled\n"
      "parameters into the model (compute1 does not); \"pageable\" rows (--pageable)\n"
      "keep those parameters in pageable host memory, the others page-locked.\n";
  std::cout << report;
  if (!absl::GetFlag(FLAGS_out).empty()) std::ofstream(absl::GetFlag(FLAGS_out)) << report;
  return 0;
}
