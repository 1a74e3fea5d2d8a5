#include "server/push_log.h"

#include <optional>

#include "absl/status/status.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardtrain::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr uint64_t kIncarnation = 7;

// log.Find's answer, with a test failure (and nullopt) on an error.
std::optional<int64_t> Found(const PushLog& log, uint64_t incarnation, uint64_t sequence)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(log.mu()) {
  absl::StatusOr<std::optional<int64_t>> found = log.Find(incarnation, sequence);
  EXPECT_TRUE(found.ok()) << found.status();
  return found.ok() ? *found : std::nullopt;
}

TEST(PushLogTest, AnAppliedSequenceIsFoundWithItsStaleness) {
  PushLog log;
  absl::MutexLock lock(&log.mu());
  EXPECT_EQ(Found(log, kIncarnation, 1), std::nullopt);
  log.Record(kIncarnation, 1, 0);
  log.Record(kIncarnation, 3, 2);
  EXPECT_EQ(Found(log, kIncarnation, 1), 0);
  EXPECT_EQ(Found(log, kIncarnation, 3), 2);
  // Skipped and future sequences were not applied.
  EXPECT_EQ(Found(log, kIncarnation, 2), std::nullopt);
  EXPECT_EQ(Found(log, kIncarnation, 4), std::nullopt);
}

TEST(PushLogTest, ANewIncarnationStartsAFreshLogOnceItsPushIsRecorded) {
  PushLog log;
  absl::MutexLock lock(&log.mu());
  log.Record(kIncarnation, 5, 1);
  // The restarted worker's sequence 5 is another push.
  EXPECT_EQ(Found(log, kIncarnation + 1, 5), std::nullopt);
  log.Record(kIncarnation + 1, 1, 0);
  EXPECT_EQ(Found(log, kIncarnation + 1, 1), 0);
  EXPECT_EQ(Found(log, kIncarnation, 5), std::nullopt);
}

TEST(PushLogTest, ASequenceBelowTheWindowIsRefused) {
  PushLog log;
  absl::MutexLock lock(&log.mu());
  log.Record(kIncarnation, 1, 0);
  log.Record(kIncarnation, 1 + PushLog::kWindow, 0);
  const absl::StatusOr<std::optional<int64_t>> old = log.Find(kIncarnation, 1);
  EXPECT_EQ(old.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(old.status().message(), HasSubstr("cannot tell if it was applied"));
  // A jump over the window forgets what was below it.
  EXPECT_EQ(Found(log, kIncarnation, 2), std::nullopt);
}

TEST(PushLogTest, ExportAndImportCarryTheWindow) {
  PushLog from;
  PushLogState state;
  {
    absl::MutexLock lock(&from.mu());
    EXPECT_FALSE(from.Export(&state)) << "nothing applied yet";
    from.Record(kIncarnation, 10, 3);
    from.Record(kIncarnation, 12, 1);
    ASSERT_TRUE(from.Export(&state));
  }
  EXPECT_EQ(state.incarnation(), kIncarnation);
  EXPECT_EQ(state.highest(), 12u);
  EXPECT_THAT(state.sequences(), ElementsAre(10u, 12u));
  EXPECT_THAT(state.staleness(), ElementsAre(3, 1));

  PushLog to;
  absl::MutexLock lock(&to.mu());
  ASSERT_OK(to.Import(state));
  EXPECT_EQ(Found(to, kIncarnation, 10), 3);
  EXPECT_EQ(Found(to, kIncarnation, 11), std::nullopt);
  EXPECT_EQ(Found(to, kIncarnation, 12), 1);

  PushLogState malformed = state;
  malformed.add_staleness(0);
  const absl::Status status = to.Import(malformed);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Found(to, kIncarnation, 12), 1) << "the log is unchanged";
}

}  // namespace
}  // namespace shardtrain::server
