#include "server/lr_schedule.h"

#include <cmath>

#include "gtest/gtest.h"

namespace shardtrain::server {
namespace {

constexpr double kPi = 3.14159265358979323846;

TEST(LrScheduleTest, ConstantIsBaseRate) {
  LrScheduleOptions options;
  ASSERT_TRUE(ValidateLrSchedule(options).ok());
  EXPECT_FLOAT_EQ(ScheduledLearningRate(options, 0.5f, 0), 0.5f);
  EXPECT_FLOAT_EQ(ScheduledLearningRate(options, 0.5f, 123456), 0.5f);
}

TEST(LrScheduleTest, LinearWarmup) {
  LrScheduleOptions options;
  options.warmup_steps = 4;
  ASSERT_TRUE(ValidateLrSchedule(options).ok());
  EXPECT_FLOAT_EQ(ScheduledLearningRate(options, 1.0f, 0), 0.25f);
  EXPECT_FLOAT_EQ(ScheduledLearningRate(options, 1.0f, 1), 0.5f);
  EXPECT_FLOAT_EQ(ScheduledLearningRate(options, 1.0f, 2), 0.75f);
  EXPECT_FLOAT_EQ(ScheduledLearningRate(options, 1.0f, 3), 1.0f);
  EXPECT_FLOAT_EQ(ScheduledLearningRate(options, 1.0f, 4), 1.0f);
  EXPECT_FLOAT_EQ(ScheduledLearningRate(options, 1.0f, 100), 1.0f);
}

TEST(LrScheduleTest, NegativeStepIsTreatedAsZero) {
  LrScheduleOptions options;
  options.warmup_steps = 4;
  EXPECT_FLOAT_EQ(ScheduledLearningRate(options, 1.0f, -3), 0.25f);
}

TEST(LrScheduleTest, StepDecayBoundaries) {
  LrScheduleOptions options;
  options.kind = "step";
  options.step_size = 10;
  options.gamma = 0.5f;
  ASSERT_TRUE(ValidateLrSchedule(options).ok());
  EXPECT_FLOAT_EQ(ScheduledLearningRate(options, 0.8f, 0), 0.8f);
  EXPECT_FLOAT_EQ(ScheduledLearningRate(options, 0.8f, 9), 0.8f);
  EXPECT_FLOAT_EQ(ScheduledLearningRate(options, 0.8f, 10), 0.4f);
  EXPECT_FLOAT_EQ(ScheduledLearningRate(options, 0.8f, 19), 0.4f);
  EXPECT_FLOAT_EQ(ScheduledLearningRate(options, 0.8f, 20), 0.2f);
  EXPECT_FLOAT_EQ(ScheduledLearningRate(options, 0.8f, 35), 0.1f);
}

TEST(LrScheduleTest, StepDecayCountsFromEndOfWarmup) {
  LrScheduleOptions options;
  options.kind = "step";
  options.warmup_steps = 5;
  options.step_size = 10;
  options.gamma = 0.1f;
  ASSERT_TRUE(ValidateLrSchedule(options).ok());
  EXPECT_FLOAT_EQ(ScheduledLearningRate(options, 1.0f, 0), 0.2f);
  EXPECT_FLOAT_EQ(ScheduledLearningRate(options, 1.0f, 4), 1.0f);
  EXPECT_FLOAT_EQ(ScheduledLearningRate(options, 1.0f, 14), 1.0f);
  EXPECT_FLOAT_EQ(ScheduledLearningRate(options, 1.0f, 15), 0.1f);
  EXPECT_FLOAT_EQ(ScheduledLearningRate(options, 1.0f, 25), 0.01f);
}

TEST(LrScheduleTest, CosineEndpointsAndMidpoint) {
  LrScheduleOptions options;
  options.kind = "cosine";
  options.total_steps = 100;
  options.min_lr = 0.1f;
  ASSERT_TRUE(ValidateLrSchedule(options).ok());
  EXPECT_FLOAT_EQ(ScheduledLearningRate(options, 1.0f, 0), 1.0f);
  EXPECT_FLOAT_EQ(ScheduledLearningRate(options, 1.0f, 50), 0.55f);
  const double quarter = 0.1 + 0.9 * 0.5 * (1.0 + std::cos(kPi * 0.25));
  EXPECT_FLOAT_EQ(ScheduledLearningRate(options, 1.0f, 25),
                  static_cast<float>(quarter));
  EXPECT_FLOAT_EQ(ScheduledLearningRate(options, 1.0f, 100), 0.1f);
  EXPECT_FLOAT_EQ(ScheduledLearningRate(options, 1.0f, 1000), 0.1f);
  // Just before the end it is barely above the floor.
  EXPECT_GT(ScheduledLearningRate(options, 1.0f, 99), 0.1f);
  EXPECT_LT(ScheduledLearningRate(options, 1.0f, 99), 0.1005f);
}

TEST(LrScheduleTest, CosineAfterWarmup) {
  LrScheduleOptions options;
  options.kind = "cosine";
  options.warmup_steps = 10;
  options.total_steps = 110;
  ASSERT_TRUE(ValidateLrSchedule(options).ok());
  EXPECT_FLOAT_EQ(ScheduledLearningRate(options, 2.0f, 0), 0.2f);
  EXPECT_FLOAT_EQ(ScheduledLearningRate(options, 2.0f, 9), 2.0f);
  EXPECT_FLOAT_EQ(ScheduledLearningRate(options, 2.0f, 10), 2.0f);
  EXPECT_FLOAT_EQ(ScheduledLearningRate(options, 2.0f, 60), 1.0f);
  EXPECT_FLOAT_EQ(ScheduledLearningRate(options, 2.0f, 110), 0.0f);
}

TEST(LrScheduleTest, RejectsBadOptions) {
  auto expect_invalid = [](const LrScheduleOptions& options) {
    EXPECT_EQ(ValidateLrSchedule(options).code(),
              absl::StatusCode::kInvalidArgument)
        << "kind=" << options.kind;
  };
  LrScheduleOptions unknown;
  unknown.kind = "linear";
  expect_invalid(unknown);

  LrScheduleOptions warmup;
  warmup.warmup_steps = -1;
  expect_invalid(warmup);

  LrScheduleOptions step;
  step.kind = "step";
  step.step_size = 0;
  expect_invalid(step);
  step.step_size = 10;
  step.gamma = 0.0f;
  expect_invalid(step);
  step.gamma = 1.5f;
  expect_invalid(step);
  step.gamma = NAN;
  expect_invalid(step);

  LrScheduleOptions cosine;
  cosine.kind = "cosine";
  cosine.total_steps = 0;
  expect_invalid(cosine);
  cosine.total_steps = 10;
  cosine.warmup_steps = 10;
  expect_invalid(cosine);
  cosine.warmup_steps = 0;
  cosine.min_lr = -0.1f;
  expect_invalid(cosine);
  cosine.min_lr = 0.0f;
  EXPECT_TRUE(ValidateLrSchedule(cosine).ok());
}

}  // namespace
}  // namespace shardtrain::server
