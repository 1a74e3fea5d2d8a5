#include "python/src/tensors.h"

#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "python/src/buffers.h"

namespace shardtrain::python {
namespace py = pybind11;

namespace {

// Far above anything a shard accepts (2^32 elements); only guards the
// product against overflow before the shards give their own verdict.
constexpr int64_t kMaxElements = int64_t{1} << 40;

std::vector<int64_t> ParseShape(py::handle shape, const std::string& name,
                                int64_t* elements) {
  if (!py::isinstance<py::sequence>(shape) || py::isinstance<py::str>(shape)) {
    throw py::type_error(
        absl::StrCat("tensor ", name, ": shape must be a tuple of ints, not ",
                     std::string(py::str(py::type::handle_of(shape).attr("__qualname__")))));
  }
  std::vector<int64_t> dims;
  *elements = 1;
  for (py::handle dim : shape) {
    if (!PyLong_Check(dim.ptr())) {
      throw py::type_error(absl::StrCat("tensor ", name, ": shape must hold ints, got ",
                                        std::string(py::repr(dim))));
    }
    const int64_t value = dim.cast<int64_t>();
    if (value <= 0 || value > kMaxElements / *elements) {
      throw py::value_error(absl::StrCat("tensor ", name, ": dimension ", value,
                                         " is not positive or the tensor is too large"));
    }
    dims.push_back(value);
    *elements *= value;
  }
  if (dims.empty()) {
    throw py::value_error(absl::StrCat("tensor ", name,
                                       ": shape is empty; a scalar is shape (1,)"));
  }
  return dims;
}

}  // namespace

Initializer::Kind ParseInitKind(const std::string& kind) {
  if (kind == "zeros") return Initializer::KIND_ZEROS;
  if (kind == "constant") return Initializer::KIND_CONSTANT;
  if (kind == "uniform") return Initializer::KIND_UNIFORM;
  if (kind == "normal") return Initializer::KIND_NORMAL;
  if (kind == "glorot_uniform") return Initializer::KIND_GLOROT_UNIFORM;
  if (kind == "he_uniform") return Initializer::KIND_HE_UNIFORM;
  throw py::value_error(absl::StrCat(
      "unknown initializer '", kind,
      "'; use zeros, constant, uniform, normal, glorot_uniform or he_uniform"));
}

std::vector<TensorSpec> TensorSpecsFromPython(py::handle tensors, bool send_values,
                                              std::vector<TensorInfo>* infos) {
  if (!py::isinstance<py::sequence>(tensors) || py::isinstance<py::str>(tensors)) {
    throw py::type_error("register() takes a list of (name, shape, init) tuples");
  }
  std::vector<TensorSpec> specs;
  infos->clear();
  for (py::handle entry : tensors) {
    if (!py::isinstance<py::tuple>(entry) || py::len(entry) != 3) {
      throw py::type_error(absl::StrCat("register() takes (name, shape, init) tuples, got ",
                                        std::string(py::repr(entry))));
    }
    const py::tuple tuple = py::reinterpret_borrow<py::tuple>(entry);
    if (!py::isinstance<py::str>(tuple[0])) {
      throw py::type_error(absl::StrCat("tensor names are strings, got ",
                                        std::string(py::repr(tuple[0]))));
    }
    TensorSpec spec;
    spec.set_name(tuple[0].cast<std::string>());
    int64_t elements = 0;
    for (int64_t dim : ParseShape(tuple[1], spec.name(), &elements)) spec.add_shape(dim);
    spec.set_dtype(DTYPE_F32);
    Initializer* init = spec.mutable_init();
    const py::handle how = tuple[2];
    if (py::isinstance<Init>(how)) {
      const Init& given = how.cast<const Init&>();
      init->set_kind(ParseInitKind(given.kind));
      init->set_scale(static_cast<float>(given.scale));
      init->set_seed(given.seed);
    } else {
      FloatBuffer values = FloatBuffer::Get(
          how, absl::StrCat("initial values of ", spec.name()), elements, /*writable=*/false);
      init->set_kind(Initializer::KIND_VALUES);
      if (send_values) {
        spec.set_values(reinterpret_cast<const char*>(values.data()),
                        static_cast<size_t>(elements) * sizeof(float));
      }
    }
    infos->push_back({spec.name(), elements});
    specs.push_back(std::move(spec));
  }
  return specs;
}

}  // namespace shardtrain::python
