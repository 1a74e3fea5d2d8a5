// The TensorSpecs that register a model's parameters with the servers.
#ifndef SHARDTRAIN_WORKER_MODEL_TENSOR_SPECS_H_
#define SHARDTRAIN_WORKER_MODEL_TENSOR_SPECS_H_

#include <cstdint>
#include <vector>

#include "proto/shardtrain.pb.h"
#include "worker/model/mlp.h"

namespace shardtrain::worker {

// One spec per model parameter, in the model's order. Initial values come
// from `seed`, so every worker registers identical specs.
std::vector<TensorSpec> TensorSpecsFor(const std::vector<ParamInfo>& params,
                                       uint64_t seed);

}  // namespace shardtrain::worker

#endif  // SHARDTRAIN_WORKER_MODEL_TENSOR_SPECS_H_
