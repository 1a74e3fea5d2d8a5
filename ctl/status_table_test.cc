#include "ctl/status_table.h"

#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardtrain::ctl {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

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
  EXPECT_THAT(table, HasSubstr("max seen 2, bound 4; live clocks 37..40 (spread 3)"));
}

// Four expected workers on a sync shard at step 41: worker 0 has pushed
// step 41, worker 1 is computing it, worker 2 was forgotten 45 s ago and
// came back twice before, worker 3 never joined.
StatusResponse SyncShard(uint32_t index) {
  StatusResponse status;
  status.set_shard(index);
  status.set_num_shards(2);
  status.set_mode("sync");
  status.set_optimizer("sgd");
  status.set_max_staleness_bound(-1);
  status.set_num_workers(4);
  status.set_incarnation(0xabcdef0123456789ULL + index);
  status.set_num_tensors(3);
  status.set_num_partitions(1'000'000);
  status.set_stored_elements(12'345'678);
  status.set_min_version(41);
  status.set_max_version(42);
  status.set_partitions_truncated(true);
  status.set_duplicate_pushes(7);
  for (int i = 0; i < 2; ++i) {
    PartitionInfo* part = status.add_partitions();
    part->set_tensor("layer0/w");
    part->set_partition(i);
    part->set_offset(i * 1000);
    part->set_size(1000);
    part->set_version(41 + i);
  }
  auto add = [&](uint32_t worker, int64_t clock, bool seen, bool live, double age,
                 int64_t rejoins) {
    WorkerState* state = status.add_workers();
    state->set_worker(worker);
    state->set_clock(clock);
    state->set_seen(seen);
    state->set_live(live);
    state->set_seconds_since_heartbeat(age);
    state->set_rejoins(rejoins);
  };
  add(0, 42, true, true, 0.2, 0);
  add(1, 41, true, true, 0.3, 0);
  add(2, 30, true, false, 45.2, 2);
  add(3, 0, false, false, 12.0, 0);
  return status;
}

TEST(StatusTableTest, ExpectedLiveAndMissingWorkersOfASyncStep) {
  const std::string table =
      FormatClusterStatus({"a:7000", "b:7000"}, {SyncShard(0), SyncShard(1)});
  EXPECT_THAT(table, HasSubstr("workers: 4 expected, 2 live, 0 done, 2 missing"));
  EXPECT_THAT(table, HasSubstr("sync step 41 waits for worker 1 (live, at clock 41), "
                               "worker 2 (gone, last heard 45.2s ago), "
                               "worker 3 (never joined, waited 12.0s)"));
  EXPECT_THAT(table, ::testing::ContainsRegex("\n2 +gone +45[.]2s +2  30 30\n"));
  EXPECT_THAT(table, ::testing::ContainsRegex("\n3 +not-joined +12[.]0s +0  - -\n"));
  // Summary fields, not the two listed partitions.
  EXPECT_THAT(table, HasSubstr(" 1.0M "));
  EXPECT_THAT(table, HasSubstr("12.3M"));
  EXPECT_THAT(table, HasSubstr("41/42"));
  EXPECT_THAT(table, HasSubstr("abcdef0123456789"));
  EXPECT_THAT(table, ::testing::Not(HasSubstr("layer0/w")));  // none asked for
}

TEST(StatusTableTest, ListsTheFirstPartitionsAndSaysHowManyMore) {
  const std::string table = FormatClusterStatus({"a:7000"}, {SyncShard(0)}, 1);
  EXPECT_THAT(table, ::testing::ContainsRegex("0 +layer0/w +0 +0 +1000 +41\n"));
  EXPECT_THAT(table, ::testing::Not(HasSubstr("1000       1000")));
  EXPECT_THAT(table, HasSubstr("999999 more partitions"));
}

TEST(StatusTableTest, AsyncListsMissingWorkersAndDownShards) {
  StatusResponse up = SyncShard(0);
  up.set_mode("async");
  StatusResponse down;
  down.set_shard(1);
  down.set_mode("DOWN");
  const std::string table = FormatClusterStatus({"a:7000", "b:7000"}, {up, down});
  EXPECT_THAT(table, ::testing::ContainsRegex("1 +b:7000 +DOWN"));
  EXPECT_THAT(table, HasSubstr("shards: 1 of 2 answered"));
  EXPECT_THAT(table, HasSubstr("missing: worker 2 (gone, last heard 45.2s ago), "
                               "worker 3 (never joined, waited 12.0s)"));
  EXPECT_THAT(table, ::testing::Not(HasSubstr("sync step")));
}

TEST(StatusTableTest, DoneWorkersAndEveryonePushed) {
  StatusResponse status = SyncShard(0);
  status.set_num_workers(2);
  status.mutable_workers()->DeleteSubrange(1, 3);
  status.mutable_workers(0)->set_done(true);
  WorkerState* other = status.add_workers();
  other->set_worker(1);
  other->set_clock(42);
  other->set_seen(true);
  other->set_live(true);
  const std::string table = FormatClusterStatus({"a:7000"}, {status});
  EXPECT_THAT(table, HasSubstr("workers: 2 expected, 1 live, 1 done, 0 missing"));
  EXPECT_THAT(table, HasSubstr("sync step 41: every worker has pushed it"));
}

void AddChain(StatusResponse* status, int group, int64_t epoch, std::vector<int> members,
              int64_t applied, int64_t acked, bool catching_up = false) {
  ChainState* chain = status->add_chains();
  chain->set_group(group);
  chain->set_epoch(epoch);
  int position = -1;
  for (size_t i = 0; i < members.size(); ++i) {
    chain->add_members(members[i]);
    if (members[i] == static_cast<int>(status->shard())) position = static_cast<int>(i);
  }
  chain->set_position(position);
  chain->set_applied_ops(applied);
  chain->set_acked_ops(acked);
  chain->set_catching_up(catching_up);
}

// Two shards, R = 2: group 0 is 0 -> 1 with 7 pushes not yet acknowledged;
// group 1 lost shard 0, which shard 1 has seen (epoch 4) and shard 0 not.
std::vector<StatusResponse> ReplicatedShards() {
  std::vector<StatusResponse> statuses = {Shard(0, 40), Shard(1, 41)};
  for (StatusResponse& status : statuses) status.set_replicas(2);
  AddChain(&statuses[0], 0, 2, {0, 1}, 1007, 1000);
  AddChain(&statuses[0], 1, 3, {1, 0}, 900, 0, /*catching_up=*/true);
  AddChain(&statuses[1], 0, 2, {0, 1}, 1000, 0);
  AddChain(&statuses[1], 1, 4, {1}, 905, 905);
  return statuses;
}

TEST(StatusTableTest, ReplicatedShardsShowTheirChains) {
  const std::vector<StatusResponse> statuses = ReplicatedShards();
  const std::string table =
      FormatClusterStatus({"10.0.0.1:7000", "10.0.0.2:7000"}, statuses);
  EXPECT_THAT(table, HasSubstr("chains (replicas 2):"));
  const std::vector<std::string> lines = absl::StrSplit(table, '\n');
  auto has_line = [&](const std::vector<std::string>& words) {
    for (const std::string& line : lines) {
      if (std::vector<std::string>(absl::StrSplit(line, ' ', absl::SkipEmpty())) == words) {
        return true;
      }
    }
    return false;
  };
  // shard, address, group, epoch, members, position, applied, lag, catching up
  EXPECT_TRUE(has_line({"0", "10.0.0.1:7000", "0", "2", "0,1", "head", "1007", "7", "-"}))
      << table;
  EXPECT_TRUE(has_line({"0", "10.0.0.1:7000", "1", "3", "1,0", "tail", "900", "-", "yes"}))
      << table;
  EXPECT_TRUE(has_line({"1", "10.0.0.2:7000", "0", "2", "0,1", "tail", "1000", "-", "-"}))
      << table;
  // Alone in its chain: head and tail, nothing to wait for.
  EXPECT_TRUE(has_line({"1", "10.0.0.2:7000", "1", "4", "1", "only", "905", "-", "-"}))
      << table;
  EXPECT_THAT(table, HasSubstr("group 1 DEGRADED: 1 of 2 replicas at epoch 4\n"));
  EXPECT_THAT(table, HasSubstr("group 1: shards disagree (epoch 3 at shard 0; epoch 4 at shard 1)"));
  EXPECT_THAT(table, Not(HasSubstr("group 0 DEGRADED")));
}

TEST(StatusTableTest, UnreplicatedOrDownShardsShowNoChains) {
  std::vector<StatusResponse> statuses = ReplicatedShards();
  for (StatusResponse& status : statuses) status.set_replicas(1);
  EXPECT_EQ(FormatChainStates({"a:1", "b:1"}, statuses), "");
  EXPECT_THAT(FormatClusterStatus({"a:1", "b:1"}, statuses), Not(HasSubstr("chains")));
  // Only a shard that answered counts.
  statuses = ReplicatedShards();
  statuses[0].set_mode("DOWN");
  statuses[1].set_replicas(1);
  EXPECT_EQ(FormatChainStates({"a:1", "b:1"}, statuses), "");
  statuses[1].set_replicas(2);
  const std::string chains = FormatChainStates({"a:1", "b:1"}, statuses);
  EXPECT_THAT(chains, HasSubstr("group 1 DEGRADED"));
  EXPECT_THAT(chains, Not(HasSubstr("disagree")));
  EXPECT_THAT(chains, Not(HasSubstr("a:1")));
}

TEST(StatusTableTest, TablesShowEachShardsShare) {
  std::vector<StatusResponse> statuses(2);
  for (int s = 0; s < 2; ++s) {
    statuses[s].set_shard(s);
    statuses[s].set_mode("async");
    TableState* table = statuses[s].add_tables();
    table->set_name("user");
    table->set_dim(16);
    table->set_optimizer("rowwise_adagrad");
    table->set_rows(1000 + s * 500);
    table->set_capacity(2000);
    table->set_bytes(90 * (1000 + s * 500));
  }
  const std::string tables = FormatTableStates({"a:1", "b:1"}, statuses);
  EXPECT_THAT(tables, HasSubstr("sparse tables:"));
  EXPECT_THAT(tables, HasSubstr("rowwise_adagrad"));
  EXPECT_THAT(tables, HasSubstr("75%"));  // shard 1: 1500 of 2000
  EXPECT_THAT(tables, HasSubstr("90.0"));
  EXPECT_THAT(tables, HasSubstr("table user: 2500 rows on 2 shards\n"));
  for (int s = 0; s < 2; ++s) {
    statuses[s].mutable_tables(0)->set_sync(true);
    statuses[s].mutable_tables(0)->set_steps(41 + s);
  }
  EXPECT_THAT(FormatTableStates({"a:1", "b:1"}, statuses),
              HasSubstr("table user: 2500 rows on 2 shards; sync, steps 41-42\n"));
  EXPECT_THAT(FormatClusterStatus({"a:1", "b:1"}, statuses), HasSubstr("sparse tables:"));
  for (StatusResponse& status : statuses) status.clear_tables();
  EXPECT_EQ(FormatTableStates({"a:1", "b:1"}, statuses), "");
}

TEST(StatusTableTest, Ages) {
  EXPECT_EQ(FormatAge(-1), "never");
  EXPECT_EQ(FormatAge(0.25), "250ms");
  EXPECT_EQ(FormatAge(12.34), "12.3s");
  EXPECT_EQ(FormatAge(245), "4m05s");
}

}  // namespace
}  // namespace shardtrain::ctl
