#include "worker/data/dataset.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/data/idx_reader.h"

namespace shardtrain::worker {

absl::StatusOr<Dataset> LoadIdxDataset(const std::string& images_path,
                                       const std::string& labels_path,
                                       int num_classes, float mean, float std,
                                       int max_examples) {
  if (!(std > 0.0f) || num_classes < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "LoadIdxDataset: need std > 0 and num_classes >= 1, got std=", std,
        " num_classes=", num_classes));
  }
  ASSIGN_OR_RETURN(IdxArray images, ReadIdx(images_path));
  ASSIGN_OR_RETURN(IdxArray labels, ReadIdx(labels_path));
  if (images.dims.size() < 2) {
    return absl::DataLossError(absl::StrCat(
        images_path, ": images need at least 2 dimensions, file has ",
        images.dims.size()));
  }
  if (labels.dims.size() != 1) {
    return absl::DataLossError(
        absl::StrCat(labels_path, ": labels need 1 dimension, file has ",
                     labels.dims.size()));
  }
  if (images.dims[0] != labels.dims[0]) {
    return absl::DataLossError(
        absl::StrCat(images_path, " has ", images.dims[0], " images but ",
                     labels_path, " has ", labels.dims[0], " labels"));
  }
  int64_t feature_dim = 1;
  for (size_t i = 1; i < images.dims.size(); ++i) feature_dim *= images.dims[i];
  if (feature_dim > std::numeric_limits<int>::max()) {
    return absl::DataLossError(
        absl::StrCat(images_path, ": ", feature_dim, " features per example"));
  }

  Dataset dataset;
  dataset.num_examples = max_examples < 0
                             ? images.dims[0]
                             : std::min(images.dims[0], max_examples);
  dataset.feature_dim = static_cast<int>(feature_dim);
  const int64_t n = dataset.num_examples;
  dataset.labels.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    if (labels.data[i] >= num_classes) {
      return absl::DataLossError(
          absl::StrCat(labels_path, ": label ", int{labels.data[i]},
                       " of example ", i, " is not below ", num_classes));
    }
    dataset.labels[i] = labels.data[i];
  }
  // One multiply-add per byte: (b/255 - mean)/std = b*scale + offset.
  const float scale = 1.0f / (255.0f * std);
  const float offset = -mean / std;
  dataset.features.resize(n * feature_dim);
  for (int64_t i = 0; i < n * feature_dim; ++i) {
    dataset.features[i] = images.data[i] * scale + offset;
  }
  return dataset;
}

absl::StatusOr<Dataset> LoadFashionMnist(const std::string& dir, bool train,
                                         int max_examples) {
  const std::string prefix = absl::StrCat(dir, "/", train ? "train" : "t10k");
  return LoadIdxDataset(absl::StrCat(prefix, "-images-idx3-ubyte.gz"),
                        absl::StrCat(prefix, "-labels-idx1-ubyte.gz"),
                        kFashionMnistClasses, kFashionMnistMean,
                        kFashionMnistStd, max_examples);
}

}  // namespace shardtrain::worker
