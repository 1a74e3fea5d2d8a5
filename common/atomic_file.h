// Writing a small file so that readers see all of it or none of it.
//
// Processes bind port 0 and let the kernel choose, then publish what they
// got this way, so scripts and tests never race for a "free" port; results
// and checkpoints use it too.
#ifndef SHARDTRAIN_COMMON_ATOMIC_FILE_H_
#define SHARDTRAIN_COMMON_ATOMIC_FILE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace shardtrain::common {

// Atomically writes `contents` to `path` (write a temporary, then rename),
// so a reader sees either nothing or the whole file.
absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view contents);

}  // namespace shardtrain::common

#endif  // SHARDTRAIN_COMMON_ATOMIC_FILE_H_
