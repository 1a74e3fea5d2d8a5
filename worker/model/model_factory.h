// MakeModelFactory: the model a worker trains, built from typed options: an
// Mlp on one device, or a PipelineModel whose stages each get a device (CPU
// backends with the local transport, or GPUs with NCCL).
//
// Example:
//   ModelOptions options;
//   ASSIGN_OR_RETURN(options.spec, ModelSpec::Parse("mlp:784-256-10"));
//   options.device = DeviceKind::kCpu;
//   ASSIGN_OR_RETURN(ModelFactory make_model, MakeModelFactory(options));
//   ASSIGN_OR_RETURN(std::unique_ptr<Model> model, make_model(/*max_batch=*/64));
#ifndef SHARDTRAIN_WORKER_MODEL_MODEL_FACTORY_H_
#define SHARDTRAIN_WORKER_MODEL_MODEL_FACTORY_H_

#include <memory>

#include "absl/status/statusor.h"
#include "worker/device/backend.h"
#include "worker/device/device_options.h"
#include "worker/model/model.h"
#include "worker/model/model_spec.h"
#include "worker/model/pipeline/schedule.h"

namespace shardtrain::worker {

// A plain value.
struct ModelOptions {
  ModelSpec spec;
  DeviceKind device = DeviceKind::kCpu;
  // OpenBLAS threads for the cpu device.
  int cpu_threads = 1;
  // How GEMMs multiply on cuda; the cpu device takes only kFp32.
  GemmPrecision gemm_precision = GemmPrecision::kFp32;
  // Contiguous pipeline stages (1: no pipeline), one device each; GPU
  // stages go round-robin over the visible GPUs.
  int pipeline_stages = 1;
  // Microbatches per batch when pipelined.
  int microbatches = 1;
  pipeline::ScheduleKind schedule = pipeline::ScheduleKind::k1F1B;
};

// One backend of options.device (GPU `gpu_index` for cuda) with its GEMM
// precision. cuda needs a CUDA build and a visible GPU; the
// FAILED_PRECONDITION says which is missing. INVALID_ARGUMENT for a reduced
// precision on the cpu.
absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const ModelOptions& options,
                                                     int gpu_index = 0);

// Checks `options` (the device exists, the stages fit the model) and returns
// a factory of models for them. Models may outlive the factory.
absl::StatusOr<ModelFactory> MakeModelFactory(const ModelOptions& options);

}  // namespace shardtrain::worker

#endif  // SHARDTRAIN_WORKER_MODEL_MODEL_FACTORY_H_
