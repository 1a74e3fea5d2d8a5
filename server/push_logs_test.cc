#include "server/push_logs.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardtrain::server {
namespace {

using ::testing::HasSubstr;

void Apply(const PushLogs& logs, int group, uint32_t worker, uint64_t sequence) {
  PushLog& log = logs.Of(group, worker);
  absl::MutexLock lock(&log.mu());
  log.Record(/*worker_incarnation=*/9, sequence, /*staleness=*/0);
}

bool Applied(const PushLogs& logs, int group, uint32_t worker, uint64_t sequence) {
  PushLog& log = logs.Of(group, worker);
  absl::MutexLock lock(&log.mu());
  absl::StatusOr<std::optional<int64_t>> found = log.Find(9, sequence);
  return found.ok() && found->has_value();
}

TEST(PushLogsTest, OneLogPerGroupHeldAndWorker) {
  PushLogs logs({2, 0}, 3);
  EXPECT_EQ(logs.SlotOf(2), 0);
  EXPECT_EQ(logs.SlotOf(0), 1);
  EXPECT_EQ(logs.SlotOf(1), -1);
  EXPECT_EQ(logs.SlotOf(7), -1);
  EXPECT_EQ(logs.SlotOf(-1), -1);
  EXPECT_FALSE(logs.Holds(1));
  Apply(logs, 2, 1, 5);
  EXPECT_TRUE(Applied(logs, 2, 1, 5));
  EXPECT_FALSE(Applied(logs, 0, 1, 5));
  EXPECT_FALSE(Applied(logs, 2, 0, 5));
  EXPECT_FALSE(Applied(logs, 2, 2, 5));
}

TEST(PushLogsTest, AGroupsLogsMoveToAnotherShard) {
  PushLogs head({0, 1}, 2);
  Apply(head, 1, 0, 3);
  Apply(head, 1, 1, 4);
  Apply(head, 0, 0, 8);  // another group: not exported with group 1
  google::protobuf::RepeatedPtrField<PushLogState> state;
  head.Export(1, &state);
  EXPECT_EQ(state.size(), 2);

  PushLogs tail({1}, 2);
  ASSERT_TRUE(tail.Import(1, state, "push log").ok());
  EXPECT_TRUE(Applied(tail, 1, 0, 3));
  EXPECT_TRUE(Applied(tail, 1, 1, 4));
  EXPECT_FALSE(Applied(tail, 1, 0, 8));
}

TEST(PushLogsTest, ImportRefusesAGroupNotHeldAndAWorkerOutsideTheJob) {
  PushLogs logs({0}, 2);
  google::protobuf::RepeatedPtrField<PushLogState> state;
  absl::Status status = logs.Import(1, state, "push log");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("does not hold"));
  PushLogs big({0}, 5);
  Apply(big, 0, 4, 1);
  big.Export(0, &state);
  status = logs.Import(0, state, "table push log");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("table push log of worker 4"));
}

}  // namespace
}  // namespace shardtrain::server
