// Trainer on an in-memory parameter server (client/testing/
// in_memory_parameter_client.h): the training loop's own logic, without
// shards. What the shards and the wire add is tested in tests/.
#include "worker/trainer.h"

#include <memory>
#include <random>
#include <tuple>
#include <vector>

#include "client/testing/in_memory_parameter_client.h"
#include "common/initializer.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/device/cpu/cpu_backend.h"
#include "worker/model/model_spec.h"
#include "worker/model/model_test_util.h"
#include "worker/model/tensor_specs.h"

namespace shardtrain::worker {
namespace {

using ::shardtrain::client::testing::InMemoryParameterClient;
using ::testing::HasSubstr;

constexpr float kLearningRate = 0.1f;
constexpr int kBatch = 8;
constexpr int kFeatures = 4;
constexpr int kClasses = 3;
constexpr uint64_t kSeed = 7;

// Examples whose label is the argmax of a fixed linear map of the features.
Dataset MakeDataset(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Dataset data;
  data.num_examples = n;
  data.feature_dim = kFeatures;
  for (int i = 0; i < n; ++i) {
    float score[kClasses] = {0, 0, 0};
    for (int f = 0; f < kFeatures; ++f) {
      const float x = normal(rng);
      data.features.push_back(x);
      score[f % kClasses] += (f < kClasses ? 1.0f : -0.5f) * x;
    }
    int label = 0;
    for (int c = 1; c < kClasses; ++c) {
      if (score[c] > score[label]) label = c;
    }
    data.labels.push_back(label);
  }
  return data;
}

class TrainerTest : public ::testing::Test {
 protected:
  TrainerTest() : backend_(MakeCpuBackend()), data_(MakeDataset(64, 3)) {
    spec_ = *ModelSpec::Parse("mlp:4-8-3");
  }

  TrainerOptions Options(bool sync, bool overlap) const {
    TrainerOptions options;
    options.sync = sync;
    options.overlap = overlap;
    options.batch = kBatch;
    options.epochs = 1;
    options.seed = kSeed;
    options.heartbeat_interval = absl::Milliseconds(20);
    return options;
  }

  // Async, without per-layer overlap, each step's exchange behind the next.
  TrainerOptions StaleOptions() const {
    TrainerOptions options = Options(/*sync=*/false, /*overlap=*/false);
    options.stale_overlap = true;
    return options;
  }

  absl::StatusOr<std::unique_ptr<Trainer>> MakeTrainer(const TrainerOptions& options,
                                                       client::ParameterClient* client) {
    return Trainer::Create(options, MlpFactory(spec_, backend_.get()), client,
                           /*metrics=*/nullptr);
  }

  // Batch `b` of the data set, in order.
  const float* X(int b) const { return data_.features.data() + b * kBatch * kFeatures; }
  const int32_t* Labels(int b) const { return data_.labels.data() + b * kBatch; }

  std::unique_ptr<Backend> backend_;
  ModelSpec spec_;
  Dataset data_;
};

// The model plain SGD makes from the shards' initial values over batches
// 0..steps-1: what one worker's trainer must end with in either mode.
std::vector<std::vector<float>> PlainSgd(const ModelFactory& make_model, int steps,
                                         const Dataset& data) {
  absl::StatusOr<std::unique_ptr<Model>> made = make_model(kBatch);
  EXPECT_OK(made.status());
  Model& model = **made;
  std::vector<std::vector<float>> params;
  for (const TensorSpec& spec : TensorSpecsFor(model.params(), kSeed)) {
    params.emplace_back(common::NumElements(spec));
    common::FillInitialValues(spec, 0, absl::MakeSpan(params.back()));
  }
  for (int b = 0; b < steps; ++b) {
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_OK(model.SetParam(static_cast<int>(i), params[i]));
    }
    EXPECT_OK(model
                  .ForwardBackward(data.features.data() + b * kBatch * kFeatures,
                                   data.labels.data() + b * kBatch, kBatch, nullptr)
                  .status());
    for (size_t i = 0; i < params.size(); ++i) {
      std::vector<float> grad(params[i].size());
      EXPECT_OK(model.GetGrad(static_cast<int>(i), absl::MakeSpan(grad)));
      for (size_t k = 0; k < grad.size(); ++k) params[i][k] -= kLearningRate * grad[k];
    }
  }
  return params;
}

class TrainerModesTest : public TrainerTest,
                         public ::testing::WithParamInterface<std::tuple<bool, bool>> {
 protected:
  bool sync() const { return std::get<0>(GetParam()); }
  bool overlap() const { return std::get<1>(GetParam()); }
};

INSTANTIATE_TEST_SUITE_P(
    SyncOverlap, TrainerModesTest, ::testing::Combine(::testing::Bool(), ::testing::Bool()),
    [](const ::testing::TestParamInfo<std::tuple<bool, bool>>& info) {
      return std::string(std::get<0>(info.param) ? "Sync" : "Async") +
             (std::get<1>(info.param) ? "Overlap" : "AfterBackward");
    });

TEST_P(TrainerModesTest, StepsAreSgdOnTheServersModel) {
  InMemoryParameterClient client(0, 1, kLearningRate);
  ASSERT_OK_AND_ASSIGN(auto trainer, MakeTrainer(Options(sync(), overlap()), &client));
  ASSERT_OK(trainer->Initialize());
  EXPECT_EQ(trainer->clock(), 0);
  constexpr int kSteps = 5;
  for (int b = 0; b < kSteps; ++b) {
    ASSERT_OK_AND_ASSIGN(const float loss, trainer->Step(X(b), Labels(b), kBatch));
    EXPECT_GT(loss, 0.0f);
  }
  ASSERT_OK(trainer->Drain());
  EXPECT_EQ(trainer->clock(), kSteps);
  const std::vector<std::vector<float>> expected =
      PlainSgd(MlpFactory(spec_, backend_.get()), kSteps, data_);
  ASSERT_EQ(expected.size(), trainer->params().size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(client.version(static_cast<int>(i)), kSteps);
    // One worker computes every gradient from the parameters of the step
    // before: the server's model is plain SGD's, bit for bit.
    EXPECT_EQ(client.values(static_cast<int>(i)), expected[i]) << "tensor " << i;
  }
}

// Stale overlap: step b's push and pull run behind step b+1's compute, so
// every gradient from step 1 on is computed one update behind: the shards'
// model is delayed SGD's, gradient b taken at the parameters after b-1
// updates (b = 0 and 1 both at the initial ones).
TEST_F(TrainerTest, StaleOverlapIsSgdOneStepBehind) {
  InMemoryParameterClient client(0, 1, kLearningRate);
  ASSERT_OK_AND_ASSIGN(auto trainer, MakeTrainer(StaleOptions(), &client));
  ASSERT_OK(trainer->Initialize());
  constexpr int kSteps = 6;
  for (int b = 0; b < kSteps; ++b) {
    ASSERT_OK(trainer->Step(X(b), Labels(b), kBatch).status());
    // The step returns with its exchange in flight or landed: never more
    // than one gradient behind the trainer's clock.
    EXPECT_GE(client.pushes_applied(), b * static_cast<int64_t>(trainer->params().size()));
  }
  ASSERT_OK(trainer->Drain());
  EXPECT_EQ(trainer->clock(), kSteps);

  // Delayed SGD from the shards' initial values.
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Model> model, MlpFactory(spec_, backend_.get())(kBatch));
  std::vector<std::vector<float>> params;
  for (const TensorSpec& spec : TensorSpecsFor(model->params(), kSeed)) {
    params.emplace_back(common::NumElements(spec));
    common::FillInitialValues(spec, 0, absl::MakeSpan(params.back()));
  }
  std::vector<std::vector<float>> behind = params;  // after b-1 updates
  for (int b = 0; b < kSteps; ++b) {
    for (size_t i = 0; i < behind.size(); ++i) {
      ASSERT_OK(model->SetParam(static_cast<int>(i), behind[i]));
    }
    ASSERT_OK(model->ForwardBackward(X(b), Labels(b), kBatch, nullptr).status());
    behind = params;
    for (size_t i = 0; i < params.size(); ++i) {
      std::vector<float> grad(params[i].size());
      ASSERT_OK(model->GetGrad(static_cast<int>(i), absl::MakeSpan(grad)));
      for (size_t k = 0; k < grad.size(); ++k) params[i][k] -= kLearningRate * grad[k];
    }
  }
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(client.version(static_cast<int>(i)), kSteps);
    EXPECT_EQ(client.values(static_cast<int>(i)), params[i]) << "tensor " << i;
    // Drain pulled the last update: the trainer holds the shards' model.
    EXPECT_EQ(trainer->params()[i], params[i]) << "tensor " << i;
  }
}

// The shards hear the staleness stale overlap adds: one update per gradient
// for a lone worker, whose gradients are otherwise never stale.
TEST_F(TrainerTest, StaleOverlapReportsTheStalenessItAdds) {
  InMemoryParameterClient client(0, 1, kLearningRate);
  ASSERT_OK_AND_ASSIGN(auto trainer, MakeTrainer(StaleOptions(), &client));
  ASSERT_OK(trainer->Initialize());
  ASSERT_OK_AND_ASSIGN(const TrainResult result, trainer->Run(data_, nullptr, nullptr));
  ASSERT_EQ(result.epochs.size(), 1u);
  EXPECT_EQ(result.epochs[0].max_staleness, 1);
  EXPECT_EQ(result.steps, 64 / kBatch);
  EXPECT_EQ(client.version(0), 64 / kBatch);
}

TEST_F(TrainerTest, StaleOverlapIsRefusedInSyncModeAndWithOverlap) {
  InMemoryParameterClient client(0, 1, kLearningRate);
  for (const auto& [sync, overlap] : {std::pair{true, false}, std::pair{false, true}}) {
    TrainerOptions options = Options(sync, overlap);
    options.stale_overlap = true;
    EXPECT_EQ(MakeTrainer(options, &client).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
}

// Sync only: the shards' answers a sync trainer acts on, with and without
// overlap.
class TrainerSyncTest : public TrainerTest, public ::testing::WithParamInterface<bool> {
 protected:
  bool overlap() const { return GetParam(); }
};

INSTANTIATE_TEST_SUITE_P(Overlap, TrainerSyncTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "Overlap" : "AfterBackward");
                         });

TEST_P(TrainerSyncTest, RepeatedPushOfAStepGoesOnWithTheEarlierOne) {
  InMemoryParameterClient client(0, 1, kLearningRate);
  ASSERT_OK_AND_ASSIGN(auto trainer, MakeTrainer(Options(true, overlap()), &client));
  ASSERT_OK(trainer->Initialize());
  client.FailNextPush(absl::AlreadyExistsError("worker 0 pushed for step 1 before"),
                      /*applied=*/true);
  ASSERT_OK(trainer->Step(X(0), Labels(0), kBatch).status());
  ASSERT_OK(trainer->Step(X(1), Labels(1), kBatch).status());
  ASSERT_OK(trainer->Drain());
  EXPECT_EQ(trainer->clock(), 2);
  EXPECT_EQ(client.version(0), 2);
}

TEST_P(TrainerSyncTest, LateGradientRejoinsAtTheShardsStep) {
  InMemoryParameterClient client(0, 1, kLearningRate);
  ASSERT_OK_AND_ASSIGN(auto trainer, MakeTrainer(Options(true, overlap()), &client));
  ASSERT_OK(trainer->Initialize());
  ASSERT_OK(trainer->Step(X(0), Labels(0), kBatch).status());
  // While this worker computes step 1, the others finish steps 1 to 3
  // without it: its push for step 2 is refused as late.
  client.AdvanceBeforeNextPush(3);
  ASSERT_OK(trainer->Step(X(1), Labels(1), kBatch).status());
  // It rejoins at step 4 (after backward: at once; with overlap: when the
  // next step finishes the refused exchange) and goes on from there.
  ASSERT_OK(trainer->Step(X(2), Labels(2), kBatch).status());
  ASSERT_OK(trainer->Drain());
  EXPECT_EQ(trainer->clock(), 5);
  ASSERT_OK(trainer->PullParameters(5));
  for (int i = 0; i < static_cast<int>(trainer->params().size()); ++i) {
    EXPECT_EQ(client.version(i), 5);
    EXPECT_EQ(client.values(i), trainer->params()[i]);
  }
}

TEST_P(TrainerModesTest, UnreachableShardFailsTheStep) {
  InMemoryParameterClient client(0, 1, kLearningRate);
  ASSERT_OK_AND_ASSIGN(auto trainer, MakeTrainer(Options(sync(), overlap()), &client));
  ASSERT_OK(trainer->Initialize());
  client.FailNextPush(absl::UnavailableError("shard 1 (10.0.0.2:5000) unreachable for 120s"),
                      /*applied=*/false);
  absl::Status failed = trainer->Step(X(0), Labels(0), kBatch).status();
  // With overlap the push runs behind the step: its error ends the next.
  if (overlap()) failed = trainer->Step(X(1), Labels(1), kBatch).status();
  EXPECT_EQ(failed.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(failed.message(), HasSubstr("shard 1 (10.0.0.2:5000)"));
  // Nothing of the failed push is in (with overlap, the other tensors'
  // exchanges of that step are) and nothing after it.
  const int64_t tensors = static_cast<int64_t>(trainer->params().size());
  EXPECT_EQ(client.pushes_applied(), overlap() ? tensors - 1 : 0);
}

TEST_F(TrainerTest, ShardsAheadOfAPullMakeTheWorkerRejoin) {
  // A step pulls when it holds no parameters: the first one, here. Later
  // steps get theirs with the push (one PushPull), so what a worker dropped
  // between steps sees is its push refused as late:
  // LateGradientRejoinsAtTheShardsStep.
  InMemoryParameterClient client(0, 1, kLearningRate);
  ASSERT_OK_AND_ASSIGN(auto trainer, MakeTrainer(Options(true, false), &client));
  ASSERT_OK(trainer->Initialize());
  // The others went on without this worker (it was dropped while it started).
  client.AdvanceSteps(2);
  // Step 0 pulls, finds step 2, and computes that one instead.
  ASSERT_OK(trainer->Step(X(0), Labels(0), kBatch).status());
  EXPECT_EQ(trainer->clock(), 3);
  EXPECT_EQ(client.version(0), 3);
}

// Sync without overlap: a step's push brings the parameters of the step it
// completes (the shard answers once every worker's gradient is in), so the
// steps after the first make one round trip each, not a push and a pull.
TEST_F(TrainerTest, SyncStepsFetchTheirParametersWithThePush) {
  InMemoryParameterClient client(0, 1, kLearningRate);
  ASSERT_OK_AND_ASSIGN(auto trainer, MakeTrainer(Options(true, false), &client));
  ASSERT_OK(trainer->Initialize());
  const int64_t before = client.round_trips();
  for (int b = 0; b < 4; ++b) ASSERT_OK(trainer->Step(X(b), Labels(b), kBatch).status());
  EXPECT_EQ(client.round_trips() - before, 1 + 4) << "the first step's pull, then one per step";
  EXPECT_EQ(trainer->clock(), 4);
  EXPECT_EQ(client.version(0), 4);
}

TEST_F(TrainerTest, AsyncResumesAtTheClockRecordedForItsIndex) {
  InMemoryParameterClient client(0, 1, kLearningRate);
  client.set_worker_clock(5);
  ASSERT_OK_AND_ASSIGN(auto trainer, MakeTrainer(Options(false, true), &client));
  ASSERT_OK(trainer->Initialize());
  EXPECT_EQ(trainer->clock(), 5);
  // 64 examples in batches of 8: one epoch is 8 steps, 3 are left.
  ASSERT_OK_AND_ASSIGN(TrainResult result, trainer->Run(data_, nullptr, nullptr));
  EXPECT_EQ(result.steps, 3);
  EXPECT_EQ(trainer->clock(), 8);
  ASSERT_EQ(result.epochs.size(), 1u);
  EXPECT_EQ(result.epochs[0].epoch, 1);
  EXPECT_EQ(client.version(0), 3);
}

TEST_F(TrainerTest, AsyncPushesRecordTheClockARestartResumesAt) {
  InMemoryParameterClient client(0, 1, kLearningRate);
  for (const bool overlap : {false, true}) {
    SCOPED_TRACE(overlap ? "overlap" : "after backward");
    ASSERT_OK_AND_ASSIGN(auto trainer, MakeTrainer(Options(false, overlap), &client));
    ASSERT_OK(trainer->Initialize());
    const int64_t start = trainer->clock();
    for (int b = 0; b < 3; ++b) ASSERT_OK(trainer->Step(X(b), Labels(b), kBatch).status());
    ASSERT_OK(trainer->Drain());
    // The process dies here, before any heartbeat: its pushes alone told
    // the server where it was.
    ASSERT_OK_AND_ASSIGN(auto restarted, MakeTrainer(Options(false, overlap), &client));
    ASSERT_OK(restarted->Initialize());
    EXPECT_EQ(restarted->clock(), start + 3);
  }
}

TEST_F(TrainerTest, SyncStartsAtTheShardsStep) {
  InMemoryParameterClient client(0, 1, kLearningRate);
  ASSERT_OK_AND_ASSIGN(auto trainer, MakeTrainer(Options(true, true), &client));
  ASSERT_OK(trainer->Initialize());
  client.AdvanceSteps(6);
  ASSERT_OK(trainer->Initialize());  // a restarted worker process
  EXPECT_EQ(trainer->clock(), 6);
  ASSERT_OK_AND_ASSIGN(TrainResult result, trainer->Run(data_, nullptr, nullptr));
  EXPECT_EQ(result.steps, 2);
  EXPECT_EQ(client.version(0), 8);
}

TEST_F(TrainerTest, SyncPartitionsStepsApartGoOnAtTheNewest) {
  // The shards of a killed job restored step checkpoints of different
  // steps: the job goes on at the newest, the rest catch up on the push.
  InMemoryParameterClient client(0, 1, kLearningRate);
  ASSERT_OK_AND_ASSIGN(auto trainer, MakeTrainer(Options(true, false), &client));
  ASSERT_OK(trainer->Initialize());
  client.AdvanceSteps(3);
  client.SetVersion(0, 5);
  ASSERT_OK(trainer->Initialize());
  EXPECT_EQ(trainer->clock(), 5);
  ASSERT_OK(trainer->Step(X(0), Labels(0), kBatch).status());
  EXPECT_EQ(trainer->clock(), 6);
  for (int i = 0; i < static_cast<int>(trainer->params().size()); ++i) {
    EXPECT_EQ(client.version(i), 6) << "tensor " << i;
  }
}

TEST_F(TrainerTest, ChiefEvaluatesOnceTheOthersAreDone) {
  InMemoryParameterClient client(0, 2, kLearningRate);
  client.SetWorkerState(1, /*clock=*/8, /*done=*/true, /*live=*/true);
  TrainerOptions options = Options(false, true);
  options.num_workers = 2;
  options.chief = true;
  options.epochs = 2;
  ASSERT_OK_AND_ASSIGN(auto trainer, MakeTrainer(options, &client));
  ASSERT_OK(trainer->Initialize());
  const Dataset test = MakeDataset(30, 4);
  std::vector<int> reported;
  ASSERT_OK_AND_ASSIGN(TrainResult result,
                       trainer->Run(data_, &test, [&](const EpochResult& epoch) {
                         reported.push_back(epoch.epoch);
                       }));
  // Half of 64 examples each: 4 steps an epoch.
  EXPECT_EQ(result.steps, 8);
  EXPECT_EQ(reported, (std::vector<int>{1, 2}));
  ASSERT_EQ(result.epochs.size(), 2u);
  for (const EpochResult& epoch : result.epochs) {
    EXPECT_GE(epoch.test_accuracy, 0.0);
    EXPECT_LE(epoch.test_accuracy, 1.0);
  }
  EXPECT_EQ(result.final_test_accuracy, result.epochs.back().test_accuracy);
  EXPECT_GT(result.samples_per_second, 0);
  EXPECT_GT(client.heartbeats(), 0);
}

TEST_F(TrainerTest, ChiefGivesUpOnAWorkerThatNeverFinishes) {
  InMemoryParameterClient client(0, 2, kLearningRate);
  client.SetWorkerState(1, /*clock=*/1, /*done=*/false, /*live=*/true);
  TrainerOptions options = Options(false, false);
  options.num_workers = 2;
  options.chief = true;
  options.wait_for_workers = absl::Milliseconds(300);
  ASSERT_OK_AND_ASSIGN(auto trainer, MakeTrainer(options, &client));
  ASSERT_OK(trainer->Initialize());
  const Dataset test = MakeDataset(30, 4);
  const absl::Status status = trainer->Run(data_, &test, nullptr).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(status.message(), HasSubstr("1 of 2 workers finished"));
}

TEST_F(TrainerTest, ChiefCountsASilentWorkerAsFinished) {
  InMemoryParameterClient client(0, 2, kLearningRate);
  client.SetWorkerState(1, /*clock=*/1, /*done=*/false, /*live=*/false);
  TrainerOptions options = Options(false, false);
  options.num_workers = 2;
  options.chief = true;
  ASSERT_OK_AND_ASSIGN(auto trainer, MakeTrainer(options, &client));
  ASSERT_OK(trainer->Initialize());
  const Dataset test = MakeDataset(30, 4);
  ASSERT_OK_AND_ASSIGN(TrainResult result, trainer->Run(data_, &test, nullptr));
  EXPECT_GE(result.final_test_accuracy, 0.0);
}

TEST_F(TrainerTest, CreateRefusesBadOptions) {
  InMemoryParameterClient client(0, 1, kLearningRate);
  TrainerOptions options = Options(false, false);
  options.worker_index = 1;
  EXPECT_EQ(MakeTrainer(options, &client).status().code(),
            absl::StatusCode::kInvalidArgument);
  options = Options(false, false);
  options.batch = 0;
  EXPECT_EQ(MakeTrainer(options, &client).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(TrainerTest, ChiefNeedsATestSet) {
  InMemoryParameterClient client(0, 1, kLearningRate);
  TrainerOptions options = Options(false, false);
  options.chief = true;
  ASSERT_OK_AND_ASSIGN(auto trainer, MakeTrainer(options, &client));
  ASSERT_OK(trainer->Initialize());
  EXPECT_EQ(trainer->Run(data_, nullptr, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardtrain::worker
