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
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <string>
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
#include "client/ps_client.h"
#include "server/ps_server.h"
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

double Median(std::vector<double> values) {
  std::nth_element(values.begin(), values.begin() + values.size() / 2, values.end());
  return values[values.size() / 2];
}

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown CPU";
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

Cluster StartShards(int shards) {
  Cluster cluster;
  for (int s = 0; s < shards; ++s) {
    server::PsServerOptions options;
    options.metrics_address = "";
    options.shard.shard_index = s;
    options.shard.partitioning.num_shards = shards;
    options.shard.optimizer.name = "sgd";
    options.shard.optimizer.learning_rate = 1e-4f;
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

  std::string report = absl::StrFormat(
      "step_bench  model %s  batch %d  device %s  (host %s, %d OpenBLAS threads)\n",
      spec->ToString(), batch, worker::DeviceKindName(model_options.device), CpuModel(),
      absl::GetFlag(FLAGS_cpu_threads));

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
    const double compute_alone = Median(compute_s);
    const double comm_alone = Median(comm_s);
    for (Arm& arm : arms) {
      const worker::EpochResult after = arm.trainer->PhaseTotals();
      auto per_step_ms = [&](double total) { return total / steps * 1e3; };
      const double step = Median(arm.step_s);
      absl::StrAppendFormat(
          &report, "%-7d %-20s %9.1f %9.1f | %9.1f %9.1f %9.1f %9.1f %9.1f | %8.2f\n", shards,
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
