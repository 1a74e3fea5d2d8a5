// Layer, LinearLayer, ReluLayer: the building blocks of Mlp.
//
// A Layer maps a batch of row-major activations x [batch, in_dim] to
// y [batch, out_dim] on a Backend, and back-propagates dL/dy into gradients
// of its own parameters and, when asked, dL/dx. Layers keep no per-batch
// state: the caller hands Backward the same x and y it used in Forward, which
// lets the model own all activation memory in one place.
//
// Example:
//   ASSIGN_OR_RETURN(std::unique_ptr<LinearLayer> fc,
//                    LinearLayer::Create(backend, 784, 10));
//   RETURN_IF_ERROR(fc->Forward(batch, x, y));
//   RETURN_IF_ERROR(fc->Backward(batch, x, y, dy, /*dx=*/nullptr, nullptr));
#ifndef SHARDTRAIN_WORKER_MODEL_LAYERS_H_
#define SHARDTRAIN_WORKER_MODEL_LAYERS_H_

#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/device/backend.h"

namespace shardtrain::worker {

// Thread-compatible, like the Backend it runs on.
class Layer {
 public:
  virtual ~Layer() = default;

  virtual int in_dim() const = 0;
  virtual int out_dim() const = 0;

  // y = f(x). x and y are backend memory of batch*in_dim and batch*out_dim
  // floats and must not overlap.
  // REQUIRES: batch >= 0.
  virtual absl::Status Forward(int batch, const float* x, float* y) = 0;

  // Given the x and y of the matching Forward and dy = dL/dy, overwrites the
  // gradients of this layer's parameters and, if dx is non-null, writes
  // dx = dL/dx (batch*in_dim floats, not overlapping dy). on_param_grad(j),
  // if set, runs as soon as the gradient of local parameter j is written.
  virtual absl::Status Backward(
      int batch, const float* x, const float* y, const float* dy, float* dx,
      const std::function<void(int)>& on_param_grad) = 0;

  // Parameters, indexed locally from 0. A layer without parameters has none.
  virtual int num_params() const { return 0; }
  // REQUIRES: 0 <= j < num_params(). Owned by the layer.
  virtual DeviceBuffer* param(int j) { return nullptr; }
  virtual DeviceBuffer* grad(int j) { return nullptr; }
};

// y = x·W + b with W [in_dim, out_dim] row-major (local parameter 0) and
// b [out_dim] (local parameter 1). Parameters start at zero.
class LinearLayer final : public Layer {
 public:
  static constexpr int kWeight = 0;
  static constexpr int kBias = 1;

  // backend: not owned, must outlive the layer.
  // INVALID_ARGUMENT unless in_dim >= 1 and out_dim >= 1.
  static absl::StatusOr<std::unique_ptr<LinearLayer>> Create(Backend* backend,
                                                             int in_dim,
                                                             int out_dim);

  int in_dim() const override { return in_dim_; }
  int out_dim() const override { return out_dim_; }
  absl::Status Forward(int batch, const float* x, float* y) override;
  // Reports the bias gradient before the weight gradient: it is one cheap
  // column sum, so a caller streaming gradients can start sooner.
  absl::Status Backward(int batch, const float* x, const float* y,
                        const float* dy, float* dx,
                        const std::function<void(int)>& on_param_grad) override;

  int num_params() const override { return 2; }
  DeviceBuffer* param(int j) override;
  DeviceBuffer* grad(int j) override;

 private:
  LinearLayer(Backend* backend, int in_dim, int out_dim)
      : backend_(backend), in_dim_(in_dim), out_dim_(out_dim) {}

  Backend* const backend_;  // Not owned.
  const int in_dim_;
  const int out_dim_;
  std::unique_ptr<DeviceBuffer> weight_;       // [in_dim, out_dim]
  std::unique_ptr<DeviceBuffer> bias_;         // [out_dim]
  std::unique_ptr<DeviceBuffer> weight_grad_;  // Same shape as weight_.
  std::unique_ptr<DeviceBuffer> bias_grad_;    // Same shape as bias_.
};

// y = max(x, 0), elementwise over dim features.
class ReluLayer final : public Layer {
 public:
  // backend: not owned, must outlive the layer. REQUIRES: dim >= 1.
  ReluLayer(Backend* backend, int dim) : backend_(backend), dim_(dim) {}

  int in_dim() const override { return dim_; }
  int out_dim() const override { return dim_; }
  absl::Status Forward(int batch, const float* x, float* y) override;
  absl::Status Backward(int batch, const float* x, const float* y,
                        const float* dy, float* dx,
                        const std::function<void(int)>& on_param_grad) override;

 private:
  Backend* const backend_;  // Not owned.
  const int dim_;
};

}  // namespace shardtrain::worker

#endif  // SHARDTRAIN_WORKER_MODEL_LAYERS_H_
