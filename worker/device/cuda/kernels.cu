// The CUDA backend's kernels: plain __global__ functions with bounds guards,
// launched through LinearLaunch. Pointers that a Backend method allows to
// alias (ReLU in place, dlogits == logits) are deliberately not __restrict__.
#include <cfloat>
#include <cstdint>

#include "worker/device/cuda/internal/kernels.h"

namespace shardtrain::worker::cuda::internal {
namespace {

constexpr int kThreads = 256;
// Enough blocks to fill any current GPU several times over; larger inputs are
// covered by grid-stride loops.
constexpr int64_t kMaxBlocks = 65536;

struct Launch {
  unsigned blocks;
  unsigned threads;
};

// The one sizing helper for elementwise kernels over n items.
Launch LinearLaunch(int64_t n) {
  int64_t blocks = (n + kThreads - 1) / kThreads;
  if (blocks < 1) blocks = 1;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  return {static_cast<unsigned>(blocks), static_cast<unsigned>(kThreads)};
}

__device__ int64_t GlobalIndex() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ int64_t GridStride() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

__global__ void ScaleKernel(int64_t n, float beta, float* __restrict__ x) {
  for (int64_t i = GlobalIndex(); i < n; i += GridStride()) {
    x[i] = beta == 0.0f ? 0.0f : beta * x[i];
  }
}

// x and y may be the same array, so neither is __restrict__.
__global__ void AxpbyKernel(int64_t n, float alpha, const float* x, float beta,
                            float* y) {
  for (int64_t i = GlobalIndex(); i < n; i += GridStride()) {
    y[i] = beta == 0.0f ? alpha * x[i] : alpha * x[i] + beta * y[i];
  }
}

__global__ void AddBiasKernel(int64_t n, int cols,
                              const float* __restrict__ bias,
                              float* __restrict__ x) {
  for (int64_t i = GlobalIndex(); i < n; i += GridStride()) {
    x[i] += bias[i % cols];
  }
}

// Block (32, kColumnSumRows): threadIdx.x picks a column, so reads of a row
// are coalesced; threadIdx.y strides over rows and the partial sums are
// combined in shared memory in a fixed order (deterministic results).
constexpr int kColumnSumRows = 8;

__global__ void ColumnSumKernel(int rows, int cols,
                                const float* __restrict__ x,
                                float* __restrict__ out) {
  __shared__ float partial[kColumnSumRows][32];
  const int c = blockIdx.x * 32 + threadIdx.x;
  float sum = 0.0f;
  if (c < cols) {
    for (int r = threadIdx.y; r < rows; r += kColumnSumRows) {
      sum += x[static_cast<int64_t>(r) * cols + c];
    }
  }
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float total = 0.0f;
    for (int i = 0; i < kColumnSumRows; ++i) total += partial[i][threadIdx.x];
    out[c] = total;
  }
}

__global__ void ReluForwardKernel(int64_t n, const float* x, float* y) {
  for (int64_t i = GlobalIndex(); i < n; i += GridStride()) {
    y[i] = x[i] > 0.0f ? x[i] : 0.0f;
  }
}

__global__ void ReluBackwardKernel(int64_t n, const float* __restrict__ y,
                                   const float* dy, float* dx) {
  for (int64_t i = GlobalIndex(); i < n; i += GridStride()) {
    dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
  }
}

// Block-wide reduction of one value per thread; every thread gets the result.
// `scratch` holds blockDim.x / 32 floats.
template <typename Op>
__device__ float BlockReduce(float v, float* scratch, Op op) {
  for (int offset = 16; offset > 0; offset /= 2) {
    v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int warps = blockDim.x / 32;
  __syncthreads();  // scratch may still be read by a previous reduction.
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = scratch[0];
  for (int w = 1; w < warps; ++w) v = op(v, scratch[w]);
  return v;
}

struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};

// One block per row. Subtracting the row max keeps expf from overflowing.
__global__ void SoftmaxCrossEntropyKernel(int cols, float inv_rows,
                                          const float* logits,
                                          const int32_t* __restrict__ labels,
                                          float* dlogits,
                                          float* __restrict__ row_loss,
                                          int32_t* __restrict__ bad_label) {
  __shared__ float scratch[kThreads / 32];
  const int r = blockIdx.x;
  const float* in = logits + static_cast<int64_t>(r) * cols;
  float* out = dlogits + static_cast<int64_t>(r) * cols;
  const int32_t label = labels[r];
  const bool label_ok = label >= 0 && label < cols;

  float m = -FLT_MAX;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, in[c]);
  m = BlockReduce(m, scratch, MaxOp());
  float s = 0.0f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) s += expf(in[c] - m);
  s = BlockReduce(s, scratch, SumOp());
  // Read before any thread overwrites the row: out may alias in. The
  // barriers inside BlockReduce order every read above before the writes.
  const float label_logit = label_ok ? in[label] : 0.0f;
  __syncthreads();

  const float scale = inv_rows / s;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    float g = expf(in[c] - m) * scale;
    if (c == label) g -= inv_rows;
    out[c] = g;
  }
  if (threadIdx.x == 0) {
    if (label_ok) {
      row_loss[r] = m + logf(s) - label_logit;
    } else {
      row_loss[r] = __int_as_float(0x7fc00000);  // NaN
      *bad_label = 1;
    }
  }
}

// One thread per row: the class count of a classifier is small, so a
// sequential scan per row is simpler than a reduction and keeps "first
// maximum wins" trivially.
__global__ void ArgmaxCorrectKernel(int rows, int cols,
                                    const float* __restrict__ logits,
                                    const int32_t* __restrict__ labels,
                                    int32_t* __restrict__ correct) {
  for (int64_t r = GlobalIndex(); r < rows; r += GridStride()) {
    const float* in = logits + r * cols;
    int best = 0;
    for (int c = 1; c < cols; ++c) {
      if (in[c] > in[best]) best = c;
    }
    if (best == labels[r]) atomicAdd(correct, 1);
  }
}

}  // namespace

cudaError_t LaunchScale(int64_t n, float beta, float* x, cudaStream_t stream) {
  const Launch l = LinearLaunch(n);
  ScaleKernel<<<l.blocks, l.threads, 0, stream>>>(n, beta, x);
  return cudaGetLastError();
}

cudaError_t LaunchAxpby(int64_t n, float alpha, const float* x, float beta,
                        float* y, cudaStream_t stream) {
  const Launch l = LinearLaunch(n);
  AxpbyKernel<<<l.blocks, l.threads, 0, stream>>>(n, alpha, x, beta, y);
  return cudaGetLastError();
}

cudaError_t LaunchAddBias(int rows, int cols, const float* bias, float* x,
                          cudaStream_t stream) {
  const int64_t n = static_cast<int64_t>(rows) * cols;
  const Launch l = LinearLaunch(n);
  AddBiasKernel<<<l.blocks, l.threads, 0, stream>>>(n, cols, bias, x);
  return cudaGetLastError();
}

cudaError_t LaunchColumnSum(int rows, int cols, const float* x, float* out,
                            cudaStream_t stream) {
  const dim3 threads(32, kColumnSumRows);
  const dim3 blocks((cols + 31) / 32);
  ColumnSumKernel<<<blocks, threads, 0, stream>>>(rows, cols, x, out);
  return cudaGetLastError();
}

cudaError_t LaunchReluForward(int64_t n, const float* x, float* y,
                              cudaStream_t stream) {
  const Launch l = LinearLaunch(n);
  ReluForwardKernel<<<l.blocks, l.threads, 0, stream>>>(n, x, y);
  return cudaGetLastError();
}

cudaError_t LaunchReluBackward(int64_t n, const float* y, const float* dy,
                               float* dx, cudaStream_t stream) {
  const Launch l = LinearLaunch(n);
  ReluBackwardKernel<<<l.blocks, l.threads, 0, stream>>>(n, y, dy, dx);
  return cudaGetLastError();
}

cudaError_t LaunchSoftmaxCrossEntropy(int rows, int cols, float inv_rows,
                                      const float* logits,
                                      const int32_t* labels, float* dlogits,
                                      float* row_loss, int32_t* bad_label,
                                      cudaStream_t stream) {
  // One block per row; a narrow row (e.g. 10 classes) still gets a full
  // warp, wider rows up to kThreads threads.
  int threads = 32;
  while (threads < kThreads && threads < cols) threads *= 2;
  SoftmaxCrossEntropyKernel<<<rows, threads, 0, stream>>>(
      cols, inv_rows, logits, labels, dlogits, row_loss, bad_label);
  return cudaGetLastError();
}

cudaError_t LaunchArgmaxCorrect(int rows, int cols, const float* logits,
                                const int32_t* labels, int32_t* correct,
                                cudaStream_t stream) {
  const Launch l = LinearLaunch(rows);
  ArgmaxCorrectKernel<<<l.blocks, l.threads, 0, stream>>>(rows, cols, logits,
                                                          labels, correct);
  return cudaGetLastError();
}

}  // namespace shardtrain::worker::cuda::internal
