#include "server/lr_schedule.h"

#include <algorithm>
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

  LrScheduleOptions noam;
  noam.kind = "noam";
  expect_invalid(noam);  // no warmup
  noam.warmup_steps = 4;
  EXPECT_TRUE(ValidateLrSchedule(noam).ok());
  noam.updates_per_step = 0;
  expect_invalid(noam);
}

// Noam: linear warmup to the peak at step warmup - 1, then
// base * sqrt(warmup / (step + 1)), i.e. the Transformer paper's
// d^-0.5 * min(t^-0.5, t * warmup^-1.5) with t = step + 1, scaled so that the
// peak is the base rate.
TEST(LrScheduleTest, NoamWarmsUpThenDecaysAsInverseSquareRoot) {
  LrScheduleOptions options;
  options.kind = "noam";
  options.warmup_steps = 100;
  for (int64_t step : {0, 1, 49, 98, 99, 100, 399, 9999}) {
    const double t = static_cast<double>(step + 1);
    const double paper = std::pow(128.0, -0.5) * std::min(std::pow(t, -0.5), t * std::pow(100.0, -1.5));
    const double peak = std::pow(128.0, -0.5) * std::pow(100.0, -0.5);
    EXPECT_NEAR(ScheduledLearningRate(options, 0.5f, step), 0.5 * paper / peak, 1e-6)
        << "step " << step;
  }
  EXPECT_FLOAT_EQ(ScheduledLearningRate(options, 0.5f, 99), 0.5f);
  EXPECT_FLOAT_EQ(ScheduledLearningRate(options, 0.5f, 399), 0.25f);
}

// updates_per_step: N updates (an async shard's pushes from N workers) make
// one schedule step, for every kind.
TEST(LrScheduleTest, UpdatesPerStepDividesTheUpdateIndex) {
  LrScheduleOptions options;
  options.kind = "noam";
  options.warmup_steps = 10;
  LrScheduleOptions per_four = options;
  per_four.updates_per_step = 4;
  for (int64_t step : {0, 3, 9, 40, 57, 1000}) {
    for (int64_t push = 4 * step; push < 4 * step + 4; ++push) {
      EXPECT_FLOAT_EQ(ScheduledLearningRate(per_four, 1.0f, push),
                      ScheduledLearningRate(options, 1.0f, step))
          << "push " << push;
    }
  }
}

}  // namespace
}  // namespace shardtrain::server
