#include "worker/device/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "worker/device/backend_test_util.h"

namespace shardtrain::worker {
namespace {

class CpuBackendTest : public ::testing::Test {
 protected:
  std::unique_ptr<DeviceBuffer> Upload(const std::vector<float>& host) {
    return io_.Upload(host);
  }
  std::unique_ptr<DeviceLabelBuffer> UploadLabels(const std::vector<int32_t>& host) {
    return io_.UploadLabels(host);
  }
  std::vector<float> Download(const DeviceBuffer& buffer) { return io_.Download(buffer); }

  BackendIo io_{MakeCpuBackend()};
  Backend* const backend_ = io_.backend.get();
};

TEST_F(CpuBackendTest, NameIsCpu) { EXPECT_EQ(backend_->Name(), "cpu"); }

// OpenBLAS names the kernels it loaded with: those OPENBLAS_CORETYPE asks
// for, when it names a kernel set this OpenBLAS has.
TEST(CpuMathKernelsTest, NameOpenBlasChoice) {
  const std::string kernels = CpuMathKernels();
  EXPECT_FALSE(kernels.empty());
  EXPECT_NE(kernels, "unknown");
  const char* asked = std::getenv("OPENBLAS_CORETYPE");
  if (asked != nullptr && (absl::EqualsIgnoreCase(asked, "Haswell") ||
                           absl::EqualsIgnoreCase(asked, "Prescott"))) {
    EXPECT_TRUE(absl::EqualsIgnoreCase(kernels, asked)) << kernels << " for " << asked;
  }
}

TEST_F(CpuBackendTest, AllocateIsZeroFilledAndAllowsEmpty) {
  auto buffer = backend_->Allocate(37);
  ASSERT_TRUE(buffer.ok());
  EXPECT_EQ((*buffer)->size(), 37u);
  for (float v : Download(**buffer)) EXPECT_EQ(v, 0.0f);
  auto empty = backend_->Allocate(0);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ((*empty)->size(), 0u);
}

TEST_F(CpuBackendTest, CopiesHonourOffsetsAndBounds) {
  auto buffer = std::move(backend_->Allocate(6)).value();
  const std::vector<float> src = {1, 2, 3};
  ASSERT_TRUE(backend_->CopyFromHost(src, buffer.get(), 2).ok());
  EXPECT_EQ(Download(*buffer), (std::vector<float>{0, 0, 1, 2, 3, 0}));
  std::vector<float> out(2);
  ASSERT_TRUE(backend_->CopyToHost(*buffer, 3, absl::MakeSpan(out)).ok());
  EXPECT_EQ(out, (std::vector<float>{2, 3}));

  EXPECT_EQ(backend_->CopyFromHost(src, buffer.get(), 4).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend_->CopyToHost(*buffer, 5, absl::MakeSpan(out)).code(),
            absl::StatusCode::kInvalidArgument);
  // An offset near SIZE_MAX must not wrap around the bounds check.
  EXPECT_EQ(backend_->CopyFromHost(src, buffer.get(), SIZE_MAX - 1).code(),
            absl::StatusCode::kInvalidArgument);
  auto labels = std::move(backend_->AllocateLabels(2)).value();
  EXPECT_EQ(
      backend_
          ->CopyLabelsFromHost(std::vector<int32_t>{1, 2, 3}, labels.get(), 0)
          .code(),
      absl::StatusCode::kInvalidArgument);
}

// Nothing to lock on the CPU: pins always succeed, also twice, and copies
// are unchanged.
TEST_F(CpuBackendTest, PinHostDoesNothing) {
  std::vector<float> host = {1, 2, 3};
  auto pin = backend_->PinHost(absl::MakeSpan(host));
  ASSERT_TRUE(pin.ok()) << pin.status();
  auto again = backend_->PinHost(absl::MakeSpan(host));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(backend_->PinHost({}).ok());
  auto buffer = Upload({0, 0, 0});
  ASSERT_TRUE(backend_->CopyFromHost(host, buffer.get(), 0).ok());
  std::vector<float> out(3);
  ASSERT_TRUE(backend_->CopyToHost(*buffer, 0, absl::MakeSpan(out)).ok());
  EXPECT_EQ(out, host);
}

TEST_F(CpuBackendTest, CopyToHostAsyncIsDoneOnReturn) {
  auto buffer = Upload({1, 2, 3, 4, 5});
  auto host = backend_->AllocateHost(3);
  ASSERT_TRUE(host.ok()) << host.status();
  ASSERT_EQ((*host)->size(), 3u);
  EXPECT_EQ((*host)->data()[0], 0.0f);
  const absl::Span<float> dst((*host)->data(), 3);
  auto copied = backend_->CopyToHostAsync(*buffer, 2, dst);
  ASSERT_TRUE(copied.ok()) << copied.status();
  EXPECT_TRUE((*copied)->Wait().ok());
  EXPECT_EQ(std::vector<float>(dst.begin(), dst.end()),
            (std::vector<float>{3, 4, 5}));
  EXPECT_EQ(backend_->CopyToHostAsync(*buffer, 3, dst).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend_->CopyToHostAsync(*buffer, SIZE_MAX, dst).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Reference row-major GEMM in double.
std::vector<float> NaiveGemm(bool ta, bool tb, int m, int n, int k, float alpha,
                             const std::vector<float>& a,
                             const std::vector<float>& b, float beta,
                             const std::vector<float>& c) {
  std::vector<float> out(size_t(m) * n);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double sum = 0.0;
      for (int p = 0; p < k; ++p) {
        const double av = ta ? a[size_t(p) * m + i] : a[size_t(i) * k + p];
        const double bv = tb ? b[size_t(j) * k + p] : b[size_t(p) * n + j];
        sum += av * bv;
      }
      const double prior = beta == 0.0f ? 0.0 : beta * c[size_t(i) * n + j];
      out[size_t(i) * n + j] = static_cast<float>(alpha * sum + prior);
    }
  }
  return out;
}

class GemmTest : public CpuBackendTest,
                 public ::testing::WithParamInterface<
                     std::tuple<bool, bool, std::tuple<int, int, int>>> {};

TEST_P(GemmTest, MatchesNaiveReference) {
  const auto [ta, tb, dims] = GetParam();
  const auto [m, n, k] = dims;
  const auto a = RandomVector(size_t(m) * k, 1);
  const auto b = RandomVector(size_t(k) * n, 2);
  const auto c = RandomVector(size_t(m) * n, 3);
  for (float beta : {0.0f, 0.5f}) {
    auto da = Upload(a), db = Upload(b), dc = Upload(c);
    ASSERT_TRUE(backend_
                    ->Gemm(ta ? Trans::kYes : Trans::kNo,
                           tb ? Trans::kYes : Trans::kNo, m, n, k, 0.75f,
                           da->data(), db->data(), beta, dc->data())
                    .ok());
    const auto want = NaiveGemm(ta, tb, m, n, k, 0.75f, a, b, beta, c);
    const auto got = Download(*dc);
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], 1e-5f * k + 1e-6f)
          << "beta=" << beta << " i=" << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllTransposesOddSizes, GemmTest,
    ::testing::Combine(::testing::Bool(), ::testing::Bool(),
                       ::testing::Values(std::make_tuple(1, 1, 1),
                                         std::make_tuple(3, 5, 7),
                                         std::make_tuple(17, 13, 9),
                                         std::make_tuple(33, 1, 65),
                                         std::make_tuple(2, 31, 1))));

TEST_F(CpuBackendTest, GemmBetaZeroOverwritesNan) {
  auto a = Upload({1, 2}), b = Upload({3, 4});
  auto c = Upload({std::numeric_limits<float>::quiet_NaN()});
  ASSERT_TRUE(backend_
                  ->Gemm(Trans::kNo, Trans::kNo, 1, 1, 2, 1.0f, a->data(),
                         b->data(), 0.0f, c->data())
                  .ok());
  EXPECT_EQ(Download(*c)[0], 11.0f);
}

TEST_F(CpuBackendTest, GemmWithEmptyInnerDimensionScalesC) {
  auto c = Upload({1, 2, 3, 4, 5, 6});
  ASSERT_TRUE(backend_
                  ->Gemm(Trans::kNo, Trans::kYes, 2, 3, 0, 1.0f, nullptr,
                         nullptr, 2.0f, c->data())
                  .ok());
  EXPECT_EQ(Download(*c), (std::vector<float>{2, 4, 6, 8, 10, 12}));
}

TEST_F(CpuBackendTest, RejectsNegativeShapesAndNullPointers) {
  auto x = Upload({1, 2, 3});
  EXPECT_EQ(backend_
                ->Gemm(Trans::kNo, Trans::kNo, -1, 1, 1, 1, x->data(),
                       x->data(), 0, x->data())
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend_->AddBias(1, 3, nullptr, x->data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend_->ReluForward(-3, x->data(), x->data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend_->ColumnSum(1, -3, x->data(), x->data()).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(CpuBackendTest, AxpbyAccumulatesAndOverwritesNaNsWithZeroBeta) {
  const auto x = RandomVector(11, 7);
  auto dx = Upload(x);
  auto dy = Upload(std::vector<float>(11, std::numeric_limits<float>::quiet_NaN()));
  ASSERT_TRUE(backend_->Axpby(11, 0.5f, dx->data(), 0.0f, dy->data()).ok());
  ASSERT_TRUE(backend_->Axpby(11, 2.0f, dx->data(), 1.0f, dy->data()).ok());
  const auto got = Download(*dy);
  for (int i = 0; i < 11; ++i) EXPECT_FLOAT_EQ(got[i], 2.5f * x[i]);
  ASSERT_TRUE(backend_->Axpby(11, 1.0f, dy->data(), 1.0f, dy->data()).ok());  // y += y
  EXPECT_FLOAT_EQ(Download(*dy)[3], 5.0f * x[3]);
  EXPECT_TRUE(backend_->Axpby(0, 1.0f, nullptr, 1.0f, nullptr).ok());
  EXPECT_EQ(backend_->Axpby(-1, 1.0f, dx->data(), 1.0f, dy->data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend_->Axpby(3, 1.0f, nullptr, 1.0f, dy->data()).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(CpuBackendTest, AddBiasAndColumnSumOddShapes) {
  const int rows = 7, cols = 13;
  const auto x = RandomVector(rows * cols, 4);
  const auto bias = RandomVector(cols, 5);
  auto dx = Upload(x), dbias = Upload(bias);
  ASSERT_TRUE(backend_->AddBias(rows, cols, dbias->data(), dx->data()).ok());
  const auto added = Download(*dx);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) {
      EXPECT_FLOAT_EQ(added[r * cols + c], x[r * cols + c] + bias[c]);
    }
  }
  auto sum = Upload(RandomVector(cols, 6));  // Garbage to be overwritten.
  ASSERT_TRUE(backend_->ColumnSum(rows, cols, dx->data(), sum->data()).ok());
  const auto got = Download(*sum);
  for (int c = 0; c < cols; ++c) {
    double want = 0.0;
    for (int r = 0; r < rows; ++r) want += added[r * cols + c];
    EXPECT_NEAR(got[c], want, 1e-5);
  }
}

TEST_F(CpuBackendTest, ReluForwardAndBackwardInAndOutOfPlace) {
  const std::vector<float> x = {-2, -0.0f, 0.5f, 3, -1e-7f};
  const std::vector<float> want_y = {0, 0, 0.5f, 3, 0};
  auto dx = Upload(x), dy = Upload(std::vector<float>(x.size()));
  ASSERT_TRUE(backend_->ReluForward(x.size(), dx->data(), dy->data()).ok());
  EXPECT_EQ(Download(*dy), want_y);
  ASSERT_TRUE(backend_->ReluForward(x.size(), dx->data(), dx->data()).ok());
  EXPECT_EQ(Download(*dx), want_y);

  const std::vector<float> grad = {1, 2, 3, 4, 5};
  const std::vector<float> want_grad = {0, 0, 3, 4, 0};
  auto dgrad = Upload(grad), dout = Upload(std::vector<float>(grad.size()));
  ASSERT_TRUE(
      backend_
          ->ReluBackward(grad.size(), dy->data(), dgrad->data(), dout->data())
          .ok());
  EXPECT_EQ(Download(*dout), want_grad);
  ASSERT_TRUE(
      backend_
          ->ReluBackward(grad.size(), dy->data(), dgrad->data(), dgrad->data())
          .ok());
  EXPECT_EQ(Download(*dgrad), want_grad);
}

// Long enough for the vectorized loop and its remainder, signs at random
// (as real activations are), and gradients that are not finite: those of
// inactive units are still 0, those of active ones pass through.
TEST_F(CpuBackendTest, ReluBackwardMatchesTheDefinitionElementByElement) {
  constexpr int kN = 1003;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::vector<float> y(kN), grad(kN), want(kN);
  for (int i = 0; i < kN; ++i) {
    y[i] = std::max(normal(rng), 0.0f);
    grad[i] = i % 17 == 0 ? std::numeric_limits<float>::quiet_NaN()
              : i % 19 == 0 ? std::numeric_limits<float>::infinity()
                            : normal(rng);
    want[i] = y[i] > 0.0f ? grad[i] : 0.0f;
  }
  auto expect_want = [&](const std::vector<float>& got) {
    ASSERT_EQ(got.size(), want.size());
    for (int i = 0; i < kN; ++i) {
      if (std::isnan(want[i])) {
        EXPECT_TRUE(std::isnan(got[i])) << i;
      } else {
        EXPECT_EQ(got[i], want[i]) << i;
      }
    }
  };
  auto dy = Upload(y), dgrad = Upload(grad), dout = Upload(std::vector<float>(kN));
  ASSERT_TRUE(backend_->ReluBackward(kN, dy->data(), dgrad->data(), dout->data()).ok());
  expect_want(Download(*dout));
  ASSERT_TRUE(backend_->ReluBackward(kN, dy->data(), dgrad->data(), dgrad->data()).ok());
  expect_want(Download(*dgrad));
}

// Reference softmax cross-entropy in double: returns the mean loss and fills
// the gradient of the mean.
double NaiveSoftmaxCe(int rows, int cols, const std::vector<float>& logits,
                      const std::vector<int32_t>& labels,
                      std::vector<double>* grad) {
  grad->assign(size_t(rows) * cols, 0.0);
  double total = 0.0;
  for (int r = 0; r < rows; ++r) {
    double max = -1e300;
    for (int c = 0; c < cols; ++c)
      max = std::max<double>(max, logits[r * cols + c]);
    double sum = 0.0;
    for (int c = 0; c < cols; ++c) sum += std::exp(logits[r * cols + c] - max);
    total += max + std::log(sum) - logits[r * cols + labels[r]];
    for (int c = 0; c < cols; ++c) {
      (*grad)[r * cols + c] = (std::exp(logits[r * cols + c] - max) / sum -
                               (c == labels[r] ? 1.0 : 0.0)) /
                              rows;
    }
  }
  return total / rows;
}

TEST_F(CpuBackendTest, SoftmaxCrossEntropyMatchesReference) {
  const int rows = 5, cols = 11;
  auto logits = RandomVector(rows * cols, 7, -4.0f, 4.0f);
  logits[3] = 1000.0f;  // Overflows exp() unless the row max is subtracted.
  logits[cols + 2] = -1000.0f;
  const std::vector<int32_t> labels = {0, 10, 3, 7, 3};
  std::vector<double> want_grad;
  const double want_loss =
      NaiveSoftmaxCe(rows, cols, logits, labels, &want_grad);
  ASSERT_TRUE(std::isfinite(want_loss));

  for (bool in_place : {false, true}) {
    auto dlogits = Upload(logits);
    auto dlabels = UploadLabels(labels);
    auto dgrad = Upload(std::vector<float>(logits.size()));
    float* out = in_place ? dlogits->data() : dgrad->data();
    auto loss = backend_->SoftmaxCrossEntropy(rows, cols, dlogits->data(),
                                              dlabels->data(), out);
    ASSERT_TRUE(loss.ok()) << loss.status();
    EXPECT_NEAR(*loss, want_loss, 1e-4 * std::abs(want_loss) + 1e-5);
    const auto got = Download(in_place ? *dlogits : *dgrad);
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_NEAR(got[i], want_grad[i], 1e-6) << "in_place=" << in_place;
    }
  }
}

TEST_F(CpuBackendTest, SoftmaxCrossEntropyRejectsBadInput) {
  auto logits = Upload({1, 2, 3, 4});
  auto grad = Upload({0, 0, 0, 0});
  auto bad = UploadLabels({0, 2});
  EXPECT_EQ(
      backend_
          ->SoftmaxCrossEntropy(2, 2, logits->data(), bad->data(), grad->data())
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Download(*grad), (std::vector<float>{0, 0, 0, 0}));
  EXPECT_EQ(
      backend_
          ->SoftmaxCrossEntropy(0, 2, logits->data(), bad->data(), grad->data())
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
}

TEST_F(CpuBackendTest, ArgmaxCorrectCountsFirstMaximum) {
  // Row 0: argmax 2. Row 1: tie between 0 and 1, first wins. Row 2: argmax 1.
  auto logits = Upload({0, 1, 5, 3, 3, 1, -1, 0, -2});
  auto labels = UploadLabels({2, 1, 1});
  auto correct = backend_->ArgmaxCorrect(3, 3, logits->data(), labels->data());
  ASSERT_TRUE(correct.ok());
  EXPECT_EQ(*correct, 2);
  auto none = backend_->ArgmaxCorrect(0, 3, nullptr, nullptr);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, 0);
}

}  // namespace
}  // namespace shardtrain::worker
