// MakeCpuBackend: the reference Backend, running on the host CPU.
//
// GEMM goes to OpenBLAS (cblas_sgemm); the elementwise and reduction kernels
// are plain loops over __restrict pointers that the compiler vectorises.
// "Device" memory is 64-byte-aligned host memory, so copies are memcpy and
// Synchronize() is a no-op.
//
// Note: OpenBLAS keeps its own thread pool per process; running several
// CpuBackends on several threads shares that pool.
//
// Example:
//   std::unique_ptr<Backend> backend = MakeCpuBackend();
#ifndef SHARDTRAIN_WORKER_DEVICE_CPU_CPU_BACKEND_H_
#define SHARDTRAIN_WORKER_DEVICE_CPU_CPU_BACKEND_H_

#include <memory>
#include <string>

#include "worker/device/backend.h"

namespace shardtrain::worker {

// Returns a new CPU backend (thread-compatible, like every Backend). Never
// fails: it holds no resources until Allocate is called.
std::unique_ptr<Backend> MakeCpuBackend();

// Sets how many threads OpenBLAS uses in this process. On a machine shared
// with shards and other workers, 1 avoids its spinning threads fighting
// them for cores.
void SetCpuMathThreads(int threads);

// The kernels OpenBLAS chose for this CPU as it loaded ("Haswell",
// "SkylakeX", "Cooperlake", ...; the environment variable OPENBLAS_CORETYPE
// overrides its choice). Benchmarks report it: on an AVX-512 CPU the
// worker's GEMMs ran 1.7x as fast on those kernels as on the AVX2 (Haswell)
// ones (docs/figures.md, "OpenBLAS kernels").
std::string CpuMathKernels();

}  // namespace shardtrain::worker

#endif  // SHARDTRAIN_WORKER_DEVICE_CPU_CPU_BACKEND_H_
