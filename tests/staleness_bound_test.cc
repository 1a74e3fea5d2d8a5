// StalenessBound: in async mode with bound S, a fast worker may start a step
// only while it is at most S steps ahead of the slowest live worker. With
// one worker slowed down on purpose, the fast one must wait, the clock gap
// must stay within S+1 (S, plus the step it is pushing), and no gradient the
// shards apply may be staler than (N-1)(2S+1) updates: while one gradient is
// computed, each other worker can push at most 2S+1 gradients. A sparse
// table's training lookups obey the same bound (TableLookupsWaitLikePulls).
#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "client/ps_client.h"
#include "client/table_client.h"
#include "common/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "server/ps_server.h"
#include "tests/in_process_shards.h"

namespace shardtrain {
namespace {

constexpr int kWorkers = 2;
constexpr int kSteps = 24;
constexpr int64_t kElements = 2000;

struct Outcome {
  int64_t max_staleness = 0;
  int64_t max_gap = 0;
  double fast_wait_seconds = 0;
};

// How each step's gradients go to a shard.
enum class Calls {
  kWhole,  // one Pull and one Push call per shard
  // Four calls on four connections, which the shard must count before it
  // moves the worker's clock (PushRequest.clock_parts).
  kSplit,
  // Overlapped (StartExchange, as ps-worker's backward does): one PushPull
  // per tensor and shard, four tensors, a quarter of the step time apart.
  kOverlapped,
};
constexpr int kOverlappedTensors = 4;

absl::StatusOr<Outcome> RunTwoWorkers(int64_t bound, Calls calls = Calls::kWhole) {
  // Split: four partitions per shard, each at the client's floor per
  // connection (128k elements).
  const bool split = calls == Calls::kSplit;
  const int64_t partition = split ? 128 * 1024 : 500;
  const int64_t elements = split ? 8 * partition : kElements;
  const int tensors = calls == Calls::kOverlapped ? kOverlappedTensors : 1;
  server::ShardOptions options;
  options.partitioning.max_partition_elements = partition;
  options.mode = server::ConsistencyMode::kAsync;
  options.num_workers = kWorkers;
  options.max_staleness = bound;
  ASSIGN_OR_RETURN(testutil::InProcessShards cluster,
                   testutil::StartInProcessShards(options, 2));
  const std::vector<std::string>& addresses = cluster.addresses;
  std::vector<TensorSpec> specs(tensors);
  for (int t = 0; t < tensors; ++t) {
    specs[t].set_name("w" + std::to_string(t));
    specs[t].add_shape(elements);
    specs[t].set_dtype(DTYPE_F32);
  }

  Outcome outcome;
  std::atomic<int64_t> max_staleness{0};
  std::atomic<bool> done{false};
  std::atomic<double> fast_wait{0};
  auto train = [&](int w, absl::Duration step_time) {
    client::PsClientOptions options;
    options.servers = addresses;
    options.worker_index = w;
    options.max_partition_elements = partition;
    options.exchanges_cover_every_tensor = true;
    auto client = client::PsClient::Create(options, nullptr).value();
    ASSERT_TRUE(client->Register(specs).ok());
    std::vector<std::vector<float>> params(tensors, std::vector<float>(elements));
    const std::vector<float> grads(elements, 1e-3f);
    std::vector<absl::Span<float>> param_spans;
    for (std::vector<float>& p : params) param_spans.push_back(absl::MakeSpan(p));
    const std::vector<absl::Span<const float>> grad_spans(tensors, absl::MakeConstSpan(grads));
    double waited = 0;
    for (int64_t clock = 0; clock < kSteps; ++clock) {
      client::PullStats pull;
      client::PushStats push;
      if (calls != Calls::kOverlapped) {
        ASSERT_TRUE(client->Pull(clock, 0, param_spans, &pull).ok());
        waited += pull.server_wait_seconds;
        absl::SleepFor(step_time);
        ASSERT_TRUE(client->Push(clock + 1, grad_spans, &push).ok());
      } else {
        // The last layer's gradient first; each tensor's pull half brings
        // its parameters for the next step.
        if (clock == 0) {
          ASSERT_TRUE(client->Pull(0, 0, param_spans, &pull).ok());
        }
        for (int t = tensors - 1; t >= 0; --t) {
          absl::SleepFor(step_time / tensors);
          client->StartExchange(t, clock + 1, 0, grads, nullptr, param_spans[t]);
        }
        ASSERT_TRUE(client->FinishExchanges(&push, &pull).ok());
        waited += pull.server_wait_seconds;
      }
      int64_t seen = max_staleness.load();
      while (push.max_staleness > seen &&
             !max_staleness.compare_exchange_weak(seen, push.max_staleness)) {
      }
    }
    ASSERT_TRUE(client->Heartbeat(kSteps, /*done=*/true, absl::InfiniteDuration()).ok());
    if (w == 0) fast_wait = waited;
  };
  // Samples the clocks the shards see while the workers run.
  std::thread monitor([&] {
    while (!done.load()) {
      StatusResponse status;
      cluster.shards[0]->shard().FillStatus(StatusRequest(), &status);
      int64_t lo = INT64_MAX, hi = 0;
      for (const WorkerState& w : status.workers()) {
        lo = std::min(lo, w.clock());
        hi = std::max(hi, w.clock());
      }
      if (status.workers_size() == kWorkers) {
        outcome.max_gap = std::max(outcome.max_gap, hi - lo);
      }
      absl::SleepFor(absl::Milliseconds(1));
    }
  });
  std::thread fast(train, 0, absl::ZeroDuration());
  std::thread slow(train, 1, absl::Milliseconds(15));
  fast.join();
  slow.join();
  done = true;
  monitor.join();
  outcome.max_staleness = max_staleness.load();
  outcome.fast_wait_seconds = fast_wait.load();
  StatusResponse status;
  cluster.shards[1]->shard().FillStatus(StatusRequest(), &status);
  outcome.max_staleness = std::max(outcome.max_staleness, status.max_staleness_seen());
  return outcome;
}

TEST(StalenessBound, FastWorkerWaitsAndStalenessStaysBounded) {
  for (int64_t bound : {0, 2}) {
    ASSERT_OK_AND_ASSIGN(const Outcome outcome, RunTwoWorkers(bound));
    EXPECT_LE(outcome.max_gap, bound + 1) << "bound " << bound;
    EXPECT_LE(outcome.max_staleness, (kWorkers - 1) * (2 * bound + 1)) << "bound " << bound;
    // The fast worker spent most of the slow worker's 24 x 15 ms waiting.
    EXPECT_GT(outcome.fast_wait_seconds, 0.15) << "bound " << bound;
  }
}

TEST(StalenessBound, APushSplitOverConnectionsKeepsTheBound) {
  // A shard that moved the clock with the first of a step's calls would let
  // the other worker's held pull go while the rest of that step is still on
  // its way (a staleness of 2 at bound 0).
  ASSERT_OK_AND_ASSIGN(const Outcome outcome, RunTwoWorkers(0, Calls::kSplit));
  EXPECT_LE(outcome.max_gap, 1);
  EXPECT_LE(outcome.max_staleness, kWorkers - 1);
  EXPECT_GT(outcome.fast_wait_seconds, 0.15);
}

TEST(StalenessBound, AnOverlappedExchangeKeepsTheBoundWithinAStep) {
  // A shard that moved the clock with a step's first tensor would let the
  // other worker's held pulls go while the slow worker's later tensors are
  // still being computed: that worker's last tensors then land 2 updates
  // stale at bound 0.
  ASSERT_OK_AND_ASSIGN(const Outcome outcome, RunTwoWorkers(0, Calls::kOverlapped));
  EXPECT_LE(outcome.max_gap, 1);
  EXPECT_LE(outcome.max_staleness, kWorkers - 1);
  EXPECT_GT(outcome.fast_wait_seconds, 0.15);
}

// A PushPull split over a shard's connections at bound 0: its pull halves
// carry the step's clock, which the shard reaches once every part's push
// half is in. When the parts carried the clock before the step and a
// Heartbeat after the call moved it on, the pull halves waited for a
// Heartbeat that only came after them: every step waited out the pull
// timeout (2 min by default).
TEST(StalenessBound, ASplitPushPullAtBoundZeroIsNotHeldByItsOwnStep) {
  constexpr int64_t kPartition = 128 * 1024;  // 4 per shard: 4 calls each
  server::ShardOptions options;
  options.partitioning.max_partition_elements = kPartition;
  options.mode = server::ConsistencyMode::kAsync;
  options.num_workers = 1;
  options.max_staleness = 0;
  ASSERT_OK_AND_ASSIGN(testutil::InProcessShards cluster,
                       testutil::StartInProcessShards(options, 2));
  TensorSpec spec;
  spec.set_name("w");
  spec.add_shape(8 * kPartition);
  spec.set_dtype(DTYPE_F32);
  client::PsClientOptions client_options;
  client_options.servers = cluster.addresses;
  client_options.max_partition_elements = kPartition;
  client_options.pull_timeout = absl::Seconds(5);
  client_options.reconnect_timeout = absl::Seconds(5);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<client::PsClient> client,
                       client::PsClient::Create(client_options, nullptr));
  ASSERT_OK(client->Register({spec}));
  std::vector<float> params(8 * kPartition), grads(8 * kPartition, 1e-3f);
  const absl::Time start = absl::Now();
  for (int64_t clock = 0; clock < 5; ++clock) {
    client::PushStats push;
    client::PullStats pull;
    const absl::Status status = client->PushPull(clock + 1, 0, {absl::MakeConstSpan(grads)},
                                                 {absl::MakeSpan(params)}, &push, &pull);
    ASSERT_TRUE(status.ok()) << "step " << clock + 1 << ": " << status;
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(4));
  EXPECT_EQ(cluster.shards[0]->shard().WorkerClocks(), std::vector<int64_t>{5});
}

TEST(StalenessBound, WithoutABoundTheFastWorkerRunsAhead) {
  ASSERT_OK_AND_ASSIGN(const Outcome outcome, RunTwoWorkers(-1));
  EXPECT_GT(outcome.max_gap, 3);
  EXPECT_GT(outcome.max_staleness, 3);
  EXPECT_LT(outcome.fast_wait_seconds, 0.05);
}

// A push says which versions its gradients were computed at: one computed
// on parameters older than the client's last pull (SetNextPushComputedAt,
// Trainer's stale overlap) counts as that much staler, over gRPC and over
// the data port, and only that push.
TEST(StalenessBound, APushComputedOnOlderParametersCountsAsStaler) {
  for (const bool data_port : {false, true}) {
    SCOPED_TRACE(data_port ? "data port" : "gRPC");
    server::ShardOptions options;
    options.partitioning.max_partition_elements = 500;
    options.mode = server::ConsistencyMode::kAsync;
    options.num_workers = 1;
    ASSERT_OK_AND_ASSIGN(testutil::InProcessShards cluster,
                         testutil::StartInProcessShards(options, 2, data_port));
    client::PsClientOptions client_options;
    client_options.servers = cluster.addresses;
    client_options.max_partition_elements = 500;
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<client::PsClient> client,
                         client::PsClient::Create(client_options, nullptr));
    TensorSpec spec;
    spec.set_name("w");
    spec.add_shape(kElements);
    spec.set_dtype(DTYPE_F32);
    ASSERT_OK(client->Register({spec}));
    std::vector<float> params(kElements), grads(kElements, 1e-3f);
    const std::vector<absl::Span<float>> param_spans = {absl::MakeSpan(params)};
    const std::vector<absl::Span<const float>> grad_spans = {grads};
    // The push's staleness; -1 if the call failed.
    auto push_pull = [&](int64_t clock) -> int64_t {
      client::PushStats push;
      client::PullStats pull;
      const absl::Status status =
          client->PushPull(clock, 0, grad_spans, param_spans, &push, &pull);
      EXPECT_OK(status);
      return status.ok() ? push.max_staleness : -1;
    };
    EXPECT_EQ(push_pull(1), 0);
    const std::vector<int64_t> one_behind = client->PulledVersions();
    EXPECT_EQ(one_behind, std::vector<int64_t>(kElements / 500, 1));
    EXPECT_EQ(push_pull(2), 0);
    client->SetNextPushComputedAt(one_behind);
    EXPECT_EQ(push_pull(3), 1);
    EXPECT_EQ(push_pull(4), 0);  // that push only
  }
}

// Worker 0 looks up an async table at clock 3 while worker 1 is at clock 0
// and the bound is 1: the lookup waits (an evaluation lookup does not)
// until worker 1's clock reaches 2, as a pull would.
TEST(StalenessBound, TableLookupsWaitLikePulls) {
  server::ShardOptions options;
  options.mode = server::ConsistencyMode::kAsync;
  options.num_workers = kWorkers;
  options.max_staleness = 1;
  ASSERT_OK_AND_ASSIGN(testutil::InProcessShards cluster,
                       testutil::StartInProcessShards(options, 1));
  std::vector<std::unique_ptr<client::PsClient>> clients;
  for (int w = 0; w < kWorkers; ++w) {
    client::PsClientOptions client_options;
    client_options.servers = cluster.addresses;
    client_options.worker_index = w;
    client_options.num_workers = kWorkers;
    ASSERT_OK_AND_ASSIGN(clients.emplace_back(),
                         client::PsClient::Create(client_options, nullptr));
    TensorSpec dense;  // registering makes the worker a member
    dense.set_name("w");
    dense.add_shape(4);
    dense.set_dtype(DTYPE_F32);
    ASSERT_OK(clients.back()->Register({dense}));
  }
  client::TableClient fast(clients[0].get());
  client::TableClient slow(clients[1].get());
  TableSpec spec;
  spec.set_name("t");
  spec.set_dim(4);
  spec.set_optimizer("sgd");
  spec.set_learning_rate(0.1f);
  ASSERT_OK(fast.Register({spec}));
  const std::vector<uint64_t> ids = {1, 2, 3};
  std::vector<float> rows(ids.size() * 4);
  ASSERT_OK(clients[0]->Heartbeat(3, /*done=*/false, absl::InfiniteDuration()));
  ASSERT_OK(clients[1]->Heartbeat(0, /*done=*/false, absl::InfiniteDuration()));
  ASSERT_OK(fast.Lookup("t", ids, /*train=*/true, /*clock=*/1, rows.data()));
  ASSERT_OK(fast.Lookup("t", ids, /*train=*/false, /*clock=*/3, rows.data()));

  absl::Notification looked_up;
  absl::Status status;
  std::thread ahead([&] {
    std::vector<float> out(ids.size() * 4);
    status = fast.Lookup("t", ids, /*train=*/true, /*clock=*/3, out.data());
    looked_up.Notify();
  });
  EXPECT_FALSE(looked_up.WaitForNotificationWithTimeout(absl::Milliseconds(500)))
      << "worker 0 at clock 3 read the table with worker 1 at clock 0 and a bound of 1";
  ASSERT_OK(clients[1]->Heartbeat(1, /*done=*/false, absl::InfiniteDuration()));
  EXPECT_FALSE(looked_up.WaitForNotificationWithTimeout(absl::Milliseconds(300)))
      << "clock 3 is still 2 ahead of 1";
  ASSERT_OK(clients[1]->Heartbeat(2, /*done=*/false, absl::InfiniteDuration()));
  EXPECT_TRUE(looked_up.WaitForNotificationWithTimeout(absl::Seconds(10)));
  ahead.join();
  EXPECT_OK(status);
}

}  // namespace
}  // namespace shardtrain
