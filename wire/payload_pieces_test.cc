#include "wire/payload_pieces.h"

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/payload.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "wire/element_load.h"

namespace shardtrain::wire {
namespace {

using ::testing::HasSubstr;

// `bytes` split at `cuts` (increasing offsets), each piece a view of
// `bytes`, which must outlive the result.
ReceivedBytes Cut(const std::string& bytes, const std::vector<size_t>& cuts) {
  ReceivedBytes out;
  size_t begin = 0;
  for (size_t cut : cuts) {
    out.Append(absl::string_view(bytes).substr(begin, cut - begin));
    begin = cut;
  }
  out.Append(absl::string_view(bytes).substr(begin));
  return out;
}

uint32_t Bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

std::string Encode(const std::vector<float>& values, DType dtype) {
  std::string bytes;
  common::EncodeDense(values, dtype, &bytes);
  return bytes;
}

PayloadView Dense(DType dtype, const ReceivedBytes& data) {
  PayloadView view;
  view.dtype = dtype;
  view.encoding = ENCODING_DENSE;
  view.data = data;
  return view;
}

const DType kDTypes[] = {DTYPE_F32, DTYPE_F16, DTYPE_BF16};

std::vector<float> SomeValues(size_t n) {
  std::vector<float> values(n);
  for (size_t i = 0; i < n; ++i) values[i] = 0.25f * static_cast<float>(i) - 1.5f;
  return values;
}

TEST(ElementLoadTest, HalfMatchesCommonForEveryBitPattern) {
  for (uint32_t h = 0; h <= 0xffffu; ++h) {
    const uint16_t bits = static_cast<uint16_t>(h);
    char bytes[2];
    std::memcpy(bytes, &bits, 2);
    ASSERT_EQ(Bits(LoadElement<DTYPE_F16>(bytes, 0)), Bits(common::HalfToFloat(bits)))
        << "half bits " << h;
    ASSERT_EQ(Bits(LoadElement<DTYPE_BF16>(bytes, 0)),
              Bits(common::Bfloat16ToFloat(bits)))
        << "bf16 bits " << h;
  }
}

TEST(ElementLoadTest, StoreMatchesCommon) {
  std::mt19937 random(7);
  std::vector<float> values = {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 1e-8f, 1e-40f,
                               std::numeric_limits<float>::infinity(),
                               -std::numeric_limits<float>::infinity(),
                               std::numeric_limits<float>::quiet_NaN(),
                               std::numeric_limits<float>::max()};
  for (int i = 0; i < 100000; ++i) {
    const uint32_t bits = random();
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    values.push_back(f);
  }
  for (DType dtype : kDTypes) {
    const std::string expected = Encode(values, dtype);
    std::string out(expected.size() + 1, '\0');
    EncodeElements(values, dtype, out.data() + 1);  // odd alignment
    EXPECT_EQ(out.substr(1), expected) << common::DTypeName(dtype);
  }
}

// Every 4099th float bit pattern (about a million, all exponents, signs
// and low mantissa bits), and the boundaries where f16 rounding changes
// (subnormal threshold, largest half, ties).
TEST(ElementLoadTest, HalfAndBfloat16StoresMatchCommonAcrossTheRange) {
  std::vector<uint32_t> patterns = {0x38800000u, 0x387fffffu, 0x33000000u, 0x33000001u,
                                    0x32ffffffu, 0x477fefffu, 0x477ff000u, 0x477ff001u,
                                    0x47800000u, 0x7f800000u, 0x7f800001u, 0xffc00000u};
  for (uint64_t bits = 0; bits <= 0xffffffffull; bits += 4099) {
    patterns.push_back(static_cast<uint32_t>(bits));
  }
  for (uint32_t bits : patterns) {
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    ASSERT_EQ(element_internal::FloatToHalfBits(f), common::FloatToHalf(f))
        << std::hex << bits;
    ASSERT_EQ(element_internal::FloatToBfloat16Bits(f), common::FloatToBfloat16(f))
        << std::hex << bits;
  }
}

TEST(ForEachRunTest, EveryElementOnceInOrderWhereverTheCuts) {
  for (int width : {2, 4}) {
    const size_t n = 7;
    std::string bytes(n * width, '\0');
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i + 1);
    // Every pair of cuts, a cut at the same place twice included.
    for (size_t a = 0; a <= bytes.size(); ++a) {
      for (size_t b = a; b <= bytes.size(); ++b) {
        std::string seen;
        int64_t next = 0;
        ForEachRun(Cut(bytes, {a, b}), width,
                   [&](int64_t first, const char* run, int64_t count) {
                     EXPECT_EQ(first, next);
                     EXPECT_GT(count, 0);
                     seen.append(run, static_cast<size_t>(count * width));
                     next = first + count;
                   });
        ASSERT_EQ(seen, bytes) << "width " << width << " cuts " << a << "," << b;
      }
    }
  }
}

TEST(ForEachRunTest, OneByteBytePieces) {
  const std::string bytes = Encode(SomeValues(5), DTYPE_F32);
  std::vector<size_t> cuts;
  for (size_t i = 1; i < bytes.size(); ++i) cuts.push_back(i);
  std::string seen;
  ForEachRun(Cut(bytes, cuts), 4, [&](int64_t first, const char* run, int64_t count) {
    EXPECT_EQ(count, 1);
    EXPECT_EQ(seen.size(), static_cast<size_t>(first) * 4);
    seen.append(run, 4);
  });
  EXPECT_EQ(seen, bytes);
}

TEST(ForEachRunTest, EmptyData) {
  int calls = 0;
  ForEachRun(ReceivedBytes(), 4, [&](int64_t, const char*, int64_t) { ++calls; });
  EXPECT_EQ(calls, 0);
}

TEST(CheckDenseTest, AcceptsExactSize) {
  for (DType dtype : kDTypes) {
    const std::string bytes = Encode(SomeValues(10), dtype);
    EXPECT_OK(CheckDense(Dense(dtype, ReceivedBytes(bytes)), 10));
  }
  EXPECT_OK(CheckDense(Dense(DTYPE_F32, ReceivedBytes()), 0));
}

TEST(CheckDenseTest, RefusesWhatIsNotExactlyDense) {
  const std::string bytes = Encode(SomeValues(10), DTYPE_F32);
  const PayloadView good = Dense(DTYPE_F32, ReceivedBytes(bytes));
  EXPECT_THAT(CheckDense(good, 11).message(), HasSubstr("payload has 40 bytes"));
  EXPECT_THAT(CheckDense(good, 9).message(), HasSubstr("payload has 40 bytes"));
  EXPECT_EQ(CheckDense(good, -1).code(), absl::StatusCode::kInvalidArgument);

  PayloadView f16 = good;
  f16.dtype = DTYPE_F16;  // 40 bytes are 20 f16 elements
  EXPECT_THAT(CheckDense(f16, 10).message(), HasSubstr("10 elements of f16 need 20"));

  PayloadView unknown = good;
  unknown.dtype = 77;
  EXPECT_THAT(CheckDense(unknown, 10).message(), HasSubstr("not one of f32, f16, bf16"));
  unknown.dtype = DTYPE_UNSPECIFIED;
  EXPECT_EQ(CheckDense(unknown, 10).code(), absl::StatusCode::kInvalidArgument);

  PayloadView with_indices = good;
  const std::string index(4, '\0');
  with_indices.indices = ReceivedBytes(index);
  EXPECT_THAT(CheckDense(with_indices, 10).message(), HasSubstr("must not carry indices"));

  PayloadView sparse = good;
  sparse.encoding = ENCODING_SPARSE;
  EXPECT_THAT(CheckDense(sparse, 10).message(), HasSubstr("sparse"));
  sparse.encoding = 9;
  EXPECT_THAT(CheckDense(sparse, 10).message(), HasSubstr("unknown payload encoding 9"));
}

TEST(CheckFiniteTest, AcceptsFiniteExtremes) {
  const std::vector<float> values = {std::numeric_limits<float>::max(),
                                     -std::numeric_limits<float>::max(),
                                     std::numeric_limits<float>::denorm_min(),
                                     -0.0f, 65504.0f, -65504.0f, 6e-8f};
  const std::string f32 = Encode(values, DTYPE_F32);
  EXPECT_OK(CheckFinite(Dense(DTYPE_F32, ReceivedBytes(f32))));
  // The largest finite bf16 (float max would round to Inf).
  const std::string bf16("\x7f\x7f\x7f\xff\x01\x00\x00\x80", 8);
  EXPECT_OK(CheckFinite(Dense(DTYPE_BF16, ReceivedBytes(bf16))));
  const std::vector<float> half_range = {65504.0f, -65504.0f, 6e-8f, -0.0f, 1.0f};
  const std::string half = Encode(half_range, DTYPE_F16);
  EXPECT_OK(CheckFinite(Dense(DTYPE_F16, ReceivedBytes(half))));
}

TEST(CheckFiniteTest, NamesTheFirstBadElementWhereverTheCut) {
  const float kBad[] = {std::numeric_limits<float>::quiet_NaN(),
                        std::numeric_limits<float>::infinity(),
                        -std::numeric_limits<float>::infinity()};
  const size_t n = 37;  // more than a vector's worth, with a tail
  for (DType dtype : kDTypes) {
    for (float bad : kBad) {
      for (size_t position : {size_t{0}, size_t{5}, size_t{17}, n - 1}) {
        std::vector<float> values = SomeValues(n);
        values[position] = bad;
        if (position + 3 < n) values[position + 3] = bad;  // a later one too
        const std::string bytes = Encode(values, dtype);
        for (size_t cut = 0; cut <= bytes.size(); ++cut) {
          const absl::Status status = CheckFinite(Dense(dtype, Cut(bytes, {cut})));
          ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument)
              << common::DTypeName(dtype) << " bad at " << position << " cut " << cut;
          ASSERT_THAT(status.message(),
                      HasSubstr(absl::StrFormat("gradient element %d is", position)))
              << common::DTypeName(dtype) << " cut " << cut;
        }
      }
    }
  }
}

TEST(CheckFiniteTest, BadElementSplitAcrossPieces) {
  std::vector<float> values = SomeValues(4);
  values[2] = std::numeric_limits<float>::infinity();
  const std::string bytes = Encode(values, DTYPE_F32);
  // Element 2 is bytes [8, 12): cut it at each inner byte, and into bytes.
  for (size_t cut = 9; cut < 12; ++cut) {
    EXPECT_THAT(CheckFinite(Dense(DTYPE_F32, Cut(bytes, {cut}))).message(),
                HasSubstr("gradient element 2 is inf"));
  }
  EXPECT_THAT(CheckFinite(Dense(DTYPE_F32, Cut(bytes, {9, 10, 11}))).message(),
              HasSubstr("gradient element 2 is inf"));
  const std::string half = Encode(values, DTYPE_F16);
  EXPECT_THAT(CheckFinite(Dense(DTYPE_F16, Cut(half, {5}))).message(),
              HasSubstr("gradient element 2 is inf"));
}

TEST(DecodeIntoTest, DenseMatchesCommonForEveryCut) {
  const std::vector<float> values = SomeValues(13);
  for (DType dtype : kDTypes) {
    const std::string bytes = Encode(values, dtype);
    std::vector<float> expected(values.size());
    ASSERT_OK(common::DecodeDense(dtype, bytes, absl::MakeSpan(expected)));
    for (size_t cut = 0; cut <= bytes.size(); ++cut) {
      std::vector<float> out(values.size(), 9.0f);
      ASSERT_OK(DecodeInto(Dense(dtype, Cut(bytes, {cut})), absl::MakeSpan(out)));
      ASSERT_EQ(out, expected) << common::DTypeName(dtype) << " cut " << cut;
    }
  }
}

TEST(DecodeIntoTest, DenseOfWrongSizeLeavesOutUnchanged) {
  const std::string bytes = Encode(SomeValues(5), DTYPE_F32);
  std::vector<float> out(6, 3.0f);
  EXPECT_EQ(DecodeInto(Dense(DTYPE_F32, ReceivedBytes(bytes)), absl::MakeSpan(out)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out, std::vector<float>(6, 3.0f));
}

struct Sparse {
  std::string indices;
  std::string values;
  Payload Proto(DType dtype) const {
    Payload payload;
    payload.set_dtype(dtype);
    payload.set_encoding(ENCODING_SPARSE);
    payload.set_indices(indices);
    payload.set_data(values);
    return payload;
  }
};

Sparse MakeSparse(const std::vector<uint32_t>& indices, const std::vector<float>& values,
                  DType dtype) {
  Sparse sparse;
  sparse.indices.assign(reinterpret_cast<const char*>(indices.data()),
                        indices.size() * sizeof(uint32_t));
  sparse.values = Encode(values, dtype);
  return sparse;
}

PayloadView SparseView(DType dtype, const ReceivedBytes& indices,
                       const ReceivedBytes& values) {
  PayloadView view;
  view.dtype = dtype;
  view.encoding = ENCODING_SPARSE;
  view.indices = indices;
  view.data = values;
  return view;
}

TEST(DecodeIntoTest, SparseMatchesCommonForEveryCutOfIndicesAndValues) {
  // Index 3 twice: the values add up, as common::DecodePayload does.
  const std::vector<uint32_t> indices = {7, 3, 0, 3, 9};
  const std::vector<float> values = {1.5f, -2.0f, 0.25f, 4.0f, -1.0f};
  for (DType dtype : kDTypes) {
    const Sparse sparse = MakeSparse(indices, values, dtype);
    std::vector<float> expected(10);
    ASSERT_OK(common::DecodePayload(sparse.Proto(dtype), absl::MakeSpan(expected)));
    EXPECT_EQ(expected[3], 2.0f);
    for (size_t a = 0; a <= sparse.indices.size(); ++a) {
      for (size_t b = 0; b <= sparse.values.size(); ++b) {
        std::vector<float> out(10, 5.0f);
        ASSERT_OK(DecodeInto(SparseView(dtype, Cut(sparse.indices, {a}),
                                        Cut(sparse.values, {b})),
                             absl::MakeSpan(out)));
        ASSERT_EQ(out, expected) << common::DTypeName(dtype) << " cuts " << a << "," << b;
      }
    }
  }
}

TEST(DecodeIntoTest, SparseRefusalsLeaveOutUnchanged) {
  const std::vector<float> before(10, 5.0f);
  auto refuse = [&](const PayloadView& view, const std::string& message) {
    std::vector<float> out = before;
    const absl::Status status = DecodeInto(view, absl::MakeSpan(out));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << message;
    EXPECT_THAT(status.message(), HasSubstr(message));
    EXPECT_EQ(out, before) << message;
  };
  // An index out of range, after good ones (and split across pieces).
  const Sparse outside = MakeSparse({1, 2, 10}, {1.0f, 2.0f, 3.0f}, DTYPE_F32);
  refuse(SparseView(DTYPE_F32, Cut(outside.indices, {9}), ReceivedBytes(outside.values)),
         "sparse index 10 is outside the 10-element partition");
  const Sparse huge = MakeSparse({0xffffffffu}, {1.0f}, DTYPE_BF16);
  refuse(SparseView(DTYPE_BF16, ReceivedBytes(huge.indices), ReceivedBytes(huge.values)),
         "sparse index 4294967295 is outside");
  // Indices not a multiple of 4 bytes.
  const Sparse good = MakeSparse({1, 2}, {1.0f, 2.0f}, DTYPE_F32);
  refuse(SparseView(DTYPE_F32, ReceivedBytes(absl::string_view(good.indices).substr(0, 7)),
                    ReceivedBytes(good.values)),
         "not a multiple of 4");
  // Values that do not match the indices.
  refuse(SparseView(DTYPE_F16, ReceivedBytes(good.indices), ReceivedBytes(good.values)),
         "sparse payload has 8 value bytes for 2 indices of f16");
  // More indices than the partition has elements.
  std::vector<uint32_t> many(11, 0);
  const Sparse too_many = MakeSparse(many, std::vector<float>(11, 1.0f), DTYPE_F32);
  refuse(SparseView(DTYPE_F32, ReceivedBytes(too_many.indices),
                    ReceivedBytes(too_many.values)),
         "names 11 elements of a 10-element partition");
  // Unknown dtype and encoding.
  refuse(SparseView(static_cast<DType>(12), ReceivedBytes(good.indices),
                    ReceivedBytes(good.values)),
         "not one of f32, f16, bf16");
  PayloadView unknown = SparseView(DTYPE_F32, ReceivedBytes(good.indices),
                                   ReceivedBytes(good.values));
  unknown.encoding = 5;
  refuse(unknown, "unknown payload encoding 5");
}

TEST(AddIntoTest, AddsEveryElementWhereverTheCut) {
  const std::vector<float> values = SomeValues(11);
  for (DType dtype : kDTypes) {
    const std::string bytes = Encode(values, dtype);
    std::vector<float> decoded(values.size());
    ASSERT_OK(common::DecodeDense(dtype, bytes, absl::MakeSpan(decoded)));
    for (size_t cut = 0; cut <= bytes.size(); ++cut) {
      std::vector<float> out(values.size(), 0.5f);
      AddInto(Dense(dtype, Cut(bytes, {cut})), absl::MakeSpan(out));
      for (size_t i = 0; i < out.size(); ++i) {
        ASSERT_EQ(out[i], 0.5f + decoded[i]) << common::DTypeName(dtype) << " " << i;
      }
    }
  }
}

}  // namespace
}  // namespace shardtrain::wire
