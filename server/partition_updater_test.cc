#include "server/partition_updater.h"

#include <deque>
#include <memory>
#include <vector>

#include <prometheus/registry.h>

#include "common/payload.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "server/decoded_push.h"

namespace shardtrain::server {
namespace {

constexpr int kElements = 4;

// One partition of kElements ones, updated by an updater of `options`.
class PartitionUpdaterTest : public ::testing::Test {
 protected:
  void Start(ConsistencyMode mode, bool staleness_aware_lr = false) {
    options_.mode = mode;
    options_.num_workers = 2;
    options_.staleness_aware_lr = staleness_aware_lr;
    options_.optimizer.name = "sgd";
    options_.optimizer.learning_rate = 0.5f;
    auto optimizer = Optimizer::Create(options_.optimizer);
    ASSERT_TRUE(optimizer.ok()) << optimizer.status();
    optimizer_ = std::move(*optimizer);
    store_ = std::make_unique<TensorStore>(options_.partitioning, 0, std::vector<int>{0},
                                           TensorStore::SlotSpec{}, options_.num_workers);
    membership_ = std::make_unique<Membership>(options_.num_workers, absl::Seconds(10),
                                               absl::Seconds(60), absl::Now());
    updater_ = std::make_unique<PartitionUpdater>(options_, optimizer_.get(),
                                                  membership_.get(), &metrics_, &snapshot_);
    TensorSpec spec;
    spec.set_name("w");
    spec.add_shape(kElements);
    spec.set_dtype(DTYPE_F32);
    spec.mutable_init()->set_kind(Initializer::KIND_CONSTANT);
    spec.mutable_init()->set_scale(1.0f);
    auto parts = store_->Register(spec);
    ASSERT_TRUE(parts.ok()) << parts.status();
    part_ = parts->front();
  }

  // The one part of a push of `grad` everywhere from `worker` at `version`,
  // checked by CheckPart under the partition's lock.
  absl::StatusOr<DecodedPart> Checked(uint32_t worker, int64_t version, float grad) {
    PushRequest& request = requests_.emplace_back();
    request.set_worker(worker);
    GradientPart* part = request.add_parts();
    part->mutable_key()->set_tensor("w");
    part->set_version(version);
    common::EncodeDense(std::vector<float>(kElements, grad), DTYPE_F32,
                        part->mutable_grad()->mutable_data());
    part->mutable_grad()->set_dtype(DTYPE_F32);
    views_.push_back(wire::ViewOf(request));
    auto decoded = DecodePush(views_.back(), *store_, 100, &metrics_);
    if (!decoded.ok()) return decoded.status();
    DecodedPart out = decoded->front();
    absl::MutexLock lock(&part_->mu);
    RETURN_IF_ERROR(updater_->CheckPart(*part_, out, worker));
    return out;
  }

  float Value() {
    absl::MutexLock lock(&part_->mu);
    return part_->params[0];
  }
  int64_t Version() { return part_->version.load(); }

  // A partition that has completed a step is no longer resuming.
  void CompleteFirstStep() {
    for (uint32_t worker : {0u, 1u}) {
      auto part = Checked(worker, 0, 0.0f);
      ASSERT_TRUE(part.ok()) << part.status();
      absl::MutexLock lock(&part_->mu);
      updater_->AddSyncGradient(*part_, *part, worker);
    }
    ASSERT_EQ(Version(), 1);
  }

  ShardOptions options_;
  prometheus::Registry registry_;
  ShardMetrics metrics_{registry_};
  StepSnapshot snapshot_{0};
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<TensorStore> store_;
  std::unique_ptr<Membership> membership_;
  std::unique_ptr<PartitionUpdater> updater_;
  Partition* part_ = nullptr;
  std::deque<PushRequest> requests_;
  std::deque<wire::PushView> views_;
};

TEST_F(PartitionUpdaterTest, SyncAppliesTheMeanOnceEveryWorkerHasPushed) {
  Start(ConsistencyMode::kSync);
  auto first = Checked(0, 0, 1.0f);
  ASSERT_TRUE(first.ok()) << first.status();
  {
    absl::MutexLock lock(&part_->mu);
    EXPECT_EQ(updater_->AddSyncGradient(*part_, *first, 0), 0);
  }
  EXPECT_EQ(Version(), 0);  // waits for worker 1
  EXPECT_EQ(Value(), 1.0f);
  auto second = Checked(1, 0, 3.0f);
  ASSERT_TRUE(second.ok()) << second.status();
  {
    absl::MutexLock lock(&part_->mu);
    updater_->AddSyncGradient(*part_, *second, 1);
  }
  EXPECT_EQ(Version(), 1);
  EXPECT_EQ(Value(), 1.0f - 0.5f * 2.0f);  // lr * mean(1, 3)
  EXPECT_EQ(updater_->updates_applied(), 1);
  EXPECT_EQ(updater_->RejoinStep(), 2);
}

TEST_F(PartitionUpdaterTest, SyncRefusesLateRepeatedAndFutureGradients) {
  Start(ConsistencyMode::kSync);
  CompleteFirstStep();
  EXPECT_EQ(Checked(0, 0, 1.0f).status().code(), absl::StatusCode::kFailedPrecondition);
  auto part = Checked(0, 1, 1.0f);
  ASSERT_TRUE(part.ok()) << part.status();
  {
    absl::MutexLock lock(&part_->mu);
    updater_->AddSyncGradient(*part_, *part, 0);
  }
  EXPECT_EQ(Checked(0, 1, 1.0f).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(Checked(1, 2, 1.0f).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(Version(), 1);
}

TEST_F(PartitionUpdaterTest, AResumingPartitionIsFastForwardedByALaterStep) {
  Start(ConsistencyMode::kSync);  // a new partition resumes until its first step
  auto part = Checked(0, 3, 1.0f);
  ASSERT_TRUE(part.ok()) << part.status();
  EXPECT_TRUE(part->ahead);
  {
    absl::MutexLock lock(&part_->mu);
    EXPECT_EQ(updater_->AddSyncGradient(*part_, *part, 0), 3);  // steps 0..2 lost
  }
  EXPECT_EQ(Version(), 3);
  EXPECT_EQ(Value(), 1.0f);  // step 3 waits for worker 1
  EXPECT_EQ(updater_->RejoinStep(), 4);
}

TEST_F(PartitionUpdaterTest, AsyncAppliesOnArrivalAndScalesByStaleness) {
  Start(ConsistencyMode::kAsync, /*staleness_aware_lr=*/true);
  for (int i = 0; i < 2; ++i) {
    auto part = Checked(0, i, 1.0f);
    ASSERT_TRUE(part.ok()) << part.status();
    absl::MutexLock lock(&part_->mu);
    EXPECT_EQ(updater_->ApplyAsyncGradient(*part_, *part), 0);
  }
  EXPECT_EQ(Value(), 0.0f);  // 1 - 0.5 - 0.5
  auto stale = Checked(1, 0, 1.0f);  // computed from version 0; now at 2
  ASSERT_TRUE(stale.ok()) << stale.status();
  {
    absl::MutexLock lock(&part_->mu);
    EXPECT_EQ(updater_->ApplyAsyncGradient(*part_, *stale), 2);
  }
  EXPECT_EQ(Value(), -0.25f);  // lr / staleness
  EXPECT_EQ(Version(), 3);
  EXPECT_EQ(updater_->updates_applied(), 3);
}

TEST_F(PartitionUpdaterTest, ACloseAppliesTheGradientsPresent) {
  Start(ConsistencyMode::kSync);
  CompleteFirstStep();
  auto part = Checked(1, 1, 2.0f);
  ASSERT_TRUE(part.ok()) << part.status();
  absl::MutexLock lock(&part_->mu);
  updater_->AddSyncGradient(*part_, *part, 1);
  EXPECT_FALSE(updater_->MaybeFinishStep(*part_));
  EXPECT_TRUE(updater_->MaybeFinishStep(*part_, /*close=*/true));
  EXPECT_EQ(part_->version.load(), 2);
  EXPECT_EQ(part_->params[0], 0.0f);  // 1 - 0.5 * 2
  EXPECT_FALSE(updater_->MaybeFinishStep(*part_, /*close=*/true));  // nothing pending
}

}  // namespace
}  // namespace shardtrain::server
