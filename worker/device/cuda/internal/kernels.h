// Host-side launchers of the CUDA backend's kernels (defined in kernels.cu).
//
// Each launches on `stream` and returns cudaGetLastError() (launch errors
// only; execution errors surface at the next synchronisation). Pointers are
// device memory; shapes are those of the matching Backend method and have
// already been validated (non-negative, at least one output element).
// Host-only header: includes no kernel code.
#ifndef SHARDTRAIN_WORKER_DEVICE_CUDA_INTERNAL_KERNELS_H_
#define SHARDTRAIN_WORKER_DEVICE_CUDA_INTERNAL_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace shardtrain::worker::cuda::internal {

// x[i] = beta == 0 ? 0 : beta * x[i] for i < n (NaNs cleared when beta == 0).
cudaError_t LaunchScale(int64_t n, float beta, float* x, cudaStream_t stream);

// y[i] = alpha * x[i] + beta * y[i] for i < n (y[i] = alpha * x[i] when
// beta == 0); x may equal y.
cudaError_t LaunchAxpby(int64_t n, float alpha, const float* x, float beta,
                        float* y, cudaStream_t stream);

// x[r, c] += bias[c].
cudaError_t LaunchAddBias(int rows, int cols, const float* bias, float* x,
                          cudaStream_t stream);

// out[c] = sum_r x[r, c]; rows may be 0 (out becomes zeros).
cudaError_t LaunchColumnSum(int rows, int cols, const float* x, float* out,
                            cudaStream_t stream);

// y = max(x, 0); y may equal x.
cudaError_t LaunchReluForward(int64_t n, const float* x, float* y,
                              cudaStream_t stream);

// dx = y > 0 ? dy : 0; dx may equal dy.
cudaError_t LaunchReluBackward(int64_t n, const float* y, const float* dy,
                               float* dx, cudaStream_t stream);

// Per row r: row_loss[r] = logsumexp(logits[r]) - logits[r, labels[r]] and
// dlogits[r] = (softmax(logits[r]) - onehot(labels[r])) * inv_rows.
// dlogits may equal logits. A label outside [0, cols) sets *bad_label to 1
// and row_loss[r] to NaN; that row's dlogits are then unspecified.
cudaError_t LaunchSoftmaxCrossEntropy(int rows, int cols, float inv_rows,
                                      const float* logits,
                                      const int32_t* labels, float* dlogits,
                                      float* row_loss, int32_t* bad_label,
                                      cudaStream_t stream);

// *correct += number of rows whose first argmax equals the label.
// REQUIRES: *correct was zeroed on `stream` beforehand.
cudaError_t LaunchArgmaxCorrect(int rows, int cols, const float* logits,
                                const int32_t* labels, int32_t* correct,
                                cudaStream_t stream);

}  // namespace shardtrain::worker::cuda::internal

#endif  // SHARDTRAIN_WORKER_DEVICE_CUDA_INTERNAL_KERNELS_H_
