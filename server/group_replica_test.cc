// GroupReplica on the shards that host it: two shards of a 2-shard job with
// --replicas 2, so each holds both replica groups, one the head that
// applies workers' pushes and one the follower that applies the forwards.
#include "server/group_replica.h"

#include <cstring>
#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include <prometheus/registry.h>

#include "common/partition.h"
#include "common/payload.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/shard.h"

namespace shardtrain::server {
namespace {

using ::testing::HasSubstr;

constexpr int kShards = 2;
constexpr int64_t kPartitionElements = 4;
constexpr int64_t kElements = 16;  // 4 partitions over 2 groups

TensorSpec Spec(float value) {
  TensorSpec spec;
  spec.set_name("w");
  spec.add_shape(kElements);
  spec.set_dtype(DTYPE_F32);
  spec.mutable_init()->set_kind(Initializer::KIND_CONSTANT);
  spec.mutable_init()->set_scale(value);
  return spec;
}

class GroupReplicaTest : public ::testing::Test {
 protected:
  static ShardOptions Options(int index, ConsistencyMode mode) {
    ShardOptions options;
    options.shard_index = index;
    options.partitioning = {kPartitionElements, kShards};
    options.replicas = 2;
    options.mode = mode;
    options.num_workers = 1;
    options.optimizer.name = "sgd";
    options.optimizer.learning_rate = 1.0f;
    return options;
  }

  std::unique_ptr<Shard> Start(int index, ConsistencyMode mode = ConsistencyMode::kAsync) {
    auto shard = Shard::Create(Options(index, mode), &metrics_);
    EXPECT_TRUE(shard.ok()) << shard.status();
    RegisterRequest request;
    *request.add_tensors() = Spec(1.0f);
    RegisterResponse response;
    EXPECT_TRUE((*shard)->Register(request, &response).ok());
    return *std::move(shard);
  }

  void SetUp() override {
    for (int64_t p = 0; p < kElements / kPartitionElements; ++p) {
      by_group_[common::ReplicaGroupFor("w", p, kShards)].push_back(static_cast<uint32_t>(p));
    }
    ASSERT_FALSE(by_group_[0].empty());
    ASSERT_FALSE(by_group_[1].empty());
    head_ = Start(0);
    follower_ = Start(1);
  }

  // Worker 0's push of `grad` to every partition of `group` (or of
  // `partitions`), computed from version `version`, with `sequence`.
  PushRequest Push(int group, float grad, uint64_t sequence, int64_t version = 0,
                   std::vector<uint32_t> partitions = {}) {
    if (partitions.empty()) partitions = by_group_[group];
    PushRequest request;
    request.set_worker(0);
    request.set_worker_incarnation(5);
    request.set_sequence(sequence);
    request.set_clock(version + 1);
    for (uint32_t p : partitions) {
      GradientPart* part = request.add_parts();
      part->mutable_key()->set_tensor("w");
      part->mutable_key()->set_partition(p);
      part->set_version(version);
      common::EncodeDense(std::vector<float>(kPartitionElements, grad), DTYPE_F32,
                          part->mutable_grad()->mutable_data());
      part->mutable_grad()->set_dtype(DTYPE_F32);
    }
    return request;
  }

  // Applies `request` at the head; returns its forwarded copy.
  PushRequest ApplyAtHead(const PushRequest& request, GroupReplica::Applied* applied) {
    PushResponse response;
    const absl::Status status =
        head_->Push(wire::ViewOf(request), GroupOf(request), &response, applied);
    EXPECT_TRUE(status.ok()) << status;
    PushRequest forward = request;
    for (const ReplicatedOp& op : applied->ops) *forward.add_replicated() = op;
    return forward;
  }

  int GroupOf(const PushRequest& request) const {
    absl::StatusOr<int> group = head_->replica().GroupOf(wire::ViewOf(request));
    EXPECT_TRUE(group.ok()) << group.status();
    return group.ok() ? *group : -1;
  }

  absl::Status Forward(Shard& to, const PushRequest& forward,
                       absl::Duration wait = absl::Seconds(5)) {
    PushResponse response;
    return to.replica().ApplyForwarded(wire::ViewOf(forward), wait, [] { return true; },
                                       &response);
  }

  // The first element of each of `group`'s partitions on `shard`.
  std::vector<float> Values(const Shard& shard, int group) {
    PullRequest request;
    for (uint32_t p : by_group_[group]) {
      PartitionKey* key = request.add_parts();
      key->set_tensor("w");
      key->set_partition(p);
    }
    EXPECT_TRUE(shard.pulls().Validate(request).ok());
    PullResponse response;
    shard.pulls().Fill(request, &response);
    std::vector<float> out;
    for (const ParameterPart& part : response.parts()) {
      float value;
      std::memcpy(&value, part.value().data().data(), sizeof(value));
      out.push_back(value);
    }
    return out;
  }

  prometheus::Registry registry_;
  ShardMetrics metrics_{registry_};
  std::vector<uint32_t> by_group_[kShards];
  std::unique_ptr<Shard> head_;
  std::unique_ptr<Shard> follower_;
};

TEST_F(GroupReplicaTest, EachShardHoldsBothGroupsItsOwnFirst) {
  EXPECT_EQ(head_->replica().groups(), (std::vector<int>{0, 1}));
  EXPECT_EQ(follower_->replica().groups(), (std::vector<int>{1, 0}));
}

TEST_F(GroupReplicaTest, AForwardIsAppliedAtTheHeadsOperationsOnce) {
  GroupReplica::Applied applied;
  const PushRequest forward = ApplyAtHead(Push(0, 0.25f, 1), &applied);
  ASSERT_EQ(applied.ops.size(), by_group_[0].size());
  for (const ReplicatedOp& op : applied.ops) {
    EXPECT_EQ(op.op(), 0);
    EXPECT_EQ(op.version_after(), 1);
  }
  ASSERT_TRUE(Forward(*follower_, forward).ok());
  EXPECT_EQ(Values(*follower_, 0), Values(*head_, 0));
  EXPECT_EQ(Values(*follower_, 0)[0], 0.75f);
  EXPECT_EQ(follower_->replica().Ops(0), head_->replica().Ops(0));
  // Sent again (a retried forward): skipped, nothing changes.
  ASSERT_TRUE(Forward(*follower_, forward).ok());
  EXPECT_EQ(Values(*follower_, 0)[0], 0.75f);
  EXPECT_EQ(follower_->replica().Ops(0), static_cast<int64_t>(by_group_[0].size()));
  EXPECT_EQ(follower_->replica().Ops(1), 0);
  // The follower's push log followed the head's: the worker's retry of the
  // push, should this shard become the head, is a duplicate.
  PushResponse response;
  ASSERT_TRUE(follower_->Push(wire::ViewOf(Push(0, 0.25f, 1)), 0, &response, nullptr).ok());
  EXPECT_TRUE(response.duplicate());
  EXPECT_EQ(Values(*follower_, 0)[0], 0.75f);
}

TEST_F(GroupReplicaTest, AForwardAheadOfItsTurnWaitsThenIsRefusedUnavailable) {
  GroupReplica::Applied first, second;
  const PushRequest forward0 = ApplyAtHead(Push(0, 1.0f, 1), &first);
  const PushRequest forward1 = ApplyAtHead(Push(0, 1.0f, 2, 1), &second);
  const absl::Status early = Forward(*follower_, forward1, absl::Milliseconds(50));
  EXPECT_EQ(early.code(), absl::StatusCode::kUnavailable) << early;
  EXPECT_THAT(early.message(), HasSubstr("is not next here"));
  EXPECT_EQ(follower_->replica().Ops(0), 0);
  ASSERT_TRUE(Forward(*follower_, forward0).ok());
  ASSERT_TRUE(Forward(*follower_, forward1).ok());
  EXPECT_EQ(Values(*follower_, 0), Values(*head_, 0));
  EXPECT_EQ(Values(*follower_, 0)[0], -1.0f);
}

// The usual reordering: a forward overtakes the one before it, waits
// holding nothing, and is applied (and logged) once that one arrives.
TEST_F(GroupReplicaTest, AForwardAheadOfItsTurnIsAppliedOnceTheOneBeforeItArrives) {
  GroupReplica::Applied first, second;
  const PushRequest forward0 = ApplyAtHead(Push(0, 1.0f, 1), &first);
  const PushRequest forward1 = ApplyAtHead(Push(0, 1.0f, 2, 1), &second);
  absl::Status early = absl::UnknownError("not run");
  std::thread waiting([&] { early = Forward(*follower_, forward1, absl::Seconds(10)); });
  absl::SleepFor(absl::Milliseconds(50));  // it waits for operation 0
  const absl::Status in_turn = Forward(*follower_, forward0);
  waiting.join();
  ASSERT_TRUE(in_turn.ok()) << in_turn;
  ASSERT_TRUE(early.ok()) << early;
  EXPECT_EQ(Values(*follower_, 0), Values(*head_, 0));
  EXPECT_EQ(Values(*follower_, 0)[0], -1.0f);
  EXPECT_EQ(follower_->replica().Ops(0), head_->replica().Ops(0));
  PushResponse response;
  ASSERT_TRUE(follower_->Push(wire::ViewOf(Push(0, 1.0f, 2, 1)), 0, &response, nullptr).ok());
  EXPECT_TRUE(response.duplicate());
  EXPECT_EQ(Values(*follower_, 0)[0], -1.0f);
}

// The head died with two pushes forwarded; the second's forward came first
// and waits for the first's, which never comes. The chain moves on (this
// follower heads it now) and the worker's retry of the second push is
// applied here at the operation the first had: the waiting forward, from
// the old chain, must not then apply the same push again at its own.
TEST_F(GroupReplicaTest, AForwardOfAChainThatMovedOnIsNotAppliedAtItsTurn) {
  GroupReplica::Applied first, second;
  ApplyAtHead(Push(0, 1.0f, 1), &first);  // its forward is lost with the head
  const PushRequest forward = ApplyAtHead(Push(0, 1.0f, 2), &second);
  std::atomic<bool> valid{true};
  absl::Status waited;
  std::thread waiting([&] {
    PushResponse response;
    waited = follower_->replica().ApplyForwarded(wire::ViewOf(forward), absl::Seconds(10),
                                                 [&valid] { return valid.load(); }, &response);
  });
  absl::SleepFor(absl::Milliseconds(50));  // it waits for operation 0
  valid = false;                           // the chain moved on without the head
  PushResponse response;
  ASSERT_TRUE(follower_->Push(wire::ViewOf(Push(0, 1.0f, 2)), 0, &response, nullptr).ok());
  EXPECT_FALSE(response.duplicate());
  waiting.join();
  EXPECT_EQ(waited.code(), absl::StatusCode::kUnavailable) << waited;
  // The worker's retry of the first push: applied once too.
  ASSERT_TRUE(follower_->Push(wire::ViewOf(Push(0, 1.0f, 1)), 0, &response, nullptr).ok());
  EXPECT_FALSE(response.duplicate());
  EXPECT_EQ(follower_->replica().Ops(0), 2 * static_cast<int64_t>(by_group_[0].size()));
  EXPECT_EQ(Values(*follower_, 0), Values(*head_, 0));
}

TEST_F(GroupReplicaTest, AForwardThatDisagreesWithThisReplicaIsAnInternalError) {
  GroupReplica::Applied applied;
  PushRequest forward = ApplyAtHead(Push(0, 1.0f, 1), &applied);
  forward.mutable_replicated(0)->set_version_after(7);
  EXPECT_EQ(Forward(*follower_, forward).code(), absl::StatusCode::kInternal);
  PushRequest missing_ops = Push(0, 1.0f, 2);
  EXPECT_EQ(Forward(*follower_, missing_ops).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(GroupReplicaTest, APushNamesOneGroup) {
  const PushRequest both = Push(0, 1.0f, 1, 0, {by_group_[0][0], by_group_[1][0]});
  const absl::StatusOr<int> group = head_->replica().GroupOf(wire::ViewOf(both));
  EXPECT_EQ(group.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(group.status().message(), HasSubstr("send one per group"));
  PushRequest none;
  EXPECT_EQ(head_->replica().GroupOf(wire::ViewOf(none)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GroupOf(Push(1, 1.0f, 1)), 1);
}

TEST_F(GroupReplicaTest, CommitMarksLetCommittedReadsThrough) {
  int woken = 0;
  head_->SetProgressCallback([&woken] { ++woken; });
  GroupReplica::Applied applied;
  ApplyAtHead(Push(0, 1.0f, 1), &applied);
  PullRequest pull;
  for (uint32_t p : by_group_[0]) {
    PartitionKey* key = pull.add_parts();
    key->set_tensor("w");
    key->set_partition(p);
  }
  wire::PullResponseBuilder builder;
  std::vector<int64_t> versions;
  head_->pulls().Fill(pull, &builder, &versions);
  EXPECT_FALSE(head_->pulls().Committed(pull, versions));
  woken = 0;
  head_->replica().MarkCommitted(applied, /*wake=*/true);
  EXPECT_TRUE(head_->pulls().Committed(pull, versions));
  EXPECT_EQ(woken, 1);

  // A new tail commits whatever it holds of the group.
  ApplyAtHead(Push(0, 1.0f, 2, 1), &applied);
  wire::PullResponseBuilder again;
  head_->pulls().Fill(pull, &again, &versions);
  EXPECT_FALSE(head_->pulls().Committed(pull, versions));
  woken = 0;
  head_->replica().CommitGroup(0);
  EXPECT_TRUE(head_->pulls().Committed(pull, versions));
  EXPECT_EQ(woken, 1);
  head_->replica().CommitGroup(0);  // nothing new
  EXPECT_EQ(woken, 1);
}

TEST_F(GroupReplicaTest, AJoiningTailImportsTheGroupWhole) {
  GroupReplica::Applied applied;
  for (uint64_t sequence = 1; sequence <= 3; ++sequence) {
    ApplyAtHead(Push(0, 1.0f, sequence, static_cast<int64_t>(sequence) - 1), &applied);
  }
  ASSERT_TRUE(follower_->replica().Import(0, head_->replica().Export(0)).ok());
  EXPECT_EQ(Values(*follower_, 0), Values(*head_, 0));
  EXPECT_EQ(follower_->replica().Ops(0), head_->replica().Ops(0));
  EXPECT_EQ(follower_->replica().Ops(1), 0);
  // What a tail holds is committed; the push logs came along.
  PullRequest pull;
  pull.add_parts()->set_tensor("w");
  pull.mutable_parts(0)->set_partition(by_group_[0][0]);
  EXPECT_TRUE(follower_->pulls().Committed(pull, {3}));
  PushResponse response;
  ASSERT_TRUE(
      follower_->Push(wire::ViewOf(Push(0, 1.0f, 3, 2)), 0, &response, nullptr).ok());
  EXPECT_TRUE(response.duplicate());
  // A group this shard does not hold is refused.
  ShardOptions single = Options(0, ConsistencyMode::kAsync);
  single.replicas = 1;
  auto alone = Shard::Create(single, &metrics_);
  ASSERT_TRUE(alone.ok());
  EXPECT_EQ((*alone)->replica().Import(1, head_->replica().Export(1)).code(),
            absl::StatusCode::kInvalidArgument);
}

// A joining replica copies whether a partition may still fast-forward: a
// copy of a restored partition that became the head must take the workers'
// later step too (they resume where the job was, the group at its
// checkpoint), and a copy of one that closed a step must not.
TEST_F(GroupReplicaTest, AStateCopyKeepsWhetherAPartitionResumes) {
  head_ = Start(0, ConsistencyMode::kSync);
  PushResponse response;
  std::unique_ptr<Shard> resuming = Start(1, ConsistencyMode::kSync);
  ASSERT_TRUE(resuming->replica().Import(0, head_->replica().Export(0)).ok());
  EXPECT_TRUE(resuming->Push(wire::ViewOf(Push(0, 1.0f, 0, 5)), 0, &response, nullptr).ok());

  ASSERT_TRUE(head_->Push(wire::ViewOf(Push(0, 1.0f, 0, 0)), 0, &response, nullptr).ok());
  std::unique_ptr<Shard> stepped = Start(1, ConsistencyMode::kSync);
  ASSERT_TRUE(stepped->replica().Import(0, head_->replica().Export(0)).ok());
  EXPECT_EQ(stepped->Push(wire::ViewOf(Push(0, 1.0f, 0, 5)), 0, &response, nullptr).code(),
            absl::StatusCode::kOutOfRange);
}

TEST_F(GroupReplicaTest, WithoutHooksTheShardLeadsEveryGroup) {
  EXPECT_TRUE(head_->replica().Leads(0));
  EXPECT_TRUE(head_->replica().Leads(1));
  std::vector<int> asked, closed;
  GroupReplica::Hooks hooks;
  hooks.leads = [&asked](int group) {
    asked.push_back(group);
    return group == 1;
  };
  hooks.on_closed = [&closed](int group, std::vector<ReplicatedOp>) { closed.push_back(group); };
  head_->replica().SetHooks(std::move(hooks));
  EXPECT_FALSE(head_->replica().Leads(0));
  EXPECT_TRUE(head_->replica().Leads(1));
  EXPECT_EQ(asked, (std::vector<int>{0, 1}));
  head_->replica().Closed(1, {});
  EXPECT_EQ(closed, (std::vector<int>{1}));
}

}  // namespace
}  // namespace shardtrain::server
