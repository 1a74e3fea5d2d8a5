// End to end on a GPU: a local cluster whose workers run --device=cuda
// trains Fashion-MNIST to the accuracy the same job reaches on the CPU, with
// whole-model workers and with workers split into pipeline stages over NCCL.
// Sync mode with fixed seeds makes the two jobs the same computation up to
// float rounding. Skips itself on a machine without a CUDA device.
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "testing/local_cluster.h"
#include "testing/process_group.h"
#include "worker/device/cuda/cuda_test_util.h"

namespace shardtrain {
namespace {

// Final test accuracy of a 2-shard, 2-worker sync job on `device`.
absl::StatusOr<double> Train(const std::string& device, std::vector<std::string> extra) {
  testutil::ProcessGroup group;
  testutil::LocalClusterOptions options;
  options.bin_dir = SHARDTRAIN_BIN_DIR;
  options.mode = "sync";
  options.server_flags = {"--optimizer=adam", "--lr=0.001"};
  options.worker_flags = {"--device=" + device, "--epochs=2", "--batch=64",
                          "--max_test_examples=10000", "--linger_s=60"};
  options.worker_flags.insert(options.worker_flags.end(), extra.begin(), extra.end());
  absl::StatusOr<testutil::LocalCluster> cluster = testutil::StartLocalCluster(group, options);
  if (!cluster.ok()) return cluster.status();
  absl::StatusOr<double> accuracy = testutil::WaitForFinalAccuracy(group, *cluster, absl::Minutes(8));
  group.StopAll();
  if (accuracy.ok()) std::filesystem::remove_all(cluster->dir);  // logs only of failures
  return accuracy;
}

class GpuCluster : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_CUDA_DEVICE();
    ASSERT_EQ(access(absl::StrCat(testutil::kFashionMnistDir, "/train-images-idx3-ubyte.gz").c_str(),
                     R_OK),
              0)
        << "Fashion-MNIST is not installed (dataset-fashion-mnist)";
  }
};

TEST_F(GpuCluster, TrainsToTheAccuracyOfTheCpu) {
  const absl::StatusOr<double> cpu = Train("cpu", {});
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  const absl::StatusOr<double> gpu = Train("cuda", {});
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  std::cout << "2 epochs, sync, 2 workers: cpu accuracy " << *cpu << ", cuda accuracy " << *gpu
            << std::endl;
  EXPECT_GE(*gpu, 0.82);
  EXPECT_NEAR(*gpu, *cpu, 0.01);
}

TEST_F(GpuCluster, PipelinedWorkersTrainOverNccl) {
  const absl::StatusOr<double> gpu =
      Train("cuda", {"--pipeline_stages=2", "--microbatches=4", "--schedule=1f1b"});
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  std::cout << "2 epochs, sync, 2 workers of 2 stages: cuda accuracy " << *gpu << std::endl;
  EXPECT_GE(*gpu, 0.82);
}

}  // namespace
}  // namespace shardtrain
