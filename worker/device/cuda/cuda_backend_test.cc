// Parity of CudaBackend with the CPU backend: each op, and a whole Mlp
// forward/backward on both with the same parameters and batches. Every test
// skips itself on a machine without a CUDA device.
#include "worker/device/backend_test_util.h"
#include "worker/device/cuda/cuda_backend.h"
#include "worker/device/cuda/cuda_test_util.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "worker/device/cpu/cpu_backend.h"
#include "worker/model/mlp.h"
#include "worker/model/model_spec.h"

namespace shardtrain::worker {
namespace {

constexpr float kFp32Tolerance = 1e-4f;

std::vector<int32_t> RandomLabels(size_t n, int classes, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> dist(0, classes - 1);
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = dist(rng);
  return v;
}

// max |got - want| / max(max |want|, 1e-6): relative to the result's scale,
// so a sum that cancels to ~0 is not judged against its own tiny size.
float RelativeError(const std::vector<float>& got,
                    const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  float diff = 0.0f;
  float scale = 1e-6f;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    if (std::isnan(got[i]) != std::isnan(want[i])) return INFINITY;
    diff = std::max(diff, std::fabs(got[i] - want[i]));
    scale = std::max(scale, std::fabs(want[i]));
  }
  return diff / scale;
}

using Side = BackendIo;

class BackendParity : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_CUDA_DEVICE();
    auto gpu = MakeCudaBackend(CudaBackendOptions());
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    gpu_.backend = std::move(gpu).value();
    cpu_.backend = MakeCpuBackend();
  }

  Side cpu_;
  Side gpu_;
};

TEST_F(BackendParity, NameAndZeroFilledAllocation) {
  EXPECT_EQ(gpu_.backend->Name(), "cuda");
  auto buffer = gpu_.backend->Allocate(1001);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  for (float v : gpu_.Download(**buffer)) ASSERT_EQ(v, 0.0f);
  auto empty = gpu_.backend->Allocate(0);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ((*empty)->size(), 0u);
}

TEST_F(BackendParity, AbsurdAllocationIsResourceExhausted) {
  auto buffer = gpu_.backend->Allocate(size_t{1} << 50);  // 4 PiB of floats.
  EXPECT_EQ(buffer.status().code(), absl::StatusCode::kResourceExhausted)
      << buffer.status();
  // The backend is still usable afterwards.
  EXPECT_TRUE(gpu_.backend->Allocate(16).ok());
}

TEST_F(BackendParity, CopiesHonourOffsets) {
  auto buffer = gpu_.Upload({0, 0, 0, 0, 0, 0});
  ASSERT_TRUE(gpu_.backend->CopyFromHost({1, 2, 3}, buffer.get(), 2).ok());
  EXPECT_EQ(gpu_.Download(*buffer), (std::vector<float>{0, 0, 1, 2, 3, 0}));
  std::vector<float> out(2);
  ASSERT_TRUE(gpu_.backend->CopyToHost(*buffer, 3, absl::MakeSpan(out)).ok());
  EXPECT_EQ(out, (std::vector<float>{2, 3}));
}

// A pin page-locks the caller's memory until it goes; copies through it are
// exact; memory pinned already is refused with INVALID_ARGUMENT and stays
// usable.
TEST_F(BackendParity, PinHostLocksTheMemoryUntilThePinGoes) {
  std::vector<float> host(1 << 20);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i % 977);
  auto locked = [&] {
    cudaPointerAttributes attributes{};
    EXPECT_EQ(cudaPointerGetAttributes(&attributes, host.data()), cudaSuccess);
    return attributes.type == cudaMemoryTypeHost;
  };
  EXPECT_FALSE(locked());
  auto pin = gpu_.backend->PinHost(absl::MakeSpan(host));
  ASSERT_TRUE(pin.ok()) << pin.status();
  EXPECT_TRUE(locked());
  EXPECT_EQ(gpu_.backend->PinHost(absl::MakeSpan(host)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(locked());
  auto buffer = gpu_.backend->Allocate(host.size());
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  ASSERT_TRUE(gpu_.backend->CopyFromHost(host, buffer->get(), 0).ok());
  std::vector<float> back(host.size());
  ASSERT_TRUE(gpu_.backend->CopyToHost(**buffer, 0, absl::MakeSpan(back)).ok());
  EXPECT_EQ(back, host);
  pin->reset();
  EXPECT_FALSE(locked());
  EXPECT_TRUE(gpu_.backend->PinHost({}).ok());
  // The refused second pin left no error behind for later work.
  EXPECT_TRUE(gpu_.backend->Synchronize().ok());
}

// Every transpose combination over odd and model-like shapes, including
// k == 0 (C is only scaled) and beta != 0 (C is accumulated into).
TEST_F(BackendParity, GemmMatchesCpu) {
  for (int m : {1, 7, 64, 257}) {
    for (int n : {1, 10, 33}) {
      for (int k : {0, 1, 5, 129, 784}) {
        for (int t = 0; t < 4; ++t) {
          const Trans ta = (t & 1) ? Trans::kYes : Trans::kNo;
          const Trans tb = (t & 2) ? Trans::kYes : Trans::kNo;
          const std::vector<float> a = RandomVector(size_t(m) * k, 1);
          const std::vector<float> b = RandomVector(size_t(k) * n, 2);
          const std::vector<float> c0 = RandomVector(size_t(m) * n, 3);
          for (float beta : {0.0f, 0.5f}) {
            std::vector<std::vector<float>> results;
            for (Side* side : {&cpu_, &gpu_}) {
              auto da = side->Upload(a);
              auto db = side->Upload(b);
              auto dc = side->Upload(c0);
              ASSERT_TRUE(side->backend
                              ->Gemm(ta, tb, m, n, k, 1.5f, da->data(),
                                     db->data(), beta, dc->data())
                              .ok());
              results.push_back(side->Download(*dc));
            }
            EXPECT_LE(RelativeError(results[1], results[0]), kFp32Tolerance)
                << "m " << m << " n " << n << " k " << k << " trans " << t
                << " beta " << beta;
          }
        }
      }
    }
  }
}

TEST_F(BackendParity, ReducedPrecisionGemmIsClose) {
  const int m = 128, n = 96, k = 256;
  const std::vector<float> a = RandomVector(size_t(m) * k, 4);
  const std::vector<float> b = RandomVector(size_t(k) * n, 5);
  auto cpu_a = cpu_.Upload(a), cpu_b = cpu_.Upload(b);
  auto cpu_c = cpu_.Upload(std::vector<float>(size_t(m) * n));
  ASSERT_TRUE(cpu_.backend
                  ->Gemm(Trans::kNo, Trans::kNo, m, n, k, 1.0f, cpu_a->data(),
                         cpu_b->data(), 0.0f, cpu_c->data())
                  .ok());
  const std::vector<float> want = cpu_.Download(*cpu_c);
  for (auto [precision, tolerance] :
       {std::pair{GemmPrecision::kTf32, 1e-2f},
        std::pair{GemmPrecision::kBf16, 5e-2f}}) {
    CudaBackendOptions options;
    options.gemm_precision = precision;
    auto backend = MakeCudaBackend(options);
    ASSERT_TRUE(backend.ok()) << backend.status();
    Side side{std::move(backend).value()};
    auto da = side.Upload(a), db = side.Upload(b);
    auto dc = side.Upload(std::vector<float>(size_t(m) * n));
    ASSERT_TRUE(side.backend
                    ->Gemm(Trans::kNo, Trans::kNo, m, n, k, 1.0f, da->data(),
                           db->data(), 0.0f, dc->data())
                    .ok());
    EXPECT_LE(RelativeError(side.Download(*dc), want), tolerance)
        << static_cast<int>(precision);
  }
}

TEST_F(BackendParity, AddBiasAndColumnSum) {
  for (auto [rows, cols] : {std::pair{1, 1}, std::pair{3, 5}, std::pair{64, 33},
                            std::pair{1000, 10}, std::pair{257, 4097}}) {
    const std::vector<float> x = RandomVector(size_t(rows) * cols, 6);
    const std::vector<float> bias = RandomVector(cols, 7);
    std::vector<std::vector<float>> added, sums;
    for (Side* side : {&cpu_, &gpu_}) {
      auto dx = side->Upload(x);
      auto db = side->Upload(bias);
      auto dsum = side->Upload(std::vector<float>(cols, 42.0f));
      ASSERT_TRUE(side->backend->AddBias(rows, cols, db->data(), dx->data()).ok());
      ASSERT_TRUE(
          side->backend->ColumnSum(rows, cols, dx->data(), dsum->data()).ok());
      added.push_back(side->Download(*dx));
      sums.push_back(side->Download(*dsum));
    }
    EXPECT_LE(RelativeError(added[1], added[0]), kFp32Tolerance)
        << rows << "x" << cols;
    EXPECT_LE(RelativeError(sums[1], sums[0]), kFp32Tolerance)
        << rows << "x" << cols;
  }
}

TEST_F(BackendParity, AxpbyInAndOutOfPlace) {
  const int64_t n = 100003;
  const std::vector<float> x = RandomVector(n, 17);
  const std::vector<float> y = RandomVector(n, 18);
  std::vector<std::vector<float>> out, doubled;
  for (Side* side : {&cpu_, &gpu_}) {
    auto dx = side->Upload(x);
    auto dy = side->Upload(y);
    auto dz = side->Upload(std::vector<float>(n, std::nanf("")));
    ASSERT_TRUE(side->backend->Axpby(n, 0.25f, dx->data(), 1.0f, dy->data()).ok());
    ASSERT_TRUE(side->backend->Axpby(n, 3.0f, dx->data(), 0.0f, dz->data()).ok());
    ASSERT_TRUE(side->backend->Axpby(n, 1.0f, dz->data(), 1.0f, dz->data()).ok());
    out.push_back(side->Download(*dy));
    doubled.push_back(side->Download(*dz));
  }
  EXPECT_LE(RelativeError(out[1], out[0]), kFp32Tolerance);
  EXPECT_LE(RelativeError(doubled[1], doubled[0]), kFp32Tolerance);
}

// Pipeline gradient accumulation goes through Axpby, which must stay fp32
// when the GEMMs are tf32/bf16.
TEST(CudaBackendPrecision, AxpbyIsFp32UnderReducedPrecisionGemms) {
  SKIP_WITHOUT_CUDA_DEVICE();
  CudaBackendOptions options;
  options.gemm_precision = GemmPrecision::kBf16;
  auto backend = MakeCudaBackend(options);
  ASSERT_TRUE(backend.ok()) << backend.status();
  Side gpu{std::move(backend).value()};
  const std::vector<float> x = {1.0f + 1.0f / 1024, 3.14159265f, 1e-3f + 1e-7f};
  auto dx = gpu.Upload(x);
  auto dy = gpu.Upload(std::vector<float>(3, 0.0f));
  ASSERT_TRUE(gpu.backend->Axpby(3, 1.0f, dx->data(), 0.0f, dy->data()).ok());
  EXPECT_EQ(gpu.Download(*dy), x);  // bf16 would round every one of these.
}

TEST_F(BackendParity, ColumnSumOfNoRowsIsZero) {
  auto out = gpu_.Upload({1, 2, 3});
  ASSERT_TRUE(gpu_.backend->ColumnSum(0, 3, nullptr, out->data()).ok());
  EXPECT_EQ(gpu_.Download(*out), (std::vector<float>{0, 0, 0}));
}

TEST_F(BackendParity, ReluForwardAndBackwardInAndOutOfPlace) {
  const int64_t n = 100003;
  const std::vector<float> x = RandomVector(n, 8);
  const std::vector<float> dy = RandomVector(n, 9);
  for (bool in_place : {false, true}) {
    std::vector<std::vector<float>> ys, dxs;
    for (Side* side : {&cpu_, &gpu_}) {
      auto dx_in = side->Upload(x);
      auto y = in_place ? nullptr : side->Upload(std::vector<float>(n));
      float* y_ptr = in_place ? dx_in->data() : y->data();
      ASSERT_TRUE(side->backend->ReluForward(n, dx_in->data(), y_ptr).ok());
      auto grad = side->Upload(dy);
      auto out = in_place ? nullptr : side->Upload(std::vector<float>(n));
      float* out_ptr = in_place ? grad->data() : out->data();
      ASSERT_TRUE(
          side->backend->ReluBackward(n, y_ptr, grad->data(), out_ptr).ok());
      ys.push_back(side->Download(in_place ? *dx_in : *y));
      dxs.push_back(side->Download(in_place ? *grad : *out));
    }
    EXPECT_EQ(ys[1], ys[0]) << "in_place " << in_place;
    EXPECT_EQ(dxs[1], dxs[0]) << "in_place " << in_place;
  }
}

TEST_F(BackendParity, SoftmaxCrossEntropyIncludingLargeLogitsAndInPlace) {
  for (auto [rows, cols] : {std::pair{1, 1}, std::pair{5, 10},
                            std::pair{64, 3}, std::pair{33, 1000}}) {
    for (bool in_place : {false, true}) {
      // Logits of +-80 overflow exp() unless the row max is subtracted.
      const std::vector<float> logits =
          RandomVector(size_t(rows) * cols, 10, -80.0f, 80.0f);
      const std::vector<int32_t> labels = RandomLabels(rows, cols, 11);
      std::vector<float> losses;
      std::vector<std::vector<float>> grads;
      for (Side* side : {&cpu_, &gpu_}) {
        auto dl = side->Upload(logits);
        auto dlab = side->UploadLabels(labels);
        auto dg = in_place ? nullptr : side->Upload(std::vector<float>(logits.size()));
        float* g = in_place ? dl->data() : dg->data();
        auto loss = side->backend->SoftmaxCrossEntropy(rows, cols, dl->data(),
                                                       dlab->data(), g);
        ASSERT_TRUE(loss.ok()) << loss.status();
        losses.push_back(*loss);
        grads.push_back(side->Download(in_place ? *dl : *dg));
      }
      EXPECT_TRUE(std::isfinite(losses[1]));
      EXPECT_NEAR(losses[1], losses[0],
                  kFp32Tolerance * std::max(1.0f, std::fabs(losses[0])));
      EXPECT_LE(RelativeError(grads[1], grads[0]), kFp32Tolerance)
          << rows << "x" << cols << " in_place " << in_place;
    }
  }
}

TEST_F(BackendParity, SoftmaxCrossEntropyRejectsBadLabel) {
  auto logits = gpu_.Upload(RandomVector(20, 12));
  auto labels = gpu_.UploadLabels({0, 1, 10, 3});
  auto grad = gpu_.Upload(std::vector<float>(20));
  auto loss = gpu_.backend->SoftmaxCrossEntropy(4, 5, logits->data(),
                                                labels->data(), grad->data());
  EXPECT_EQ(loss.status().code(), absl::StatusCode::kInvalidArgument)
      << loss.status();
}

TEST_F(BackendParity, ArgmaxCorrectFirstMaximumWinsTies) {
  // Row 0 ties between classes 1 and 2: the first (1) is the prediction.
  const std::vector<float> tie = {0, 5, 5, 1};
  const std::vector<int32_t> labels = {1};
  for (Side* side : {&cpu_, &gpu_}) {
    auto dl = side->Upload(tie);
    auto dlab = side->UploadLabels(labels);
    auto correct = side->backend->ArgmaxCorrect(1, 4, dl->data(), dlab->data());
    ASSERT_TRUE(correct.ok());
    EXPECT_EQ(*correct, 1) << side->backend->Name();
  }
  const int rows = 1031, cols = 10;
  const std::vector<float> logits = RandomVector(size_t(rows) * cols, 13);
  const std::vector<int32_t> many = RandomLabels(rows, cols, 14);
  std::vector<int> counts;
  for (Side* side : {&cpu_, &gpu_}) {
    auto dl = side->Upload(logits);
    auto dlab = side->UploadLabels(many);
    auto correct =
        side->backend->ArgmaxCorrect(rows, cols, dl->data(), dlab->data());
    ASSERT_TRUE(correct.ok());
    counts.push_back(*correct);
  }
  EXPECT_EQ(counts[1], counts[0]);
}

// The asynchronous copy must wait for the GEMM that wrote its source (it runs
// on another stream) and must not be disturbed by work queued after it.
TEST_F(BackendParity, CopyToHostAsyncSeesEarlierWorkOnly) {
  const int m = 257, n = 129, k = 67;
  const std::vector<float> a = RandomVector(size_t(m) * k, 15);
  const std::vector<float> b = RandomVector(size_t(k) * n, 16);
  std::vector<std::vector<float>> results;
  for (Side* side : {&cpu_, &gpu_}) {
    Backend& backend = *side->backend;
    auto da = side->Upload(a);
    auto db = side->Upload(b);
    auto dc = backend.Allocate(size_t(m) * n);
    auto scratch = backend.Allocate(size_t(m) * n);
    ASSERT_TRUE(dc.ok() && scratch.ok());
    ASSERT_TRUE(backend.Gemm(Trans::kNo, Trans::kNo, m, n, k, 1.0f, da->data(),
                             db->data(), 0.0f, (*dc)->data())
                    .ok());
    auto host = backend.AllocateHost(size_t(m) * n - 7);
    ASSERT_TRUE(host.ok()) << host.status();
    auto copied = backend.CopyToHostAsync(
        **dc, 7, absl::MakeSpan((*host)->data(), (*host)->size()));
    ASSERT_TRUE(copied.ok()) << copied.status();
    for (int i = 0; i < 4; ++i) {
      ASSERT_TRUE(backend.Gemm(Trans::kNo, Trans::kNo, m, n, k, 1.0f,
                               da->data(), db->data(), 0.0f,
                               (*scratch)->data())
                      .ok());
    }
    ASSERT_TRUE((*copied)->Wait().ok());
    ASSERT_TRUE((*copied)->Wait().ok());  // Waiting again is allowed.
    results.emplace_back((*host)->data(), (*host)->data() + (*host)->size());
    ASSERT_TRUE(backend.Synchronize().ok());
  }
  EXPECT_LE(RelativeError(results[1], results[0]), kFp32Tolerance);
}

TEST_F(BackendParity, CopyToHostAsyncRejectsRangesOutsideTheSource) {
  auto buffer = gpu_.backend->Allocate(4096);
  auto host = gpu_.backend->AllocateHost(1000);
  ASSERT_TRUE(buffer.ok() && host.ok());
  const absl::Span<float> dst((*host)->data(), (*host)->size());
  EXPECT_EQ(gpu_.backend->CopyToHostAsync(**buffer, 4000, dst).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto empty = gpu_.backend->CopyToHostAsync(**buffer, 4096, dst.subspan(0, 0));
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE((*empty)->Wait().ok());
}

// A whole model: same parameters and batches on both backends, then the
// loss, every gradient and the accuracy count must agree.
void CheckMlpParity(const char* text, int batch, Side& cpu, Side& gpu) {
  auto spec = ModelSpec::Parse(text);
  ASSERT_TRUE(spec.ok()) << spec.status();
  std::vector<std::unique_ptr<Mlp>> mlps;
  for (Side* side : {&cpu, &gpu}) {
    auto mlp = Mlp::Create(*spec, side->backend.get(), /*max_batch=*/batch);
    ASSERT_TRUE(mlp.ok()) << mlp.status();
    mlps.push_back(std::move(mlp).value());
  }
  const std::vector<ParamInfo>& params = mlps[0]->params();
  for (size_t i = 0; i < params.size(); ++i) {
    size_t size = 1;
    for (int64_t d : params[i].shape) size *= d;
    // Scaled like He initialisation so activations stay O(1) through layers.
    const float a = std::sqrt(6.0f / params[i].shape[0]);
    const std::vector<float> values = RandomVector(size, 100 + i, -a, a);
    for (auto& mlp : mlps) ASSERT_TRUE(mlp->SetParam(i, values).ok());
  }
  for (int step = 0; step < 2; ++step) {
    const std::vector<float> x =
        RandomVector(size_t(batch) * mlps[0]->input_dim(), 200 + step);
    const std::vector<int32_t> labels =
        RandomLabels(batch, mlps[0]->num_classes(), 300 + step);
    std::vector<float> losses;
    std::vector<int> ready_order[2];
    for (int s = 0; s < 2; ++s) {
      auto loss = mlps[s]->ForwardBackward(
          x.data(), labels.data(), batch,
          [&, s](int i) { ready_order[s].push_back(i); });
      ASSERT_TRUE(loss.ok()) << loss.status();
      losses.push_back(*loss);
    }
    EXPECT_NEAR(losses[1], losses[0], kFp32Tolerance * std::fabs(losses[0]));
    EXPECT_EQ(ready_order[1], ready_order[0]);
    for (size_t i = 0; i < params.size(); ++i) {
      std::vector<float> grads[2];
      for (int s = 0; s < 2; ++s) {
        size_t size = 1;
        for (int64_t d : params[i].shape) size *= d;
        grads[s].resize(size);
        ASSERT_TRUE(mlps[s]->GetGrad(i, absl::MakeSpan(grads[s])).ok());
      }
      EXPECT_LE(RelativeError(grads[1], grads[0]), kFp32Tolerance)
          << params[i].name << " step " << step;
    }
    std::vector<int> correct;
    for (auto& mlp : mlps) {
      auto c = mlp->CountCorrect(x.data(), labels.data(), batch);
      ASSERT_TRUE(c.ok()) << c.status();
      correct.push_back(*c);
    }
    EXPECT_EQ(correct[1], correct[0]);
  }
}


// Shapes include odd widths, a width-1 bottleneck and the default model.
TEST_F(BackendParity, MlpForwardBackwardMatchesCpu) {
  for (const char* text : {"mlp:7-5-3", "mlp:13-1-2", "mlp:784-33-17-10",
                           "mlp:784-256-128-10"}) {
    for (int batch : {1, 5, 64}) {
      SCOPED_TRACE(testing::Message() << text << " batch " << batch);
      CheckMlpParity(text, batch, cpu_, gpu_);
    }
  }
}

// The other side of the precondition: without a device the factory refuses
// cleanly instead of crashing. Skipped where a device exists.
TEST(CudaBackendWithoutDevice, FactoryIsFailedPrecondition) {
  if (CudaDeviceAvailable()) GTEST_SKIP() << "a CUDA device is present";
  auto backend = MakeCudaBackend(CudaBackendOptions());
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kFailedPrecondition)
      << backend.status();
}

TEST(CudaBackendDevices, BadOrdinalIsFailedPrecondition) {
  SKIP_WITHOUT_CUDA_DEVICE();
  CudaBackendOptions options;
  options.device = 1 << 20;
  EXPECT_EQ(MakeCudaBackend(options).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace shardtrain::worker
