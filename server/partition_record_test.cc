#include "server/partition_record.h"

#include <vector>

#include "absl/status/status.h"
#include "common/payload.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardtrain::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class PartitionRecordTest : public ::testing::Test {
 protected:
  PartitionRecordTest() {
    spec_.set_name("w");
    spec_.add_shape(6);
    spec_.set_dtype(DTYPE_F32);
    Fill(from_, 1.0f);
    Fill(to_, 0.0f);
  }

  // Three parameters, two slots, a sync step with workers 0 and 2 in.
  void Fill(Partition& part, float base) {
    part.tensor = "w";
    part.spec = &spec_;
    part.index = 1;
    absl::MutexLock lock(&part.mu);
    part.version.store(static_cast<int64_t>(base * 10));
    part.params = {base, base + 1, base + 2};
    part.slots = {{base + 3, base + 4, base + 5}, {base + 6, base + 7, base + 8}};
    part.accum = {base * 2, base * 3, base * 4};
    part.contributed = {base > 0, false, base > 0};
    part.contributions = base > 0 ? 2 : 0;
    part.ops = static_cast<int64_t>(base * 7);
    part.resuming = base == 0;
  }

  CheckpointRecord Write(PartitionRecordContents contents) {
    CheckpointRecord record;
    absl::ReaderMutexLock lock(&from_.mu);
    WritePartitionRecord(from_, contents, &record);
    return record;
  }

  absl::Status Read(const CheckpointRecord& record, PartitionRecordContents contents) {
    absl::MutexLock lock(&to_.mu);
    return ReadPartitionRecord(record, contents, "checkpoint", "adam", to_);
  }

  // to_'s state, for comparisons.
  std::vector<float> Params() {
    absl::MutexLock lock(&to_.mu);
    return to_.params;
  }

  TensorSpec spec_;
  Partition from_;
  Partition to_;
};

TEST_F(PartitionRecordTest, AModelRecordCarriesParamsAndSlotsOnly) {
  const CheckpointRecord record = Write(PartitionRecordContents::kModel);
  EXPECT_EQ(record.spec().name(), "w");
  EXPECT_EQ(record.partition(), 1u);
  EXPECT_EQ(record.version(), 10);
  EXPECT_EQ(record.slots_size(), 2);
  EXPECT_TRUE(record.accum().empty());
  EXPECT_EQ(record.contributors_size(), 0);
  ASSERT_OK(Read(record, PartitionRecordContents::kModel));
  absl::MutexLock lock(&to_.mu);
  EXPECT_THAT(to_.params, ElementsAre(1, 2, 3));
  EXPECT_THAT(to_.slots[0], ElementsAre(4, 5, 6));
  EXPECT_THAT(to_.slots[1], ElementsAre(7, 8, 9));
  // The step in flight is not a checkpoint's.
  EXPECT_EQ(to_.contributions, 0);
  EXPECT_EQ(to_.ops, 0);
}

TEST_F(PartitionRecordTest, AReplicaRecordCarriesTheStepInFlight) {
  const CheckpointRecord record = Write(PartitionRecordContents::kReplica);
  EXPECT_THAT(record.contributors(), ElementsAre(0u, 2u));
  ASSERT_OK(Read(record, PartitionRecordContents::kReplica));
  absl::MutexLock lock(&to_.mu);
  EXPECT_THAT(to_.params, ElementsAre(1, 2, 3));
  EXPECT_THAT(to_.accum, ElementsAre(2, 3, 4));
  EXPECT_THAT(to_.contributed, ElementsAre(true, false, true));
  EXPECT_EQ(to_.contributions, 2);
  EXPECT_EQ(to_.ops, 7);
  EXPECT_FALSE(to_.resuming);
}

TEST_F(PartitionRecordTest, ABadRecordChangesNothing) {
  CheckpointRecord fewer_slots = Write(PartitionRecordContents::kReplica);
  fewer_slots.mutable_slots()->RemoveLast();
  absl::Status status = Read(fewer_slots, PartitionRecordContents::kReplica);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("has 1 optimizer slots; optimizer adam needs 2"));

  CheckpointRecord short_slot = Write(PartitionRecordContents::kReplica);
  short_slot.mutable_slots(1)->resize(8);
  status = Read(short_slot, PartitionRecordContents::kReplica);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("slot 1 has 8 bytes"));

  CheckpointRecord stranger = Write(PartitionRecordContents::kReplica);
  stranger.add_contributors(3);
  status = Read(stranger, PartitionRecordContents::kReplica);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("contributor 3 out of range"));

  // None of the three wrote anything (the parameters come before the slots
  // and the contributors in the record).
  EXPECT_THAT(Params(), ElementsAre(0, 1, 2));
  absl::MutexLock lock(&to_.mu);
  EXPECT_EQ(to_.contributions, 0);
  EXPECT_THAT(to_.slots[1], ElementsAre(6, 7, 8));
}

}  // namespace
}  // namespace shardtrain::server
