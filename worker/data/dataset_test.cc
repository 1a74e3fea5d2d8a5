#include "worker/data/dataset.h"

#include <sys/stat.h>
#include <zlib.h>

#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/data/idx_test_util.h"

namespace shardtrain::worker {
namespace {



// A 3-example, 2x2-pixel dataset in Fashion-MNIST file layout under a fresh
// directory; returns the directory.
std::string WriteTinyFashionMnist(const std::string& name,
                                  const std::string& labels) {
  const std::string dir = ::testing::TempDir() + "/dataset_test_" + name;
  mkdir(dir.c_str(), 0755);
  std::string images = IdxHeader({3, 2, 2});
  const unsigned char pixels[] = {0, 255, 51,  102, 0,   0,
                                  0, 0,   255, 255, 255, 255};
  images.append(reinterpret_cast<const char*>(pixels), sizeof(pixels));
  WriteGzipFile(dir + "/t10k-images-idx3-ubyte.gz", images);
  WriteGzipFile(dir + "/t10k-labels-idx1-ubyte.gz",
            IdxHeader({static_cast<uint32_t>(labels.size())}) + labels);
  return dir;
}

float Standardised(int byte) {
  return (byte / 255.0f - kFashionMnistMean) / kFashionMnistStd;
}

TEST(DatasetTest, LoadsAndStandardisesSyntheticFiles) {
  const std::string dir = WriteTinyFashionMnist("ok", std::string{4, 0, 9});
  auto data = LoadFashionMnist(dir, /*train=*/false);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->num_examples, 3);
  EXPECT_EQ(data->feature_dim, 4);
  EXPECT_EQ(data->labels, (std::vector<int32_t>{4, 0, 9}));
  ASSERT_EQ(data->features.size(), 12u);
  const int pixels[] = {0, 255, 51, 102, 0, 0, 0, 0, 255, 255, 255, 255};
  for (int i = 0; i < 12; ++i) {
    EXPECT_NEAR(data->features[i], Standardised(pixels[i]), 1e-5) << i;
  }
}

TEST(DatasetTest, MaxExamplesLoadsAPrefix) {
  const std::string dir = WriteTinyFashionMnist("prefix", std::string{4, 0, 9});
  auto data = LoadFashionMnist(dir, false, /*max_examples=*/2);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->num_examples, 2);
  EXPECT_EQ(data->features.size(), 8u);
  EXPECT_EQ(data->labels, (std::vector<int32_t>{4, 0}));
  auto all = LoadFashionMnist(dir, false, /*max_examples=*/100);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->num_examples, 3);
}

TEST(DatasetTest, RejectsInconsistentFiles) {
  const std::string mismatch =
      WriteTinyFashionMnist("mismatch", std::string{4, 0});
  EXPECT_EQ(LoadFashionMnist(mismatch, false).status().code(),
            absl::StatusCode::kDataLoss);
  const std::string bad_label =
      WriteTinyFashionMnist("bad_label", std::string{4, 10, 0});
  EXPECT_EQ(LoadFashionMnist(bad_label, false).status().code(),
            absl::StatusCode::kDataLoss);
  // Training files were never written there.
  EXPECT_EQ(LoadFashionMnist(mismatch, true).status().code(),
            absl::StatusCode::kNotFound);
  const std::string dir = WriteTinyFashionMnist("args", std::string{4, 0, 9});
  EXPECT_EQ(LoadIdxDataset(dir + "/t10k-images-idx3-ubyte.gz",
                           dir + "/t10k-labels-idx1-ubyte.gz", 10, 0.5f, 0.0f)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  // Labels in the images' place: one dimension is not an image.
  EXPECT_EQ(LoadIdxDataset(dir + "/t10k-labels-idx1-ubyte.gz",
                           dir + "/t10k-labels-idx1-ubyte.gz", 10, 0.5f, 1.0f)
                .status()
                .code(),
            absl::StatusCode::kDataLoss);
}

TEST(DatasetTest, LoadsRealFashionMnistTestSet) {
  struct stat st;
  if (stat(kDefaultFashionMnistDir, &st) != 0) {
    GTEST_SKIP() << kDefaultFashionMnistDir << " not installed";
  }
  auto data = LoadFashionMnist(kDefaultFashionMnistDir, /*train=*/false);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->num_examples, 10000);
  EXPECT_EQ(data->feature_dim, 784);
  ASSERT_EQ(data->features.size(), 10000u * 784);
  ASSERT_EQ(data->labels.size(), 10000u);
  std::vector<int> counts(10);
  for (int32_t label : data->labels) {
    ASSERT_GE(label, 0);
    ASSERT_LT(label, 10);
    ++counts[label];
  }
  for (int c : counts) EXPECT_EQ(c, 1000);  // The test set is balanced.
  // Standardisation with training-set statistics leaves the test set close
  // to zero mean and unit variance.
  double sum = 0.0, sum_sq = 0.0;
  for (float v : data->features) {
    sum += v;
    sum_sq += double{v} * v;
  }
  const double mean = sum / data->features.size();
  const double var = sum_sq / data->features.size() - mean * mean;
  EXPECT_NEAR(mean, 0.0, 0.02);
  EXPECT_NEAR(std::sqrt(var), 1.0, 0.02);
}

}  // namespace
}  // namespace shardtrain::worker
