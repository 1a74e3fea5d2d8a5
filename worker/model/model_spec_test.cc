#include "worker/model/model_spec.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardtrain::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ModelSpecTest, ParsesMlp) {
  auto spec = ModelSpec::Parse("mlp:784-256-128-10");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_THAT(spec->layer_sizes, ElementsAre(784, 256, 128, 10));
  EXPECT_EQ(spec->ToString(), "mlp:784-256-128-10");
}

TEST(ModelSpecTest, ParsesMinimalDepthAndSizeOne) {
  auto spec = ModelSpec::Parse("mlp:1-1");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_THAT(spec->layer_sizes, ElementsAre(1, 1));
}

TEST(ModelSpecTest, RoundTrips) {
  for (const char* text : {"mlp:3-2", "mlp:7-5-4-3", "mlp:1048576-1"}) {
    auto spec = ModelSpec::Parse(text);
    ASSERT_TRUE(spec.ok()) << text << ": " << spec.status();
    EXPECT_EQ(spec->ToString(), text);
    EXPECT_TRUE(spec->Validate().ok());
  }
}

TEST(ModelSpecTest, RejectsBadStrings) {
  struct Case {
    const char* text;
    const char* message;
  };
  const Case cases[] = {
      {"", "must start with \"mlp:\""},
      {"784-10", "must start with \"mlp:\""},
      {"MLP:784-10", "must start with \"mlp:\""},
      {"cnn:784-10", "must start with \"mlp:\""},
      {"mlp:", "empty layer size"},
      {"mlp:784", "at least an input and an output"},
      {"mlp:784--10", "empty layer size"},
      {"mlp:784-10-", "empty layer size"},
      {"mlp:-784-10", "empty layer size"},
      {"mlp:784-0", "must be at least 1"},
      {"mlp:784-010", "leading zero"},
      {"mlp:784-+10", "not a decimal number"},
      {"mlp:784- 10", "not a decimal number"},
      {"mlp:784-10 ", "not a decimal number"},
      {"mlp:784-1x", "not a decimal number"},
      {"mlp:784-1.5", "not a decimal number"},
      {"mlp:784-1048577", "exceeds"},
      {"mlp:784-99999999999999999999", "exceeds"},
  };
  for (const Case& c : cases) {
    auto spec = ModelSpec::Parse(c.text);
    ASSERT_FALSE(spec.ok()) << "accepted \"" << c.text << "\"";
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(spec.status().message(), HasSubstr(c.message)) << c.text;
  }
}

TEST(ModelSpecTest, ValidateChecksHandBuiltSpecs) {
  EXPECT_EQ((ModelSpec{{10}}).Validate().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((ModelSpec{{10, 0}}).Validate().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((ModelSpec{{-3, 4}}).Validate().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((ModelSpec{{10, 4}}).Validate().ok());
}

}  // namespace
}  // namespace shardtrain::worker
