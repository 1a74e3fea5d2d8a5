#include "common/float_env.h"

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

namespace shardtrain::common {

void EnableFlushToZero() {
#if defined(__SSE__)
  // FTZ (bit 15) and DAZ (bit 6) of MXCSR.
  _mm_setcsr(_mm_getcsr() | 0x8040);
#endif
}

}  // namespace shardtrain::common
