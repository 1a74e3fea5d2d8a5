#include "worker/model/model_factory.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/device/cpu/cpu_backend.h"
#include "worker/model/mlp.h"
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

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const ModelOptions& options,
                                                     int gpu_index) {
  const std::string& precision = options.gemm_precision;
  if (precision != "fp32" && precision != "tf32" && precision != "bf16") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--gemm_precision must be fp32, tf32 or bf16, got ", precision));
  }
  if (options.device == "cpu") {
    if (precision != "fp32") {
      return absl::InvalidArgumentError(absl::StrCat(
          "--gemm_precision=", precision,
          " needs --device=cuda: the cpu backend multiplies in fp32"));
    }
    return MakeCpuBackend();
  }
  if (options.device == "cuda") {
#if SHARDTRAIN_WITH_CUDA
    if (!CudaDeviceAvailable()) {
      return absl::FailedPreconditionError(
          "--device=cuda: this build has CUDA, but no CUDA device is present "
          "(no GPU visible or no driver loaded)");
    }
    CudaBackendOptions cuda_options;
    cuda_options.device = gpu_index;
    cuda_options.gemm_precision = precision == "tf32"   ? GemmPrecision::kTf32
                                  : precision == "bf16" ? GemmPrecision::kBf16
                                                        : GemmPrecision::kFp32;
    return MakeCudaBackend(cuda_options);
#else
    (void)gpu_index;
    return absl::FailedPreconditionError(
        "--device=cuda: this build has no CUDA support (it was configured "
        "without a CUDA compiler or with -DSHARDTRAIN_WITH_CUDA=OFF)");
#endif
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--device must be cpu or cuda, got ", options.device));
}

absl::StatusOr<ModelFactory> MakeModelFactory(const ModelOptions& options) {
  if (options.device == "cpu") SetCpuMathThreads(options.cpu_threads);
  // Fail now, with the device's own message, rather than inside training.
  RETURN_IF_ERROR(MakeBackend(options).status());
  if (options.pipeline_stages <= 1) {
    // The backend outlives every model the factory makes.
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
  ASSIGN_OR_RETURN(pipeline::ScheduleKind kind,
                   pipeline::ParseScheduleKind(options.schedule));
  pipeline::PipelineOptions pipeline_options;
  pipeline_options.stages = options.pipeline_stages;
  pipeline_options.microbatches = options.microbatches;
  pipeline_options.schedule = kind;
  const ModelOptions copy = options;
  return ModelFactory([copy, pipeline_options](
                          int max_batch) -> absl::StatusOr<std::unique_ptr<Model>> {
    if (copy.device == "cpu") {
      ASSIGN_OR_RETURN(auto model, pipeline::PipelineModel::CreateCpu(
                                       copy.spec, max_batch, pipeline_options));
      return std::unique_ptr<Model>(std::move(model));
    }
#if SHARDTRAIN_PIPELINE_HAVE_NCCL
    const int gpus = VisibleGpus();
    std::vector<std::unique_ptr<Backend>> backends;
    for (int s = 0; s < copy.pipeline_stages; ++s) {
      ASSIGN_OR_RETURN(backends.emplace_back(), MakeBackend(copy, s % gpus));
    }
    ASSIGN_OR_RETURN(
        auto model,
        pipeline::PipelineModel::Create(
            copy.spec, std::move(backends), max_batch, pipeline_options,
            [](std::vector<Backend*> stage_backends) {
              return pipeline::NcclTransport::Create(std::move(stage_backends));
            }));
    return std::unique_ptr<Model>(std::move(model));
#else
    (void)VisibleGpus;
    return absl::FailedPreconditionError(
        "pipeline stages on --device=cuda need NCCL, which this build lacks");
#endif
  });
}

}  // namespace shardtrain::worker
