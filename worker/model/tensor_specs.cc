#include "worker/model/tensor_specs.h"

namespace shardtrain::worker {

std::vector<TensorSpec> TensorSpecsFor(const std::vector<ParamInfo>& params,
                                       uint64_t seed) {
  std::vector<TensorSpec> specs;
  specs.reserve(params.size());
  for (const ParamInfo& param : params) {
    TensorSpec spec;
    spec.set_name(param.name);
    for (int64_t dim : param.shape) spec.add_shape(dim);
    spec.set_dtype(DTYPE_F32);
    Initializer* init = spec.mutable_init();
    switch (param.init) {
      case Init::kZeros:
        init->set_kind(Initializer::KIND_ZEROS);
        break;
      case Init::kGlorotUniform:
        init->set_kind(Initializer::KIND_GLOROT_UNIFORM);
        break;
      case Init::kHeUniform:
        init->set_kind(Initializer::KIND_HE_UNIFORM);
        break;
    }
    init->set_seed(seed);
    specs.push_back(std::move(spec));
  }
  return specs;
}

}  // namespace shardtrain::worker
