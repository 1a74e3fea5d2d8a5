// Dataset, LoadIdxDataset, LoadFashionMnist: labelled examples held in host
// memory, ready to be copied into training batches.
//
// Features are float, one row of feature_dim values per example, scaled from
// bytes to [0, 1] and then standardised with a fixed mean and standard
// deviation (fixed rather than computed, so every worker and every shard of
// the data sees identical inputs).
//
// Example:
//   ASSIGN_OR_RETURN(Dataset test, LoadFashionMnist(
//       "/usr/share/datasets/fashion-mnist", /*train=*/false));
//   test.num_examples;  // 10000
//   test.feature_dim;   // 784
#ifndef SHARDTRAIN_WORKER_DATA_DATASET_H_
#define SHARDTRAIN_WORKER_DATA_DATASET_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/huge_page_allocator.h"

namespace shardtrain::worker {

// Where the Debian package dataset-fashion-mnist installs the files.
inline constexpr char kDefaultFashionMnistDir[] =
    "/usr/share/datasets/fashion-mnist";
// Pixel statistics of the Fashion-MNIST training set, after scaling to [0,1].
inline constexpr float kFashionMnistMean = 0.2860f;
inline constexpr float kFashionMnistStd = 0.3530f;
inline constexpr int kFashionMnistClasses = 10;

// A plain value; thread-compatible.
struct Dataset {
  int num_examples = 0;
  int feature_dim = 0;
  // num_examples * feature_dim, row-major, in huge pages when large (a
  // worker's start writes all of it once).
  std::vector<float, HugePageAllocator<float>> features;
  std::vector<int32_t> labels;  // num_examples, each in [0, num_classes).
};

// Reads images (IDX, uint8, >= 2 dims: n x feature dims) and labels (IDX,
// uint8, 1 dim: n) and returns the first min(n, max_examples) examples, or
// all of them if max_examples < 0. Each feature becomes (byte/255 - mean)/std.
// Errors: those of ReadIdx; DATA_LOSS if the shapes disagree or a label is
// >= num_classes; INVALID_ARGUMENT if std <= 0 or num_classes < 1.
absl::StatusOr<Dataset> LoadIdxDataset(const std::string& images_path,
                                       const std::string& labels_path,
                                       int num_classes, float mean, float std,
                                       int max_examples = -1);

// Loads {train,t10k}-{images-idx3,labels-idx1}-ubyte.gz from dir with the
// Fashion-MNIST statistics above; see LoadIdxDataset for max_examples and
// errors.
absl::StatusOr<Dataset> LoadFashionMnist(const std::string& dir, bool train,
                                         int max_examples = -1);

}  // namespace shardtrain::worker

#endif  // SHARDTRAIN_WORKER_DATA_DATASET_H_
