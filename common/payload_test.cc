#include "common/payload.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardtrain::common {
namespace {

using ::testing::HasSubstr;

TEST(PayloadTest, F32RoundTripIsExact) {
  const std::vector<float> values = {0.0f, -1.5f, 3.25e-7f, 1e30f, -0.0f};
  std::string bytes;
  EncodeDense(values, DTYPE_F32, &bytes);
  EXPECT_EQ(bytes.size(), values.size() * 4);
  std::vector<float> out(values.size());
  ASSERT_TRUE(DecodeDense(DTYPE_F32, bytes, absl::MakeSpan(out)).ok());
  EXPECT_EQ(std::memcmp(out.data(), values.data(), bytes.size()), 0);
}

TEST(PayloadTest, HalfPrecisionRoundTripsWithinItsPrecision) {
  const std::vector<float> values = {0.0f, 1.0f, -2.5f, 0.1f, 65504.0f, 6.1e-5f, 3e-7f};
  for (DType dtype : {DTYPE_F16, DTYPE_BF16}) {
    std::string bytes;
    EncodeDense(values, dtype, &bytes);
    EXPECT_EQ(bytes.size(), values.size() * 2);
    std::vector<float> out(values.size());
    ASSERT_TRUE(DecodeDense(dtype, bytes, absl::MakeSpan(out)).ok());
    const float tolerance = dtype == DTYPE_F16 ? 1e-3f : 8e-3f;
    for (size_t i = 0; i < values.size(); ++i) {
      EXPECT_NEAR(out[i], values[i], std::abs(values[i]) * tolerance + 1e-7f)
          << DTypeName(dtype) << " " << values[i];
    }
  }
}

TEST(PayloadTest, HalfConversionsOfSpecialValues) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(FloatToHalf(1e6f), 0x7c00);  // overflow to +Inf
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(std::nanf("")))));
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(FloatToBfloat16(1.0f), 0x3f80);
  EXPECT_EQ(Bfloat16ToFloat(0xc000), -2.0f);
}

// EncodeDenseInto's inlined loops give exactly FloatToBfloat16 and
// FloatToHalf, at any alignment, for values across the range, ties, NaNs
// and infinities; DecodeDenseFrom inverts them as the scalar functions do.
TEST(PayloadTest, BufferConversionsMatchTheScalarOnes) {
  std::vector<float> values;
  for (uint32_t bits = 0; bits < 0xffffffffu - 0x10001u; bits += 0x10001u) {
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    values.push_back(f);
  }
  values.push_back(std::numeric_limits<float>::quiet_NaN());
  values.push_back(-std::numeric_limits<float>::infinity());
  values.push_back(1.0f + 1.0f / 256);  // a tie: rounds to even (1.0)
  values.push_back(1.0f + 3.0f / 256);  // a tie: rounds to even (up)
  for (DType dtype : {DTYPE_BF16, DTYPE_F16}) {
    std::string buffer(values.size() * 2 + 1, '\0');
    EncodeDenseInto(values, dtype, buffer.data() + 1);  // unaligned
    std::vector<float> back(values.size());
    DecodeDenseFrom(dtype, buffer.data() + 1, absl::MakeSpan(back));
    for (size_t i = 0; i < values.size(); ++i) {
      uint16_t got;
      std::memcpy(&got, buffer.data() + 1 + 2 * i, sizeof(got));
      const uint16_t want =
          dtype == DTYPE_BF16 ? FloatToBfloat16(values[i]) : FloatToHalf(values[i]);
      ASSERT_EQ(got, want) << DTypeName(dtype) << " value " << i << " = " << values[i];
      const float decoded = dtype == DTYPE_BF16 ? Bfloat16ToFloat(want) : HalfToFloat(want);
      ASSERT_TRUE(std::memcmp(&back[i], &decoded, sizeof(float)) == 0) << i;
    }
  }
}

TEST(PayloadTest, RejectsWrongSizeAndUnknownDtype) {
  std::vector<float> out(4);
  auto status = DecodeDense(DTYPE_F32, std::string(12, '\0'), absl::MakeSpan(out));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("12 bytes"));
  status = DecodeDense(DTYPE_UNSPECIFIED, std::string(16, '\0'), absl::MakeSpan(out));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  status = DecodeDense(42, std::string(16, '\0'), absl::MakeSpan(out));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("dtype"));
}

TEST(PayloadTest, SparseScattersAndValidatesIndices) {
  Payload payload;
  payload.set_dtype(DTYPE_F32);
  payload.set_encoding(ENCODING_SPARSE);
  const uint32_t indices[] = {3, 0};
  const float values[] = {2.0f, -1.0f};
  payload.set_indices(reinterpret_cast<const char*>(indices), sizeof(indices));
  payload.set_data(reinterpret_cast<const char*>(values), sizeof(values));
  std::vector<float> out(5, 9.0f);
  ASSERT_TRUE(DecodePayload(payload, absl::MakeSpan(out)).ok());
  EXPECT_EQ(out, (std::vector<float>{-1.0f, 0, 0, 2.0f, 0}));

  const uint32_t bad[] = {3, 5};
  payload.set_indices(reinterpret_cast<const char*>(bad), sizeof(bad));
  EXPECT_THAT(DecodePayload(payload, absl::MakeSpan(out)).message(),
              HasSubstr("outside"));
  payload.set_indices("abc");
  EXPECT_EQ(DecodePayload(payload, absl::MakeSpan(out)).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PayloadTest, CheckFiniteNamesTheBadElement) {
  std::vector<float> values(100, 1.0f);
  EXPECT_TRUE(CheckFinite(values).ok());
  values[37] = std::numeric_limits<float>::infinity();
  EXPECT_THAT(CheckFinite(values).message(), HasSubstr("element 37"));
  values[37] = std::nanf("");
  EXPECT_EQ(CheckFinite(values).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardtrain::common
