// RETURN_IF_ERROR and ASSIGN_OR_RETURN for absl::Status / absl::StatusOr.
//
// Debian's Abseil (20220623) ships neither macro, so the project keeps this
// one local pair. Usage:
//
//   RETURN_IF_ERROR(DoThing());
//   ASSIGN_OR_RETURN(std::unique_ptr<Foo> foo, Foo::Create(options));
#ifndef SHARDTRAIN_COMMON_STATUS_MACROS_H_
#define SHARDTRAIN_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define SHARDTRAIN_CONCAT_INNER_(a, b) a##b
#define SHARDTRAIN_CONCAT_(a, b) SHARDTRAIN_CONCAT_INNER_(a, b)

#define RETURN_IF_ERROR(expr)                                  \
  do {                                                         \
    const ::absl::Status shardtrain_status_ = (expr);          \
    if (!shardtrain_status_.ok()) return shardtrain_status_;   \
  } while (0)

#define SHARDTRAIN_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                      \
  if (!statusor.ok()) return statusor.status();                 \
  lhs = std::move(statusor).value()

#define ASSIGN_OR_RETURN(lhs, rexpr)                                          \
  SHARDTRAIN_ASSIGN_OR_RETURN_IMPL_(                                          \
      SHARDTRAIN_CONCAT_(shardtrain_statusor_, __LINE__), lhs, rexpr)

#endif  // SHARDTRAIN_COMMON_STATUS_MACROS_H_
