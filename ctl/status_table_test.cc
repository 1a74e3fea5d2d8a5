#include "ctl/status_table.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardtrain::ctl {
namespace {

using ::testing::HasSubstr;

StatusResponse Shard(uint32_t index, int64_t version) {
  StatusResponse status;
  status.set_shard(index);
  status.set_num_shards(2);
  status.set_mode("async");
  status.set_optimizer("adam");
  status.set_max_staleness_bound(4);
  status.set_max_staleness_seen(2);
  status.set_updates_applied(12345);
  status.set_seconds_since_checkpoint(75);
  status.set_uptime_seconds(3700);
  PartitionInfo* part = status.add_partitions();
  part->set_size(50000);
  part->set_version(version);
  WorkerState* a = status.add_workers();
  a->set_worker(0);
  a->set_clock(version);
  a->set_live(true);
  WorkerState* b = status.add_workers();
  b->set_worker(1);
  b->set_clock(version - 3);
  b->set_live(true);
  return status;
}

TEST(StatusTableTest, ShowsShardsWorkersAndSpread) {
  const std::string table =
      FormatClusterStatus({"10.0.0.1:7000", "10.0.0.2:7000"}, {Shard(0, 40), Shard(1, 41)});
  EXPECT_THAT(table, HasSubstr("10.0.0.2:7000"));
  EXPECT_THAT(table, HasSubstr("40/40"));
  EXPECT_THAT(table, HasSubstr("12.3k"));
  EXPECT_THAT(table, HasSubstr("1m15s"));
  EXPECT_THAT(table, HasSubstr("1h01m"));
  EXPECT_THAT(table, HasSubstr("37 38"));  // worker 1's clock on each shard
  EXPECT_THAT(table, HasSubstr("max seen 2, bound 4; active clocks 37..40 (spread 3)"));
}

TEST(StatusTableTest, Ages) {
  EXPECT_EQ(FormatAge(-1), "never");
  EXPECT_EQ(FormatAge(0.25), "250ms");
  EXPECT_EQ(FormatAge(12.34), "12.3s");
  EXPECT_EQ(FormatAge(245), "4m05s");
}

}  // namespace
}  // namespace shardtrain::ctl
