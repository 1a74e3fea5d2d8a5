#include "worker/model/model_factory.h"

#include <memory>
#include <string>

#include "gtest/gtest.h"

namespace shardtrain::worker {
namespace {

ModelOptions Options(const std::string& device) {
  ModelOptions options;
  options.spec = ModelSpec::Parse("mlp:6-5-4-3").value();
  options.device = device;
  return options;
}

TEST(ModelFactoryTest, CpuMlpAndPipelineHaveTheSameParameters) {
  auto mlp_factory = MakeModelFactory(Options("cpu"));
  ASSERT_TRUE(mlp_factory.ok()) << mlp_factory.status();
  ModelOptions pipelined = Options("cpu");
  pipelined.pipeline_stages = 3;
  pipelined.microbatches = 2;
  pipelined.schedule = "gpipe";
  auto pipeline_factory = MakeModelFactory(pipelined);
  ASSERT_TRUE(pipeline_factory.ok()) << pipeline_factory.status();
  auto mlp = (*mlp_factory)(4);
  auto pipeline = (*pipeline_factory)(4);
  ASSERT_TRUE(mlp.ok() && pipeline.ok());
  ASSERT_EQ((*mlp)->params().size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ((*pipeline)->params()[i].name, (*mlp)->params()[i].name);
  }
}

TEST(ModelFactoryTest, RejectsWhatTheDeviceCannotDo) {
  ModelOptions options = Options("cpu");
  options.gemm_precision = "tf32";
  EXPECT_EQ(MakeModelFactory(options).status().code(), absl::StatusCode::kInvalidArgument);
  options.gemm_precision = "fp16";
  EXPECT_EQ(MakeModelFactory(options).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeModelFactory(Options("tpu")).status().code(),
            absl::StatusCode::kInvalidArgument);
  ModelOptions bad_schedule = Options("cpu");
  bad_schedule.pipeline_stages = 2;
  bad_schedule.schedule = "zigzag";
  EXPECT_EQ(MakeModelFactory(bad_schedule).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Without a GPU (or without CUDA in the build) --device=cuda must fail at
// once, saying which of the two is missing.
TEST(ModelFactoryTest, CudaWithoutADeviceSaysWhy) {
  ModelOptions options = Options("cuda");
  options.gemm_precision = "bf16";
  absl::StatusOr<std::unique_ptr<Backend>> backend = MakeBackend(options);
  if (backend.ok()) GTEST_SKIP() << "this machine has a CUDA device";
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string message(backend.status().message());
  EXPECT_TRUE(message.find("no CUDA device") != std::string::npos ||
              message.find("no CUDA support") != std::string::npos)
      << message;
}

}  // namespace
}  // namespace shardtrain::worker
