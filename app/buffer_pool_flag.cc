#include "app/buffer_pool_flag.h"

#include <cstddef>
#include <cstdint>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "wire/buffer_pool.h"

ABSL_FLAG(int64_t, buffer_pool_mb,
          static_cast<int64_t>(shardtrain::wire::BufferPool::kDefaultMaxKeptBytes >> 20),
          "MiB of released message buffers and large frame bodies kept for reuse; past "
          "it they are freed, and the next large message faults its pages in again "
          "(0 keeps none)");

namespace shardtrain::app {

absl::Status ApplyBufferPoolFlag() {
  constexpr int64_t kMaxMiB = int64_t{1} << 20;  // 1 TiB
  const int64_t mib = absl::GetFlag(FLAGS_buffer_pool_mb);
  if (mib < 0 || mib > kMaxMiB) {
    return absl::InvalidArgumentError(
        absl::StrCat("--buffer_pool_mb must be in [0, ", kMaxMiB, "], got ", mib));
  }
  wire::BufferPool::Default().set_max_kept_bytes(static_cast<size_t>(mib) << 20);
  return absl::OkStatus();
}

}  // namespace shardtrain::app
