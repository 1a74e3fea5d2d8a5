// ModelSpec: the architecture of a model, parsed from a short string.
//
// The only family today is the multi-layer perceptron, written
// "mlp:IN-H1-...-OUT", e.g. "mlp:784-256-128-10": an input of 784 features,
// two hidden layers and 10 classes. Workers and parameter servers agree on
// the model by exchanging this string.
//
// Example:
//   ASSIGN_OR_RETURN(ModelSpec spec, ModelSpec::Parse("mlp:784-256-10"));
//   spec.layer_sizes;  // {784, 256, 10}
//   spec.ToString();   // "mlp:784-256-10"
#ifndef SHARDTRAIN_WORKER_MODEL_MODEL_SPEC_H_
#define SHARDTRAIN_WORKER_MODEL_MODEL_SPEC_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shardtrain::worker {

// A plain value; thread-compatible.
struct ModelSpec {
  // Largest accepted layer width. It keeps every matrix dimension, and
  // batch * width for any sane batch, inside the int that BLAS takes.
  static constexpr int kMaxLayerSize = 1 << 20;

  // Parses "mlp:" followed by two or more '-'-separated decimal sizes, each
  // in [1, kMaxLayerSize]. No whitespace, signs or leading zeros. Returns
  // INVALID_ARGUMENT naming the offending part otherwise.
  static absl::StatusOr<ModelSpec> Parse(absl::string_view text);

  // OK if layer_sizes has at least two entries, each in [1, kMaxLayerSize];
  // INVALID_ARGUMENT otherwise. For specs built by hand rather than parsed.
  absl::Status Validate() const;

  // The canonical string; Parse(spec.ToString()) gives spec back.
  std::string ToString() const;

  // Widths from the input features to the number of classes.
  std::vector<int> layer_sizes;
};

}  // namespace shardtrain::worker

#endif  // SHARDTRAIN_WORKER_MODEL_MODEL_SPEC_H_
