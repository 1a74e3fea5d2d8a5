#include "server/update_rule.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardtrain::server {
namespace {

using ::testing::HasSubstr;

ShardOptions Shard(ConsistencyMode mode, const std::string& optimizer, int workers) {
  ShardOptions shard;
  shard.mode = mode;
  shard.num_workers = workers;
  shard.optimizer.name = optimizer;
  shard.optimizer.learning_rate = 0.1f;
  return shard;
}

TEST(UpdateRuleTest, AsyncMomentumBecomesDelayedNesterovWithPeriodWorkers) {
  for (const char* name : {"momentum", "nesterov"}) {
    ShardOptions shard = Shard(ConsistencyMode::kAsync, name, 4);
    absl::StatusOr<std::vector<std::string>> warnings =
        ResolveUpdateRule(UpdateRuleChoice{}, &shard);
    ASSERT_TRUE(warnings.ok()) << warnings.status();
    EXPECT_TRUE(warnings->empty());
    EXPECT_EQ(shard.optimizer.name, "delayed_nesterov");
    EXPECT_EQ(shard.optimizer.period, 4);
  }
  UpdateRuleChoice choice;
  choice.period = 8;
  ShardOptions shard = Shard(ConsistencyMode::kAsync, "momentum", 4);
  ASSERT_TRUE(ResolveUpdateRule(choice, &shard).ok());
  EXPECT_EQ(shard.optimizer.period, 8);
}

TEST(UpdateRuleTest, SyncAndSingleWorkerKeepTheRuleAsNamed) {
  ShardOptions sync = Shard(ConsistencyMode::kSync, "momentum", 4);
  ASSERT_TRUE(ResolveUpdateRule(UpdateRuleChoice{}, &sync).ok());
  EXPECT_EQ(sync.optimizer.name, "momentum");
  ShardOptions one = Shard(ConsistencyMode::kAsync, "nesterov", 1);
  ASSERT_TRUE(ResolveUpdateRule(UpdateRuleChoice{}, &one).ok());
  EXPECT_EQ(one.optimizer.name, "nesterov");
  // Named directly in sync mode: one update per step, plain Nesterov.
  ShardOptions delayed = Shard(ConsistencyMode::kSync, "delayed_nesterov", 4);
  ASSERT_TRUE(ResolveUpdateRule(UpdateRuleChoice{}, &delayed).ok());
  EXPECT_EQ(delayed.optimizer.period, 1);
  ShardOptions adam = Shard(ConsistencyMode::kAsync, "adam", 4);
  ASSERT_TRUE(ResolveUpdateRule(UpdateRuleChoice{}, &adam).ok());
  EXPECT_EQ(adam.optimizer.name, "adam");
}

TEST(UpdateRuleTest, HeavyBallOnRequestWithAWarningNamingTheAlternative) {
  UpdateRuleChoice choice;
  choice.async_momentum = "heavy_ball";
  ShardOptions shard = Shard(ConsistencyMode::kAsync, "momentum", 2);
  absl::StatusOr<std::vector<std::string>> warnings = ResolveUpdateRule(choice, &shard);
  ASSERT_TRUE(warnings.ok());
  EXPECT_EQ(shard.optimizer.name, "momentum");
  ASSERT_EQ(warnings->size(), 1u);
  EXPECT_THAT((*warnings)[0], HasSubstr("--async_momentum=delayed_nesterov"));
}

TEST(UpdateRuleTest, StalenessAwareRateWithTwoWorkersIsFlagged) {
  ShardOptions shard = Shard(ConsistencyMode::kAsync, "sgd", 2);
  shard.staleness_aware_lr = true;
  absl::StatusOr<std::vector<std::string>> warnings =
      ResolveUpdateRule(UpdateRuleChoice{}, &shard);
  ASSERT_TRUE(warnings.ok());
  ASSERT_EQ(warnings->size(), 1u);
  EXPECT_THAT((*warnings)[0], HasSubstr("changes nothing"));
  shard.num_workers = 8;
  EXPECT_TRUE(ResolveUpdateRule(UpdateRuleChoice{}, &shard)->empty());
}

TEST(UpdateRuleTest, AsyncNoamCountsOneStepPerWorkersPushes) {
  ShardOptions shard = Shard(ConsistencyMode::kAsync, "adam", 3);
  shard.optimizer.schedule.kind = "noam";
  ASSERT_TRUE(ResolveUpdateRule(UpdateRuleChoice{}, &shard).ok());
  EXPECT_EQ(shard.optimizer.schedule.updates_per_step, 3);
  ShardOptions sync = Shard(ConsistencyMode::kSync, "adam", 3);
  sync.optimizer.schedule.kind = "noam";
  ASSERT_TRUE(ResolveUpdateRule(UpdateRuleChoice{}, &sync).ok());
  EXPECT_EQ(sync.optimizer.schedule.updates_per_step, 1);
}

TEST(UpdateRuleTest, RefusesWhatCannotWork) {
  UpdateRuleChoice unknown;
  unknown.async_momentum = "dana";
  ShardOptions shard = Shard(ConsistencyMode::kAsync, "momentum", 2);
  EXPECT_EQ(ResolveUpdateRule(unknown, &shard).status().code(),
            absl::StatusCode::kInvalidArgument);
  UpdateRuleChoice negative;
  negative.period = -1;
  EXPECT_EQ(ResolveUpdateRule(negative, &shard).status().code(),
            absl::StatusCode::kInvalidArgument);
  ShardOptions sync = Shard(ConsistencyMode::kSync, "sgd", 2);
  sync.optimizer.delay_compensation = 0.04f;
  absl::StatusOr<std::vector<std::string>> refused =
      ResolveUpdateRule(UpdateRuleChoice{}, &sync);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("--mode=async"));
}

}  // namespace
}  // namespace shardtrain::server
