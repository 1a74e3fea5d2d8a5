#include "python/src/errors.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace shardtrain::python {
namespace py = pybind11;

namespace {

// The exception type; created once at import and never freed (the module
// lives as long as the interpreter).
PyObject* error_type = nullptr;

}  // namespace

StatusError::StatusError(absl::Status status)
    : std::runtime_error(absl::StrCat(absl::StatusCodeToString(status.code()), ": ",
                                      status.message())),
      status_(std::move(status)) {}

void ThrowIfError(const absl::Status& status) {
  if (!status.ok()) throw StatusError(status);
}

void RegisterErrors(py::module_& module) {
  py::dict attributes;
  attributes["code"] = py::none();
  attributes["message"] = py::none();
  error_type = PyErr_NewExceptionWithDoc(
      "shardtrain.ShardtrainError",
      "An error from the parameter-server client. `code` is the canonical status "
      "code's name (e.g. \"UNAVAILABLE\", \"UNAUTHENTICATED\", \"INVALID_ARGUMENT\"), "
      "`message` what went wrong; str() shows both.",
      PyExc_RuntimeError, attributes.ptr());
  if (error_type == nullptr) throw py::error_already_set();
  module.add_object("ShardtrainError", py::handle(error_type));
  py::register_exception_translator([](std::exception_ptr thrown) {
    try {
      if (thrown) std::rethrow_exception(thrown);
    } catch (const StatusError& error) {
      py::object instance = py::reinterpret_borrow<py::object>(error_type)(error.what());
      instance.attr("code") = std::string(absl::StatusCodeToString(error.status().code()));
      instance.attr("message") = std::string(error.status().message());
      PyErr_SetObject(error_type, instance.ptr());
    }
  });
}

}  // namespace shardtrain::python
