#include "common/initializer.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace shardtrain::common {
namespace {

TensorSpec Spec(Initializer::Kind kind, float scale = 0.0f) {
  TensorSpec spec;
  spec.set_name("w");
  spec.add_shape(300);
  spec.add_shape(200);
  spec.set_dtype(DTYPE_F32);
  spec.mutable_init()->set_kind(kind);
  spec.mutable_init()->set_scale(scale);
  spec.mutable_init()->set_seed(7);
  return spec;
}

TEST(InitializerTest, PiecesEqualTheWhole) {
  const TensorSpec spec = Spec(Initializer::KIND_GLOROT_UNIFORM);
  std::vector<float> whole(60000), pieces(60000);
  FillInitialValues(spec, 0, absl::MakeSpan(whole));
  FillInitialValues(spec, 0, absl::MakeSpan(pieces).subspan(0, 12345));
  FillInitialValues(spec, 12345, absl::MakeSpan(pieces).subspan(12345));
  EXPECT_EQ(whole, pieces);
}

TEST(InitializerTest, GlorotBoundAndMoments) {
  const TensorSpec spec = Spec(Initializer::KIND_GLOROT_UNIFORM);
  std::vector<float> values(60000);
  FillInitialValues(spec, 0, absl::MakeSpan(values));
  const double bound = std::sqrt(6.0 / 500.0);
  double sum = 0, sum_sq = 0;
  for (float v : values) {
    EXPECT_LE(std::abs(v), bound);
    sum += v;
    sum_sq += v * v;
  }
  EXPECT_NEAR(sum / values.size(), 0.0, 0.01 * bound);
  EXPECT_NEAR(sum_sq / values.size(), bound * bound / 3.0, 0.02 * bound * bound);
}

TEST(InitializerTest, NormalHasTheRequestedStddev) {
  const TensorSpec spec = Spec(Initializer::KIND_NORMAL, 0.5f);
  std::vector<float> values(60000);
  FillInitialValues(spec, 0, absl::MakeSpan(values));
  double sum_sq = 0;
  for (float v : values) sum_sq += v * v;
  EXPECT_NEAR(std::sqrt(sum_sq / values.size()), 0.5, 0.01);
}

TEST(InitializerTest, SeedAndNameChangeTheValues) {
  TensorSpec a = Spec(Initializer::KIND_UNIFORM, 1.0f);
  TensorSpec b = a;
  b.mutable_init()->set_seed(8);
  TensorSpec c = a;
  c.set_name("v");
  std::vector<float> va(10), vb(10), vc(10);
  FillInitialValues(a, 0, absl::MakeSpan(va));
  FillInitialValues(b, 0, absl::MakeSpan(vb));
  FillInitialValues(c, 0, absl::MakeSpan(vc));
  EXPECT_NE(va, vb);
  EXPECT_NE(va, vc);
}

TEST(InitializerTest, ValidationRejectsBadSpecs) {
  TensorSpec spec = Spec(Initializer::KIND_ZEROS);
  EXPECT_TRUE(ValidateTensorSpec(spec).ok());
  EXPECT_EQ(NumElements(spec), 60000);
  TensorSpec no_name = spec;
  no_name.clear_name();
  EXPECT_EQ(ValidateTensorSpec(no_name).code(), absl::StatusCode::kInvalidArgument);
  TensorSpec zero_dim = spec;
  zero_dim.set_shape(1, 0);
  EXPECT_EQ(ValidateTensorSpec(zero_dim).code(), absl::StatusCode::kInvalidArgument);
  TensorSpec huge = spec;
  huge.set_shape(0, int64_t{1} << 40);
  EXPECT_EQ(ValidateTensorSpec(huge).code(), absl::StatusCode::kInvalidArgument);
  TensorSpec f16 = spec;
  f16.set_dtype(DTYPE_F16);
  EXPECT_EQ(ValidateTensorSpec(f16).code(), absl::StatusCode::kInvalidArgument);
  TensorSpec bad_kind = spec;
  bad_kind.mutable_init()->set_kind(static_cast<Initializer::Kind>(99));
  EXPECT_EQ(ValidateTensorSpec(bad_kind).code(), absl::StatusCode::kInvalidArgument);
}

TEST(InitializerTest, ValuesAreCopiedAndValidated) {
  TensorSpec spec = Spec(Initializer::KIND_VALUES);
  spec.set_shape(0, 3);
  spec.set_shape(1, 2);
  const std::vector<float> values = {1.5f, -2.0f, 0.0f, 3.25f, -0.5f, 7.0f};
  spec.set_values(std::string(reinterpret_cast<const char*>(values.data()),
                              values.size() * sizeof(float)));
  ASSERT_TRUE(ValidateTensorSpec(spec).ok());
  std::vector<float> slice(3);
  FillInitialValues(spec, 2, absl::MakeSpan(slice));
  EXPECT_EQ(slice, std::vector<float>(values.begin() + 2, values.begin() + 5));

  // Without values (a restore overwrites them): zeros.
  TensorSpec stripped = WithoutValues(spec);
  EXPECT_TRUE(stripped.values().empty());
  EXPECT_TRUE(SameTensorSpec(stripped, spec));
  ASSERT_TRUE(ValidateTensorSpec(stripped).ok());
  FillInitialValues(stripped, 2, absl::MakeSpan(slice));
  EXPECT_EQ(slice, std::vector<float>(3, 0.0f));
  TensorSpec other_shape = stripped;
  other_shape.set_shape(0, 6);
  other_shape.set_shape(1, 1);
  EXPECT_FALSE(SameTensorSpec(other_shape, spec));

  TensorSpec short_values = spec;
  short_values.mutable_values()->pop_back();
  EXPECT_EQ(ValidateTensorSpec(short_values).code(), absl::StatusCode::kInvalidArgument);
  TensorSpec nan = spec;
  const float bad = std::nanf("");
  std::memcpy(nan.mutable_values()->data() + 4 * sizeof(float), &bad, sizeof(bad));
  EXPECT_EQ(ValidateTensorSpec(nan).code(), absl::StatusCode::kInvalidArgument);
  TensorSpec not_values = spec;
  not_values.mutable_init()->set_kind(Initializer::KIND_CONSTANT);
  EXPECT_EQ(ValidateTensorSpec(not_values).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardtrain::common
