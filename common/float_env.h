// Per-thread floating-point environment for math threads.
//
// Dead ReLU units and decaying momentum leave subnormal floats behind, and
// x86 handles those in microcode (a ~1.35x slower training step was measured).
// Flush-to-zero / denormals-are-zero trade them for zero, as GPUs do.
#ifndef SHARDTRAIN_COMMON_FLOAT_ENV_H_
#define SHARDTRAIN_COMMON_FLOAT_ENV_H_

namespace shardtrain::common {

// Sets FTZ and DAZ for the calling thread; a no-op off x86.
void EnableFlushToZero();

}  // namespace shardtrain::common

#endif  // SHARDTRAIN_COMMON_FLOAT_ENV_H_
