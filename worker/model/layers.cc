#include "worker/model/layers.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace shardtrain::worker {

absl::StatusOr<std::unique_ptr<LinearLayer>> LinearLayer::Create(
    Backend* backend, int in_dim, int out_dim) {
  if (backend == nullptr) {
    return absl::InvalidArgumentError("LinearLayer: backend is null");
  }
  if (in_dim < 1 || out_dim < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "LinearLayer: dimensions must be >= 1, got ", in_dim, "x", out_dim));
  }
  std::unique_ptr<LinearLayer> layer(new LinearLayer(backend, in_dim, out_dim));
  const size_t weight_size = static_cast<size_t>(in_dim) * out_dim;
  ASSIGN_OR_RETURN(layer->weight_, backend->Allocate(weight_size));
  ASSIGN_OR_RETURN(layer->bias_, backend->Allocate(out_dim));
  ASSIGN_OR_RETURN(layer->weight_grad_, backend->Allocate(weight_size));
  ASSIGN_OR_RETURN(layer->bias_grad_, backend->Allocate(out_dim));
  return layer;
}

absl::Status LinearLayer::Forward(int batch, const float* x, float* y) {
  RETURN_IF_ERROR(backend_->Gemm(Trans::kNo, Trans::kNo, batch, out_dim_,
                                 in_dim_, 1.0f, x, weight_->data(), 0.0f, y));
  return backend_->AddBias(batch, out_dim_, bias_->data(), y);
}

absl::Status LinearLayer::Backward(
    int batch, const float* x, const float* y, const float* dy, float* dx,
    const std::function<void(int)>& on_param_grad) {
  // db = sum over the batch of dy.
  RETURN_IF_ERROR(backend_->ColumnSum(batch, out_dim_, dy, bias_grad_->data()));
  if (on_param_grad) on_param_grad(kBias);
  // dW [in, out] = x^T [in, batch] · dy [batch, out].
  RETURN_IF_ERROR(backend_->Gemm(Trans::kYes, Trans::kNo, in_dim_, out_dim_,
                                 batch, 1.0f, x, dy, 0.0f,
                                 weight_grad_->data()));
  if (on_param_grad) on_param_grad(kWeight);
  if (dx == nullptr) return absl::OkStatus();
  // dx [batch, in] = dy [batch, out] · W^T [out, in].
  return backend_->Gemm(Trans::kNo, Trans::kYes, batch, in_dim_, out_dim_, 1.0f,
                        dy, weight_->data(), 0.0f, dx);
}

DeviceBuffer* LinearLayer::param(int j) {
  return j == kWeight ? weight_.get() : bias_.get();
}

DeviceBuffer* LinearLayer::grad(int j) {
  return j == kWeight ? weight_grad_.get() : bias_grad_.get();
}

absl::Status ReluLayer::Forward(int batch, const float* x, float* y) {
  return backend_->ReluForward(int64_t{batch} * dim_, x, y);
}

absl::Status ReluLayer::Backward(
    int batch, const float* x, const float* y, const float* dy, float* dx,
    const std::function<void(int)>& on_param_grad) {
  // Nothing to learn here; without dx there is nothing to compute.
  if (dx == nullptr) return absl::OkStatus();
  return backend_->ReluBackward(int64_t{batch} * dim_, y, dy, dx);
}

}  // namespace shardtrain::worker
