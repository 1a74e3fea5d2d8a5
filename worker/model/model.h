// Model: what the trainer needs of a model, whichever way it is computed —
// Mlp on one backend, or PipelineModel split into stages.
//
// Parameters are identified by index in params() order; gradients are of the
// mean loss over the batch.
//
// Example (a step without a parameter server):
//   ASSIGN_OR_RETURN(std::unique_ptr<Model> model, make_model(/*max_batch=*/64));
//   for (int i = 0; i < static_cast<int>(model->params().size()); ++i)
//     RETURN_IF_ERROR(model->SetParam(i, values[i]));
//   ASSIGN_OR_RETURN(float loss, model->ForwardBackward(x, labels, 64, nullptr));
//   RETURN_IF_ERROR(model->GetGrad(0, absl::MakeSpan(grad0)));
#ifndef SHARDTRAIN_WORKER_MODEL_MODEL_H_
#define SHARDTRAIN_WORKER_MODEL_MODEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/device/fence.h"
#include "worker/device/host_pin.h"

namespace shardtrain::worker {

// How a parameter is initialised (the parameter server does it).
enum class Init {
  kZeros,
  // U(-a, a), a = sqrt(6 / (fan_in + fan_out)); used for the output layer.
  kGlorotUniform,
  // U(-a, a), a = sqrt(6 / fan_in); used for weights feeding a ReLU.
  kHeUniform,
};

struct ParamInfo {
  std::string name;            // "fc<layer>.weight" or "fc<layer>.bias".
  std::vector<int64_t> shape;  // {in, out} for weights, {out} for biases.
  Init init;
};

// Elements of parameter `param`.
inline int64_t NumElements(const ParamInfo& param) {
  int64_t n = 1;
  for (int64_t d : param.shape) n *= d;
  return n;
}

// A gradient on its way to host memory that the model owns.
struct PendingGrad {
  // The gradient, once ready->Wait() has returned OK. Valid and unchanged
  // until the next StartGradCopy of the same parameter (ForwardBackward
  // makes one only through its on_grad_ready), so it may be sent while the
  // next step computes.
  absl::Span<const float> values;
  std::unique_ptr<Fence> ready;
};

// Thread-compatible: one caller at a time.
class Model {
 public:
  virtual ~Model() = default;

  virtual const std::vector<ParamInfo>& params() const = 0;
  // Host values of parameter `index`; INVALID_ARGUMENT on a size mismatch.
  virtual absl::Status SetParam(int index, absl::Span<const float> host_values) = 0;
  virtual absl::Status GetParam(int index, absl::Span<float> host_out) const = 0;
  // For host memory the caller keeps and hands to SetParam(index, ...) step
  // after step: makes that copy run at the bus's speed until the pin goes
  // (a GPU page-locks it, see Backend::PinHost; the CPU does nothing).
  // INVALID_ARGUMENT for a bad index or size; otherwise Backend::PinHost's
  // errors, after which SetParam still works, only slower.
  virtual absl::StatusOr<std::unique_ptr<HostPin>> PinParamHost(int index,
                                                                absl::Span<float> host) = 0;
  // Forward and backward on one batch; returns the mean loss once every
  // gradient is computed. on_grad_ready(i), if set, is called once per
  // parameter as soon as its gradient is final (on a GPU: queued), while
  // backward continues; GetGrad(i) and StartGradCopy(i) may be called inside
  // it. Implementations say on which thread.
  virtual absl::StatusOr<float> ForwardBackward(
      const float* x, const int32_t* labels, int batch,
      const std::function<void(int)>& on_grad_ready) = 0;
  virtual absl::Status GetGrad(int index, absl::Span<float> host_out) const = 0;
  // Starts copying gradient `index` to the host without waiting for it: on
  // a GPU the copy runs on its own stream into page-locked memory, behind the
  // backward step that produced it and beside the ones after it.
  // REQUIRES: the previous copy of `index` was waited for, and its fence is
  // waited for before the next ForwardBackward.
  virtual absl::StatusOr<PendingGrad> StartGradCopy(int index) = 0;
  // Correct argmax predictions on `batch` examples (forward only).
  virtual absl::StatusOr<int> CountCorrect(const float* x, const int32_t* labels,
                                           int batch) = 0;
};

// Makes a model whose batches hold up to `max_batch` examples.
using ModelFactory =
    std::function<absl::StatusOr<std::unique_ptr<Model>>(int max_batch)>;

}  // namespace shardtrain::worker

#endif  // SHARDTRAIN_WORKER_MODEL_MODEL_H_
