#include "python/src/buffers.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace shardtrain::python {
namespace py = pybind11;

namespace {

// float32 in native (little-endian) order: numpy's 'f', memoryview's 'f',
// and the explicit '<f', '=f', '@f'.
bool IsFloat32(const Py_buffer& view) {
  if (view.itemsize != 4 || view.format == nullptr) return false;
  const char* format = view.format;
  if (*format == '<' || *format == '=' || *format == '@') ++format;
  return std::strcmp(format, "f") == 0;
}

std::string TypeName(py::handle object) {
  return py::str(py::type::handle_of(object).attr("__qualname__"));
}

// A torch tensor (or anything else with .numpy()) as its numpy view: zero
// copy for a CPU tensor; torch raises for one on a GPU or needing grad
// (detach() removes that).
py::object NumpyView(py::handle object, const std::string& what) {
  py::object source = py::reinterpret_borrow<py::object>(object);
  try {
    if (py::hasattr(source, "detach")) source = source.attr("detach")();
    return source.attr("numpy")();
  } catch (py::error_already_set& error) {
    throw py::type_error(absl::StrCat(what, ": a ", TypeName(object),
                                      " that gives no float32 CPU buffer (",
                                      std::string(py::str(error.value())), ")"));
  }
}

}  // namespace

FloatBuffer FloatBuffer::Get(py::handle object, const std::string& what, int64_t elements,
                             bool writable) {
  FloatBuffer buffer;
  py::handle exporter = object;
  if (!PyObject_CheckBuffer(object.ptr()) && py::hasattr(object, "numpy")) {
    buffer.owner_ = NumpyView(object, what);
    exporter = buffer.owner_;
  }
  if (!PyObject_CheckBuffer(exporter.ptr())) {
    throw py::type_error(absl::StrCat(what, " must be a float32 buffer (a numpy array, "
                                            "memoryview or torch CPU tensor), not ",
                                      TypeName(object)));
  }
  // Strides and format are asked for so the checks below, not the
  // exporter, say what is wrong.
  if (PyObject_GetBuffer(exporter.ptr(), &buffer.view_, PyBUF_RECORDS_RO) != 0) {
    throw py::error_already_set();
  }
  buffer.held_ = true;
  const Py_buffer& view = buffer.view_;
  if (!IsFloat32(view)) {
    throw py::type_error(absl::StrCat(what, " must hold float32 values, not format '",
                                      view.format == nullptr ? "B" : view.format,
                                      "' with ", view.itemsize, "-byte items"));
  }
  if (!PyBuffer_IsContiguous(&view, 'C')) {
    throw py::value_error(absl::StrCat(
        what, " is not C-contiguous (a strided view or a transpose); pass a contiguous "
              "copy, e.g. numpy.ascontiguousarray(x) or tensor.contiguous()"));
  }
  if (writable && view.readonly) {
    throw py::value_error(
        absl::StrCat(what, " is read-only; parameters are pulled into it, so it must be "
                           "writable"));
  }
  buffer.size_ = static_cast<int64_t>(view.len / 4);
  if (elements >= 0 && buffer.size_ != elements) {
    throw py::value_error(absl::StrCat(what, " has ", buffer.size_, " elements; the tensor has ",
                                       elements));
  }
  buffer.data_ = static_cast<float*>(view.buf);
  return buffer;
}

FloatBuffer::FloatBuffer(FloatBuffer&& other) noexcept { *this = std::move(other); }

FloatBuffer& FloatBuffer::operator=(FloatBuffer&& other) noexcept {
  if (this == &other) return *this;
  Release();
  view_ = other.view_;
  held_ = std::exchange(other.held_, false);
  owner_ = std::move(other.owner_);
  data_ = std::exchange(other.data_, nullptr);
  size_ = std::exchange(other.size_, 0);
  return *this;
}

FloatBuffer::~FloatBuffer() { Release(); }

void FloatBuffer::Release() {
  if (held_) {
    PyBuffer_Release(&view_);
    held_ = false;
  }
  owner_ = py::object();
  data_ = nullptr;
  size_ = 0;
}

}  // namespace shardtrain::python
