// The layout of an MLP -- its layers and its parameters -- built in one place
// for Mlp and PipelineModel, so the single-device and the pipelined model
// cannot drift apart; plus the argument checks the two share.
//
// For layer sizes {d0, ..., dL} the model has L Linear layers. Linear l maps
// d_l features to d_{l+1} and, unless it is the last, is followed by a ReLU.
// Its parameters are "fc<l>.weight" of shape {d_l, d_{l+1}} (He-uniform
// before a ReLU, Glorot-uniform for the output layer) and "fc<l>.bias" of
// shape {d_{l+1}} (zeros), in that order. A section is a contiguous run of
// Linear layers, each with its ReLU: the whole model for Mlp, one stage for
// PipelineModel.
//
// Example:
//   const int num_linear = NumLinearLayers(spec);
//   ASSIGN_OR_RETURN(MlpSection whole,
//                    BuildMlpSection(spec, 0, num_linear, backend));
//   whole.layers;  // Linear, ReLU, Linear, ..., Linear
//   whole.params;  // fc0.weight, fc0.bias, fc1.weight, ...
//   whole.layers[whole.slots[2].layer]->param(whole.slots[2].local);  // fc1.weight
#ifndef SHARDTRAIN_WORKER_MODEL_MLP_LAYOUT_H_
#define SHARDTRAIN_WORKER_MODEL_MLP_LAYOUT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/device/backend.h"
#include "worker/model/layers.h"
#include "worker/model/model.h"
#include "worker/model/model_spec.h"

namespace shardtrain::worker {

// Where a parameter lives in a section: layers[layer]->param(local).
struct ParamSlot {
  int layer;
  int local;
};

// Linear layers [first_linear, end_linear) of an MLP on one backend.
// Thread-compatible, like its layers.
struct MlpSection {
  // Linear, ReLU, Linear, ...: a ReLU after each Linear but the model's last.
  std::vector<std::unique_ptr<Layer>> layers;
  // fc<l>.weight, fc<l>.bias for each Linear l of the section, in order.
  std::vector<ParamInfo> params;
  std::vector<ParamSlot> slots;  // Parallel to params.
};

// Linear layers of the model: layer_sizes.size() - 1.
// REQUIRES: spec.Validate() is OK.
int NumLinearLayers(const ModelSpec& spec);

// Builds the section's layers on `backend` (not owned; it must outlive
// them), with parameters at zero. INVALID_ARGUMENT for an invalid spec, a
// null backend or a range outside 0 <= first_linear < end_linear <=
// NumLinearLayers(spec); RESOURCE_EXHAUSTED if the backend is out of memory.
absl::StatusOr<MlpSection> BuildMlpSection(const ModelSpec& spec,
                                           int first_linear, int end_linear,
                                           Backend* backend);

// OK if 0 <= index < params.size() and host_size is that parameter's number
// of elements; otherwise INVALID_ARGUMENT whose message starts with `model`.
absl::Status CheckParamAccess(absl::string_view model,
                              const std::vector<ParamInfo>& params, int index,
                              size_t host_size);

// OK if x and labels are non-null, 1 <= batch <= max_batch and every label
// is in [0, num_classes); otherwise INVALID_ARGUMENT whose message starts
// with `model`. Labels are checked on the host so every backend rejects them
// the same way, and before any work so a bad batch leaves a model untouched.
absl::Status CheckBatch(absl::string_view model, const float* x,
                        const int32_t* labels, int batch, int max_batch,
                        int num_classes);

}  // namespace shardtrain::worker

#endif  // SHARDTRAIN_WORKER_MODEL_MLP_LAYOUT_H_
