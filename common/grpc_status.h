// The one place where absl::Status and grpc::Status meet.
//
// Canonical codes have the same numbers in both libraries; these functions
// carry the code and message across unchanged. Thread-safe.
#ifndef SHARDTRAIN_COMMON_GRPC_STATUS_H_
#define SHARDTRAIN_COMMON_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace shardtrain::common {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace shardtrain::common

#endif  // SHARDTRAIN_COMMON_GRPC_STATUS_H_
