// TensorSpecsFor: the TensorSpecs that register a model's parameters with the
// servers (name, shape, f32, and the initializer ParamInfo::init names).
//
// Example:
//   RETURN_IF_ERROR(client->Register(TensorSpecsFor(model->params(), seed)));
#ifndef SHARDTRAIN_WORKER_MODEL_TENSOR_SPECS_H_
#define SHARDTRAIN_WORKER_MODEL_TENSOR_SPECS_H_

#include <cstdint>
#include <vector>

#include "proto/shardtrain.pb.h"
#include "worker/model/model.h"

namespace shardtrain::worker {

// One spec per model parameter, in the model's order. Initial values come
// from `seed`, so every worker registers identical specs.
std::vector<TensorSpec> TensorSpecsFor(const std::vector<ParamInfo>& params,
                                       uint64_t seed);

}  // namespace shardtrain::worker

#endif  // SHARDTRAIN_WORKER_MODEL_TENSOR_SPECS_H_
