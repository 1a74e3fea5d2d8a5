#include "worker/model/mlp_layout.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace shardtrain::worker {

int NumLinearLayers(const ModelSpec& spec) {
  return static_cast<int>(spec.layer_sizes.size()) - 1;
}

absl::StatusOr<MlpSection> BuildMlpSection(const ModelSpec& spec,
                                           int first_linear, int end_linear,
                                           Backend* backend) {
  RETURN_IF_ERROR(spec.Validate());
  if (backend == nullptr) {
    return absl::InvalidArgumentError("MLP section: backend is null");
  }
  const int num_linear = NumLinearLayers(spec);
  if (first_linear < 0 || first_linear >= end_linear ||
      end_linear > num_linear) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MLP section: Linear layers [", first_linear, ", ", end_linear,
        ") are not a non-empty range inside [0, ", num_linear, ")"));
  }
  const std::vector<int>& sizes = spec.layer_sizes;
  MlpSection section;
  for (int l = first_linear; l < end_linear; ++l) {
    const bool last = l + 1 == num_linear;
    ASSIGN_OR_RETURN(std::unique_ptr<LinearLayer> linear,
                     LinearLayer::Create(backend, sizes[l], sizes[l + 1]));
    const int layer = static_cast<int>(section.layers.size());
    const std::string prefix = absl::StrCat("fc", l);
    section.params.push_back({prefix + ".weight",
                              {sizes[l], sizes[l + 1]},
                              last ? Init::kGlorotUniform : Init::kHeUniform});
    section.slots.push_back({layer, LinearLayer::kWeight});
    section.params.push_back({prefix + ".bias", {sizes[l + 1]}, Init::kZeros});
    section.slots.push_back({layer, LinearLayer::kBias});
    section.layers.push_back(std::move(linear));
    if (!last) {
      section.layers.push_back(
          std::make_unique<ReluLayer>(backend, sizes[l + 1]));
    }
  }
  return section;
}

absl::Status CheckParamAccess(absl::string_view model,
                              const std::vector<ParamInfo>& params, int index,
                              size_t host_size) {
  if (index < 0 || index >= static_cast<int>(params.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat(model, ": parameter index ", index, " outside [0, ",
                     params.size(), ")"));
  }
  const int64_t expected = NumElements(params[index]);
  if (static_cast<int64_t>(host_size) != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat(model, ": parameter ", params[index].name, " has ",
                     expected, " values, host buffer has ", host_size));
  }
  return absl::OkStatus();
}

absl::Status CheckBatch(absl::string_view model, const float* x,
                        const int32_t* labels, int batch, int max_batch,
                        int num_classes) {
  if (x == nullptr || labels == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(model, ": x and labels must be non-null"));
  }
  if (batch < 1 || batch > max_batch) {
    return absl::InvalidArgumentError(absl::StrCat(
        model, ": batch ", batch, " outside [1, ", max_batch, "]"));
  }
  for (int i = 0; i < batch; ++i) {
    if (labels[i] < 0 || labels[i] >= num_classes) {
      return absl::InvalidArgumentError(
          absl::StrCat(model, ": label ", labels[i], " of example ", i,
                       " outside [0, ", num_classes, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace shardtrain::worker
