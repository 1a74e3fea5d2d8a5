// Test helpers for GPU tests: they skip themselves on machines without a
// CUDA device, so the CPU-only CI stays green and a GPU machine runs them.
#ifndef SHARDTRAIN_WORKER_DEVICE_CUDA_CUDA_TEST_UTIL_H_
#define SHARDTRAIN_WORKER_DEVICE_CUDA_CUDA_TEST_UTIL_H_

#include "gtest/gtest.h"
#include "worker/device/cuda/cuda_backend.h"

#define SKIP_WITHOUT_CUDA_DEVICE()                                \
  do {                                                            \
    if (!::shardtrain::worker::CudaDeviceAvailable()) {           \
      GTEST_SKIP() << "no CUDA device on this machine";           \
    }                                                             \
  } while (0)

#endif  // SHARDTRAIN_WORKER_DEVICE_CUDA_CUDA_TEST_UTIL_H_
