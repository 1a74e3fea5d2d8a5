#include "common/topk_compressor.h"

#include <cmath>
#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "common/payload.h"
#include "gtest/gtest.h"

namespace shardtrain::common {
namespace {

std::vector<float> Decode(const Payload& payload, size_t n) {
  std::vector<float> out(n);
  EXPECT_TRUE(DecodePayload(payload, absl::MakeSpan(out)).ok());
  return out;
}

std::vector<uint32_t> Indices(const Payload& payload) {
  std::vector<uint32_t> indices(payload.indices().size() / 4);
  std::memcpy(indices.data(), payload.indices().data(), payload.indices().size());
  return indices;
}

TEST(TopKCompressorTest, SendsTheLargestMagnitudesInIndexOrder) {
  auto topk = TopKCompressor::Create(0.3, {10});
  ASSERT_TRUE(topk.ok());
  const std::vector<float> grad = {0.1f, -5.0f, 0.2f, 3.0f, 0.0f, -0.3f, 4.0f, 0.0f, 1.0f, 0.5f};
  Payload payload;
  topk->Encode(0, grad, DTYPE_F32, &payload);
  EXPECT_EQ(payload.encoding(), ENCODING_SPARSE);
  EXPECT_EQ(Indices(payload), (std::vector<uint32_t>{1, 3, 6}));  // |-5|, |4|, |3|
  EXPECT_EQ(Decode(payload, 10),
            (std::vector<float>{0, -5.0f, 0, 3.0f, 0, 0, 4.0f, 0, 0, 0}));
  // Everything else is owed.
  EXPECT_EQ(std::vector<float>(topk->residual(0).begin(), topk->residual(0).end()),
            (std::vector<float>{0.1f, 0, 0.2f, 0, 0, -0.3f, 0, 0, 1.0f, 0.5f}));
}

// Error feedback: whatever is not sent now is sent later, so over many steps
// the shard receives the sum of the gradients, minus only what is still owed.
TEST(TopKCompressorTest, SentPlusOwedIsEverythingPushed) {
  constexpr size_t kN = 1000;
  for (DType dtype : {DTYPE_F32, DTYPE_BF16}) {
    auto topk = TopKCompressor::Create(0.01, {kN});
    ASSERT_TRUE(topk.ok());
    std::mt19937 rng(4);
    std::normal_distribution<float> normal;
    std::vector<double> pushed(kN, 0.0), received(kN, 0.0);
    for (int step = 0; step < 200; ++step) {
      std::vector<float> grad(kN);
      for (size_t i = 0; i < kN; ++i) {
        grad[i] = normal(rng) * 1e-3f;
        pushed[i] += grad[i];
      }
      Payload payload;
      topk->Encode(0, grad, dtype, &payload);
      ASSERT_EQ(Indices(payload).size(), 10u);
      const std::vector<float> sent = Decode(payload, kN);
      for (size_t i = 0; i < kN; ++i) received[i] += sent[i];
    }
    double worst = 0;
    for (size_t i = 0; i < kN; ++i) {
      worst = std::max(worst, std::fabs(received[i] + topk->residual(0)[i] - pushed[i]));
    }
    EXPECT_LT(worst, 1e-5) << DTypeName(dtype);
  }
}

// Large partitions take the sampled-threshold path; the selection must still
// be exactly the k largest (ties by lower index), as a full sort says.
TEST(TopKCompressorTest, LargePartitionsSelectExactlyTheTopK) {
  constexpr size_t kN = 100000;
  for (double ratio : {0.001, 0.01, 0.1}) {
    auto topk = TopKCompressor::Create(ratio, {kN});
    ASSERT_TRUE(topk.ok());
    std::mt19937 rng(9);
    std::normal_distribution<float> normal;
    std::vector<float> grad(kN);
    for (float& g : grad) g = normal(rng);
    for (size_t i = 0; i < 500; ++i) grad[i * 37] = 2.5f;  // ties at one magnitude
    std::vector<uint32_t> order(kN);
    for (uint32_t i = 0; i < kN; ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
      const float x = std::fabs(grad[a]), y = std::fabs(grad[b]);
      return x > y || (x == y && a < b);
    });
    const size_t k = static_cast<size_t>(topk->KeptFor(kN));
    std::vector<uint32_t> want(order.begin(), order.begin() + k);
    std::sort(want.begin(), want.end());
    Payload payload;
    topk->Encode(0, grad, DTYPE_F32, &payload);
    EXPECT_EQ(Indices(payload), want) << ratio;
  }
}

TEST(TopKCompressorTest, KeepsAtLeastOneAndAtMostAll) {
  auto topk = TopKCompressor::Create(0.001, {5, 1});
  ASSERT_TRUE(topk.ok());
  EXPECT_EQ(topk->KeptFor(5), 1);
  auto seven = TopKCompressor::Create(0.07, {100});
  ASSERT_TRUE(seven.ok());
  EXPECT_EQ(seven->KeptFor(100), 7);  // not 8 from 0.07 * 100 = 7.000000000000001
  EXPECT_EQ(seven->KeptFor(101), 8);
  EXPECT_EQ(topk->KeptFor(0), 0);
  auto all = TopKCompressor::Create(1.0, {4});
  ASSERT_TRUE(all.ok());
  Payload payload;
  all->Encode(0, std::vector<float>{1, 2, 3, 4}, DTYPE_F32, &payload);
  EXPECT_EQ(Decode(payload, 4), (std::vector<float>{1, 2, 3, 4}));
  for (float owed : all->residual(0)) EXPECT_EQ(owed, 0.0f);
}

// A diverged worker's NaN goes out first (and the shard refuses it) instead
// of upsetting the selection.
TEST(TopKCompressorTest, NaNIsSentFirst) {
  auto topk = TopKCompressor::Create(0.2, {10});
  ASSERT_TRUE(topk.ok());
  std::vector<float> grad(10, 1.0f);
  grad[7] = std::nanf("");
  grad[2] = 50.0f;
  Payload payload;
  topk->Encode(0, grad, DTYPE_F32, &payload);
  EXPECT_EQ(Indices(payload), (std::vector<uint32_t>{2, 7}));
}

TEST(TopKCompressorTest, RatioOutsideZeroOneIsRejected) {
  for (double ratio : {0.0, -0.1, 1.5, std::nan("")}) {
    EXPECT_EQ(TopKCompressor::Create(ratio, {10}).status().code(),
              absl::StatusCode::kInvalidArgument)
        << ratio;
  }
}

}  // namespace
}  // namespace shardtrain::common
