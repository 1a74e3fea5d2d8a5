#include "worker/model/model_factory.h"

#include <memory>
#include <string>

#include "gtest/gtest.h"

namespace shardtrain::worker {
namespace {

ModelOptions Options(DeviceKind device) {
  ModelOptions options;
  options.spec = ModelSpec::Parse("mlp:6-5-4-3").value();
  options.device = device;
  return options;
}

TEST(ModelFactoryTest, CpuMlpAndPipelineHaveTheSameParameters) {
  auto mlp_factory = MakeModelFactory(Options(DeviceKind::kCpu));
  ASSERT_TRUE(mlp_factory.ok()) << mlp_factory.status();
  ModelOptions pipelined = Options(DeviceKind::kCpu);
  pipelined.pipeline_stages = 3;
  pipelined.microbatches = 2;
  pipelined.schedule = pipeline::ScheduleKind::kGPipe;
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
  ModelOptions options = Options(DeviceKind::kCpu);
  for (GemmPrecision reduced : {GemmPrecision::kTf32, GemmPrecision::kBf16}) {
    options.gemm_precision = reduced;
    const absl::Status status = MakeModelFactory(options).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(status.message().find(GemmPrecisionName(reduced)),
              absl::string_view::npos)
        << status;
  }
}

TEST(ModelFactoryTest, RejectsStagesThatDoNotFitTheModel) {
  ModelOptions options = Options(DeviceKind::kCpu);
  options.pipeline_stages = 4;  // mlp:6-5-4-3 has 3 Linear layers
  options.microbatches = 2;
  EXPECT_EQ(MakeModelFactory(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.pipeline_stages = 3;
  options.microbatches = 0;
  EXPECT_EQ(MakeModelFactory(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.microbatches = 2;
  EXPECT_TRUE(MakeModelFactory(options).ok());
}

// Without a GPU (or without CUDA in the build) --device=cuda must fail at
// once, saying which of the two is missing.
TEST(ModelFactoryTest, CudaWithoutADeviceSaysWhy) {
  ModelOptions options = Options(DeviceKind::kCuda);
  options.gemm_precision = GemmPrecision::kBf16;
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
