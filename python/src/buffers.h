// FloatBuffer: a float32 view of a Python object, without a copy.
//
// Takes anything with the buffer protocol (numpy arrays, memoryviews,
// array.array('f')) and torch CPU tensors (through their zero-copy
// .detach().numpy() view). The view must be float32 ('f', native byte
// order), C-contiguous, hold exactly the expected number of elements and,
// for parameters, be writable; otherwise TypeError (not a float32 buffer)
// or ValueError (layout, size, read-only) naming the tensor and the fault.
// The FloatBuffer holds the export (and so a reference to the object) until
// it is destroyed, so the memory stays put while the GIL is released.
//
//   FloatBuffer grad = FloatBuffer::Get(object, "gradient of fc1.weight",
//                                       elements, /*writable=*/false);
//   absl::Span<const float> span = grad.span();
//
// Create and destroy with the GIL held; span() may be used without it.
#ifndef SHARDTRAIN_PYTHON_SRC_BUFFERS_H_
#define SHARDTRAIN_PYTHON_SRC_BUFFERS_H_

#include <cstdint>
#include <string>

#include <pybind11/pybind11.h>

#include "absl/types/span.h"

namespace shardtrain::python {

class FloatBuffer {
 public:
  // `what` names the buffer in errors ("gradient of fc1.weight"). A
  // negative `elements` accepts any count.
  static FloatBuffer Get(pybind11::handle object, const std::string& what,
                         int64_t elements, bool writable);

  FloatBuffer(FloatBuffer&& other) noexcept;
  FloatBuffer& operator=(FloatBuffer&& other) noexcept;
  FloatBuffer(const FloatBuffer&) = delete;
  FloatBuffer& operator=(const FloatBuffer&) = delete;
  ~FloatBuffer();

  int64_t size() const { return size_; }
  float* data() const { return data_; }
  absl::Span<float> span() const { return absl::MakeSpan(data_, size_); }
  absl::Span<const float> const_span() const { return absl::MakeConstSpan(data_, size_); }

 private:
  FloatBuffer() = default;
  void Release();

  Py_buffer view_{};
  bool held_ = false;
  // For a torch tensor, the numpy view that exports the buffer.
  pybind11::object owner_;
  float* data_ = nullptr;
  int64_t size_ = 0;
};

}  // namespace shardtrain::python

#endif  // SHARDTRAIN_PYTHON_SRC_BUFFERS_H_
