// Publishing the ports a process bound.
//
// Processes bind port 0 and let the kernel choose, then write what they got
// to a file, so scripts and tests never race for a "free" port.
#ifndef SHARDTRAIN_COMMON_PORT_FILE_H_
#define SHARDTRAIN_COMMON_PORT_FILE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace shardtrain::common {

// Atomically writes `contents` to `path` (write a temporary, then rename),
// so a reader sees either nothing or the whole file.
absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view contents);

// The port of "host:port" (or "[v6]:port"); INVALID_ARGUMENT if absent.
absl::Status SplitHostPort(absl::string_view address, std::string* host,
                           int* port);

}  // namespace shardtrain::common

#endif  // SHARDTRAIN_COMMON_PORT_FILE_H_
