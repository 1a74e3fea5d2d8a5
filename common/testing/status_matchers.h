// ASSERT_OK, EXPECT_OK and ASSERT_OK_AND_ASSIGN for tests on absl::Status
// and absl::StatusOr.
//
// Debian's Abseil (20220623) ships none of them. ASSERT_OK_AND_ASSIGN ends
// the test (or the void helper) with a failure naming the status instead of
// dereferencing an error and crashing the test binary. Usage:
//
//   ASSERT_OK(shard->Register(request, &response));
//   ASSERT_OK_AND_ASSIGN(std::unique_ptr<Shard> shard, Shard::Create(options));
//   ASSERT_OK_AND_ASSIGN(auto server, PsServer::Start(options));
//
// Like every ASSERT_*, they return from the enclosing function, which must
// return void; a helper that builds something returns absl::StatusOr and
// its callers assert on it.
#ifndef SHARDTRAIN_COMMON_TESTING_STATUS_MATCHERS_H_
#define SHARDTRAIN_COMMON_TESTING_STATUS_MATCHERS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"

namespace shardtrain::testing_internal {

inline const absl::Status& ToStatus(const absl::Status& status) { return status; }

template <typename T>
const absl::Status& ToStatus(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}

}  // namespace shardtrain::testing_internal

#define ASSERT_OK(expr)                                                       \
  do {                                                                        \
    const ::absl::Status shardtrain_assert_status_ =                          \
        ::shardtrain::testing_internal::ToStatus(expr);                       \
    ASSERT_TRUE(shardtrain_assert_status_.ok()) << shardtrain_assert_status_; \
  } while (0)

#define EXPECT_OK(expr)                                                       \
  do {                                                                        \
    const ::absl::Status shardtrain_expect_status_ =                          \
        ::shardtrain::testing_internal::ToStatus(expr);                       \
    EXPECT_TRUE(shardtrain_expect_status_.ok()) << shardtrain_expect_status_; \
  } while (0)

#define SHARDTRAIN_ASSERT_OK_AND_ASSIGN_IMPL_(statusor, lhs, rexpr)      \
  auto statusor = (rexpr);                                               \
  ASSERT_TRUE(statusor.ok()) << #rexpr << ": " << statusor.status();     \
  lhs = std::move(statusor).value()

#define ASSERT_OK_AND_ASSIGN(lhs, rexpr)                                      \
  SHARDTRAIN_ASSERT_OK_AND_ASSIGN_IMPL_(                                      \
      SHARDTRAIN_CONCAT_(shardtrain_assert_statusor_, __LINE__), lhs, rexpr)

#endif  // SHARDTRAIN_COMMON_TESTING_STATUS_MATCHERS_H_
