// The tensors a Python client registers: shardtrain.Init (a named
// initialiser the shards compute) or the tensor's own values, turned into
// TensorSpecs for PsClient::Register.
//
//   c.register([("fc.weight", (784, 256), shardtrain.Init("glorot_uniform", seed=1)),
//               ("fc.bias", (256,), numpy.zeros(256, numpy.float32))])
//
// Own values use Initializer KIND_VALUES: only worker 0's are sent (they
// create the parameters on the shards, whoever registers first); the other
// workers' are checked like any buffer and not sent, and their Register
// waits until worker 0's has been applied. Call with the GIL held.
#ifndef SHARDTRAIN_PYTHON_SRC_TENSORS_H_
#define SHARDTRAIN_PYTHON_SRC_TENSORS_H_

#include <cstdint>
#include <string>
#include <vector>

#include <pybind11/pybind11.h>

#include "proto/shardtrain.pb.h"

namespace shardtrain::python {

// shardtrain.Init: one of the shards' initialisers.
struct Init {
  // "zeros", "constant", "uniform", "normal", "glorot_uniform", "he_uniform".
  std::string kind = "zeros";
  // The value for constant, the bound for uniform, the stddev for normal.
  double scale = 0;
  uint64_t seed = 0;
};

// ValueError for an unknown kind.
Initializer::Kind ParseInitKind(const std::string& kind);

// One registered tensor as the Python side checks buffers against it.
struct TensorInfo {
  std::string name;
  int64_t elements = 0;
};

// `tensors`: a sequence of (name, shape, init) with init an Init or a
// float32 buffer of the tensor's values. Values are sent only when
// `send_values` (worker 0). TypeError/ValueError for a malformed entry.
std::vector<TensorSpec> TensorSpecsFromPython(pybind11::handle tensors, bool send_values,
                                              std::vector<TensorInfo>* infos);

}  // namespace shardtrain::python

#endif  // SHARDTRAIN_PYTHON_SRC_TENSORS_H_
