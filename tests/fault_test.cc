// Fault tolerance with real processes (issue 8): shards killed and restarted,
// the whole job stopped and resumed, workers stalled, killed, late or lost,
// a worker with the wrong job size, and a network partition. Every test runs
// a small job on 127.0.0.1 (Partition also on a private veth pair) and
// prints one FAULT-TABLE line: the fault, how long recovery took, the
// updates lost and the final accuracy against a clean run where there is
// one. Every process is stopped when the test ends, pass or fail.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"
#include "testing/files.h"
#include "testing/local_cluster.h"
#include "testing/metrics_scrape.h"
#include "testing/net_ns.h"
#include "testing/port_file.h"
#include "testing/process_group.h"

namespace shardtrain {
namespace {

using testutil::LocalCluster;
using testutil::LocalClusterOptions;
using testutil::NetNs;
using testutil::ProcessGroup;

constexpr int kShards = 2;
constexpr int kWorkers = 2;
constexpr int kEpochs = 3;
constexpr int kBatch = 16;
constexpr int kTrainExamples = 12000;
constexpr int kStepsPerEpoch = kTrainExamples / kWorkers / kBatch;  // 375
constexpr double kHeartbeatS = 3;
constexpr double kJoinTimeoutS = 5;
constexpr absl::Duration kJobTimeout = absl::Minutes(3);
constexpr absl::Duration kExitTimeout = absl::Seconds(60);

// The job of every test: a small one (a few seconds when nothing fails),
// with a cosine learning rate so the final accuracy of two runs of it
// agrees to a few thousandths in async mode too.
LocalClusterOptions Job(const std::string& mode, const std::string& dir, int epochs = kEpochs,
                        double checkpoint_interval_s = 1) {
  const int steps = epochs * kStepsPerEpoch;
  LocalClusterOptions options;
  options.bin_dir = SHARDTRAIN_BIN_DIR;
  options.mode = mode;
  options.shards = kShards;
  options.workers = kWorkers;
  options.fixed_ports = true;
  options.dir = dir;
  options.server_flags = {
      "--optimizer=adam", "--lr=0.002", "--lr_schedule=cosine",
      absl::StrCat("--lr_total_steps=", mode == "sync" ? steps : steps * kWorkers),
      "--max_staleness=4", absl::StrCat("--heartbeat_timeout_s=", kHeartbeatS),
      "--checkpoint_dir=" + dir + "/checkpoints"};
  if (mode == "sync") {
    options.server_flags.push_back("--checkpoint_every_steps=50");
  } else {
    options.server_flags.push_back(
        absl::StrCat("--checkpoint_interval_s=", checkpoint_interval_s));
  }
  options.worker_flags = {absl::StrCat("--epochs=", epochs), absl::StrCat("--batch=", kBatch),
                          absl::StrCat("--max_train_examples=", kTrainExamples),
                          "--max_test_examples=10000", "--reconnect_timeout_s=60"};
  return options;
}

// The last `n` characters of a log, for failure messages.
std::string Tail(const std::string& path, size_t n = 4000) {
  const std::string text = testutil::ReadFile(path);
  return text.size() <= n ? text : "..." + text.substr(text.size() - n);
}

// One scrape of a /metrics endpoint; nullopt when it does not answer.
std::optional<std::string> Scrape(int port) {
  if (port <= 0) return std::nullopt;
  absl::StatusOr<std::string> body = testutil::HttpGet(port, "/metrics");
  if (!body.ok()) return std::nullopt;
  return *body;
}

// The sum of a metric's samples (0 when absent); -1 when the endpoint does
// not answer.
double Metric(int port, const std::string& name) {
  std::optional<std::string> body = Scrape(port);
  if (!body) return -1;
  return testutil::SumByName(*body)[name];
}

// The value of the one sample written exactly `series` (name{labels}).
double Sample(const std::string& exposition, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(exposition, '\n')) {
    if (!absl::StartsWith(line, series + " ")) continue;
    double value = 0;
    if (absl::SimpleAtod(line.substr(series.size() + 1), &value)) return value;
  }
  return 0;
}

// Sum over the shards of a metric (the shards are up at the end).
double ShardSum(const LocalCluster& cluster, const std::string& name) {
  double sum = 0;
  for (int port : cluster.shard_metrics_ports) sum += std::max(0.0, Metric(port, name));
  return sum;
}

int64_t Steps(const LocalCluster& cluster, int w) {
  return static_cast<int64_t>(
      Metric(cluster.worker_metrics_ports[w], "shardtrain_worker_steps_total"));
}

// Waits until worker `w` has done `steps` steps; fails if it exits first.
absl::Status WaitForSteps(ProcessGroup& group, const LocalCluster& cluster, int w,
                          int64_t steps, absl::Duration timeout = absl::Minutes(1)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (Steps(cluster, w) >= steps) return absl::OkStatus();
    absl::StatusOr<int> exited = group.Wait(cluster.workers[w], absl::Milliseconds(50));
    if (exited.ok()) {
      return absl::FailedPreconditionError(absl::StrCat("worker ", w, " exited with ", *exited,
                                                        " before step ", steps, "; its log:\n",
                                                        Tail(cluster.WorkerLog(w))));
    }
  }
  return absl::DeadlineExceededError(absl::StrCat("worker ", w, " did not reach step ", steps,
                                                  " in ", absl::FormatDuration(timeout)));
}

// The longest time a worker's step counter stood still while it still had
// steps to do; a worker that stops serving (exits) stops the clock.
class StallMeter {
 public:
  explicit StallMeter(int64_t total_steps) : total_steps_(total_steps) {}
  void Observe(int64_t steps) {
    const absl::Time now = absl::Now();
    last_observed_ = now;
    if (steps < 0) {  // not serving (yet, or any more: it exited)
      if (last_steps_ >= 0 && last_steps_ < total_steps_) {
        longest_ = std::max(longest_, now - last_change_);
      }
      last_steps_ = -1;
      return;
    }
    if (steps != last_steps_ || last_steps_ >= total_steps_) {
      if (last_steps_ >= 0 && last_steps_ < total_steps_) {
        longest_ = std::max(longest_, now - last_change_);
      }
      last_steps_ = steps;
      last_change_ = now;
    }
  }
  // Includes a stall still in progress at the last observation (not the
  // time since observing stopped).
  absl::Duration Longest() const {
    if (last_steps_ >= 0 && last_steps_ < total_steps_) {
      return std::max(longest_, last_observed_ - last_change_);
    }
    return longest_;
  }

 private:
  const int64_t total_steps_;
  int64_t last_steps_ = -1;
  absl::Time last_observed_ = absl::InfinitePast();
  absl::Time last_change_;
  absl::Duration longest_ = absl::ZeroDuration();
};

// The largest N in the log's "resuming at step N" lines; -1 if none.
int64_t ResumedAt(const std::string& log) {
  static const std::regex kResume("resuming at step ([0-9]+)");
  int64_t best = -1;
  for (std::sregex_iterator it(log.begin(), log.end(), kResume), end; it != end; ++it) {
    best = std::max<int64_t>(best, std::stoll((*it)[1].str()));
  }
  return best;
}

// Keeps the logs only when the test failed; checks every worker's exit and
// prints the FAULT-TABLE line.
class FaultTest : public ::testing::Test {
 protected:
  void TearDown() override {
    for (const std::string& dir : dirs_) {
      if (!HasFailure()) {
        std::filesystem::remove_all(dir);
      } else {
        std::printf("logs kept in %s\n", dir.c_str());
      }
    }
  }

  std::string NewDir() {
    std::string dir = testutil::MakeTempDir("shardtrain-fault-");
    dirs_.push_back(dir);
    return dir;
  }

  // Every started worker exits 0 within kExitTimeout.
  void ExpectWorkersExitZero(ProcessGroup& group, const LocalCluster& cluster) {
    for (int w = 0; w < static_cast<int>(cluster.workers.size()); ++w) {
      if (cluster.workers[w] == 0) continue;
      absl::StatusOr<int> code = group.Wait(cluster.workers[w], kExitTimeout);
      ASSERT_TRUE(code.ok()) << "worker " << w << ": " << code.status() << "\n"
                             << Tail(cluster.WorkerLog(w));
      EXPECT_EQ(*code, 0) << "worker " << w << " log:\n" << Tail(cluster.WorkerLog(w));
    }
  }

  // A clean run of the job; its final accuracy.
  double CleanRun(const std::string& mode, int epochs = kEpochs) {
    ProcessGroup group;
    auto cluster = testutil::StartLocalCluster(group, Job(mode, NewDir(), epochs));
    if (!cluster.ok()) {
      ADD_FAILURE() << cluster.status();
      return -1;
    }
    absl::StatusOr<double> accuracy = testutil::WaitForFinalAccuracy(group, *cluster, kJobTimeout);
    if (!accuracy.ok()) {
      ADD_FAILURE() << "clean run: " << accuracy.status();
      return -1;
    }
    ExpectWorkersExitZero(group, *cluster);
    return *accuracy;
  }

  void Report(const std::string& fault, double recovery_s, const std::string& lost,
              double accuracy, double clean_accuracy) {
    const std::string line = absl::StrFormat(
        "FAULT-TABLE: %s recovery_s=%.2f lost=%s acc=%.4f clean_acc=%s", fault, recovery_s, lost,
        accuracy, clean_accuracy < 0 ? "n/a" : absl::StrFormat("%.4f", clean_accuracy));
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    RecordProperty("recovery_s", absl::StrFormat("%.2f", recovery_s));
    RecordProperty("lost_updates", lost);
    RecordProperty("final_accuracy", absl::StrFormat("%.4f", accuracy));
  }

  std::vector<std::string> dirs_;
};

std::vector<int> Ports(const LocalCluster& cluster) {
  std::vector<int> ports;
  for (const std::string& server : cluster.servers) {
    int port = 0;
    (void)absl::SimpleAtoi(server.substr(server.rfind(':') + 1), &port);
    ports.push_back(port);
  }
  return ports;
}

class ModeTest : public FaultTest, public ::testing::WithParamInterface<std::string> {};

std::string ModeName(const ::testing::TestParamInfo<std::string>& info) { return info.param; }

// ---------------------------------------------------------------------------
// A shard is killed mid-training and started again with the same flags after
// 2 s: every worker keeps going and the job finishes. With R = 1 the shard
// comes back from its last checkpoint, so what the test holds it to is what
// R = 1 promises: the updates rolled back are at most those the shard applied
// in one checkpoint interval (plus the time to write one), the workers count
// them, and the final accuracy is within 0.01 of a clean run's. A rollback
// costs accuracy in proportion to its share of the job, so the async job
// checkpoints every 0.25 s: its worst case is a few percent of the victim's
// updates, where a 1 s interval let a kill roll back a quarter of a
// 4-second job and the accuracy bound failed 2 runs in 5 (sync checkpoints
// every 50 of its 1,125 steps). Even so, a rollback of 140 updates per
// partition (6% of a 3-epoch async job, on half the model) cost 0.012
// while the model was still gaining 0.014 an epoch, so the async job runs 6
// epochs: the same rollback is 3% of it and lands further from the end.
using ShardKillRestart = ModeTest;

constexpr double kKillCheckpointS = 0.25;

int KillEpochs(const std::string& mode) { return mode == "async" ? 2 * kEpochs : kEpochs; }

// The victim's partition versions: their sum and how many partitions.
struct Versions {
  double sum = 0;
  int partitions = 0;
};

std::optional<Versions> PartitionVersions(int metrics_port) {
  const std::optional<std::string> body = Scrape(metrics_port);
  if (!body) return std::nullopt;
  Versions versions;
  for (absl::string_view line : absl::StrSplit(*body, '\n')) {
    if (!absl::StartsWith(line, "shardtrain_partition_version{")) continue;
    double value = 0;
    if (absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &value)) {
      versions.sum += value;
      ++versions.partitions;
    }
  }
  return versions;
}

TEST_P(ShardKillRestart, WorkersContinueAndAccuracyHolds) {
  const std::string mode = GetParam();
  const int epochs = KillEpochs(mode);
  const double clean_accuracy = CleanRun(mode, epochs);
  ASSERT_GT(clean_accuracy, 0);

  ProcessGroup group;
  auto started = testutil::StartLocalCluster(
      group, Job(mode, NewDir(), epochs, kKillCheckpointS));
  ASSERT_TRUE(started.ok()) << started.status();
  LocalCluster& cluster = *started;
  const int64_t total = epochs * kStepsPerEpoch;
  constexpr int kVictim = 1;
  // The victim's update rate, measured over the same stretch of training
  // the kill lands in: the rollback's bound below is that rate times the
  // interval, whatever the machine's load.
  ASSERT_TRUE(WaitForSteps(group, cluster, 0, total / 6).ok());
  const std::optional<Versions> early = PartitionVersions(cluster.shard_metrics_ports[kVictim]);
  const absl::Time early_at = absl::Now();
  // Mid-epoch, past a step checkpoint (every 50 steps in sync mode).
  ASSERT_TRUE(WaitForSteps(group, cluster, 0, total / 3 + 30).ok());

  // The premise: the victim has a checkpoint to come back from (async ones
  // are timed, and a fast run can reach the step above before the first).
  const absl::Time checkpointed_by = absl::Now() + absl::Seconds(30);
  while (absl::Now() < checkpointed_by) {
    const std::optional<std::string> body = Scrape(cluster.shard_metrics_ports[kVictim]);
    if (body && Sample(*body, "shardtrain_checkpoints_total{result=\"ok\"}") >= 1) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  const std::optional<Versions> late = PartitionVersions(cluster.shard_metrics_ports[kVictim]);
  const absl::Time late_at = absl::Now();
  ASSERT_TRUE(early && late && late->partitions > 0) << "the victim's versions are not exported";
  ASSERT_TRUE(group.Signal(cluster.shards[kVictim], SIGKILL).ok());
  ASSERT_TRUE(group.Wait(cluster.shards[kVictim], absl::Seconds(10)).ok());
  const absl::Time killed = absl::Now();
  // Updates per partition per second.
  const double rate = (late->sum - early->sum) / late->partitions /
                      std::max(1e-3, absl::ToDoubleSeconds(late_at - early_at));
  absl::SleepFor(absl::Seconds(2));
  std::vector<int64_t> before(kWorkers);
  for (int w = 0; w < kWorkers; ++w) before[w] = Steps(cluster, w);
  absl::Status restarted = testutil::RestartShard(group, cluster, kVictim);
  ASSERT_TRUE(restarted.ok()) << restarted;

  // Recovered: every worker has stepped since the restart (or finished).
  std::map<int, double> worker_lost, shard_restarts;
  auto watch = [&] {
    for (int w = 0; w < kWorkers; ++w) {
      std::optional<std::string> body = Scrape(cluster.worker_metrics_ports[w]);
      if (!body) continue;
      auto sums = testutil::SumByName(*body);
      worker_lost[w] = std::max(worker_lost[w], sums["shardtrain_worker_lost_updates_total"]);
      shard_restarts[w] =
          std::max(shard_restarts[w], sums["shardtrain_worker_shard_restarts_total"]);
    }
  };
  std::optional<absl::Duration> recovery;
  const absl::Time deadline = absl::Now() + absl::Seconds(90);
  while (!recovery && absl::Now() < deadline) {
    watch();
    bool all = true, exited = false;
    for (int w = 0; w < kWorkers; ++w) {
      exited = exited || group.Wait(cluster.workers[w], absl::ZeroDuration()).ok();
    }
    if (exited) break;  // checked below
    for (int w = 0; w < kWorkers; ++w) {
      const int64_t steps = Steps(cluster, w);
      all = all && (steps > before[w] || steps >= total);
    }
    if (all) recovery = absl::Now() - killed;
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE(recovery.has_value())
      << "the workers made no progress after the restart (or one exited)";

  absl::StatusOr<double> accuracy = testutil::WaitForFinalAccuracy(group, cluster, kJobTimeout, watch);
  ASSERT_TRUE(accuracy.ok()) << accuracy.status();
  ExpectWorkersExitZero(group, cluster);

  const std::optional<std::string> shard = Scrape(cluster.shard_metrics_ports[kVictim]);
  ASSERT_TRUE(shard.has_value());
  const double shard_lost = ShardSum(cluster, "shardtrain_lost_updates_total");
  // Each worker counts the partition versions it saw roll back: report
  // the most any worker saw, not the sum.
  double workers_lost = 0, restarts_seen = 0;
  for (int w = 0; w < kWorkers; ++w) {
    workers_lost = std::max(workers_lost, worker_lost[w]);
    restarts_seen += shard_restarts[w];
  }
  Report(absl::StrCat("ShardKillRestart/", mode),
         recovery ? absl::ToDoubleSeconds(*recovery) : -1,
         absl::StrFormat("%.0f(shard)/%.0f(worker)", shard_lost, workers_lost), *accuracy,
         clean_accuracy);
  // The restarted shard came back from its checkpoint, not from scratch,
  // and the workers noticed its new incarnation.
  EXPECT_EQ(Sample(*shard, "shardtrain_checkpoint_restores_total{result=\"ok\"}"), 1)
      << "restarted shard's log:\n" << Tail(cluster.ShardLog(kVictim));
  EXPECT_GT(restarts_seen, 0) << "no worker counted the shard's restart";
  // The rollback: at most the updates of one interval, a step checkpoint's
  // 50 steps in sync mode, plus 2 s of slack for writing the file and the
  // kill's own latency on a loaded machine (seen: 0.9 s worth).
  const double per_partition = workers_lost / late->partitions;
  const double bound = mode == "sync" ? 50 + 2 * rate : rate * (kKillCheckpointS + 2.0);
  std::printf("rollback: %.1f updates per partition (bound %.1f, %.0f updates/s)\n",
              per_partition, bound, rate);
  EXPECT_LE(per_partition, bound) << "more was lost than one checkpoint interval";
  EXPECT_NEAR(*accuracy, clean_accuracy, 0.01);
}

INSTANTIATE_TEST_SUITE_P(Modes, ShardKillRestart, ::testing::Values("sync", "async"), ModeName);

// ---------------------------------------------------------------------------
// The whole cluster is stopped (SIGTERM) mid-run and started again with the
// same flags and checkpoints: it trains the remaining epochs only.
using JobResume = ModeTest;

TEST_P(JobResume, FinishesTheRemainingEpochs) {
  const std::string mode = GetParam();
  const int64_t total = kEpochs * kStepsPerEpoch;
  const std::string dir = NewDir();
  ProcessGroup group;
  LocalClusterOptions options = Job(mode, dir);
  auto first = testutil::StartLocalCluster(group, options);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(WaitForSteps(group, *first, 0, total / 2).ok());
  const int64_t stopped_at = Steps(*first, 0);
  for (pid_t pid : first->workers) ASSERT_TRUE(group.Signal(pid, SIGTERM).ok());
  for (pid_t pid : first->shards) ASSERT_TRUE(group.Signal(pid, SIGTERM).ok());
  for (pid_t pid : first->workers) EXPECT_TRUE(group.Wait(pid, absl::Seconds(20)).ok());
  for (pid_t pid : first->shards) {
    EXPECT_TRUE(group.Wait(pid, absl::Seconds(20)).ok()) << "a shard ignored SIGTERM";
  }
  group.StopAll();
  const absl::Time stopped = absl::Now();
  ASSERT_NE(access(first->ResultsPath().c_str(), F_OK), 0) << "a stopped job wrote results";

  options.shard_ports = Ports(*first);
  auto second = testutil::StartLocalCluster(group, options);
  ASSERT_TRUE(second.ok()) << second.status();
  LocalCluster& cluster = *second;
  std::optional<absl::Duration> recovery;
  absl::StatusOr<double> accuracy = testutil::WaitForFinalAccuracy(group, cluster, kJobTimeout, [&] {
    if (!recovery && Steps(cluster, 0) > 0) recovery = absl::Now() - stopped;
  });
  ASSERT_TRUE(accuracy.ok()) << accuracy.status();
  ExpectWorkersExitZero(group, cluster);

  const int64_t resumed_at = ResumedAt(testutil::ReadFile(cluster.WorkerLog(0)));
  const double shard_lost = ShardSum(cluster, "shardtrain_lost_updates_total");
  Report(absl::StrCat("JobResume/", mode), recovery ? absl::ToDoubleSeconds(*recovery) : -1,
         absl::StrFormat("%.0f(shard) redone=%s", shard_lost,
                         resumed_at >= 0 ? absl::StrCat(stopped_at - resumed_at) : "n/a"),
         *accuracy, -1);

  EXPECT_GT(resumed_at, 0) << "the chief did not resume; its log:\n"
                           << Tail(cluster.WorkerLog(0));
  // Resumed from the newest checkpoint, not ahead of the job (a few steps
  // may finish between the scrape and the signal).
  EXPECT_LE(resumed_at, stopped_at + 20);
  absl::StatusOr<testutil::RunResults> results = testutil::ReadResults(cluster.ResultsPath());
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_EQ(results->epochs, kEpochs);
  EXPECT_EQ(results->last_epoch, kEpochs);
  EXPECT_GE(results->final_test_accuracy, 0.7);
  if (mode == "sync") {
    // Versions are steps: the resumed job ends at a full run's step count.
    for (int port : cluster.shard_metrics_ports) {
      EXPECT_EQ(Metric(port, "shardtrain_partition_version_max"), total);
      EXPECT_EQ(Metric(port, "shardtrain_partition_version_min"), total);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, JobResume, ::testing::Values("sync", "async"), ModeName);

// ---------------------------------------------------------------------------
// Sync, the whole job SIGKILLed between the shards' writes of one step
// checkpoint (each shard writes its own from its housekeeping loop, so they
// can be up to ~0.1 s apart): one shard restores the step before the one
// the other restores. The workers go on at the newer step, the older
// shard's partitions catch up on their first push (their steps between are
// lost, as after one shard's restart), and the job ends at a full run's
// step count. When the kill fell between two steps' writes, shard 0's
// newest checkpoint is deleted to make the gap certain.
using JobKilledBetweenCheckpointWrites = FaultTest;

TEST_F(JobKilledBetweenCheckpointWrites, ResumesAtTheNewerStep) {
  const int64_t total = kEpochs * kStepsPerEpoch;
  const std::string dir = NewDir();
  ProcessGroup group;
  LocalClusterOptions options = Job("sync", dir);
  auto first = testutil::StartLocalCluster(group, options);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(WaitForSteps(group, *first, 0, total / 2).ok());
  for (pid_t pid : first->workers) ASSERT_TRUE(group.Signal(pid, SIGKILL).ok());
  for (pid_t pid : first->shards) ASSERT_TRUE(group.Signal(pid, SIGKILL).ok());
  group.StopAll();

  // Each shard's step checkpoints, by step.
  std::map<int64_t, std::string> steps[2];
  for (const auto& entry : std::filesystem::directory_iterator(dir + "/checkpoints")) {
    const std::string name = entry.path().filename().string();
    int shard = -1, shards = 0;
    long long step = -1;
    if (std::sscanf(name.c_str(), "shard-%d-of-%d-%lld.ckpt", &shard, &shards, &step) == 3 &&
        absl::EndsWith(name, ".ckpt") && shard >= 0 && shard < 2) {
      steps[shard][step] = entry.path().string();
    }
  }
  ASSERT_FALSE(steps[0].empty() || steps[1].empty()) << "a shard wrote no step checkpoint";
  // The job may have died between the shards' writes of one step: then
  // they restore different steps already. Otherwise shard 0's newest goes.
  if (steps[0].rbegin()->first == steps[1].rbegin()->first) {
    ASSERT_GE(steps[0].size(), 2u) << "shard 0 keeps its previous step checkpoint";
    ASSERT_TRUE(std::filesystem::remove(steps[0].rbegin()->second));
  }

  options.shard_ports = Ports(*first);
  auto second = testutil::StartLocalCluster(group, options);
  ASSERT_TRUE(second.ok()) << second.status();
  LocalCluster& cluster = *second;
  absl::StatusOr<double> accuracy = testutil::WaitForFinalAccuracy(group, cluster, kJobTimeout);
  ASSERT_TRUE(accuracy.ok()) << accuracy.status();
  ExpectWorkersExitZero(group, cluster);
  // The first worker to register sees the gap (no push has closed it yet).
  const std::string logs = testutil::ReadFile(cluster.WorkerLog(0)) +
                           testutil::ReadFile(cluster.WorkerLog(1));
  EXPECT_TRUE(absl::StrContains(logs, "restored an older step checkpoint"))
      << "no worker saw the gap; the chief's log:\n" << Tail(cluster.WorkerLog(0));
  EXPECT_GT(ResumedAt(testutil::ReadFile(cluster.WorkerLog(0))), 0) << "the chief did not resume";
  EXPECT_GE(*accuracy, 0.7);
  for (int port : cluster.shard_metrics_ports) {
    EXPECT_EQ(Metric(port, "shardtrain_partition_version_max"), total);
    EXPECT_EQ(Metric(port, "shardtrain_partition_version_min"), total);
  }
}

// ---------------------------------------------------------------------------
// A worker is stopped (SIGSTOP) for longer than the heartbeat timeout, then
// continued: the other worker waits at most about the heartbeat timeout,
// and the stalled one rejoins and finishes.
using WorkerStallRejoin = FaultTest;

TEST_F(WorkerStallRejoin, OthersContinueAndTheStalledOneRejoins) {
  constexpr int kEpochsHere = 12;  // worker 0 still trains when worker 1 wakes
  const int64_t total = kEpochsHere * kStepsPerEpoch;
  ProcessGroup group;
  auto started = testutil::StartLocalCluster(group, Job("sync", NewDir(), kEpochsHere));
  ASSERT_TRUE(started.ok()) << started.status();
  LocalCluster& cluster = *started;
  ASSERT_TRUE(WaitForSteps(group, cluster, 0, 200).ok());

  const absl::Duration stall = absl::Seconds(kHeartbeatS + 5);
  ASSERT_TRUE(group.Signal(cluster.workers[1], SIGSTOP).ok());
  StallMeter others(total);
  const absl::Time stopped = absl::Now();
  while (absl::Now() < stopped + stall) {
    others.Observe(Steps(cluster, 0));
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_TRUE(group.Signal(cluster.workers[1], SIGCONT).ok());
  for (absl::Time until = absl::Now() + absl::Seconds(2); absl::Now() < until;) {
    others.Observe(Steps(cluster, 0));
    absl::SleepFor(absl::Milliseconds(50));
  }
  double rejoins = 0;
  absl::StatusOr<double> accuracy = testutil::WaitForFinalAccuracy(group, cluster, kJobTimeout, [&] {
    rejoins = std::max(rejoins, Metric(cluster.worker_metrics_ports[1],
                                       "shardtrain_worker_rejoins_total"));
  });
  ASSERT_TRUE(accuracy.ok()) << accuracy.status();
  ExpectWorkersExitZero(group, cluster);

  double shard_rejoins = 0;
  for (int port : cluster.shard_metrics_ports) {
    std::optional<std::string> body = Scrape(port);
    if (body) shard_rejoins += Sample(*body, "shardtrain_worker_joins_total{kind=\"rejoin\"}");
  }
  const absl::Duration longest = others.Longest();
  Report("WorkerStallRejoin", absl::ToDoubleSeconds(longest),
         absl::StrFormat("n/a(rejoins worker=%.0f shards=%.0f)", rejoins, shard_rejoins),
         *accuracy, -1);
  EXPECT_LE(longest, absl::Seconds(kHeartbeatS + 3))
      << "worker 0 stood still that long while worker 1 was stopped for "
      << absl::FormatDuration(stall);
  EXPECT_GT(std::max(rejoins, shard_rejoins), 0)
      << "no rejoin counted; worker 1's log:\n" << Tail(cluster.WorkerLog(1));
}

// ---------------------------------------------------------------------------
// A worker (not the chief; then the chief) is killed mid-run and started
// again with the same flags: it resumes where the job is and the job ends
// with results at a full run's step count.
class WorkerRestart : public FaultTest, public ::testing::WithParamInterface<int> {};

TEST_P(WorkerRestart, ResumesAndTheJobFinishes) {
  const int victim = GetParam();
  const int64_t total = kEpochs * kStepsPerEpoch;
  ProcessGroup group;
  auto started = testutil::StartLocalCluster(group, Job("sync", NewDir()));
  ASSERT_TRUE(started.ok()) << started.status();
  LocalCluster& cluster = *started;
  ASSERT_TRUE(WaitForSteps(group, cluster, 0, total / 3).ok());
  const int64_t killed_at = Steps(cluster, victim);

  ASSERT_TRUE(group.Signal(cluster.workers[victim], SIGKILL).ok());
  ASSERT_TRUE(group.Wait(cluster.workers[victim], absl::Seconds(10)).ok());
  const absl::Time killed = absl::Now();
  absl::SleepFor(absl::Seconds(1));
  absl::Status restarted = testutil::StartWorker(group, cluster, victim);
  ASSERT_TRUE(restarted.ok()) << restarted;
  std::optional<absl::Duration> recovery;
  absl::StatusOr<double> accuracy = testutil::WaitForFinalAccuracy(group, cluster, kJobTimeout, [&] {
    if (!recovery && Steps(cluster, victim) > 0) recovery = absl::Now() - killed;
  });
  ASSERT_TRUE(accuracy.ok()) << accuracy.status();
  ExpectWorkersExitZero(group, cluster);

  const int64_t resumed_at = ResumedAt(testutil::ReadFile(cluster.WorkerLog(victim)));
  Report(victim == 0 ? "WorkerRestart/chief" : "WorkerRestart/worker",
         recovery ? absl::ToDoubleSeconds(*recovery) : -1,
         absl::StrFormat("%.0f(shard) killed_at=%d resumed_at=%d",
                         ShardSum(cluster, "shardtrain_lost_updates_total"), killed_at,
                         resumed_at),
         *accuracy, -1);
  EXPECT_GE(resumed_at, killed_at) << "worker " << victim << "'s log:\n"
                                   << Tail(cluster.WorkerLog(victim));
  EXPECT_GT(resumed_at, 0);
  absl::StatusOr<testutil::RunResults> results = testutil::ReadResults(cluster.ResultsPath());
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_EQ(results->last_epoch, kEpochs);
  EXPECT_GE(results->final_test_accuracy, 0.7);
  for (int port : cluster.shard_metrics_ports) {
    EXPECT_EQ(Metric(port, "shardtrain_partition_version_max"), total);
  }
}

INSTANTIATE_TEST_SUITE_P(Victims, WorkerRestart, ::testing::Values(1, 0),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return info.param == 0 ? std::string("Chief") : std::string("NonChief");
                         });

// ---------------------------------------------------------------------------
// One worker starts 20 s late: the other is held back at most about
// --join_timeout_s, and nobody fails with DEADLINE_EXCEEDED.
using LateWorker = ModeTest;

TEST_P(LateWorker, OthersAreNotBlockedBeyondTheJoinTimeout) {
  const std::string mode = GetParam();
  constexpr int kEpochsHere = 8;
  const int64_t total = kEpochsHere * kStepsPerEpoch;
  LocalClusterOptions options = Job(mode, NewDir(), kEpochsHere);
  options.server_flags.push_back(absl::StrCat("--join_timeout_s=", kJoinTimeoutS));
  options.start_workers = 1;
  ProcessGroup group;
  const absl::Time shards_started = absl::Now();
  auto started = testutil::StartLocalCluster(group, options);
  ASSERT_TRUE(started.ok()) << started.status();
  LocalCluster& cluster = *started;

  StallMeter first(total);
  std::optional<absl::Duration> first_steps;
  auto observe = [&] {
    const int64_t steps = Steps(cluster, 0);
    first.Observe(steps);
    if (!first_steps && steps >= 10) first_steps = absl::Now() - shards_started;
  };
  const absl::Time late = shards_started + absl::Seconds(20);
  while (absl::Now() < late) {
    observe();
    absl::SleepFor(absl::Milliseconds(50));
  }
  // Worker 0 may be done already (its exit is checked below).
  absl::Status joined = testutil::StartWorker(group, cluster, 1);
  ASSERT_TRUE(joined.ok()) << joined;
  absl::StatusOr<double> accuracy =
      testutil::WaitForFinalAccuracy(group, cluster, kJobTimeout, observe);
  ASSERT_TRUE(accuracy.ok()) << accuracy.status();
  ExpectWorkersExitZero(group, cluster);

  const absl::Duration longest = first.Longest();
  Report(absl::StrCat("LateWorker/", mode), absl::ToDoubleSeconds(longest), "n/a", *accuracy,
         -1);
  ASSERT_TRUE(first_steps.has_value()) << "worker 0 never did 10 steps";
  std::printf("worker 0 did 10 steps %.2f s after the shards started; longest stall %.2f s\n",
              absl::ToDoubleSeconds(*first_steps), absl::ToDoubleSeconds(longest));
  // Startup (data loading) plus the join timeout, with slack for a busy
  // machine; without the timeout worker 0 waits the full 20 s.
  EXPECT_LE(*first_steps, absl::Seconds(kJoinTimeoutS + 8));
  EXPECT_LE(longest, absl::Seconds(kJoinTimeoutS + 4));
  for (int w = 0; w < kWorkers; ++w) {
    EXPECT_EQ(testutil::ReadFile(cluster.WorkerLog(w)).find("DEADLINE_EXCEEDED"),
              std::string::npos)
        << "worker " << w << "'s log:\n" << Tail(cluster.WorkerLog(w));
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, LateWorker, ::testing::Values("sync", "async"), ModeName);

// ---------------------------------------------------------------------------
// The chief is killed and not restarted: scripts/run-local.sh must not end
// with a silent exit 0; it says the chief died and writes no results.
using ChiefLoss = FaultTest;

// The pid of a process whose stderr is `log` and whose program is
// ps-worker; 0 when none (yet).
pid_t FindWorkerByLog(const std::string& log) {
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", error)) {
    const std::string name = entry.path().filename();
    pid_t pid = 0;
    if (!absl::SimpleAtoi(name, &pid)) continue;
    std::error_code e1, e2;
    const auto fd2 = std::filesystem::read_symlink(entry.path() / "fd" / "2", e1);
    const auto exe = std::filesystem::read_symlink(entry.path() / "exe", e2);
    if (!e1 && !e2 && fd2 == log && exe.filename() == "ps-worker") return pid;
  }
  return 0;
}

// The value of --flag= on a process's command line.
std::string FlagOf(pid_t pid, const std::string& flag) {
  const std::string cmdline = testutil::ReadFile(absl::StrCat("/proc/", pid, "/cmdline"));
  for (absl::string_view arg : absl::StrSplit(cmdline, '\0')) {
    if (absl::ConsumePrefix(&arg, "--" + flag + "=")) return std::string(arg);
  }
  return "";
}

TEST_F(ChiefLoss, RunLocalFailsAndSaysTheChiefDied) {
  const std::string dir = NewDir();
  const std::string logs = dir + "/logs";
  ProcessGroup group;
  setenv("BUILD_DIR", SHARDTRAIN_BUILD_DIR, 1);
  auto run = group.Start({"/bin/bash", std::string(SHARDTRAIN_SOURCE_DIR) + "/scripts/run-local.sh",
                          "--no-build", "--mode", "async", "--epochs", "1", "--model",
                          "mlp:784-256-128-10", "--batch", "32", "--logs", logs, "--results",
                          dir + "/results.json", "--", "--heartbeat_timeout_s=3"},
                         dir + "/run-local.out");
  ASSERT_TRUE(run.ok()) << run.status();

  // The chief, once it trains.
  pid_t chief = 0;
  int chief_metrics = 0;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (absl::Now() < deadline) {
    ASSERT_FALSE(group.Wait(*run, absl::Milliseconds(100)).ok())
        << "run-local ended first:\n" << testutil::ReadFile(dir + "/run-local.out");
    if (chief == 0) chief = FindWorkerByLog(logs + "/worker0.log");
    if (chief != 0 && chief_metrics == 0) {
      const std::string port_file = FlagOf(chief, "port_file");
      auto ports = testutil::ReadPortFile(port_file, absl::Milliseconds(100));
      if (ports.ok()) chief_metrics = (*ports)[0];
    }
    if (chief_metrics != 0 && Metric(chief_metrics, "shardtrain_worker_steps_total") >= 50) break;
  }
  ASSERT_NE(chief_metrics, 0) << "the chief did not start training:\n"
                              << testutil::ReadFile(dir + "/run-local.out");
  ASSERT_EQ(kill(chief, SIGKILL), 0);
  const absl::Time killed = absl::Now();
  absl::StatusOr<int> code = group.Wait(*run, absl::Minutes(2));
  ASSERT_TRUE(code.ok()) << "run-local still runs 2 min after the chief died:\n"
                         << testutil::ReadFile(dir + "/run-local.out");
  const double exit_s = absl::ToDoubleSeconds(absl::Now() - killed);
  const std::string output = testutil::ReadFile(dir + "/run-local.out");
  Report("ChiefLoss", exit_s, "n/a", 0, -1);
  EXPECT_NE(*code, 0) << output;
  EXPECT_TRUE(std::regex_search(output, std::regex("chief", std::regex::icase)))
      << "run-local does not say the chief died:\n" << output;
  EXPECT_NE(access((dir + "/results.json").c_str(), F_OK), 0) << "results without a chief";
}

// ---------------------------------------------------------------------------
// A worker with another job size than the shards' is refused at once, with
// both numbers in the message.
using NumWorkersMismatch = FaultTest;

TEST_F(NumWorkersMismatch, WorkerExitsQuicklyNamingBothNumbers) {
  LocalClusterOptions options = Job("sync", NewDir());
  options.start_workers = 0;
  ProcessGroup group;
  auto started = testutil::StartLocalCluster(group, options);
  ASSERT_TRUE(started.ok()) << started.status();
  LocalCluster& cluster = *started;
  std::vector<std::string> argv = cluster.worker_argv[1];
  for (std::string& arg : argv) {
    if (arg == absl::StrCat("--num_workers=", kWorkers)) arg = "--num_workers=3";
  }
  const absl::Time start = absl::Now();
  auto pid = group.Start(argv, cluster.WorkerLog(1));
  ASSERT_TRUE(pid.ok()) << pid.status();
  absl::StatusOr<int> code = group.Wait(*pid, absl::Seconds(30));
  ASSERT_TRUE(code.ok()) << "a worker of a 3-worker job still runs against 2-worker shards:\n"
                         << Tail(cluster.WorkerLog(1));
  const double exit_s = absl::ToDoubleSeconds(absl::Now() - start);
  Report("NumWorkersMismatch", exit_s, "n/a", 0, -1);
  EXPECT_NE(*code, 0);
  EXPECT_LE(exit_s, 15);
  // Some message line (past glog's prefix) names 3 and 2.
  bool named = false;
  const std::string log = testutil::ReadFile(cluster.WorkerLog(1));
  static const std::regex kTwo("\\b2\\b"), kThree("\\b3\\b");
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    const size_t prefix = line.find("] ");
    const std::string message(prefix == absl::string_view::npos ? line : line.substr(prefix + 2));
    if (message.find("worker") != std::string::npos && std::regex_search(message, kTwo) &&
        std::regex_search(message, kThree)) {
      named = true;
    }
  }
  EXPECT_TRUE(named) << "no line names both 3 and 2:\n" << Tail(cluster.WorkerLog(1));
}

// ---------------------------------------------------------------------------
// Partition: worker 1 lives in its own network namespace, joined to this one
// by a veth pair with private addresses; its link is cut for 5 s and
// restored. The job finishes and worker 1 with it.
using Partition = FaultTest;

TEST_F(Partition, WorkerCutOffFor5sContinues) {
  if (access("/usr/sbin/ip", X_OK) != 0) GTEST_SKIP() << "no /usr/sbin/ip";
  auto ns = NetNs::Create();
  if (!ns.ok()) GTEST_SKIP() << "network namespaces are not available: " << ns.status();
  constexpr int kEpochsHere = 5;
  const int64_t total = kEpochsHere * kStepsPerEpoch;
  LocalClusterOptions options = Job("sync", NewDir(), kEpochsHere);
  options.listen_host = (*ns)->host_addr();  // both workers reach the shards there
  options.worker_prefix[1] = (*ns)->Exec();
  ProcessGroup group;
  auto started = testutil::StartLocalCluster(group, options);
  ASSERT_TRUE(started.ok()) << started.status();
  LocalCluster& cluster = *started;
  ASSERT_TRUE(WaitForSteps(group, cluster, 0, 200).ok());

  ASSERT_TRUE((*ns)->SetLink(false).ok());
  StallMeter others(total);
  const absl::Time cut = absl::Now();
  while (absl::Now() < cut + absl::Seconds(5)) {
    others.Observe(Steps(cluster, 0));
    absl::SleepFor(absl::Milliseconds(50));
  }
  absl::Status restored = (*ns)->SetLink(true);
  ASSERT_TRUE(restored.ok()) << restored;
  absl::StatusOr<double> accuracy = testutil::WaitForFinalAccuracy(
      group, cluster, kJobTimeout, [&] { others.Observe(Steps(cluster, 0)); });
  ASSERT_TRUE(accuracy.ok()) << accuracy.status();
  ExpectWorkersExitZero(group, cluster);
  double shard_rejoins = 0;
  for (int port : cluster.shard_metrics_ports) {
    std::optional<std::string> body = Scrape(port);
    if (body) shard_rejoins += Sample(*body, "shardtrain_worker_joins_total{kind=\"rejoin\"}");
  }
  Report("Partition", absl::ToDoubleSeconds(others.Longest()),
         absl::StrFormat("n/a(rejoins shards=%.0f)", shard_rejoins), *accuracy, -1);
  EXPECT_LE(others.Longest(), absl::Seconds(kHeartbeatS + 3));
  EXPECT_GE(*accuracy, 0.7);
}

}  // namespace
}  // namespace shardtrain

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (access((std::string(shardtrain::testutil::kFashionMnistDir) + "/train-images-idx3-ubyte.gz")
                 .c_str(),
             R_OK) != 0) {
    std::fprintf(stderr, "Fashion-MNIST is not installed (dataset-fashion-mnist)\n");
    return 1;
  }
  return RUN_ALL_TESTS();
}
