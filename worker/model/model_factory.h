// The model a worker trains, built from its flags: an Mlp on one device, or
// a PipelineModel whose stages each get a device (CPU backends with the
// local transport, or GPUs with NCCL).
#ifndef SHARDTRAIN_WORKER_MODEL_MODEL_FACTORY_H_
#define SHARDTRAIN_WORKER_MODEL_MODEL_FACTORY_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/device/backend.h"
#include "worker/model/model.h"
#include "worker/model/model_spec.h"

namespace shardtrain::worker {

struct ModelOptions {
  ModelSpec spec;
  // "cpu" or "cuda".
  std::string device = "cpu";
  // OpenBLAS threads for the cpu device.
  int cpu_threads = 1;
  // How GEMMs multiply on cuda: "fp32" (exact, matches the CPU), "tf32" or
  // "bf16" (tensor cores, fp32 accumulation). The cpu device takes only fp32.
  std::string gemm_precision = "fp32";
  // Contiguous pipeline stages (1: no pipeline), one device each; GPU
  // stages go round-robin over the visible GPUs.
  int pipeline_stages = 1;
  // Microbatches per batch when pipelined.
  int microbatches = 1;
  // "gpipe" or "1f1b".
  std::string schedule = "1f1b";
};

// One backend of options.device (GPU `gpu_index` for cuda) with its GEMM
// precision. cuda needs a CUDA build and a visible GPU; the
// FAILED_PRECONDITION says which is missing. INVALID_ARGUMENT for an
// unknown device or precision, or a reduced precision on the cpu.
absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const ModelOptions& options,
                                                     int gpu_index = 0);

// Checks `options` (the device exists, the stages fit the model) and returns
// a factory of models for them.
absl::StatusOr<ModelFactory> MakeModelFactory(const ModelOptions& options);

}  // namespace shardtrain::worker

#endif  // SHARDTRAIN_WORKER_MODEL_MODEL_FACTORY_H_
