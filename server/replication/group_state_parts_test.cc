#include "server/replication/group_state_parts.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace shardtrain::server {
namespace {

// A state of `records` records of `bytes` parameter bytes each, and logs.
GroupStateResponse StateOf(int records, int bytes) {
  GroupStateResponse state;
  for (int i = 0; i < records; ++i) {
    CheckpointRecord* record = state.add_records();
    record->set_partition(static_cast<uint32_t>(i));
    record->set_params(std::string(static_cast<size_t>(bytes), static_cast<char>('a' + i % 26)));
  }
  state.add_push_logs()->set_worker(1);
  state.add_table_push_logs()->set_worker(2);
  state.add_table_push_logs()->set_worker(3);
  return state;
}

GroupStateResponse Reassembled(const std::vector<GroupStateResponse>& parts) {
  GroupStateResponse state;
  for (const GroupStateResponse& part : parts) AppendGroupStatePart(part, &state);
  return state;
}

TEST(GroupStatePartsTest, PartsStayWithinTheirBytesAndReassembleToTheState) {
  const GroupStateResponse state = StateOf(100, 1000);
  const std::vector<GroupStateResponse> parts = SplitGroupState(state, 10'000);
  ASSERT_GE(parts.size(), 10u);
  for (size_t i = 0; i < parts.size(); ++i) {
    EXPECT_LE(parts[i].ByteSizeLong(), 10'000u) << "part " << i;
    EXPECT_GT(parts[i].records_size(), 0) << "part " << i;
    if (i + 1 < parts.size()) {
      EXPECT_EQ(parts[i].push_logs_size() + parts[i].table_push_logs_size(), 0) << "part " << i;
    }
  }
  EXPECT_EQ(parts.back().push_logs_size(), 1);
  EXPECT_EQ(parts.back().table_push_logs_size(), 2);
  EXPECT_EQ(Reassembled(parts).SerializeAsString(), state.SerializeAsString());
}

TEST(GroupStatePartsTest, ARecordLargerThanAPartGoesAlone) {
  GroupStateResponse state = StateOf(3, 100);
  state.mutable_records(1)->set_params(std::string(50'000, 'x'));
  const std::vector<GroupStateResponse> parts = SplitGroupState(state, 10'000);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[1].records_size(), 1);
  EXPECT_EQ(parts[1].records(0).partition(), 1u);
  EXPECT_EQ(Reassembled(parts).SerializeAsString(), state.SerializeAsString());
}

TEST(GroupStatePartsTest, AnEmptyStateIsOnePart) {
  const std::vector<GroupStateResponse> parts = SplitGroupState(GroupStateResponse(), 10);
  ASSERT_EQ(parts.size(), 1u);
  EXPECT_EQ(parts[0].ByteSizeLong(), 0u);
}

TEST(GroupStatePartsTest, PartBytesAreFourMiBOrHalfTheMessageLimit) {
  EXPECT_EQ(GroupStatePartBytes(int64_t{256} << 20), int64_t{4} << 20);
  EXPECT_EQ(GroupStatePartBytes(int64_t{1} << 20), int64_t{512} << 10);
  EXPECT_EQ(GroupStatePartBytes(1), 1);
}

TEST(GroupStatePartsTest, RecordBytesAreAQuarterOfTheMessageLimitUpTo32MiB) {
  EXPECT_EQ(GroupStateRecordBytes(int64_t{256} << 20), int64_t{32} << 20);
  EXPECT_EQ(GroupStateRecordBytes(int64_t{1} << 20), int64_t{256} << 10);
  EXPECT_EQ(GroupStateRecordBytes(1), 1);
}

}  // namespace
}  // namespace shardtrain::server
