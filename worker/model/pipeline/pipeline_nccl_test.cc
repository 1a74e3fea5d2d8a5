// PipelineEquivalence over CUDA backends and NcclTransport (label gpu). Each
// stage runs on GPU s % device_count; with one GPU every stage shares it and
// NCCL runs as a one-rank communicator sending to itself.
#include <cuda_runtime_api.h>

#include <vector>

#include "gtest/gtest.h"
#include "worker/device/cuda/cuda_backend.h"
#include "worker/model/pipeline/nccl_transport.h"
#include "worker/model/pipeline/pipeline_model.h"
#include "worker/model/pipeline/pipeline_test_util.h"

namespace shardtrain::worker::pipeline {
namespace {

using testing_util::ExpectMatchesMlp;
using testing_util::MakeProblem;
using testing_util::Problem;

// fp32 GEMMs on the GPU differ from OpenBLAS in summation order only.
constexpr double kTolerance = 1e-5;

absl::StatusOr<std::unique_ptr<PipelineModel>> MakeGpuModel(
    const ModelSpec& spec, int max_batch, const PipelineOptions& options) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 1) {
    return absl::FailedPreconditionError("no CUDA device");
  }
  std::vector<std::unique_ptr<Backend>> backends;
  for (int s = 0; s < options.stages; ++s) {
    CudaBackendOptions backend_options;
    backend_options.device = s % devices;
    absl::StatusOr<std::unique_ptr<Backend>> backend =
        MakeCudaBackend(backend_options);
    if (!backend.ok()) return backend.status();
    backends.push_back(*std::move(backend));
  }
  return PipelineModel::Create(spec, std::move(backends), max_batch, options,
                               [](std::vector<Backend*> stage_backends) {
                                 return NcclTransport::Create(
                                     std::move(stage_backends));
                               });
}

TEST(PipelineEquivalence, NcclMatchesMlpOnGpu) {
  if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
  const ModelSpec spec = *ModelSpec::Parse("mlp:12-16-20-16-10");
  for (int batch : {24, 27}) {
    const Problem problem = MakeProblem(spec, batch, 7 + batch);
    for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B}) {
      for (int stages : {2, 3, 4}) {
        for (int m : {1, 4, 8}) {
          SCOPED_TRACE(::testing::Message()
                       << ScheduleKindName(kind) << " S=" << stages
                       << " M=" << m << " batch=" << batch);
          PipelineOptions options;
          options.stages = stages;
          options.microbatches = m;
          options.schedule = kind;
          absl::StatusOr<std::unique_ptr<PipelineModel>> model =
              MakeGpuModel(spec, 32, options);
          ASSERT_TRUE(model.ok()) << model.status();
          ExpectMatchesMlp(**model, problem, kTolerance);
          ExpectMatchesMlp(**model, problem, kTolerance);
        }
      }
    }
  }
}

TEST(PipelineEquivalence, NcclTransportRejectsCpuBackends) {
  if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
  std::unique_ptr<Backend> cpu = MakeCpuBackend();
  EXPECT_EQ(NcclTransport::Create({cpu.get()}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardtrain::worker::pipeline
