// topk_bench: what top-k sparsification with error feedback costs a worker
// per step, and what it saves on the wire.
//
// For a model's partitions (default partitioning, 2 shards), each step
// encodes a fresh gradient of every partition. Baseline, in the same run:
// the dense encoding a worker does without --topk_ratio (EncodeDense). For
// each ratio the table gives the encode time per step, its ratio to the
// dense encode, and the payload bytes (values + indices) against dense.
// Gradients are N(0, 1e-3) noise with a fixed seed; medians over --steps.
//
//   topk_bench --model=mlp:784-256-128-10 --ratios=0.001,0.01,0.1
//       --out=bench/results/topk_cpu.txt
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "app/deadlock_detection.h"
#include "common/partition.h"
#include "common/payload.h"
#include "common/topk_compressor.h"
#include "worker/model/model_spec.h"

ABSL_FLAG(std::string, model, "mlp:784-256-128-10", "Model spec");
ABSL_FLAG(std::string, ratios, "0.001,0.01,0.1", "Top-k ratios to try");
ABSL_FLAG(int, steps, 30, "Measured steps per case (median reported)");
ABSL_FLAG(std::string, out, "", "Also write the table here");

namespace {

using namespace shardtrain;  // NOLINT: a benchmark's main file
using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// Partition sizes of the model's tensors (weights and biases).
std::vector<int64_t> PartitionSizes(const worker::ModelSpec& spec) {
  const common::PartitionConfig config{common::kDefaultMaxPartitionElements, 2};
  std::vector<int64_t> sizes;
  for (size_t l = 0; l + 1 < spec.layer_sizes.size(); ++l) {
    for (int64_t elements : {int64_t{spec.layer_sizes[l]} * spec.layer_sizes[l + 1],
                             int64_t{spec.layer_sizes[l + 1]}}) {
      for (const common::PlacedPartition& p :
           common::PlaceTensor(absl::StrCat("t", l, "_", elements), elements, config)) {
        sizes.push_back(p.range.size);
      }
    }
  }
  return sizes;
}

}  // namespace

int main(int argc, char** argv) {
  shardtrain::app::SkipDeadlockDetectionInRelease();
  absl::SetProgramUsageMessage("Cost and savings of top-k gradient compression.");
  absl::ParseCommandLine(argc, argv);
  const auto spec = worker::ModelSpec::Parse(absl::GetFlag(FLAGS_model));
  if (!spec.ok()) {
    std::cerr << spec.status() << "\n";
    return 2;
  }
  const int steps = std::max(1, absl::GetFlag(FLAGS_steps));
  const std::vector<int64_t> sizes = PartitionSizes(*spec);
  int64_t elements = 0;
  for (int64_t s : sizes) elements += s;
  std::vector<std::vector<float>> grads;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  for (int64_t s : sizes) {
    grads.emplace_back(s);
    for (float& g : grads.back()) g = normal(rng);
  }

  // Times one step of `encode(partition, grad, payload)` over every
  // partition; returns the median seconds and the payload bytes of a step.
  auto time_steps = [&](auto encode, double* bytes) {
    std::vector<Payload> payloads(sizes.size());
    std::vector<double> seconds;
    for (int step = -2; step < steps; ++step) {  // two warm-up steps
      const auto start = Clock::now();
      for (size_t p = 0; p < sizes.size(); ++p) encode(p, grads[p], &payloads[p]);
      if (step >= 0) seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    }
    *bytes = 0;
    for (const Payload& payload : payloads) *bytes += payload.data().size() + payload.indices().size();
    return Median(seconds);
  };

  std::string report = absl::StrFormat(
      "topk_bench  model %s: %d parameters in %d partitions (2 shards), f32 on the wire, "
      "median of %d steps\n",
      spec->ToString(), elements, sizes.size(), steps);
  double dense_bytes = 0;
  const double dense = time_steps(
      [](size_t, const std::vector<float>& g, Payload* out) {
        common::EncodeDense(g, DTYPE_F32, out->mutable_data());
      },
      &dense_bytes);
  absl::StrAppendFormat(&report, "%-8s %12s %14s %12s %10s\n", "ratio", "encode_ms",
                        "vs_dense_enc", "bytes/step", "vs_dense");
  absl::StrAppendFormat(&report, "%-8s %12.3f %14.2f %12.0f %10.3f\n", "dense", dense * 1e3,
                        1.0, dense_bytes, 1.0);
  for (absl::string_view text : absl::StrSplit(absl::GetFlag(FLAGS_ratios), ',')) {
    const double ratio = std::stod(std::string(text));
    auto topk = common::TopKCompressor::Create(ratio, sizes);
    if (!topk.ok()) {
      std::cerr << topk.status() << "\n";
      return 2;
    }
    double bytes = 0;
    const double seconds = time_steps(
        [&](size_t p, const std::vector<float>& g, Payload* out) {
          topk->Encode(p, g, DTYPE_F32, out);
        },
        &bytes);
    absl::StrAppendFormat(&report, "%-8g %12.3f %14.2f %12.0f %10.3f\n", ratio, seconds * 1e3,
                          seconds / dense, bytes, bytes / dense_bytes);
  }
  report +=
      "encode_ms: one step's encoding of every partition; vs_dense_enc: over the dense\n"
      "encode measured above; bytes/step: values + indices of every partition (protobuf\n"
      "framing, names and versions, the same either way, not counted); vs_dense: over dense.\n";
  std::cout << report;
  if (!absl::GetFlag(FLAGS_out).empty()) std::ofstream(absl::GetFlag(FLAGS_out)) << report;
  return 0;
}
