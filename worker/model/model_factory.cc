#include "worker/model/model_factory.h"

#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/device/cpu/cpu_backend.h"
#include "worker/model/mlp.h"
#include "worker/model/mlp_layout.h"
#include "worker/model/pipeline/pipeline_model.h"
#include "worker/model/pipeline/schedule.h"
#if SHARDTRAIN_WITH_CUDA
#include <cuda_runtime_api.h>

#include "worker/device/cuda/cuda_backend.h"
#endif
#if SHARDTRAIN_PIPELINE_HAVE_NCCL
#include "worker/model/pipeline/nccl_transport.h"
#endif

namespace shardtrain::worker {
namespace {

// An Mlp that keeps its backend alive (models may outlive the factory).
class BackendOwningMlp final : public Model {
 public:
  BackendOwningMlp(std::shared_ptr<Backend> backend, std::unique_ptr<Mlp> mlp)
      : backend_(std::move(backend)), mlp_(std::move(mlp)) {}

  const std::vector<ParamInfo>& params() const override { return mlp_->params(); }
  absl::Status SetParam(int index, absl::Span<const float> values) override {
    return mlp_->SetParam(index, values);
  }
  absl::Status GetParam(int index, absl::Span<float> out) const override {
    return mlp_->GetParam(index, out);
  }
  absl::StatusOr<std::unique_ptr<HostPin>> PinParamHost(int index,
                                                        absl::Span<float> host) override {
    return mlp_->PinParamHost(index, host);
  }
  absl::StatusOr<float> ForwardBackward(
      const float* x, const int32_t* labels, int batch,
      const std::function<void(int)>& on_grad_ready) override {
    return mlp_->ForwardBackward(x, labels, batch, on_grad_ready);
  }
  absl::Status GetGrad(int index, absl::Span<float> out) const override {
    return mlp_->GetGrad(index, out);
  }
  absl::StatusOr<PendingGrad> StartGradCopy(int index) override {
    return mlp_->StartGradCopy(index);
  }
  absl::StatusOr<int> CountCorrect(const float* x, const int32_t* labels,
                                   int batch) override {
    return mlp_->CountCorrect(x, labels, batch);
  }

 private:
  std::shared_ptr<Backend> backend_;  // declared first: destroyed last
  std::unique_ptr<Mlp> mlp_;
};

int VisibleGpus() {
#if SHARDTRAIN_WITH_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) return 0;
  return count;
#else
  return 0;
#endif
}

// A CUDA backend on GPU `gpu_index`, or why there can be none.
absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackendOn(
    int gpu_index, GemmPrecision precision) {
#if SHARDTRAIN_WITH_CUDA
  if (!CudaDeviceAvailable()) {
    return absl::FailedPreconditionError(
        "device cuda: this build has CUDA, but no CUDA device is present "
        "(no GPU visible or no driver loaded)");
  }
  CudaBackendOptions cuda_options;
  cuda_options.device = gpu_index;
  cuda_options.gemm_precision = precision;
  return MakeCudaBackend(cuda_options);
#else
  (void)gpu_index;
  (void)precision;
  return absl::FailedPreconditionError(
      "device cuda: this build has no CUDA support (it was configured "
      "without a CUDA compiler or with -DSHARDTRAIN_WITH_CUDA=OFF)");
#endif
}

// Mlps on one backend of options.device, which every model shares and
// keeps alive.
absl::StatusOr<ModelFactory> MlpFactory(const ModelOptions& options) {
  std::shared_ptr<Backend> backend;
  {
    ASSIGN_OR_RETURN(std::unique_ptr<Backend> owned, MakeBackend(options));
    backend = std::move(owned);
  }
  const ModelSpec spec = options.spec;
  return ModelFactory(
      [spec, backend](int max_batch) -> absl::StatusOr<std::unique_ptr<Model>> {
        ASSIGN_OR_RETURN(std::unique_ptr<Mlp> mlp,
                         Mlp::Create(spec, backend.get(), max_batch));
        return std::unique_ptr<Model>(
            std::make_unique<BackendOwningMlp>(backend, std::move(mlp)));
      });
}

// One PipelineModel of options.pipeline_stages stages on options.device.
absl::StatusOr<std::unique_ptr<Model>> MakePipelineModel(
    const ModelOptions& options,
    const pipeline::PipelineOptions& pipeline_options, int max_batch) {
  if (options.device == DeviceKind::kCpu) {
    ASSIGN_OR_RETURN(auto model, pipeline::PipelineModel::CreateCpu(
                                     options.spec, max_batch, pipeline_options));
    return std::unique_ptr<Model>(std::move(model));
  }
#if SHARDTRAIN_PIPELINE_HAVE_NCCL
  const int gpus = VisibleGpus();
  std::vector<std::unique_ptr<Backend>> backends;
  for (int s = 0; s < options.pipeline_stages; ++s) {
    ASSIGN_OR_RETURN(backends.emplace_back(), MakeBackend(options, s % gpus));
  }
  ASSIGN_OR_RETURN(
      auto model,
      pipeline::PipelineModel::Create(
          options.spec, std::move(backends), max_batch, pipeline_options,
          [](std::vector<Backend*> stage_backends) {
            return pipeline::NcclTransport::Create(std::move(stage_backends));
          }));
  return std::unique_ptr<Model>(std::move(model));
#else
  (void)VisibleGpus;
  return absl::FailedPreconditionError(
      "pipeline stages on the cuda device need NCCL, which this build lacks");
#endif
}

// PipelineModels as options say.
absl::StatusOr<ModelFactory> PipelineFactory(const ModelOptions& options) {
  RETURN_IF_ERROR(options.spec.Validate());
  const int num_linear = NumLinearLayers(options.spec);
  if (options.pipeline_stages > num_linear) {
    return absl::InvalidArgumentError(absl::StrCat(
        options.pipeline_stages, " pipeline stages for a model of ",
        num_linear, " Linear layers; each stage needs at least one"));
  }
  if (options.microbatches < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "microbatches must be >= 1, got ", options.microbatches));
  }
  pipeline::PipelineOptions pipeline_options;
  pipeline_options.stages = options.pipeline_stages;
  pipeline_options.microbatches = options.microbatches;
  pipeline_options.schedule = options.schedule;
  return ModelFactory([options, pipeline_options](int max_batch) {
    return MakePipelineModel(options, pipeline_options, max_batch);
  });
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const ModelOptions& options,
                                                     int gpu_index) {
  switch (options.device) {
    case DeviceKind::kCpu:
      if (options.gemm_precision != GemmPrecision::kFp32) {
        return absl::InvalidArgumentError(absl::StrCat(
            "GEMM precision ", GemmPrecisionName(options.gemm_precision),
            " needs the cuda device: the cpu backend multiplies in fp32"));
      }
      return MakeCpuBackend();
    case DeviceKind::kCuda:
      return MakeCudaBackendOn(gpu_index, options.gemm_precision);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown device kind ", static_cast<int>(options.device)));
}

absl::StatusOr<ModelFactory> MakeModelFactory(const ModelOptions& options) {
  if (options.device == DeviceKind::kCpu) SetCpuMathThreads(options.cpu_threads);
  // Fail now, with the device's own message, rather than inside training.
  RETURN_IF_ERROR(MakeBackend(options).status());
  if (options.pipeline_stages <= 1) return MlpFactory(options);
  return PipelineFactory(options);
}

}  // namespace shardtrain::worker
