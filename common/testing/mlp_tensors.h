// The parameter tensors of an MLP, named as the worker names them, for
// placement tests:
//
//   for (const TensorShape& t : MlpTensors({784, 256, 128, 10}))
//     PlaceTensor(t.name, t.elements, config);
#ifndef SHARDTRAIN_COMMON_TESTING_MLP_TENSORS_H_
#define SHARDTRAIN_COMMON_TESTING_MLP_TENSORS_H_

#include <cstdint>
#include <string>
#include <vector>

namespace shardtrain::testutil {

struct TensorShape {
  std::string name;
  int64_t elements;
};

// fc<i>.weight (sizes[i] x sizes[i+1]) and fc<i>.bias for each layer.
inline std::vector<TensorShape> MlpTensors(const std::vector<int64_t>& sizes) {
  std::vector<TensorShape> tensors;
  for (size_t i = 0; i + 1 < sizes.size(); ++i) {
    tensors.push_back({"fc" + std::to_string(i) + ".weight", sizes[i] * sizes[i + 1]});
    tensors.push_back({"fc" + std::to_string(i) + ".bias", sizes[i + 1]});
  }
  return tensors;
}

}  // namespace shardtrain::testutil

#endif  // SHARDTRAIN_COMMON_TESTING_MLP_TENSORS_H_
