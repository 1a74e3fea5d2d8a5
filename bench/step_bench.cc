// step_bench: where a worker's training step goes — compute, push, pull,
// wait — with and without overlapped communication, against one or more
// in-process shards on loopback.
//
// Baselines measured in the same run: the step's compute alone (forward +
// backward, no parameter server) and its communication alone (push then
// pull of every tensor, no compute). Overlap is working when a step takes
// about max(compute, communication) rather than their sum; the table prints
// step / max(compute, communication).
//
//   step_bench --model=mlp:784-4096-4096-10 --batch=64 --shards=1,2 --steps=20
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
#include "common/malloc_tuning.h"
#include "server/ps_server.h"
#include "worker/model_factory.h"
#include "worker/ps_client.h"
#include "worker/tensor_specs.h"
#include "worker/trainer.h"

ABSL_FLAG(std::string, model, "mlp:784-4096-4096-10", "Model spec");
ABSL_FLAG(int, batch, 64, "Examples per step");
ABSL_FLAG(std::string, shards, "1,2", "Shard counts to try");
ABSL_FLAG(int, steps, 12, "Measured steps per case (after 3 warm-up steps)");
ABSL_FLAG(std::string, device, "cpu", "cpu or cuda");
ABSL_FLAG(int, cpu_threads, 1, "OpenBLAS threads (cpu)");
ABSL_FLAG(std::string, out, "", "Also write the table here");

namespace {

using namespace shardtrain;  // NOLINT: a benchmark's main file

struct Row {
  int shards = 0;
  std::string mode;
  double compute = 0, push = 0, pull = 0, wait = 0, step = 0;
};

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
  absl::SetProgramUsageMessage("Splits a worker step into compute/push/pull/wait.");
  absl::ParseCommandLine(argc, argv);
  // As ps-server and ps-worker do; applies to the baseline too.
  shardtrain::common::KeepLargeBuffersInHeap();
  const auto spec = worker::ModelSpec::Parse(absl::GetFlag(FLAGS_model));
  if (!spec.ok()) {
    std::cerr << spec.status() << "\n";
    return 2;
  }
  worker::ModelOptions model_options;
  model_options.spec = *spec;
  model_options.device = absl::GetFlag(FLAGS_device);
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
      spec->ToString(), batch, model_options.device, CpuModel(),
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
  absl::Time t0 = absl::Now();
  for (int i = 0; i < steps; ++i) compute_step();
  const double compute_alone = absl::ToDoubleSeconds(absl::Now() - t0) / steps;
  absl::StrAppendFormat(&report, "compute alone: %.1f ms/step (%.1fM parameters)\n",
                        compute_alone * 1e3, parameters / 1e6);
  absl::StrAppendFormat(&report, "%-7s %-11s %9s %9s %9s %9s %9s %9s %12s\n", "shards",
                        "mode", "comm_ms", "compute", "push", "pull", "wait", "step",
                        "step/max");

  for (absl::string_view count : absl::StrSplit(absl::GetFlag(FLAGS_shards), ',')) {
    const int shards = std::stoi(std::string(count));
    // Baseline 2: communication alone, against the same shards.
    Cluster cluster = StartShards(shards);
    worker::PsClientOptions client_options;
    client_options.servers = cluster.addresses;
    auto client = worker::PsClient::Create(client_options, nullptr).value();
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
    worker::PushStats push_stats;
    worker::PullStats pull_stats;
    for (int i = 0; i < 2; ++i) {
      (void)client->Push(i + 1, grad_spans, &push_stats);
      (void)client->Pull(i + 1, 0, param_spans, &pull_stats);
    }
    t0 = absl::Now();
    for (int i = 0; i < steps; ++i) {
      (void)client->Push(i + 3, grad_spans, &push_stats);
      (void)client->Pull(i + 3, 0, param_spans, &pull_stats);
    }
    const double comm_alone = absl::ToDoubleSeconds(absl::Now() - t0) / steps;
    client.reset();
    cluster = Cluster();

    for (bool overlap : {false, true}) {
      Cluster shards_now = StartShards(shards);
      worker::PsClientOptions options;
      options.servers = shards_now.addresses;
      auto trainer_client = worker::PsClient::Create(options, nullptr).value();
      worker::TrainerOptions trainer_options;
      trainer_options.batch = batch;
      trainer_options.overlap = overlap;
      auto trainer =
          worker::Trainer::Create(trainer_options, *make_model, trainer_client.get(), nullptr)
              .value();
      if (!trainer->Initialize().ok()) return 1;
      for (int i = 0; i < 3; ++i) (void)trainer->Step(x.data(), labels.data(), batch);
      const worker::EpochResult before = trainer->PhaseTotals();
      t0 = absl::Now();
      for (int i = 0; i < steps; ++i) {
        auto loss = trainer->Step(x.data(), labels.data(), batch);
        if (!loss.ok()) {
          std::cerr << loss.status() << "\n";
          return 1;
        }
      }
      (void)trainer->Drain();
      const double step = absl::ToDoubleSeconds(absl::Now() - t0) / steps;
      const worker::EpochResult after = trainer->PhaseTotals();
      Row row;
      row.shards = shards;
      row.mode = overlap ? "overlap" : "sequential";
      row.compute = (after.compute_seconds - before.compute_seconds) / steps;
      row.push = (after.push_seconds - before.push_seconds) / steps;
      row.pull = (after.pull_seconds - before.pull_seconds) / steps;
      row.wait = (after.wait_seconds - before.wait_seconds) / steps;
      absl::StrAppendFormat(&report,
                            "%-7d %-11s %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %12.2f\n",
                            row.shards, row.mode, comm_alone * 1e3, row.compute * 1e3,
                            row.push * 1e3, row.pull * 1e3, row.wait * 1e3, step * 1e3,
                            step / std::max(compute_alone, comm_alone));
      trainer.reset();
      trainer_client.reset();
    }
  }
  report +=
      "times in ms per step; comm_ms = push+pull of every tensor with no compute;\n"
      "step/max = step time / max(compute alone, comm alone): 1.0 is perfect overlap,\n"
      "(compute+comm)/max is no overlap. On a machine whose cores are shared by the\n"
      "shards and the worker, compute and communication also compete for CPU.\n";
  std::cout << report;
  if (!absl::GetFlag(FLAGS_out).empty()) std::ofstream(absl::GetFlag(FLAGS_out)) << report;
  return 0;
}
