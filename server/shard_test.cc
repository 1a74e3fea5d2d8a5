#include "server/shard.h"

#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#include <prometheus/registry.h>

#include "common/payload.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardtrain::server {
namespace {

using ::testing::HasSubstr;

constexpr int kElements = 6;

TensorSpec Spec(const std::string& name, float value) {
  TensorSpec spec;
  spec.set_name(name);
  spec.add_shape(kElements);
  spec.set_dtype(DTYPE_F32);
  spec.mutable_init()->set_kind(Initializer::KIND_CONSTANT);
  spec.mutable_init()->set_scale(value);
  return spec;
}

class ShardTest : public ::testing::Test {
 protected:
  static ShardOptions Options(ConsistencyMode mode, int workers,
                              int64_t max_staleness = -1) {
    ShardOptions options;
    options.mode = mode;
    options.num_workers = workers;
    options.max_staleness = max_staleness;
    options.optimizer.name = "sgd";
    options.optimizer.learning_rate = 0.5f;
    return options;
  }

  void Start(ConsistencyMode mode, int workers, int64_t max_staleness = -1) {
    StartWith(Options(mode, workers, max_staleness));
  }

  void StartWith(const ShardOptions& options) {
    auto shard = Shard::Create(options, &metrics_);
    ASSERT_TRUE(shard.ok()) << shard.status();
    shard_ = std::move(*shard);
    RegisterRequest request;
    *request.add_tensors() = Spec("w", 1.0f);
    RegisterResponse response;
    ASSERT_TRUE(shard_->Register(request, &response).ok());
    ASSERT_EQ(response.partitions_size(), 1);
  }

  PushRequest Push(uint32_t worker, int64_t version, float grad) {
    PushRequest request;
    request.set_worker(worker);
    request.set_clock(version + 1);
    GradientPart* part = request.add_parts();
    part->mutable_key()->set_tensor("w");
    part->set_version(version);
    std::vector<float> values(kElements, grad);
    common::EncodeDense(values, DTYPE_F32, part->mutable_grad()->mutable_data());
    part->mutable_grad()->set_dtype(DTYPE_F32);
    return request;
  }

  PullRequest Pull(uint32_t worker, int64_t clock, int64_t min_version) {
    PullRequest request;
    request.set_worker(worker);
    request.set_clock(clock);
    request.set_min_version(min_version);
    request.add_parts()->set_tensor("w");
    return request;
  }

  // The first element and the version of "w".
  std::pair<float, int64_t> Value() {
    PullRequest request = Pull(0, 0, 0);
    PullResponse response;
    EXPECT_TRUE(shard_->pulls().Validate(request).ok());
    shard_->pulls().Fill(request, &response);
    float value;
    std::memcpy(&value, response.parts(0).value().data().data(), sizeof(value));
    return {value, response.parts(0).version()};
  }

  absl::Status DoPush(const PushRequest& request) {
    PushResponse response;
    return shard_->Push(request, &response);
  }

  prometheus::Registry registry_;
  ShardMetrics metrics_{registry_};
  std::unique_ptr<Shard> shard_;
};

TEST_F(ShardTest, SyncAppliesTheMeanOnceEveryWorkerPushed) {
  Start(ConsistencyMode::kSync, 2);
  ASSERT_TRUE(DoPush(Push(0, 0, 1.0f)).ok());
  EXPECT_EQ(Value(), std::make_pair(1.0f, int64_t{0}));  // waiting for worker 1
  EXPECT_FALSE(shard_->pulls().Ready(Pull(0, 1, 1)));
  ASSERT_TRUE(DoPush(Push(1, 0, 3.0f)).ok());
  // mean gradient 2, lr 0.5: 1 - 0.5 * 2 = 0
  EXPECT_EQ(Value(), std::make_pair(0.0f, int64_t{1}));
  EXPECT_TRUE(shard_->pulls().Ready(Pull(0, 1, 1)));
}

TEST_F(ShardTest, SyncRejectsLateAndDuplicateGradientsWithoutChange) {
  Start(ConsistencyMode::kSync, 2);
  ASSERT_TRUE(DoPush(Push(0, 0, 1.0f)).ok());
  const uint64_t before = shard_->Checksum();
  absl::Status duplicate = DoPush(Push(0, 0, 1.0f));
  EXPECT_EQ(duplicate.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(shard_->Checksum(), before);
  ASSERT_TRUE(DoPush(Push(1, 0, 1.0f)).ok());
  const uint64_t after_step = shard_->Checksum();
  absl::Status late = DoPush(Push(1, 0, 1.0f));
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(late.message(), HasSubstr("finished"));
  EXPECT_EQ(shard_->Checksum(), after_step);
  StatusResponse status;
  shard_->FillStatus(StatusRequest(), &status);
  EXPECT_EQ(status.dropped_gradients(), 1);
}

TEST_F(ShardTest, SyncStepCompletesWhenAWorkerIsForgotten) {
  Start(ConsistencyMode::kSync, 2);
  HeartbeatRequest beat;
  beat.set_worker(1);
  HeartbeatResponse ignored;
  ASSERT_TRUE(shard_->Heartbeat(beat, &ignored).ok());
  ASSERT_TRUE(DoPush(Push(0, 0, 2.0f)).ok());
  EXPECT_EQ(Value().second, 0);
  shard_->Tick(absl::Now() + absl::Seconds(11));  // worker 1 timed out
  EXPECT_EQ(Value(), std::make_pair(0.0f, int64_t{1}));
}

// Worker 1 is dropped; worker 0 completes step 0 on "a" but has not pushed
// it to "b" yet when worker 1 comes back. Worker 1 moves on to step 1 (it
// pulls the later version), so "b" must not wait for its step-0 gradient.
TEST_F(ShardTest, ARejoinedWorkerDoesNotHoldBackStepsUnderWay) {
  ShardOptions options = Options(ConsistencyMode::kSync, 2);
  options.heartbeat_timeout = absl::Milliseconds(500);
  StartWith(options);
  RegisterRequest two;
  *two.add_tensors() = Spec("a", 1.0f);
  *two.add_tensors() = Spec("b", 1.0f);
  RegisterResponse registered;
  ASSERT_TRUE(shard_->Register(two, &registered).ok());
  auto push = [&](uint32_t worker, const char* tensor, int64_t version, float grad) {
    PushRequest request = Push(worker, version, grad);
    request.mutable_parts(0)->mutable_key()->set_tensor(tensor);
    return DoPush(request);
  };
  auto value = [&](const char* tensor) {
    PullRequest request = Pull(0, 0, 0);
    request.mutable_parts(0)->set_tensor(tensor);
    PullResponse response;
    EXPECT_TRUE(shard_->pulls().Validate(request).ok());
    shard_->pulls().Fill(request, &response);
    float v;
    std::memcpy(&v, response.parts(0).value().data().data(), sizeof(v));
    return std::make_pair(v, response.parts(0).version());
  };
  auto beat = [&](uint32_t worker, int64_t clock) {
    HeartbeatRequest request;
    request.set_worker(worker);
    request.set_worker_incarnation(worker + 100);
    request.set_clock(clock);
    HeartbeatResponse ignored;
    ASSERT_TRUE(shard_->Heartbeat(request, &ignored).ok());
  };
  beat(0, 0);
  beat(1, 0);
  absl::SleepFor(absl::Milliseconds(700));
  beat(0, 0);
  shard_->Tick(absl::Now());  // worker 1 silent for 700 ms: dropped
  ASSERT_EQ(metrics_.worker_departures("silent").Value(), 1);

  ASSERT_TRUE(push(0, "a", 0, 2.0f).ok());  // step 0 completes on "a" alone
  EXPECT_EQ(value("a"), std::make_pair(0.0f, int64_t{1}));
  beat(1, 0);  // back while step 0 is still open on "b"
  // "b" completes step 0 with worker 0's gradient alone.
  ASSERT_TRUE(push(0, "b", 0, 2.0f).ok());
  EXPECT_EQ(value("b"), std::make_pair(0.0f, int64_t{1}));
  // Worker 1's gradient for step 0 is late.
  EXPECT_EQ(push(1, "b", 0, 4.0f).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(value("b"), std::make_pair(0.0f, int64_t{1}));

  // Step 1 began here before worker 1 came back: it does not wait for
  // worker 1, but a gradient of worker 1 that arrives in time is averaged
  // in (and does not finish the step alone).
  ASSERT_TRUE(push(1, "a", 1, 4.0f).ok());
  EXPECT_EQ(value("a").second, 1);
  ASSERT_TRUE(push(0, "a", 1, 2.0f).ok());
  EXPECT_EQ(value("a"), std::make_pair(-1.5f, int64_t{2}));  // 0 - 0.5 * 3
  ASSERT_TRUE(push(0, "b", 1, 2.0f).ok());  // without worker 1
  EXPECT_EQ(value("b"), std::make_pair(-1.0f, int64_t{2}));

  // From step 2 on worker 1 is a full contributor again.
  ASSERT_TRUE(push(0, "a", 2, 2.0f).ok());
  EXPECT_EQ(value("a").second, 2);
  ASSERT_TRUE(push(1, "a", 2, 4.0f).ok());
  EXPECT_EQ(value("a"), std::make_pair(-3.0f, int64_t{3}));
}

TEST_F(ShardTest, AsyncAppliesEachGradientAndMeasuresStaleness) {
  Start(ConsistencyMode::kAsync, 2);
  PushResponse response;
  ASSERT_TRUE(shard_->Push(Push(0, 0, 1.0f), &response).ok());
  EXPECT_EQ(response.max_staleness(), 0);
  ASSERT_TRUE(shard_->Push(Push(1, 0, 1.0f), &response).ok());
  EXPECT_EQ(response.max_staleness(), 1);
  EXPECT_EQ(Value(), std::make_pair(0.0f, int64_t{2}));
  absl::Status future = DoPush(Push(0, 5, 1.0f));
  EXPECT_EQ(future.code(), absl::StatusCode::kOutOfRange);
}

TEST_F(ShardTest, StalenessBoundHoldsBackAWorkerTooFarAhead) {
  Start(ConsistencyMode::kAsync, 2, /*max_staleness=*/2);
  for (int64_t step = 0; step < 3; ++step) {
    ASSERT_TRUE(DoPush(Push(0, step, 0.0f)).ok());
  }
  // Worker 0 has clock 3, worker 1 was never seen (clock 0): 3 > 0 + 2.
  EXPECT_FALSE(shard_->pulls().Ready(Pull(0, 3, 0)));
  EXPECT_TRUE(shard_->pulls().Ready(Pull(1, 0, 0)));
  ASSERT_TRUE(DoPush(Push(1, 3, 0.0f)).ok());  // worker 1 reaches clock 4
  EXPECT_TRUE(shard_->pulls().Ready(Pull(0, 3, 0)));
}

TEST_F(ShardTest, RegisterIsIdempotentAndRejectsConflicts) {
  Start(ConsistencyMode::kAsync, 1);
  ASSERT_TRUE(DoPush(Push(0, 0, 1.0f)).ok());
  const uint64_t before = shard_->Checksum();
  RegisterRequest again;
  *again.add_tensors() = Spec("w", 1.0f);
  RegisterResponse response;
  ASSERT_TRUE(shard_->Register(again, &response).ok());
  EXPECT_EQ(response.partitions(0).version(), 1);
  EXPECT_EQ(shard_->Checksum(), before);

  RegisterRequest conflict;
  *conflict.add_tensors() = Spec("v", 0.0f);
  *conflict.add_tensors() = Spec("w", 2.0f);  // differs from the registered w
  absl::Status status = shard_->Register(conflict, &response);
  EXPECT_EQ(status.code(), absl::StatusCode::kAlreadyExists);
  PushRequest push_v = Push(0, 0, 1.0f);
  push_v.mutable_parts(0)->mutable_key()->set_tensor("v");
  EXPECT_EQ(DoPush(push_v).code(), absl::StatusCode::kNotFound);  // v not created
}

TEST_F(ShardTest, PullValidationNamesTheProblem) {
  Start(ConsistencyMode::kSync, 1);
  PullRequest unknown = Pull(0, 0, 0);
  unknown.mutable_parts(0)->set_tensor("nope");
  EXPECT_EQ(shard_->pulls().Validate(unknown).code(), absl::StatusCode::kNotFound);
  PullRequest bad_partition = Pull(0, 0, 0);
  bad_partition.mutable_parts(0)->set_partition(3);
  EXPECT_EQ(shard_->pulls().Validate(bad_partition).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(shard_->pulls().Validate(Pull(7, 0, 0)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(shard_->pulls().Validate(Pull(0, 0, 5)).code(), absl::StatusCode::kOutOfRange);
  PullRequest empty;
  EXPECT_EQ(shard_->pulls().Validate(empty).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ShardTest, AnotherShardIncarnationIsAborted) {
  Start(ConsistencyMode::kAsync, 1);
  const uint64_t incarnation = shard_->incarnation();
  ASSERT_NE(incarnation, 0u);
  PushRequest push = Push(0, 0, 1.0f);
  push.set_shard_incarnation(incarnation + 1);
  const uint64_t before = shard_->Checksum();
  PushResponse push_response;
  absl::Status status = shard_->Push(push, &push_response);
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(status.message(), HasSubstr("restarted"));
  EXPECT_THAT(status.message(), HasSubstr("re-register"));
  EXPECT_EQ(shard_->Checksum(), before);
  PullRequest pull = Pull(0, 0, 0);
  pull.set_shard_incarnation(incarnation + 1);
  EXPECT_EQ(shard_->pulls().Validate(pull).code(), absl::StatusCode::kAborted);

  // Its own incarnation, or none, is accepted; every response names it.
  push.set_shard_incarnation(incarnation);
  ASSERT_TRUE(shard_->Push(push, &push_response).ok());
  EXPECT_EQ(push_response.incarnation(), incarnation);
  pull.set_shard_incarnation(0);
  ASSERT_TRUE(shard_->pulls().Validate(pull).ok());
  PullResponse pull_response;
  shard_->pulls().Fill(pull, &pull_response);
  EXPECT_EQ(pull_response.incarnation(), incarnation);
  HeartbeatRequest beat;
  HeartbeatResponse beat_response;
  ASSERT_TRUE(shard_->Heartbeat(beat, &beat_response).ok());
  EXPECT_EQ(beat_response.incarnation(), incarnation);
  StatusResponse status_response;
  shard_->FillStatus(StatusRequest(), &status_response);
  EXPECT_EQ(status_response.incarnation(), incarnation);

  // Another shard (a restart) draws another incarnation.
  auto other = Shard::Create(shard_->options(), &metrics_);
  ASSERT_TRUE(other.ok());
  EXPECT_NE((*other)->incarnation(), incarnation);
}

TEST_F(ShardTest, ARetriedPushIsAppliedOnce) {
  Start(ConsistencyMode::kAsync, 2);
  PushRequest push = Push(0, 0, 1.0f);
  push.set_worker_incarnation(7);
  push.set_sequence(1);
  PushResponse response;
  response.Clear();
  ASSERT_TRUE(shard_->Push(push, &response).ok());
  EXPECT_FALSE(response.duplicate());
  const uint64_t applied = shard_->Checksum();
  response.Clear();
  ASSERT_TRUE(shard_->Push(push, &response).ok());
  EXPECT_TRUE(response.duplicate());
  EXPECT_EQ(shard_->Checksum(), applied);
  EXPECT_EQ(Value().second, 1);

  // The same sequence from another worker, or from a new incarnation of
  // this one, is a different push.
  PushRequest other = push;
  other.set_worker(1);
  response.Clear();
  ASSERT_TRUE(shard_->Push(other, &response).ok());
  EXPECT_FALSE(response.duplicate());
  PushRequest restarted = push;
  restarted.set_worker_incarnation(8);
  response.Clear();
  ASSERT_TRUE(shard_->Push(restarted, &response).ok());
  EXPECT_FALSE(response.duplicate());
  EXPECT_EQ(Value().second, 3);

  // Far beyond the window, an old sequence cannot be judged.
  restarted.set_sequence(1 + Shard::kPushWindow);
  response.Clear();
  ASSERT_TRUE(shard_->Push(restarted, &response).ok());
  const uint64_t before = shard_->Checksum();
  restarted.set_sequence(1);
  absl::Status old = shard_->Push(restarted, &response);
  EXPECT_EQ(old.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(old.message(), HasSubstr("older than the last 4096 applied"));
  EXPECT_EQ(shard_->Checksum(), before);
  // A gap inside the window is still applied once.
  restarted.set_sequence(Shard::kPushWindow);
  response.Clear();
  ASSERT_TRUE(shard_->Push(restarted, &response).ok());
  EXPECT_FALSE(response.duplicate());
  response.Clear();
  ASSERT_TRUE(shard_->Push(restarted, &response).ok());
  EXPECT_TRUE(response.duplicate());

  StatusResponse status;
  shard_->FillStatus(StatusRequest(), &status);
  EXPECT_EQ(status.duplicate_pushes(), 2);
  EXPECT_EQ(metrics_.duplicate_pushes().Value(), 2);
}

TEST_F(ShardTest, ExtremeSequencesAndVersionsAreSafe) {
  Start(ConsistencyMode::kAsync, 1);
  // The largest sequence is applied once (the window's bookkeeping must not
  // wrap around), then recognised.
  PushRequest push = Push(0, 0, 1.0f);
  push.set_worker_incarnation(7);
  push.set_sequence(~uint64_t{0});
  PushResponse response;
  ASSERT_TRUE(shard_->Push(push, &response).ok());
  EXPECT_FALSE(response.duplicate());
  response.Clear();
  ASSERT_TRUE(shard_->Push(push, &response).ok());
  EXPECT_TRUE(response.duplicate());

  // A refused push of a new worker incarnation does not reset the log.
  const uint64_t before = shard_->Checksum();
  PushRequest refused = Push(0, kMaxClock + 1, 1.0f);
  refused.set_worker_incarnation(8);
  refused.set_sequence(1);
  absl::Status status = shard_->Push(refused, &response);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("is not in [0,"));
  EXPECT_EQ(shard_->Checksum(), before);
  response.Clear();
  ASSERT_TRUE(shard_->Push(push, &response).ok());
  EXPECT_TRUE(response.duplicate());
}

TEST_F(ShardTest, ConcurrentRetriesApplyOnce) {
  Start(ConsistencyMode::kAsync, 1);
  constexpr int kPushes = 200;
  for (int sequence = 1; sequence <= kPushes; ++sequence) {
    PushRequest push = Push(0, sequence - 1, 0.0f);
    push.set_worker_incarnation(3);
    push.set_sequence(sequence);
    PushResponse first, second;
    absl::Status first_status, second_status;
    std::thread a([&] { first_status = shard_->Push(push, &first); });
    std::thread b([&] { second_status = shard_->Push(push, &second); });
    a.join();
    b.join();
    ASSERT_TRUE(first_status.ok()) << first_status;
    ASSERT_TRUE(second_status.ok()) << second_status;
    ASSERT_NE(first.duplicate(), second.duplicate()) << "push " << sequence;
  }
  EXPECT_EQ(Value().second, kPushes);
}

TEST_F(ShardTest, SyncRetryOfAnAcceptedGradientIsADuplicate) {
  Start(ConsistencyMode::kSync, 2);
  PushRequest push = Push(0, 0, 1.0f);
  push.set_worker_incarnation(5);
  push.set_sequence(1);
  ASSERT_TRUE(DoPush(push).ok());
  const uint64_t before = shard_->Checksum();
  PushResponse response;
  ASSERT_TRUE(shard_->Push(push, &response).ok());  // not ALREADY_EXISTS
  EXPECT_TRUE(response.duplicate());
  EXPECT_EQ(shard_->Checksum(), before);
  ASSERT_TRUE(DoPush(Push(1, 0, 1.0f)).ok());
  // A gradient for a finished step is still a late gradient.
  PushRequest late = Push(1, 0, 1.0f);
  absl::Status status = DoPush(late);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("late gradient dropped"));
}

TEST_F(ShardTest, SpoofedMembershipHealsAndCannotDisableTheBound) {
  Start(ConsistencyMode::kAsync, 2, /*max_staleness=*/2);
  constexpr uint64_t kWorker0 = 100, kWorker1 = 200, kSpoof = 300;
  for (int64_t step = 0; step < 3; ++step) {
    PushRequest push = Push(0, step, 0.0f);
    push.set_worker_incarnation(kWorker0);
    ASSERT_TRUE(DoPush(push).ok());
  }
  HeartbeatRequest beat;
  beat.set_worker(1);
  beat.set_worker_incarnation(kWorker1);
  HeartbeatResponse response;
  ASSERT_TRUE(shard_->Heartbeat(beat, &response).ok());
  EXPECT_FALSE(shard_->pulls().Ready(Pull(0, 3, 0)));  // 3 > 0 + 2

  // An absurd clock is refused and changes nothing.
  HeartbeatRequest absurd = beat;
  absurd.set_worker_incarnation(kSpoof);
  absurd.set_clock(std::numeric_limits<int64_t>::max());
  EXPECT_EQ(shard_->Heartbeat(absurd, &response).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(shard_->pulls().Ready(Pull(0, 3, 0)));
  PullRequest absurd_pull = Pull(0, std::numeric_limits<int64_t>::max(), 0);
  EXPECT_EQ(shard_->pulls().Validate(absurd_pull).code(),
            absl::StatusCode::kInvalidArgument);

  // A spoofed done (another incarnation) takes worker 1's record over...
  HeartbeatRequest spoof = beat;
  spoof.set_worker_incarnation(kSpoof);
  spoof.set_clock(kMaxClock);
  spoof.set_done(true);
  ASSERT_TRUE(shard_->Heartbeat(spoof, &response).ok());
  EXPECT_TRUE(shard_->pulls().Ready(Pull(0, 3, 0)));
  // ...until the real worker 1 is heard from again.
  response.Clear();
  ASSERT_TRUE(shard_->Heartbeat(beat, &response).ok());
  EXPECT_FALSE(shard_->pulls().Ready(Pull(0, 3, 0)));
  ASSERT_EQ(response.workers_size(), 2);
  EXPECT_FALSE(response.workers(1).done());
  EXPECT_EQ(response.workers(1).clock(), 0);
  EXPECT_EQ(response.workers(1).incarnation(), kWorker1);
  EXPECT_EQ(response.workers(1).rejoins(), 2);
  // The largest clock allowed cannot overflow the bound.
  EXPECT_FALSE(shard_->pulls().Ready(Pull(0, kMaxClock, 0)));
  EXPECT_EQ(metrics_.worker_joins("restart").Value(), 2);
}

TEST_F(ShardTest, WorkersThatNeverJoinStopHoldingBackTheJob) {
  ShardOptions options = Options(ConsistencyMode::kAsync, 3, /*max_staleness=*/1);
  options.join_timeout = absl::Seconds(5);
  StartWith(options);
  HeartbeatRequest beat;
  HeartbeatResponse response;
  ASSERT_TRUE(shard_->Heartbeat(beat, &response).ok());
  // Every expected worker is listed, also those never seen.
  ASSERT_EQ(response.workers_size(), 3);
  EXPECT_TRUE(response.workers(0).seen());
  EXPECT_FALSE(response.workers(2).seen());
  EXPECT_FALSE(response.workers(2).live());
  for (int64_t step = 0; step < 4; ++step) ASSERT_TRUE(DoPush(Push(0, step, 0.0f)).ok());
  EXPECT_FALSE(shard_->pulls().Ready(Pull(0, 4, 0)));
  shard_->Tick(absl::Now() + absl::Seconds(3));
  EXPECT_FALSE(shard_->pulls().Ready(Pull(0, 4, 0)));
  shard_->Tick(absl::Now() + absl::Seconds(6));
  EXPECT_TRUE(shard_->pulls().Ready(Pull(0, 4, 0)));
  EXPECT_EQ(metrics_.worker_departures("never_joined").Value(), 2);
  // A late worker still joins, where the others are: the bound counts it
  // from worker 0's clock (4), not from its own, so worker 0 goes on ...
  ASSERT_TRUE(DoPush(Push(1, 0, 0.0f)).ok());
  EXPECT_TRUE(shard_->pulls().Ready(Pull(0, 4, 0)));
  EXPECT_TRUE(shard_->pulls().Ready(Pull(1, 1, 0)));
  // ... and from there it holds the others back like any worker: worker 0
  // two steps on waits for it.
  for (int64_t step = 4; step < 6; ++step) ASSERT_TRUE(DoPush(Push(0, step, 0.0f)).ok());
  EXPECT_FALSE(shard_->pulls().Ready(Pull(0, 6, 0)));
  ASSERT_TRUE(DoPush(Push(1, 1, 0.0f)).ok());
  EXPECT_TRUE(shard_->pulls().Ready(Pull(0, 6, 0)));
  // Its own pulls are on the same scale: its clock 4 is 7 there, more than
  // one ahead of the slowest (itself, at 5).
  EXPECT_FALSE(shard_->pulls().Ready(Pull(1, 4, 0)));
  EXPECT_TRUE(shard_->pulls().Ready(Pull(1, 3, 0)));
}

TEST_F(ShardTest, SyncStepCompletesWithoutAWorkerThatNeverJoined) {
  ShardOptions options = Options(ConsistencyMode::kSync, 2);
  options.join_timeout = absl::Seconds(5);
  StartWith(options);
  ASSERT_TRUE(DoPush(Push(0, 0, 2.0f)).ok());
  EXPECT_EQ(Value().second, 0);
  shard_->Tick(absl::Now() + absl::Seconds(6));
  EXPECT_EQ(Value(), std::make_pair(0.0f, int64_t{1}));
}

TEST_F(ShardTest, SyncFastForwardsOnlyUntilTheFirstStep) {
  Start(ConsistencyMode::kSync, 1);
  // A fresh (or restored) partition at version 0 joins a job at step 5.
  ASSERT_TRUE(DoPush(Push(0, 5, 1.0f)).ok());
  EXPECT_EQ(Value(), std::make_pair(0.5f, int64_t{6}));
  EXPECT_EQ(metrics_.lost_updates().Value(), 5);
  // After a completed step the normal rule holds again.
  const uint64_t before = shard_->Checksum();
  EXPECT_EQ(DoPush(Push(0, 9, 1.0f)).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(shard_->Checksum(), before);

  // A restore starts resuming again.
  auto restored = Shard::Create(shard_->options(), &metrics_);
  ASSERT_TRUE(restored.ok());
  ASSERT_TRUE((*restored)->Restore(shard_->Snapshot()).ok());
  PushResponse response;
  ASSERT_TRUE((*restored)->Push(Push(0, 8, 1.0f), &response).ok());
  EXPECT_EQ(metrics_.lost_updates().Value(), 7);
}

TEST_F(ShardTest, SyncDoesNotFastForwardPastPendingGradients) {
  Start(ConsistencyMode::kSync, 2);
  ASSERT_TRUE(DoPush(Push(0, 0, 1.0f)).ok());
  const uint64_t before = shard_->Checksum();
  EXPECT_EQ(DoPush(Push(1, 3, 1.0f)).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(shard_->Checksum(), before);
}

TEST_F(ShardTest, SyncRedoneStepIsClosedByTheNextStep) {
  // A restarted shard redoes step 0 from worker 0's gradient sent again;
  // worker 1 had step 0's result before the restart and pushes step 1: the
  // step is closed with worker 0's gradient alone, then step 1 goes on.
  Start(ConsistencyMode::kSync, 2);
  ASSERT_TRUE(DoPush(Push(0, 0, 2.0f)).ok());
  ASSERT_TRUE(DoPush(Push(1, 1, 4.0f)).ok());
  EXPECT_EQ(Value().second, 1);
  const float after_step_0 = Value().first;
  ASSERT_TRUE(DoPush(Push(0, 1, 4.0f)).ok());
  EXPECT_EQ(Value().second, 2);
  EXPECT_NE(Value().first, after_step_0);
  // Once a step completed, a later step is out of range again.
  EXPECT_EQ(DoPush(Push(0, 5, 1.0f)).code(), absl::StatusCode::kOutOfRange);
}

TEST_F(ShardTest, RegisterChecksTheJobSizeAndReturnsTheWorkersClock) {
  Start(ConsistencyMode::kAsync, 2);
  RegisterRequest request;
  *request.add_tensors() = Spec("w", 1.0f);
  request.set_worker(1);
  request.set_num_workers(3);
  request.set_worker_incarnation(41);
  RegisterResponse response;
  absl::Status status = shard_->Register(request, &response);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("--num_workers=3"));
  EXPECT_THAT(status.message(), HasSubstr("--num_workers=2"));
  request.set_num_workers(2);
  request.set_worker(2);
  EXPECT_EQ(shard_->Register(request, &response).code(),
            absl::StatusCode::kInvalidArgument);

  request.set_worker(1);
  ASSERT_TRUE(shard_->Register(request, &response).ok());
  EXPECT_EQ(response.incarnation(), shard_->incarnation());
  EXPECT_EQ(response.worker_clock(), 0);
  PushRequest push = Push(1, 6, 0.0f);
  push.mutable_parts(0)->set_version(0);
  push.set_worker_incarnation(41);
  ASSERT_TRUE(DoPush(push).ok());  // clock 7
  // A restarted worker 1 learns its clock and resumes from it.
  request.set_worker_incarnation(42);
  RegisterResponse again;
  ASSERT_TRUE(shard_->Register(request, &again).ok());
  EXPECT_EQ(again.worker_clock(), 7);
  EXPECT_EQ(shard_->WorkerClocks(), (std::vector<int64_t>{0, 7}));

  // Clocks restored from a checkpoint count for workers not seen yet.
  auto restored = Shard::Create(shard_->options(), &metrics_);
  ASSERT_TRUE(restored.ok());
  (*restored)->RestoreWorkerClocks({3, 7});
  ASSERT_TRUE((*restored)->Register(request, &again).ok());
  EXPECT_EQ(again.worker_clock(), 7);
  EXPECT_EQ((*restored)->WorkerClocks(), (std::vector<int64_t>{3, 7}));
}

TEST_F(ShardTest, ASplitPushMovesTheWorkersClockWithItsLastCall) {
  Start(ConsistencyMode::kAsync, 2);
  RegisterRequest request;
  *request.add_tensors() = Spec("w", 1.0f);
  request.set_worker(1);
  request.set_num_workers(2);
  request.set_worker_incarnation(41);
  RegisterResponse response;
  ASSERT_TRUE(shard_->Register(request, &response).ok());
  EXPECT_TRUE(response.counts_clock_parts());

  // Step 5 in two calls: the clock is 4 until the second is applied.
  PushRequest push = Push(1, 4, 0.0f);
  push.mutable_parts(0)->set_version(0);
  push.set_worker_incarnation(41);
  push.set_clock_parts(2);
  ASSERT_TRUE(DoPush(push).ok());
  EXPECT_EQ(shard_->WorkerClocks(), (std::vector<int64_t>{0, 4}));
  ASSERT_TRUE(DoPush(push).ok());
  EXPECT_EQ(shard_->WorkerClocks(), (std::vector<int64_t>{0, 5}));
  // A late call of an earlier step counts for nothing; the first call of
  // step 7 (in three) moves the clock to 6 only.
  push.set_clock(4);
  ASSERT_TRUE(DoPush(push).ok());
  push.set_clock(7);
  push.set_clock_parts(3);
  ASSERT_TRUE(DoPush(push).ok());
  EXPECT_EQ(shard_->WorkerClocks(), (std::vector<int64_t>{0, 6}));
  // More calls than any worker makes: refused, nothing changes.
  push.set_clock(9);
  push.set_clock_parts(kMaxClockParts + 1);
  const absl::Status refused = DoPush(push);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("clock_parts 65537"));
  EXPECT_EQ(shard_->WorkerClocks(), (std::vector<int64_t>{0, 6}));
  // An unsplit push moves it at once.
  push.set_clock_parts(1);
  ASSERT_TRUE(DoPush(push).ok());
  EXPECT_EQ(shard_->WorkerClocks(), (std::vector<int64_t>{0, 9}));
}

TEST_F(ShardTest, StatusIsBoundedButSummarisesEverything) {
  Start(ConsistencyMode::kAsync, 1);
  RegisterRequest request;
  for (int i = 0; i < 4; ++i) *request.add_tensors() = Spec("t" + std::to_string(i), 0.0f);
  RegisterResponse response;
  ASSERT_TRUE(shard_->Register(request, &response).ok());
  ASSERT_TRUE(DoPush(Push(0, 0, 1.0f)).ok());
  StatusRequest status_request;
  status_request.set_max_partitions(2);
  StatusResponse status;
  shard_->FillStatus(status_request, &status);
  EXPECT_EQ(status.partitions_size(), 2);
  EXPECT_TRUE(status.partitions_truncated());
  EXPECT_EQ(status.num_tensors(), 5);
  EXPECT_EQ(status.num_partitions(), 5);
  EXPECT_EQ(status.stored_elements(), 5 * kElements);
  EXPECT_EQ(status.min_version(), 0);
  EXPECT_EQ(status.max_version(), 1);
  EXPECT_EQ(status.num_workers(), 1u);
  StatusResponse all;
  shard_->FillStatus(StatusRequest(), &all);
  EXPECT_EQ(all.partitions_size(), 5);
  EXPECT_FALSE(all.partitions_truncated());
  shard_->Tick(absl::Now());
  EXPECT_EQ(metrics_.partition_version_max().Value(), 1);
  EXPECT_EQ(metrics_.partition_version_min().Value(), 0);
}

TEST_F(ShardTest, PerPartitionGaugesAreLimited) {
  ShardOptions options = Options(ConsistencyMode::kAsync, 1);
  options.limits.max_partition_metrics = 2;
  StartWith(options);
  RegisterRequest request;
  for (int i = 0; i < 4; ++i) *request.add_tensors() = Spec("t" + std::to_string(i), 0.0f);
  RegisterResponse response;
  ASSERT_TRUE(shard_->Register(request, &response).ok());
  size_t series = 0;
  for (const prometheus::MetricFamily& family : registry_.Collect()) {
    if (family.name == "shardtrain_partition_version") series = family.metric.size();
  }
  EXPECT_EQ(series, 2u);
}

// Resource limits: each refused before anything is allocated or changed.
class ShardLimitsTest : public ShardTest {
 protected:
  void SetUp() override {
    ShardOptions options = Options(ConsistencyMode::kSync, 2);
    options.limits.max_stored_elements = 1000;
    options.limits.max_tensors = 10;
    options.limits.max_tensors_per_request = 5;
    options.limits.max_parts_per_request = 100;
    options.limits.max_response_bytes = 10000;
    StartWith(options);
    ASSERT_TRUE(DoPush(Push(0, 0, 1.0f)).ok());  // a pending accumulator
    before_ = shard_->Checksum();
  }

  void ExpectRefused(const absl::Status& status, absl::StatusCode code,
                     const std::string& message) {
    EXPECT_EQ(status.code(), code) << status;
    EXPECT_THAT(status.message(), HasSubstr(message));
    EXPECT_EQ(shard_->Checksum(), before_) << "state changed";
  }

  absl::Status DoRegister(const std::vector<std::vector<int64_t>>& shapes) {
    RegisterRequest request;
    for (size_t i = 0; i < shapes.size(); ++i) {
      TensorSpec* spec = request.add_tensors();
      *spec = Spec("big" + std::to_string(i), 0.0f);
      spec->clear_shape();
      for (int64_t dim : shapes[i]) spec->add_shape(dim);
    }
    RegisterResponse response;
    return shard_->Register(request, &response);
  }

  uint64_t before_ = 0;
};

TEST_F(ShardLimitsTest, RegistrationsOverTheLimitsAreRefused) {
  for (const std::vector<int64_t>& shape :
       std::vector<std::vector<int64_t>>{{16384, 16384}, {65536, 65536}, {1001}}) {
    ExpectRefused(DoRegister({shape}), absl::StatusCode::kResourceExhausted,
                  "--max_stored_elements");
  }
  // Two tensors that fit alone but not together.
  ExpectRefused(DoRegister({{600}, {600}}), absl::StatusCode::kResourceExhausted,
                "--max_stored_elements");
  ExpectRefused(DoRegister({{1}, {1}, {1}, {1}, {1}, {1}}),
                absl::StatusCode::kResourceExhausted, "--max_tensors_per_request");
  for (int i = 0; i < 9; ++i) {
    RegisterRequest one;
    *one.add_tensors() = Spec("s" + std::to_string(i), 0.0f);
    one.mutable_tensors(0)->set_shape(0, 1);
    RegisterResponse response;
    ASSERT_TRUE(shard_->Register(one, &response).ok()) << i;
  }
  before_ = shard_->Checksum();
  ExpectRefused(DoRegister({{1}}), absl::StatusCode::kResourceExhausted,
                "--max_tensors");
  EXPECT_EQ(metrics_.requests_refused("max_stored_elements").Value(), 4);
  EXPECT_EQ(metrics_.requests_refused("max_tensors").Value(), 1);
}

TEST_F(ShardLimitsTest, MalformedShapesAreRefused) {
  for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{
           {0},
           {-5},
           {4, 0},
           {std::numeric_limits<int64_t>::max()},
           {int64_t{1} << 32, int64_t{1} << 32},
           {int64_t{1} << 62, 4},
           {-1, -1},
           {1, 1, 1, 1, 1, 1, 1, 1, 1}}) {
    ExpectRefused(DoRegister({shape}), absl::StatusCode::kInvalidArgument,
                  "tensor big0");
  }
}

TEST_F(ShardLimitsTest, RepeatedOrTooManyPartsAreRefusedBeforeAnyWork) {
  PullRequest pull = Pull(0, 0, 0);
  for (int i = 1; i < 50; ++i) pull.add_parts()->set_tensor("w");
  ExpectRefused(shard_->pulls().Validate(pull), absl::StatusCode::kInvalidArgument,
                "appears twice");
  for (int i = 50; i < 8000; ++i) pull.add_parts()->set_tensor("w");
  ExpectRefused(shard_->pulls().Validate(pull), absl::StatusCode::kResourceExhausted,
                "--max_parts_per_request");

  // A sparse part names a partition once; 20,000 of them for one partition.
  PushRequest push = Push(1, 0, 1.0f);
  GradientPart sparse = push.parts(0);
  sparse.mutable_grad()->set_encoding(ENCODING_SPARSE);
  sparse.mutable_grad()->clear_data();
  push.clear_parts();
  for (int i = 0; i < 20000; ++i) *push.add_parts() = sparse;
  ExpectRefused(DoPush(push), absl::StatusCode::kResourceExhausted,
                "--max_parts_per_request");
  push.mutable_parts()->DeleteSubrange(50, 20000 - 50);
  ExpectRefused(DoPush(push), absl::StatusCode::kInvalidArgument, "appears twice");

  // More sparse indices than the partition has elements.
  PushRequest many = Push(1, 0, 1.0f);
  Payload* payload = many.mutable_parts(0)->mutable_grad();
  payload->set_encoding(ENCODING_SPARSE);
  std::vector<uint32_t> indices(kElements + 1, 0);
  payload->set_indices(std::string(reinterpret_cast<const char*>(indices.data()),
                                   indices.size() * sizeof(uint32_t)));
  payload->set_data(std::string(indices.size() * sizeof(float), '\0'));
  ExpectRefused(DoPush(many), absl::StatusCode::kInvalidArgument,
                "elements of a 6-element partition");
}

TEST_F(ShardLimitsTest, PullsLargerThanAResponseAreRefused) {
  RegisterRequest request;
  *request.add_tensors() = Spec("v", 0.0f);
  request.mutable_tensors(0)->set_shape(0, 900);
  RegisterResponse response;
  ASSERT_TRUE(shard_->Register(request, &response).ok());
  before_ = shard_->Checksum();
  PullRequest pull = Pull(0, 0, 0);
  pull.mutable_parts(0)->set_tensor("v");
  ASSERT_TRUE(shard_->pulls().Validate(pull).ok());  // 3600 bytes
  pull.add_parts()->set_tensor("w");
  ASSERT_TRUE(shard_->pulls().Validate(pull).ok());
  ShardOptions options = shard_->options();
  options.limits.max_response_bytes = 3000;
  StartWith(options);
  before_ = shard_->Checksum();
  ASSERT_TRUE(shard_->Register(request, &response).ok());
  before_ = shard_->Checksum();
  pull.mutable_parts()->DeleteSubrange(1, 1);
  ExpectRefused(shard_->pulls().Validate(pull), absl::StatusCode::kResourceExhausted,
                "--max_message_mb");
  pull.set_dtype(DTYPE_BF16);  // 1800 bytes
  EXPECT_TRUE(shard_->pulls().Validate(pull).ok());
}

}  // namespace
}  // namespace shardtrain::server
