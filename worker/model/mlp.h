// Mlp: a multi-layer perceptron classifier trained with softmax
// cross-entropy, running on a Backend.
//
// For layer sizes {d0, d1, ..., dL} the model is
//   Linear(d0, d1) -> ReLU -> Linear(d1, d2) -> ReLU -> ... -> Linear(.., dL)
// followed by softmax cross-entropy against integer class labels. A Linear
// computes y = x·W + b with W [in, out] row-major and b [out].
//
// The layers and parameters come from BuildMlpSection (mlp_layout.h), as
// PipelineModel's do. Parameters are exposed as a flat, ordered list
// (params()) named "fc0.weight", "fc0.bias", "fc1.weight", ... so a trainer
// can map them to parameter-server keys. Values start at zero: the trainer pulls initial
// values (initialised on the parameter server as ParamInfo::init says) and
// sets them with SetParam.
//
// Example:
//   ASSIGN_OR_RETURN(std::unique_ptr<Mlp> mlp,
//                    Mlp::Create(spec, backend.get(), /*max_batch=*/64));
//   for (int i = 0; i < mlp->params().size(); ++i)
//     RETURN_IF_ERROR(mlp->SetParam(i, pulled[i]));
//   ASSIGN_OR_RETURN(float loss, mlp->ForwardBackward(x, labels, 64,
//       [&](int i) { PushGradient(i); }));
#ifndef SHARDTRAIN_WORKER_MODEL_MLP_H_
#define SHARDTRAIN_WORKER_MODEL_MLP_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/device/backend.h"
#include "worker/model/grad_staging.h"
#include "worker/model/layers.h"
#include "worker/model/mlp_layout.h"
#include "worker/model/model.h"
#include "worker/model/model_spec.h"

namespace shardtrain::worker {

// Thread-compatible: one Mlp per thread, on that thread's Backend. The
// callback passed to ForwardBackward runs on the calling thread.
class Mlp : public Model {
 public:
  // backend: not owned, must outlive the Mlp. max_batch bounds the batch of
  // ForwardBackward and sizes the activation buffers, allocated here once.
  // INVALID_ARGUMENT for an invalid spec, a null backend or max_batch < 1.
  static absl::StatusOr<std::unique_ptr<Mlp>> Create(const ModelSpec& spec,
                                                     Backend* backend,
                                                     int max_batch);

  Mlp(const Mlp&) = delete;
  Mlp& operator=(const Mlp&) = delete;

  const ModelSpec& spec() const { return spec_; }
  int max_batch() const { return max_batch_; }
  int input_dim() const { return spec_.layer_sizes.front(); }
  int num_classes() const { return spec_.layer_sizes.back(); }

  // In order fc0.weight, fc0.bias, fc1.weight, ...
  const std::vector<ParamInfo>& params() const override { return params_; }

  // Copies host values into parameter `index`. INVALID_ARGUMENT for a bad
  // index or a size other than the product of the parameter's shape.
  absl::Status SetParam(int index, absl::Span<const float> host_values) override;
  // Copies parameter `index` to the host; same errors as SetParam.
  absl::Status GetParam(int index, absl::Span<float> host_out) const override;
  // As Model::PinParamHost, on this Mlp's backend.
  absl::StatusOr<std::unique_ptr<HostPin>> PinParamHost(int index,
                                                        absl::Span<float> host) override;

  // Runs forward and backward on one batch and returns the mean loss, after
  // the backend has finished computing every gradient. x holds
  // batch * input_dim() host floats, labels batch host labels in
  // [0, num_classes()). Afterwards GetGrad gives the gradient of the mean
  // loss. on_grad_ready(i), if set, is called once per parameter as soon as
  // backward has written (on a GPU: queued) gradient i, last parameter first;
  // inside it GetGrad(i) and StartGradCopy(i) are allowed, other calls on
  // this Mlp are not.
  // INVALID_ARGUMENT for null pointers, batch outside [1, max_batch()] or a
  // label out of range; nothing is computed then.
  absl::StatusOr<float> ForwardBackward(
      const float* x, const int32_t* labels, int batch,
      const std::function<void(int)>& on_grad_ready = nullptr) override;

  // Copies the gradient of parameter `index` from the last ForwardBackward
  // (zeros before the first) to the host; same errors as SetParam.
  absl::Status GetGrad(int index, absl::Span<float> host_out) const override;
  // As Model::StartGradCopy; INVALID_ARGUMENT for a bad index.
  absl::StatusOr<PendingGrad> StartGradCopy(int index) override;

  // Number of examples whose argmax prediction equals the label (forward
  // only). Any batch >= 1 is accepted: it is processed in chunks of
  // max_batch(). Same INVALID_ARGUMENT cases as ForwardBackward otherwise.
  // Overwrites activations but not gradients.
  absl::StatusOr<int> CountCorrect(const float* x, const int32_t* labels,
                                   int batch) override;

 private:
  Mlp(const ModelSpec& spec, Backend* backend, int max_batch,
      MlpSection section);

  // Allocates the activation, gradient and label buffers for max_batch_.
  absl::Status AllocateBuffers();
  // Where parameter `index` lives. REQUIRES: a valid index.
  DeviceBuffer* ParamBuffer(int index) const;
  DeviceBuffer* GradBuffer(int index) const;
  // Uploads a validated batch and runs every layer forward; the logits end
  // up in activations_.back().
  absl::Status UploadAndForward(const float* x, const int32_t* labels,
                                int batch);

  const ModelSpec spec_;
  Backend* const backend_;  // Not owned.
  const int max_batch_;

  // Linear, ReLU, Linear, ..., Linear.
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<ParamInfo> params_;
  std::vector<ParamSlot> slots_;  // Parallel to params_.

  // activations_[0] is the input, activations_[l + 1] the output of
  // layers_[l]; each holds max_batch rows of that layer's width.
  std::vector<std::unique_ptr<DeviceBuffer>> activations_;
  std::unique_ptr<DeviceLabelBuffer> labels_;  // max_batch labels.
  // Two buffers of max_batch * widest-layer floats that backward ping-pongs
  // between for dL/d(activation).
  std::unique_ptr<DeviceBuffer> grad_a_;
  std::unique_ptr<DeviceBuffer> grad_b_;
  GradStaging staging_;  // One slot per parameter.
};

}  // namespace shardtrain::worker

#endif  // SHARDTRAIN_WORKER_MODEL_MLP_H_
