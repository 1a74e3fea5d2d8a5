#include "server/step_snapshot.h"

#include <map>
#include <memory>
#include <optional>
#include <vector>

#include <prometheus/registry.h>

#include "common/payload.h"
#include "gtest/gtest.h"
#include "server/checkpoint_test_util.h"
#include "server/shard.h"

namespace shardtrain::server {
namespace {

std::vector<float> Params(const CheckpointRecord& record) {
  std::vector<float> values(record.params().size() / sizeof(float));
  EXPECT_TRUE(common::DecodeDense(DTYPE_F32, record.params(), absl::MakeSpan(values)).ok());
  return values;
}

class StepSnapshotTest : public ::testing::Test {
 protected:
  StepSnapshotTest() {
    spec_.set_name("w");
    spec_.add_shape(8);
    spec_.set_dtype(DTYPE_F32);
    for (int id = 0; id < 3; ++id) {
      auto part = std::make_unique<Partition>();
      part->id = id;
      part->tensor = "w";
      part->spec = &spec_;
      part->index = id;
      part->params.assign(4, static_cast<float>(id));
      part->slots.assign(1, std::vector<float>(4, 10.0f + id));
      parts_.push_back(std::move(part));
    }
  }

  // Moves partition `id` to `version` and offers it to `snapshot`.
  void Reach(StepSnapshot& snapshot, int id, int64_t version) {
    while (counted_[&snapshot] < 3) {
      snapshot.AddPartition();
      ++counted_[&snapshot];
    }
    Partition& part = *parts_[id];
    absl::MutexLock lock(&part.mu);
    part.version.store(version);
    part.params.assign(4, static_cast<float>(version * 100 + id));
    if (snapshot.Due(version)) snapshot.Capture(part);
  }

  TensorSpec spec_;
  std::vector<std::unique_ptr<Partition>> parts_;
  std::map<const StepSnapshot*, int> counted_;
};

TEST_F(StepSnapshotTest, DueAtMultiplesOnly) {
  StepSnapshot every3(3);
  EXPECT_FALSE(every3.Due(0));
  EXPECT_FALSE(every3.Due(2));
  EXPECT_TRUE(every3.Due(3));
  EXPECT_FALSE(every3.Due(4));
  EXPECT_TRUE(every3.Due(300));
  StepSnapshot off(0);
  EXPECT_FALSE(off.Due(0));
  EXPECT_FALSE(off.Due(5));
}

TEST_F(StepSnapshotTest, CompleteOnlyWhenEveryPartitionIsCopied) {
  StepSnapshot snapshot(2);
  Reach(snapshot, 0, 1);
  Reach(snapshot, 0, 2);
  Reach(snapshot, 2, 2);
  EXPECT_EQ(snapshot.completed_step(), 0);
  EXPECT_FALSE(snapshot.TakeCompleted().has_value());
  Reach(snapshot, 1, 2);
  EXPECT_EQ(snapshot.completed_step(), 2);
  // Later changes do not reach the copy.
  Reach(snapshot, 0, 3);
  std::optional<StepSnapshot::Step> step = snapshot.TakeCompleted();
  ASSERT_TRUE(step.has_value());
  EXPECT_EQ(step->step, 2);
  ASSERT_EQ(step->records.size(), 3u);
  for (int id = 0; id < 3; ++id) {
    const CheckpointRecord& record = step->records[id];
    EXPECT_EQ(record.partition(), static_cast<uint32_t>(id));  // ordered by id
    EXPECT_EQ(record.version(), 2);
    EXPECT_EQ(record.spec().name(), "w");
    EXPECT_EQ(Params(record), std::vector<float>(4, 200.0f + id));
    ASSERT_EQ(record.slots_size(), 1);
  }
  EXPECT_FALSE(snapshot.TakeCompleted().has_value());
  EXPECT_EQ(snapshot.dropped_steps(), 0);
}

TEST_F(StepSnapshotTest, ANewerStepDropsTheIncompleteOne) {
  StepSnapshot snapshot(2);
  Reach(snapshot, 0, 2);
  Reach(snapshot, 0, 4);  // partitions 1 and 2 never reached step 2
  EXPECT_EQ(snapshot.dropped_steps(), 1);
  Reach(snapshot, 1, 2);  // a straggler of the dropped step is ignored
  Reach(snapshot, 2, 2);
  EXPECT_EQ(snapshot.completed_step(), 0);
  Reach(snapshot, 1, 4);
  Reach(snapshot, 2, 4);
  std::optional<StepSnapshot::Step> step = snapshot.TakeCompleted();
  ASSERT_TRUE(step.has_value());
  EXPECT_EQ(step->step, 4);
  for (const CheckpointRecord& record : step->records) EXPECT_EQ(record.version(), 4);
}

TEST_F(StepSnapshotTest, ANewerCompleteStepReplacesAnUntakenOne) {
  StepSnapshot snapshot(1);
  for (int id = 0; id < 3; ++id) Reach(snapshot, id, 1);
  EXPECT_EQ(snapshot.completed_step(), 1);
  for (int id = 0; id < 3; ++id) Reach(snapshot, id, 2);
  EXPECT_EQ(snapshot.completed_step(), 2);
  // Re-reaching an older step (it cannot happen in a shard) changes nothing.
  Reach(snapshot, 0, 1);
  EXPECT_EQ(snapshot.TakeCompleted()->step, 2);
  EXPECT_EQ(snapshot.dropped_steps(), 0);
}

TEST_F(StepSnapshotTest, TheCompletionHookAddsToEachStepOnce) {
  StepSnapshot snapshot(2);
  std::vector<int64_t> hooked;
  snapshot.SetOnComplete([&](std::vector<CheckpointRecord>* records) {
    // Called with the step's partitions, before it can be taken.
    EXPECT_EQ(records->size(), 3u);
    EXPECT_EQ(snapshot.completed_step(), 0);
    hooked.push_back((*records)[0].version());
    records->emplace_back().set_version(-1);  // the shard's tables, say
  });
  Reach(snapshot, 0, 2);
  Reach(snapshot, 1, 2);
  EXPECT_TRUE(hooked.empty());
  Reach(snapshot, 2, 2);
  Reach(snapshot, 2, 2);  // a straggler of a complete step: no second call
  EXPECT_EQ(hooked, std::vector<int64_t>{2});
  std::optional<StepSnapshot::Step> step = snapshot.TakeCompleted();
  ASSERT_TRUE(step.has_value());
  ASSERT_EQ(step->records.size(), 4u);
  EXPECT_EQ(step->records.back().version(), -1);
}

TEST(StepSnapshotShardTest, SyncShardCopiesEveryNthStep) {
  prometheus::Registry registry;
  ShardMetrics metrics(registry);
  ShardOptions options;
  options.mode = ConsistencyMode::kSync;
  options.num_workers = 1;
  options.optimizer.name = "adam";
  options.partitioning.max_partition_elements = 5;
  options.checkpoint_every_steps = 2;
  auto shard = Shard::Create(options, &metrics);
  ASSERT_TRUE(shard.ok()) << shard.status();
  RegisterRequest request;
  TensorSpec* spec = request.add_tensors();
  spec->set_name("w");
  spec->add_shape(12);
  spec->set_dtype(DTYPE_F32);
  RegisterResponse registered;
  ASSERT_TRUE((*shard)->Register(request, &registered).ok());
  ASSERT_EQ(registered.partitions_size(), 3);
  std::vector<CheckpointRecord> at_step_2;
  for (int step = 0; step < 3; ++step) {
    const PushRequest push =
        SyncPushOfEveryPartition(registered, "w", step, 0.1f * (step + 1));
    PushResponse pushed;
    ASSERT_TRUE((*shard)->Push(push, &pushed).ok());
    if (step == 0) {
      EXPECT_EQ((*shard)->step_snapshot().completed_step(), 0);
    }
    if (step == 1) at_step_2 = (*shard)->Snapshot();
  }
  std::optional<StepSnapshot::Step> step = (*shard)->step_snapshot().TakeCompleted();
  ASSERT_TRUE(step.has_value());
  EXPECT_EQ(step->step, 2);
  ASSERT_EQ(step->records.size(), at_step_2.size());
  for (size_t i = 0; i < at_step_2.size(); ++i) {
    EXPECT_EQ(step->records[i].SerializeAsString(), at_step_2[i].SerializeAsString());
  }
}

}  // namespace
}  // namespace shardtrain::server
