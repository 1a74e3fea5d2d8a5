#include "worker/model/mlp.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace shardtrain::worker {
absl::StatusOr<std::unique_ptr<Mlp>> Mlp::Create(const ModelSpec& spec,
                                                 Backend* backend,
                                                 int max_batch) {
  RETURN_IF_ERROR(spec.Validate());
  if (backend == nullptr) {
    return absl::InvalidArgumentError("Mlp: backend is null");
  }
  if (max_batch < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("Mlp: max_batch must be >= 1, got ", max_batch));
  }
  std::unique_ptr<Mlp> mlp(new Mlp(spec, backend, max_batch));
  const std::vector<int>& sizes = spec.layer_sizes;
  const int num_linear = static_cast<int>(sizes.size()) - 1;

  for (int l = 0; l < num_linear; ++l) {
    const bool last = l + 1 == num_linear;
    ASSIGN_OR_RETURN(std::unique_ptr<LinearLayer> linear,
                     LinearLayer::Create(backend, sizes[l], sizes[l + 1]));
    const std::string prefix = absl::StrCat("fc", l);
    mlp->slots_.push_back(
        {static_cast<int>(mlp->layers_.size()), LinearLayer::kWeight});
    mlp->params_.push_back({prefix + ".weight",
                            {sizes[l], sizes[l + 1]},
                            last ? Init::kGlorotUniform : Init::kHeUniform});
    mlp->slots_.push_back(
        {static_cast<int>(mlp->layers_.size()), LinearLayer::kBias});
    mlp->params_.push_back({prefix + ".bias", {sizes[l + 1]}, Init::kZeros});
    mlp->layers_.push_back(std::move(linear));
    if (!last) {
      mlp->layers_.push_back(
          std::make_unique<ReluLayer>(backend, sizes[l + 1]));
    }
  }

  ASSIGN_OR_RETURN(std::unique_ptr<DeviceBuffer> input,
                   backend->Allocate(size_t(max_batch) * sizes.front()));
  mlp->activations_.push_back(std::move(input));
  for (const std::unique_ptr<Layer>& layer : mlp->layers_) {
    ASSIGN_OR_RETURN(std::unique_ptr<DeviceBuffer> out,
                     backend->Allocate(size_t(max_batch) * layer->out_dim()));
    mlp->activations_.push_back(std::move(out));
  }
  const int widest = *std::max_element(sizes.begin(), sizes.end());
  ASSIGN_OR_RETURN(mlp->grad_a_, backend->Allocate(size_t(max_batch) * widest));
  ASSIGN_OR_RETURN(mlp->grad_b_, backend->Allocate(size_t(max_batch) * widest));
  ASSIGN_OR_RETURN(mlp->labels_, backend->AllocateLabels(max_batch));
  mlp->staging_ = GradStaging(mlp->params_.size());
  return mlp;
}

int64_t Mlp::num_parameters() const {
  int64_t total = 0;
  for (const ParamInfo& p : params_) total += NumElements(p);
  return total;
}

absl::Status Mlp::CheckIndex(int index, size_t host_size) const {
  if (index < 0 || index >= static_cast<int>(params_.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Mlp: parameter index ", index, " outside [0, ", params_.size(), ")"));
  }
  const int64_t expected = NumElements(params_[index]);
  if (static_cast<int64_t>(host_size) != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat("Mlp: parameter ", params_[index].name, " has ", expected,
                     " values, host buffer has ", host_size));
  }
  return absl::OkStatus();
}

absl::Status Mlp::SetParam(int index, absl::Span<const float> host_values) {
  RETURN_IF_ERROR(CheckIndex(index, host_values.size()));
  const ParamSlot& slot = slots_[index];
  return backend_->CopyFromHost(host_values,
                                layers_[slot.layer]->param(slot.local), 0);
}

absl::Status Mlp::GetParam(int index, absl::Span<float> host_out) const {
  RETURN_IF_ERROR(CheckIndex(index, host_out.size()));
  const ParamSlot& slot = slots_[index];
  return backend_->CopyToHost(*layers_[slot.layer]->param(slot.local), 0,
                              host_out);
}

absl::Status Mlp::GetGrad(int index, absl::Span<float> host_out) const {
  RETURN_IF_ERROR(CheckIndex(index, host_out.size()));
  const ParamSlot& slot = slots_[index];
  return backend_->CopyToHost(*layers_[slot.layer]->grad(slot.local), 0,
                              host_out);
}

absl::StatusOr<PendingGrad> Mlp::StartGradCopy(int index) {
  const bool valid = index >= 0 && index < static_cast<int>(params_.size());
  RETURN_IF_ERROR(CheckIndex(index, valid ? NumElements(params_[index]) : 0));
  const ParamSlot& slot = slots_[index];
  return staging_.Start(index, *backend_, *layers_[slot.layer]->grad(slot.local));
}

absl::Status Mlp::CheckBatch(const float* x, const int32_t* labels, int batch,
                             int max_batch) const {
  if (x == nullptr || labels == nullptr) {
    return absl::InvalidArgumentError("Mlp: x and labels must be non-null");
  }
  if (batch < 1 || batch > max_batch) {
    return absl::InvalidArgumentError(
        absl::StrCat("Mlp: batch ", batch, " outside [1, ", max_batch, "]"));
  }
  // Checked on the host so every backend rejects bad labels the same way,
  // and before any work so a bad batch leaves the model untouched.
  for (int i = 0; i < batch; ++i) {
    if (labels[i] < 0 || labels[i] >= num_classes()) {
      return absl::InvalidArgumentError(
          absl::StrCat("Mlp: label ", labels[i], " of example ", i,
                       " outside [0, ", num_classes(), ")"));
    }
  }
  return absl::OkStatus();
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
  RETURN_IF_ERROR(CheckBatch(x, labels, batch, max_batch_));
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
  RETURN_IF_ERROR(CheckBatch(x, labels, batch, batch));
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

ModelFactory Mlp::Factory(const ModelSpec& spec, Backend* backend) {
  return [spec, backend](int max_batch) -> absl::StatusOr<std::unique_ptr<Model>> {
    absl::StatusOr<std::unique_ptr<Mlp>> mlp = Create(spec, backend, max_batch);
    if (!mlp.ok()) return mlp.status();
    return std::unique_ptr<Model>(std::move(*mlp));
  };
}

}  // namespace shardtrain::worker
