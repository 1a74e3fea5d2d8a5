// Errors of the Python extension: absl::Status becomes
// shardtrain.ShardtrainError (a RuntimeError) with .code, the canonical code
// name ("UNAVAILABLE", "INVALID_ARGUMENT", ...), and .message.
//
//   absl::Status status = client->Push(...);
//   ThrowIfError(status);  // raises ShardtrainError in Python
#ifndef SHARDTRAIN_PYTHON_SRC_ERRORS_H_
#define SHARDTRAIN_PYTHON_SRC_ERRORS_H_

#include <stdexcept>
#include <string>

#include <pybind11/pybind11.h>

#include "absl/status/status.h"

namespace shardtrain::python {

// A non-OK status on its way to Python; translated by the translator that
// RegisterErrors installs.
class StatusError : public std::runtime_error {
 public:
  explicit StatusError(absl::Status status);
  const absl::Status& status() const { return status_; }

 private:
  absl::Status status_;
};

// Throws StatusError unless `status` is OK.
void ThrowIfError(const absl::Status& status);

// Adds ShardtrainError to `module` and translates StatusError into it.
void RegisterErrors(pybind11::module_& module);

}  // namespace shardtrain::python

#endif  // SHARDTRAIN_PYTHON_SRC_ERRORS_H_
