#include "worker/model/mlp.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"

namespace shardtrain::worker {
namespace {

constexpr absl::string_view kName = "Mlp";

}  // namespace

Mlp::Mlp(const ModelSpec& spec, Backend* backend, int max_batch,
         MlpSection section)
    : spec_(spec),
      backend_(backend),
      max_batch_(max_batch),
      layers_(std::move(section.layers)),
      params_(std::move(section.params)),
      slots_(std::move(section.slots)),
      staging_(params_.size()) {}

absl::StatusOr<std::unique_ptr<Mlp>> Mlp::Create(const ModelSpec& spec,
                                                 Backend* backend,
                                                 int max_batch) {
  if (max_batch < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("Mlp: max_batch must be >= 1, got ", max_batch));
  }
  RETURN_IF_ERROR(spec.Validate());
  ASSIGN_OR_RETURN(MlpSection section,
                   BuildMlpSection(spec, 0, NumLinearLayers(spec), backend));
  std::unique_ptr<Mlp> mlp(
      new Mlp(spec, backend, max_batch, std::move(section)));
  RETURN_IF_ERROR(mlp->AllocateBuffers());
  return mlp;
}

absl::Status Mlp::AllocateBuffers() {
  const std::vector<int>& sizes = spec_.layer_sizes;
  const size_t rows = max_batch_;
  ASSIGN_OR_RETURN(std::unique_ptr<DeviceBuffer> input,
                   backend_->Allocate(rows * sizes.front()));
  activations_.push_back(std::move(input));
  for (const std::unique_ptr<Layer>& layer : layers_) {
    ASSIGN_OR_RETURN(std::unique_ptr<DeviceBuffer> out,
                     backend_->Allocate(rows * layer->out_dim()));
    activations_.push_back(std::move(out));
  }
  const int widest = *std::max_element(sizes.begin(), sizes.end());
  ASSIGN_OR_RETURN(grad_a_, backend_->Allocate(rows * widest));
  ASSIGN_OR_RETURN(grad_b_, backend_->Allocate(rows * widest));
  ASSIGN_OR_RETURN(labels_, backend_->AllocateLabels(rows));
  return absl::OkStatus();
}

DeviceBuffer* Mlp::ParamBuffer(int index) const {
  const ParamSlot& slot = slots_[index];
  return layers_[slot.layer]->param(slot.local);
}

DeviceBuffer* Mlp::GradBuffer(int index) const {
  const ParamSlot& slot = slots_[index];
  return layers_[slot.layer]->grad(slot.local);
}

absl::Status Mlp::SetParam(int index, absl::Span<const float> host_values) {
  RETURN_IF_ERROR(CheckParamAccess(kName, params_, index, host_values.size()));
  return backend_->CopyFromHost(host_values, ParamBuffer(index), 0);
}

absl::Status Mlp::GetParam(int index, absl::Span<float> host_out) const {
  RETURN_IF_ERROR(CheckParamAccess(kName, params_, index, host_out.size()));
  return backend_->CopyToHost(*ParamBuffer(index), 0, host_out);
}

absl::StatusOr<std::unique_ptr<HostPin>> Mlp::PinParamHost(int index,
                                                           absl::Span<float> host) {
  RETURN_IF_ERROR(CheckParamAccess(kName, params_, index, host.size()));
  return backend_->PinHost(host);
}

absl::Status Mlp::GetGrad(int index, absl::Span<float> host_out) const {
  RETURN_IF_ERROR(CheckParamAccess(kName, params_, index, host_out.size()));
  return backend_->CopyToHost(*GradBuffer(index), 0, host_out);
}

absl::StatusOr<PendingGrad> Mlp::StartGradCopy(int index) {
  const bool valid = index >= 0 && index < static_cast<int>(params_.size());
  RETURN_IF_ERROR(CheckParamAccess(kName, params_, index,
                                   valid ? NumElements(params_[index]) : 0));
  return staging_.Start(index, *backend_, *GradBuffer(index));
}

absl::Status Mlp::UploadAndForward(const float* x, const int32_t* labels,
                                   int batch) {
  RETURN_IF_ERROR(backend_->CopyFromHost(
      absl::MakeConstSpan(x, size_t(batch) * input_dim()),
      activations_[0].get(), 0));
  RETURN_IF_ERROR(backend_->CopyLabelsFromHost(
      absl::MakeConstSpan(labels, batch), labels_.get(), 0));
  for (size_t l = 0; l < layers_.size(); ++l) {
    RETURN_IF_ERROR(layers_[l]->Forward(batch, activations_[l]->data(),
                                        activations_[l + 1]->data()));
  }
  return absl::OkStatus();
}

absl::StatusOr<float> Mlp::ForwardBackward(
    const float* x, const int32_t* labels, int batch,
    const std::function<void(int)>& on_grad_ready) {
  RETURN_IF_ERROR(
      CheckBatch(kName, x, labels, batch, max_batch_, num_classes()));
  RETURN_IF_ERROR(UploadAndForward(x, labels, batch));

  float* dy = grad_a_->data();
  float* dx = grad_b_->data();
  ASSIGN_OR_RETURN(float loss,
                   backend_->SoftmaxCrossEntropy(batch, num_classes(),
                                                 activations_.back()->data(),
                                                 labels_->data(), dy));

  // Parameters are numbered layer by layer, so walking layers backwards and
  // translating local indices reports them in reverse global order.
  int next_global = static_cast<int>(params_.size());
  for (int l = static_cast<int>(layers_.size()) - 1; l >= 0; --l) {
    Layer& layer = *layers_[l];
    const int first_global = next_global - layer.num_params();
    std::function<void(int)> local_ready;
    if (on_grad_ready && layer.num_params() > 0) {
      local_ready = [&on_grad_ready, first_global](int local) {
        on_grad_ready(first_global + local);
      };
    }
    // The input gradient of the first layer is never used.
    float* layer_dx = l == 0 ? nullptr : dx;
    RETURN_IF_ERROR(layer.Backward(batch, activations_[l]->data(),
                                   activations_[l + 1]->data(), dy, layer_dx,
                                   local_ready));
    next_global = first_global;
    std::swap(dy, dx);
  }
  // On an asynchronous backend backward is only queued by now; waiting here
  // makes the call's duration its compute time. Gradient copies started from
  // on_grad_ready went out on their own stream meanwhile.
  RETURN_IF_ERROR(backend_->Synchronize());
  return loss;
}

absl::StatusOr<int> Mlp::CountCorrect(const float* x, const int32_t* labels,
                                      int batch) {
  if (batch < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("Mlp: batch must be >= 1, got ", batch));
  }
  RETURN_IF_ERROR(CheckBatch(kName, x, labels, batch, batch, num_classes()));
  int correct = 0;
  for (int start = 0; start < batch; start += max_batch_) {
    const int chunk = std::min(max_batch_, batch - start);
    RETURN_IF_ERROR(UploadAndForward(x + int64_t{start} * input_dim(),
                                     labels + start, chunk));
    ASSIGN_OR_RETURN(
        int chunk_correct,
        backend_->ArgmaxCorrect(chunk, num_classes(),
                                activations_.back()->data(), labels_->data()));
    correct += chunk_correct;
  }
  return correct;
}

}  // namespace shardtrain::worker
