// gemm_bench: GEMM throughput of the CUDA backend for the shapes of an MLP
// (default mlp:784-4096-4096-10) at several batch sizes, as a fraction of the
// best cuBLAS rate for the same shapes measured in the same run.
//
// For each layer [in -> out] and batch B, three row-major GEMMs as Mlp issues
// them: forward y = x·W (B x out x in), weight gradient dW = xᵀ·dy
// (in x out x B) and input gradient dx = dy·Wᵀ (B x in x out). Each runs at
// three precisions: fp32, TF32 and BF16 (tensor cores, fp32 accumulation).
// The baseline is the fastest of: cublasGemmEx (default and tensor-op
// algorithm selection) and up to --lt_algos cublasLt heuristic algorithms
// with a 32 MiB workspace at the same compute type; for BF16 also cublasGemmEx
// on bf16-stored inputs (what the backend would get if it kept bf16 copies).
//
//   gemm_bench --out=gemm_bench.tsv [--batches=64,256,1024] [--iters=50]
//
// Without a CUDA device it prints why and exits 0.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "app/deadlock_detection.h"
#include "common/status_macros.h"
#include "worker/device/cuda/cublas_handle.h"
#include "worker/device/cuda/cuda_backend.h"
#include "worker/device/cuda/cuda_status.h"
#include "worker/device/cuda/cuda_stream.h"
#include "worker/device/cuda/device_memory.h"

ABSL_FLAG(std::string, out, "gemm_bench.tsv", "Write the results table here");
ABSL_FLAG(std::string, layers, "784-4096-4096-10", "MLP layer sizes");
ABSL_FLAG(std::string, batches, "64,256,1024", "Batch sizes");
ABSL_FLAG(int, iters, 50, "Timed iterations per measurement");
ABSL_FLAG(int, warmup, 5, "Untimed iterations before each measurement");
ABSL_FLAG(int, lt_algos, 8, "cublasLt heuristic algorithms tried per shape");
ABSL_FLAG(int, device, 0, "CUDA device ordinal");

namespace {

using namespace shardtrain;  // NOLINT: a binary's main file
using worker::GemmPrecision;
using worker::Trans;

constexpr size_t kWorkspaceBytes = size_t{32} << 20;

struct Shape {
  std::string op;  // fwd, dW, dx
  int layer;
  Trans ta, tb;
  int m, n, k;
};

const char* PrecisionName(GemmPrecision p) {
  switch (p) {
    case GemmPrecision::kTf32: return "tf32";
    case GemmPrecision::kBf16: return "bf16";
    case GemmPrecision::kFp32: break;
  }
  return "fp32";
}

cublasComputeType_t ComputeType(GemmPrecision p) {
  switch (p) {
    case GemmPrecision::kTf32: return CUBLAS_COMPUTE_32F_FAST_TF32;
    case GemmPrecision::kBf16: return CUBLAS_COMPUTE_32F_FAST_16BF;
    case GemmPrecision::kFp32: break;
  }
  return CUBLAS_COMPUTE_32F;
}

// Milliseconds per call of `fn` on `stream`; fn returns a Status per call.
absl::StatusOr<double> TimeMs(cudaStream_t stream,
                              const std::function<absl::Status()>& fn) {
  for (int i = 0; i < absl::GetFlag(FLAGS_warmup); ++i) RETURN_IF_ERROR(fn());
  ASSIGN_OR_RETURN(auto start, worker::cuda::CudaEvent::Create(true));
  ASSIGN_OR_RETURN(auto stop, worker::cuda::CudaEvent::Create(true));
  const int iters = std::max(1, absl::GetFlag(FLAGS_iters));
  RETURN_IF_ERROR(start.Record(stream));
  for (int i = 0; i < iters; ++i) RETURN_IF_ERROR(fn());
  RETURN_IF_ERROR(stop.Record(stream));
  RETURN_IF_ERROR(stop.Synchronize());
  ASSIGN_OR_RETURN(float ms, stop.ElapsedMsSince(start));
  return static_cast<double>(ms) / iters;
}

template <typename T, absl::Status (*Destroy)(T)>
struct LtDeleter {
  void operator()(T p) const { Destroy(p).IgnoreError(); }
};
absl::Status DestroyDesc(cublasLtMatmulDesc_t d) {
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescDestroy(d));
  return absl::OkStatus();
}
absl::Status DestroyLayout(cublasLtMatrixLayout_t l) {
  CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutDestroy(l));
  return absl::OkStatus();
}
absl::Status DestroyPref(cublasLtMatmulPreference_t p) {
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceDestroy(p));
  return absl::OkStatus();
}
using DescPtr = std::unique_ptr<std::remove_pointer_t<cublasLtMatmulDesc_t>,
                                LtDeleter<cublasLtMatmulDesc_t, DestroyDesc>>;
using LayoutPtr =
    std::unique_ptr<std::remove_pointer_t<cublasLtMatrixLayout_t>,
                    LtDeleter<cublasLtMatrixLayout_t, DestroyLayout>>;
using PrefPtr =
    std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>,
                    LtDeleter<cublasLtMatmulPreference_t, DestroyPref>>;

absl::StatusOr<LayoutPtr> Layout(cudaDataType_t type, int rows, int cols,
                                 int ld) {
  cublasLtMatrixLayout_t layout = nullptr;
  CUBLAS_RETURN_IF_ERROR(
      cublasLtMatrixLayoutCreate(&layout, type, rows, cols, ld));
  return LayoutPtr(layout);
}

class Bench {
 public:
  absl::Status Init(int device, size_t max_elements) {
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    for (GemmPrecision p : {GemmPrecision::kFp32, GemmPrecision::kTf32,
                            GemmPrecision::kBf16}) {
      worker::CudaBackendOptions options;
      options.device = device;
      options.gemm_precision = p;
      ASSIGN_OR_RETURN(auto backend, worker::CudaBackend::Create(options));
      backends_.push_back(std::move(backend));
    }
    cudaStream_t stream = backends_[0]->stream();
    ASSIGN_OR_RETURN(blas_, worker::cuda::CublasHandle::Create(stream));
    CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&lt_));
    ASSIGN_OR_RETURN(workspace_,
                     worker::cuda::DeviceMemory<char>::Create(kWorkspaceBytes));
    // Random operands: timings on all-zero data can flatter tensor cores.
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<float> host(max_elements);
    std::vector<uint16_t> host_bf16(max_elements);
    for (size_t i = 0; i < max_elements; ++i) {
      host[i] = dist(rng);
      uint32_t bits;
      std::memcpy(&bits, &host[i], 4);
      host_bf16[i] = static_cast<uint16_t>(bits >> 16);
    }
    for (int i = 0; i < 3; ++i) {
      ASSIGN_OR_RETURN(f32_[i],
                       worker::cuda::DeviceMemory<float>::Create(max_elements));
      CUDA_RETURN_IF_ERROR(cudaMemcpy(f32_[i].data(), host.data(),
                                      f32_[i].bytes(), cudaMemcpyHostToDevice));
    }
    for (int i = 0; i < 2; ++i) {
      ASSIGN_OR_RETURN(bf16_[i], worker::cuda::DeviceMemory<uint16_t>::Create(
                                     max_elements));
      CUDA_RETURN_IF_ERROR(cudaMemcpy(bf16_[i].data(), host_bf16.data(),
                                      bf16_[i].bytes(),
                                      cudaMemcpyHostToDevice));
    }
    return absl::OkStatus();
  }
  ~Bench() {
    if (lt_ != nullptr) cublasLtDestroy(lt_);
  }

  // Backend milliseconds per call.
  absl::StatusOr<double> BackendMs(int precision_index, const Shape& s) {
    worker::CudaBackend* backend = backends_[precision_index].get();
    const float* a = f32_[0].data();
    const float* b = f32_[1].data();
    float* c = f32_[2].data();
    return TimeMs(backend->stream(), [&] {
      return backend->Gemm(s.ta, s.tb, s.m, s.n, s.k, 1.0f, a, b, 0.0f, c);
    });
  }

  // The fastest cuBLAS variant at the same precision: milliseconds and name.
  absl::Status BestCublasMs(GemmPrecision p, const Shape& s, double* best_ms,
                            std::string* best_name) {
    cudaStream_t stream = backends_[0]->stream();
    *best_ms = 1e30;
    auto consider = [&](const std::string& name, double ms) {
      if (ms < *best_ms) {
        *best_ms = ms;
        *best_name = name;
      }
    };
    const bool ta = s.ta == Trans::kYes, tb = s.tb == Trans::kYes;
    const int lda = ta ? s.m : s.k, ldb = tb ? s.k : s.n;
    const cublasOperation_t op_b = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_a = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    const float alpha = 1.0f, beta = 0.0f;
    auto gemm_ex = [&](cudaDataType_t in_type, const void* a, const void* b,
                       cublasComputeType_t compute, cublasGemmAlgo_t algo) {
      return [=, &alpha, &beta]() -> absl::Status {
        CUBLAS_RETURN_IF_ERROR(cublasGemmEx(
            blas_.get(), op_b, op_a, s.n, s.m, s.k, &alpha, b, in_type, ldb, a,
            in_type, lda, &beta, f32_[2].data(), CUDA_R_32F, s.n, compute,
            algo));
        return absl::OkStatus();
      };
    };
    const cublasComputeType_t compute = ComputeType(p);
    for (auto [algo, name] :
         {std::pair{CUBLAS_GEMM_DEFAULT, "gemmex"},
          std::pair{CUBLAS_GEMM_DEFAULT_TENSOR_OP, "gemmex_tensor_op"}}) {
      ASSIGN_OR_RETURN(double ms,
                       TimeMs(stream, gemm_ex(CUDA_R_32F, f32_[0].data(),
                                              f32_[1].data(), compute, algo)));
      consider(name, ms);
    }
    if (p == GemmPrecision::kBf16) {
      ASSIGN_OR_RETURN(double ms, TimeMs(stream, gemm_ex(CUDA_R_16BF,
                                                         bf16_[0].data(),
                                                         bf16_[1].data(),
                                                         CUBLAS_COMPUTE_32F,
                                                         CUBLAS_GEMM_DEFAULT)));
      consider("gemmex_bf16_inputs", ms);
    }

    // cublasLt: the column-major problem Cᵀ[n,m] = op(B)ᵀ·op(A)ᵀ.
    cublasLtMatmulDesc_t raw_desc = nullptr;
    CUBLAS_RETURN_IF_ERROR(
        cublasLtMatmulDescCreate(&raw_desc, compute, CUDA_R_32F));
    DescPtr desc(raw_desc);
    CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        desc.get(), CUBLASLT_MATMUL_DESC_TRANSA, &op_b, sizeof(op_b)));
    CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        desc.get(), CUBLASLT_MATMUL_DESC_TRANSB, &op_a, sizeof(op_a)));
    ASSIGN_OR_RETURN(LayoutPtr layout_b,
                     Layout(CUDA_R_32F, tb ? s.k : s.n, tb ? s.n : s.k, ldb));
    ASSIGN_OR_RETURN(LayoutPtr layout_a,
                     Layout(CUDA_R_32F, ta ? s.m : s.k, ta ? s.k : s.m, lda));
    ASSIGN_OR_RETURN(LayoutPtr layout_c, Layout(CUDA_R_32F, s.n, s.m, s.n));
    cublasLtMatmulPreference_t raw_pref = nullptr;
    CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&raw_pref));
    PrefPtr pref(raw_pref);
    const size_t workspace_bytes = kWorkspaceBytes;
    CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
        pref.get(), CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
        sizeof(workspace_bytes)));
    const int wanted = std::max(1, absl::GetFlag(FLAGS_lt_algos));
    std::vector<cublasLtMatmulHeuristicResult_t> results(wanted);
    int returned = 0;
    CUBLAS_RETURN_IF_ERROR(cublasLtMatmulAlgoGetHeuristic(
        lt_, desc.get(), layout_b.get(), layout_a.get(), layout_c.get(),
        layout_c.get(), pref.get(), wanted, results.data(), &returned));
    for (int i = 0; i < returned; ++i) {
      const cublasLtMatmulAlgo_t* algo = &results[i].algo;
      absl::StatusOr<double> ms = TimeMs(stream, [&]() -> absl::Status {
        CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(
            lt_, desc.get(), &alpha, f32_[1].data(), layout_b.get(),
            f32_[0].data(), layout_a.get(), &beta, f32_[2].data(),
            layout_c.get(), f32_[2].data(), layout_c.get(), algo,
            workspace_.data(), kWorkspaceBytes, stream));
        return absl::OkStatus();
      });
      // An algorithm the heuristic offered may still refuse this problem.
      if (ms.ok()) consider(absl::StrFormat("lt_algo%d", i), *ms);
    }
    return absl::OkStatus();
  }

 private:
  std::vector<std::unique_ptr<worker::CudaBackend>> backends_;  // fp32, tf32, bf16
  worker::cuda::CublasHandle blas_;  // On backends_[0]'s stream.
  cublasLtHandle_t lt_ = nullptr;    // Owned.
  worker::cuda::DeviceMemory<char> workspace_;
  worker::cuda::DeviceMemory<float> f32_[3];      // A, B, C
  worker::cuda::DeviceMemory<uint16_t> bf16_[2];  // A, B as bf16
};

absl::StatusOr<std::vector<int>> ParseInts(const std::string& text, char sep) {
  std::vector<int> out;
  for (absl::string_view part : absl::StrSplit(text, sep, absl::SkipEmpty())) {
    int v = 0;
    if (!absl::SimpleAtoi(part, &v) || v < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("expected positive integers, got '", text, "'"));
    }
    out.push_back(v);
  }
  if (out.empty()) return absl::InvalidArgumentError("empty list");
  return out;
}

absl::Status Run() {
  ASSIGN_OR_RETURN(std::vector<int> sizes,
                   ParseInts(absl::GetFlag(FLAGS_layers), '-'));
  ASSIGN_OR_RETURN(std::vector<int> batches,
                   ParseInts(absl::GetFlag(FLAGS_batches), ','));
  if (sizes.size() < 2) {
    return absl::InvalidArgumentError("--layers needs at least two sizes");
  }
  size_t max_elements = 1;
  std::vector<std::pair<int, Shape>> work;  // (batch, shape)
  for (int batch : batches) {
    for (size_t l = 0; l + 1 < sizes.size(); ++l) {
      const int in = sizes[l], out = sizes[l + 1];
      const int layer = static_cast<int>(l);
      work.push_back({batch, {"fwd", layer, Trans::kNo, Trans::kNo, batch, out, in}});
      work.push_back({batch, {"dW", layer, Trans::kYes, Trans::kNo, in, out, batch}});
      work.push_back({batch, {"dx", layer, Trans::kNo, Trans::kYes, batch, in, out}});
      max_elements = std::max({max_elements, size_t(batch) * in,
                               size_t(batch) * out, size_t(in) * out});
    }
  }
  Bench bench;
  RETURN_IF_ERROR(bench.Init(absl::GetFlag(FLAGS_device), max_elements));

  std::ofstream out(absl::GetFlag(FLAGS_out));
  if (!out) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot write --out=", absl::GetFlag(FLAGS_out)));
  }
  const std::string header =
      "precision\tbatch\tlayer\top\tm\tn\tk\tbackend_tflops\tbest_tflops\t"
      "fraction_of_best\tbest_variant";
  out << header << "\n";
  std::cout << header << "\n";
  const GemmPrecision precisions[] = {GemmPrecision::kFp32,
                                      GemmPrecision::kTf32,
                                      GemmPrecision::kBf16};
  for (int pi = 0; pi < 3; ++pi) {
    double sum_backend_ms = 0, sum_best_ms = 0;
    for (const auto& [batch, s] : work) {
      ASSIGN_OR_RETURN(double backend_ms, bench.BackendMs(pi, s));
      double best_ms = 0;
      std::string best_name;
      RETURN_IF_ERROR(bench.BestCublasMs(precisions[pi], s, &best_ms, &best_name));
      const double flop = 2.0 * s.m * s.n * s.k;
      const std::string line = absl::StrFormat(
          "%s\t%d\t%d\t%s\t%d\t%d\t%d\t%.2f\t%.2f\t%.3f\t%s",
          PrecisionName(precisions[pi]), batch, s.layer, s.op, s.m, s.n, s.k,
          flop / backend_ms * 1e-9, flop / best_ms * 1e-9, best_ms / backend_ms,
          best_name);
      out << line << "\n";
      std::cout << line << std::endl;
      sum_backend_ms += backend_ms;
      sum_best_ms += best_ms;
    }
    const std::string total = absl::StrFormat(
        "# %s: all shapes together (time-weighted), the backend runs at %.3f "
        "of the best cuBLAS rate",
        PrecisionName(precisions[pi]), sum_best_ms / sum_backend_ms);
    out << total << "\n";
    std::cout << total << std::endl;
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  shardtrain::app::SkipDeadlockDetectionInRelease();
  absl::SetProgramUsageMessage(
      "CUDA backend GEMM throughput vs. the best cuBLAS in the same run");
  absl::ParseCommandLine(argc, argv);
  if (!shardtrain::worker::CudaDeviceAvailable()) {
    std::cout << "gemm_bench: no CUDA device is present (no GPU visible or no "
                 "driver loaded); nothing to measure"
              << std::endl;
    return 0;
  }
  const absl::Status status = Run();
  if (!status.ok()) {
    std::cerr << "gemm_bench: " << status << std::endl;
    return 1;
  }
  std::cout << "wrote " << absl::GetFlag(FLAGS_out) << std::endl;
  return 0;
}
