// AsyncConvergesLikeSync (issue 27), with real ps-server and ps-worker
// processes on 127.0.0.1: the Fashion-MNIST MLP trained with SGD momentum
// 0.9 at lr 0.1 by N = 2, 4, 8 and 16 workers ends within 0.01 of the same
// job in sync mode (see Tolerance for what each N is held to; 16 workers
// run a momentum period of 32), with no
// NaN, when the shards admit pushes in strict worker order (every gradient
// exactly N-1 updates stale) and in seeded random order (--push_order),
// for two data/initialisation seeds. The async shards run momentum as
// Delayed Nesterov (the async default); with heavy-ball momentum the same
// jobs diverge (bench/async_convergence.sh). The push orders make the
// async runs independent of the machine's timing. Each job prints an
// ASYNC-TABLE line.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "testing/files.h"
#include "testing/local_cluster.h"
#include "testing/process_group.h"

namespace shardtrain {
namespace {

using testutil::LocalClusterOptions;
using testutil::ProcessGroup;

constexpr int kEpochs = 3;
constexpr int kBatch = 64;
// A turn is passed on only after its worker has been silent this long
// (a worker evaluating on a loaded machine is not passed over).
constexpr int kSkipSeconds = 10;
constexpr char kPassedOn[] = "push order: passed on ";

// Each worker's share of the data must give Delayed Nesterov enough
// momentum periods (N pushes each) to settle: with 8 workers, half the
// training set left it 0.009-0.018 below sync.
int TrainExamples(int workers) { return workers <= 4 ? 30000 : 60000; }

// How far below sync an async job may end, and the mean of an order's two
// seeds. Measured on 2026-12-01 over 6 runs of each (24 jobs per worker
// count, since Delayed Nesterov applies the momentum part of a period's
// step at its first push, server/optimizer.cc): N = 4 0.0078 at most
// (strict order 0.0044 on average), N = 8 0.0082 at most (strict order
// 0.0057 on average), once 0.0095 in a later run and 0.0107 with 4
// epochs. So N <= 4 holds every job to 0.01; N = 8 holds the mean of the
// two seeds to 0.01 and each job to 0.015. With 16 workers in strict order
// every gradient is 15 updates stale, and a period of 16 is not enough:
// jobs ended 0.011-0.024 below sync and, in 2 runs of 12, 0.029-0.038 (the
// mean of the seeds 0.034 once). A period of 32 (--async_momentum_period,
// twice the workers) gave 0.006-0.015 in strict and random order over 8
// runs: the 0.03 holds every job at that period. On 2026-12-02 a
// CI run (on a slow machine) ended N = 8's strict-order seed-2
// job 0.0150 below sync: the shards had passed on turns of workers still
// starting (2 s default; 6-16 turns a job beside another of these tests).
// A worker that has not pushed yet is now waited for (--push_order_start_s)
// and a silent one for kSkipSeconds: 0 turns passed on in the 4 async jobs
// at N = 8 and the 4 at N = 16, the two tests run side by side; N = 8
// 0.0031-0.0098 a job, the means 0.0048-0.0075. N = 8 holds each job to
// 0.02 and the means to 0.01.
struct Tolerance {
  double job;
  double mean;
};
Tolerance TolerancesFor(int workers) {
  if (workers <= 4) return {0.01, 0.01};
  if (workers <= 8) return {0.02, 0.01};
  return {0.03, 0.03};
}

// The final accuracy of one job; -1 (and a test failure) if it failed.
double Train(int workers, const std::string& mode, const std::string& order, int seed) {
  const std::string dir = testutil::MakeTempDir("shardtrain-async-");
  LocalClusterOptions options;
  options.bin_dir = SHARDTRAIN_BIN_DIR;
  options.mode = mode;
  options.shards = 2;
  options.workers = workers;
  options.dir = dir;
  // A cosine schedule over the job, as run-local's, so the final accuracy
  // is that of a settled model rather than of one noisy step at lr 0.1;
  // async shards count pushes, N per step.
  const int steps = kEpochs * (TrainExamples(workers) / workers / kBatch);
  options.server_flags = {"--optimizer=momentum", "--momentum=0.9", "--lr=0.1",
                          "--lr_schedule=cosine",
                          absl::StrCat("--lr_total_steps=", mode == "sync" ? steps : steps * workers)};
  if (mode == "async") {
    if (workers >= 16) {
      options.server_flags.push_back(absl::StrCat("--async_momentum_period=", 2 * workers));
    }
    options.server_flags.push_back("--push_order=" + order);
    options.server_flags.push_back(absl::StrCat("--push_order_seed=", seed));
    options.server_flags.push_back(absl::StrCat("--push_order_skip_s=", kSkipSeconds));
  }
  options.worker_flags = {absl::StrCat("--epochs=", kEpochs), absl::StrCat("--batch=", kBatch),
                          absl::StrCat("--max_train_examples=", TrainExamples(workers)),
                          "--max_test_examples=10000", absl::StrCat("--seed=", seed),
                          "--overlap=off"};
  ProcessGroup group;
  absl::StatusOr<testutil::LocalCluster> cluster = testutil::StartLocalCluster(group, options);
  if (!cluster.ok()) {
    ADD_FAILURE() << cluster.status();
    return -1;
  }
  absl::StatusOr<double> accuracy =
      testutil::WaitForFinalAccuracy(group, *cluster, absl::Minutes(4));
  if (!accuracy.ok()) {
    ADD_FAILURE() << mode << " " << order << " with " << workers
                  << " workers: " << accuracy.status();
    std::printf("logs kept in %s\n", dir.c_str());
    return -1;
  }
  if (mode == "async") {
    // Turns the shards passed on (push_order.cc logs each time): 0 means
    // the job ran in exactly the order asked for.
    int64_t passed = 0;
    for (int s = 0; s < options.shards; ++s) {
      const std::string log = testutil::ReadFile(cluster->ShardLog(s));
      for (size_t at = log.find(kPassedOn); at != std::string::npos;
           at = log.find(kPassedOn, at + 1)) {
        passed += std::strtoll(log.c_str() + at + std::strlen(kPassedOn), nullptr, 10);
      }
    }
    std::printf("ASYNC-TABLE: N=%d seed=%d %s: %lld turns passed on by the shards\n", workers,
                seed, order.c_str(), static_cast<long long>(passed));
  }
  std::filesystem::remove_all(dir);
  return *accuracy;
}

class AsyncConvergesLikeSync : public ::testing::TestWithParam<int> {};

TEST_P(AsyncConvergesLikeSync, MomentumAtTheSyncLearningRate) {
  const int workers = GetParam();
  const Tolerance tolerance = TolerancesFor(workers);
  const std::vector<std::string> orders = {"round_robin", "random"};
  std::vector<double> gaps(orders.size(), 0.0);  // by order, summed over seeds
  const std::vector<int> seeds = {1, 2};
  for (int seed : seeds) {
    const double sync = Train(workers, "sync", "", seed);
    ASSERT_GT(sync, 0.8) << "the sync baseline did not train";
    for (size_t o = 0; o < orders.size(); ++o) {
      const double async = Train(workers, "async", orders[o], seed);
      std::printf("ASYNC-TABLE: N=%d seed=%d sync=%.4f %s=%.4f\n", workers, seed, sync,
                  orders[o].c_str(), async);
      std::fflush(stdout);
      EXPECT_TRUE(std::isfinite(async) && async > 0.5) << orders[o] << ": diverged";
      EXPECT_NEAR(async, sync, tolerance.job) << orders[o] << " order, seed " << seed;
      gaps[o] += (sync - async) / static_cast<double>(seeds.size());
    }
  }
  for (size_t o = 0; o < orders.size(); ++o) {
    std::printf("ASYNC-TABLE: N=%d %s mean gap to sync over the seeds %.4f\n", workers,
                orders[o].c_str(), gaps[o]);
    EXPECT_LE(std::abs(gaps[o]), tolerance.mean) << orders[o] << " order, mean over the seeds";
  }
}

INSTANTIATE_TEST_SUITE_P(Workers, AsyncConvergesLikeSync, ::testing::Values(2, 4, 8, 16),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat("N", info.param);
                         });

}  // namespace
}  // namespace shardtrain
