#include "worker/exchange_thread.h"

#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "client/testing/in_memory_parameter_client.h"
#include "common/testing/status_matchers.h"
#include "gtest/gtest.h"

namespace shardtrain::worker {
namespace {

using ::shardtrain::client::ParameterClient;
using ::shardtrain::client::PullStats;
using ::shardtrain::client::PushStats;
using ::shardtrain::client::testing::InMemoryParameterClient;

constexpr float kLearningRate = 0.5f;
constexpr int kElements = 4;

// An InMemoryParameterClient whose PushPull records the thread it runs on
// and, while the gate is closed, waits for it to open.
class GatedClient final : public ParameterClient {
 public:
  GatedClient() : inner_(0, 1, kLearningRate) {}

  void Close() {
    absl::MutexLock lock(&mu_);
    open_ = false;
  }
  void Open() {
    absl::MutexLock lock(&mu_);
    open_ = true;
  }
  // Waits until a PushPull has begun waiting at the closed gate.
  void AwaitWaiter() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&waiting_));
  }
  std::vector<std::thread::id> threads() const {
    absl::MutexLock lock(&mu_);
    return threads_;
  }
  InMemoryParameterClient& inner() { return inner_; }

  void set_sync_mode(bool sync) override { inner_.set_sync_mode(sync); }
  absl::Status Register(const std::vector<TensorSpec>& tensors) override {
    return inner_.Register(tensors);
  }
  absl::Status Push(int64_t clock, absl::Span<const absl::Span<const float>> grads,
                    PushStats* stats) override {
    return inner_.Push(clock, grads, stats);
  }
  absl::Status Pull(int64_t clock, int64_t min_version,
                    absl::Span<const absl::Span<float>> params, PullStats* stats) override {
    return inner_.Pull(clock, min_version, params, stats);
  }
  absl::Status PushPull(int64_t clock, int64_t min_version,
                        absl::Span<const absl::Span<const float>> grads,
                        absl::Span<const absl::Span<float>> params, PushStats* push_stats,
                        PullStats* pull_stats) override {
    {
      absl::MutexLock lock(&mu_);
      threads_.push_back(std::this_thread::get_id());
      waiting_ = !open_;
      mu_.Await(absl::Condition(&open_));
      waiting_ = false;
    }
    return inner_.PushPull(clock, min_version, grads, params, push_stats, pull_stats);
  }
  void StartExchange(int tensor, int64_t clock, int64_t min_version,
                     absl::Span<const float> grad, client::GradReady grad_ready,
                     absl::Span<float> params) override {
    inner_.StartExchange(tensor, clock, min_version, grad, std::move(grad_ready), params);
  }
  absl::Status FinishExchanges(PushStats* push_stats, PullStats* pull_stats) override {
    return inner_.FinishExchanges(push_stats, pull_stats);
  }
  absl::StatusOr<HeartbeatResponse> Heartbeat(int64_t clock, bool done,
                                              absl::Duration retry_for) override {
    return inner_.Heartbeat(clock, done, retry_for);
  }
  std::pair<int64_t, int64_t> known_versions() const override {
    return inner_.known_versions();
  }
  int64_t RaiseKnownVersions(int64_t step) override { return inner_.RaiseKnownVersions(step); }
  std::vector<int64_t> PulledVersions() const override { return inner_.PulledVersions(); }
  void SetNextPushComputedAt(std::vector<int64_t> versions) override {
    inner_.SetNextPushComputedAt(std::move(versions));
  }
  int64_t registered_worker_clock() const override { return inner_.registered_worker_clock(); }

 private:
  InMemoryParameterClient inner_;
  mutable absl::Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_) = true;
  bool waiting_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread::id> threads_ ABSL_GUARDED_BY(mu_);
};

class ExchangeThreadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TensorSpec spec;
    spec.set_name("w");
    spec.add_shape(kElements);
    spec.set_dtype(DTYPE_F32);
    spec.mutable_init()->set_kind(Initializer::KIND_CONSTANT);
    spec.mutable_init()->set_scale(1.0f);
    ASSERT_OK(client_.Register({spec}));
  }

  GatedClient client_;
  std::vector<float> grad_ = std::vector<float>(kElements, 1.0f);
  std::vector<float> params_ = std::vector<float>(kElements, 0.0f);
  std::vector<absl::Span<const float>> grads() const { return {grad_}; }
  std::vector<absl::Span<float>> params() { return {absl::MakeSpan(params_)}; }
};

TEST_F(ExchangeThreadTest, RunsEachExchangeBehindTheCallerOnOneThread) {
  ExchangeThread exchange(&client_);
  EXPECT_FALSE(exchange.in_flight());
  constexpr int kExchanges = 5;
  for (int i = 0; i < kExchanges; ++i) {
    client_.Close();
    exchange.Start(i + 1, {i}, grads(), params());
    EXPECT_TRUE(exchange.in_flight());
    // Start returned while the exchange waits at the gate: it runs on
    // another thread.
    client_.AwaitWaiter();
    EXPECT_EQ(client_.inner().pushes_applied(), i);
    client_.Open();
    PushStats push;
    PullStats pull;
    ASSERT_OK(exchange.Land(&push, &pull));
    EXPECT_FALSE(exchange.in_flight());
    // The pull came back into params_: 1 - 0.5 per update.
    EXPECT_EQ(params_, std::vector<float>(kElements, 1.0f - kLearningRate * (i + 1)));
    EXPECT_EQ(client_.inner().pushes_applied(), i + 1);
  }
  const std::vector<std::thread::id> threads = client_.threads();
  ASSERT_EQ(threads.size(), static_cast<size_t>(kExchanges));
  for (const std::thread::id& id : threads) {
    EXPECT_NE(id, std::this_thread::get_id());
    EXPECT_EQ(id, threads[0]) << "every exchange runs on the thread kept for them";
  }
}

// The push says its gradient was computed at the versions Start gave, so
// the shards count the updates since then as its staleness.
TEST_F(ExchangeThreadTest, ThePushCarriesTheVersionsItWasComputedAt) {
  ExchangeThread exchange(&client_);
  PushStats push;
  for (int i = 0; i < 3; ++i) {
    exchange.Start(i + 1, {i}, grads(), params());
    ASSERT_OK(exchange.Land(&push, nullptr));
  }
  EXPECT_EQ(push.max_staleness, 0);
  // Computed at version 0, pushed at version 3.
  exchange.Start(4, {0}, grads(), params());
  ASSERT_OK(exchange.Land(&push, nullptr));
  EXPECT_EQ(push.max_staleness, 3);
}

TEST_F(ExchangeThreadTest, LandReturnsTheExchangesErrorAndTheNextOneRuns) {
  ExchangeThread exchange(&client_);
  client_.inner().FailNextPush(absl::UnavailableError("shard gone"), /*applied=*/false);
  exchange.Start(1, {0}, grads(), params());
  PushStats push;
  push.max_staleness = 42;
  const absl::Status landed = exchange.Land(&push, nullptr);
  EXPECT_EQ(landed.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(push.max_staleness, 42) << "a failed exchange's figures are not reported";
  EXPECT_FALSE(exchange.in_flight());
  EXPECT_EQ(params_, std::vector<float>(kElements, 0.0f));

  exchange.Start(1, {0}, grads(), params());
  ASSERT_OK(exchange.Land(nullptr, nullptr));
  EXPECT_EQ(params_, std::vector<float>(kElements, 1.0f - kLearningRate));
}

TEST_F(ExchangeThreadTest, LandWithNothingInFlightReturnsAtOnce) {
  ExchangeThread exchange(&client_);
  EXPECT_OK(exchange.Land(nullptr, nullptr));
  EXPECT_EQ(client_.threads().size(), 0u);
}

// Destroying it while an exchange waits lets that exchange finish: the
// buffers it was given are not abandoned to a thread still writing them.
TEST_F(ExchangeThreadTest, DestructionWaitsForTheExchangeInFlight) {
  client_.Close();
  auto exchange = std::make_unique<ExchangeThread>(&client_);
  exchange->Start(1, {0}, grads(), params());
  client_.AwaitWaiter();
  absl::Notification destroyed;
  std::thread destroyer([&] {
    exchange.reset();
    destroyed.Notify();
  });
  EXPECT_FALSE(destroyed.WaitForNotificationWithTimeout(absl::Milliseconds(50)));
  client_.Open();
  destroyer.join();
  EXPECT_EQ(client_.inner().pushes_applied(), 1);
  EXPECT_EQ(params_, std::vector<float>(kElements, 1.0f - kLearningRate));
}

}  // namespace
}  // namespace shardtrain::worker
