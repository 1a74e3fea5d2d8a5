#include "worker/model/pipeline/pipeline_model.h"

#include <atomic>
#include <vector>

#include "gtest/gtest.h"
#include "worker/device/cpu/cpu_backend.h"
#include "worker/model/mlp.h"
#include "worker/model/pipeline/pipeline_test_util.h"

namespace shardtrain::worker::pipeline {
namespace {

using testing_util::ExpectMatchesMlp;
using testing_util::MakeProblem;
using testing_util::Problem;

constexpr double kTolerance = 1e-5;

ModelSpec FourLayerSpec() { return *ModelSpec::Parse("mlp:12-16-20-16-10"); }

PipelineOptions Options(int stages, int microbatches, ScheduleKind kind,
                        bool concurrent) {
  PipelineOptions options;
  options.stages = stages;
  options.microbatches = microbatches;
  options.schedule = kind;
  options.concurrent_stages = concurrent;
  return options;
}

TEST(PipelineEquivalence, MatchesMlpForAllStagesMicrobatchesSchedules) {
  SetCpuMathThreads(1);
  const Problem problem = MakeProblem(FourLayerSpec(), /*batch=*/24, 7);
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B}) {
    for (int stages : {2, 3, 4}) {
      for (int m : {1, 4, 8}) {
        for (bool concurrent : {true, false}) {
          SCOPED_TRACE(::testing::Message()
                       << ScheduleKindName(kind) << " S=" << stages
                       << " M=" << m << " concurrent=" << concurrent);
          absl::StatusOr<std::unique_ptr<PipelineModel>> model =
              PipelineModel::CreateCpu(problem.spec, problem.batch,
                                       Options(stages, m, kind, concurrent));
          ASSERT_TRUE(model.ok()) << model.status();
          ExpectMatchesMlp(**model, problem, kTolerance);
          // A second step overwrites, rather than adds to, the gradients.
          ExpectMatchesMlp(**model, problem, kTolerance);
        }
      }
    }
  }
}

TEST(PipelineEquivalence, BatchNotDivisibleByMicrobatches) {
  // 27 = 7 + 7 + 7 + 6: microbatches are weighted by their rows.
  const Problem problem = MakeProblem(FourLayerSpec(), /*batch=*/27, 11);
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B}) {
    absl::StatusOr<std::unique_ptr<PipelineModel>> model =
        PipelineModel::CreateCpu(problem.spec, 32, Options(3, 4, kind, true));
    ASSERT_TRUE(model.ok()) << model.status();
    ExpectMatchesMlp(**model, problem, kTolerance);
  }
}

TEST(PipelineEquivalence, SmallerBatchThanMax) {
  const Problem problem = MakeProblem(FourLayerSpec(), /*batch=*/9, 3);
  absl::StatusOr<std::unique_ptr<PipelineModel>> model =
      PipelineModel::CreateCpu(problem.spec, 64,
                               Options(4, 8, ScheduleKind::k1F1B, true));
  ASSERT_TRUE(model.ok()) << model.status();
  ExpectMatchesMlp(**model, problem, kTolerance);
}

TEST(PipelineEquivalence, RejectsBadArguments) {
  const ModelSpec spec = FourLayerSpec();
  // More stages than Linear layers.
  EXPECT_EQ(PipelineModel::CreateCpu(spec, 8,
                                     Options(5, 2, ScheduleKind::kGPipe, true))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PipelineModel::CreateCpu(spec, 8,
                                     Options(2, 0, ScheduleKind::kGPipe, true))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  // max_batch below the microbatch count.
  EXPECT_EQ(PipelineModel::CreateCpu(spec, 3,
                                     Options(2, 4, ScheduleKind::kGPipe, true))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<std::unique_ptr<Backend>> one_backend;
  one_backend.push_back(MakeCpuBackend());
  EXPECT_EQ(PipelineModel::Create(spec, std::move(one_backend), 8,
                                  Options(2, 2, ScheduleKind::kGPipe, true))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);

  const Problem problem = MakeProblem(spec, 3, 5);
  absl::StatusOr<std::unique_ptr<PipelineModel>> model =
      PipelineModel::CreateCpu(spec, 16,
                               Options(2, 4, ScheduleKind::k1F1B, true));
  ASSERT_TRUE(model.ok()) << model.status();
  // Batch of 3 cannot fill 4 microbatches.
  EXPECT_EQ((*model)
                ->ForwardBackward(problem.x.data(), problem.labels.data(), 3)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<int32_t> bad_labels(4, 10);
  std::vector<float> x(4 * 12, 0.0f);
  EXPECT_EQ(
      (*model)->ForwardBackward(x.data(), bad_labels.data(), 4).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*model)->ForwardBackward(x.data(), nullptr, 4).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<float> wrong_size(3);
  EXPECT_EQ((*model)->SetParam(0, wrong_size).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*model)->GetGrad(99, absl::MakeSpan(wrong_size)).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PipelineEquivalence, StageOwnershipAndSplit) {
  // 4 Linear layers on 3 stages: 2 + 1 + 1.
  absl::StatusOr<std::unique_ptr<PipelineModel>> model =
      PipelineModel::CreateCpu(FourLayerSpec(), 8,
                               Options(3, 2, ScheduleKind::k1F1B, true));
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<int> want = {0, 0, 0, 0, 1, 1, 2, 2};
  ASSERT_EQ((*model)->params().size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ((*model)->stage_of_param(i), want[i]) << (*model)->params()[i].name;
  }
  EXPECT_EQ((*model)->params()[4].name, "fc2.weight");
  EXPECT_EQ((*model)->num_stages(), 3);
  EXPECT_NE((*model)->stage_backend(0), (*model)->stage_backend(1));
}

TEST(PipelineEquivalence, CountCorrectMatchesMlp) {
  const Problem problem = MakeProblem(FourLayerSpec(), /*batch=*/50, 13);
  std::unique_ptr<Backend> cpu = MakeCpuBackend();
  absl::StatusOr<std::unique_ptr<Mlp>> mlp =
      Mlp::Create(problem.spec, cpu.get(), 16);
  absl::StatusOr<std::unique_ptr<PipelineModel>> model =
      PipelineModel::CreateCpu(problem.spec, 16,
                               Options(4, 4, ScheduleKind::kGPipe, true));
  ASSERT_TRUE(mlp.ok() && model.ok());
  for (size_t i = 0; i < problem.params.size(); ++i) {
    ASSERT_TRUE((*mlp)->SetParam(i, problem.params[i]).ok());
    ASSERT_TRUE((*model)->SetParam(i, problem.params[i]).ok());
    std::vector<float> back(problem.params[i].size());
    ASSERT_TRUE((*model)->GetParam(i, absl::MakeSpan(back)).ok());
    EXPECT_EQ(back, problem.params[i]);
  }
  absl::StatusOr<int> want =
      (*mlp)->CountCorrect(problem.x.data(), problem.labels.data(), 50);
  absl::StatusOr<int> got =
      (*model)->CountCorrect(problem.x.data(), problem.labels.data(), 50);
  ASSERT_TRUE(want.ok() && got.ok());
  EXPECT_EQ(*got, *want);
}

// A transport that fails the n-th send: the failure must come back from
// ForwardBackward (not a hang, not the neighbours' cancellation).
class FailingTransport final : public StageTransport {
 public:
  FailingTransport(std::unique_ptr<StageTransport> inner, int fail_at)
      : inner_(std::move(inner)), fail_at_(fail_at) {}
  int num_stages() const override { return inner_->num_stages(); }
  absl::Status Send(const MessageTag& tag, const float* src,
                    size_t n) override {
    if (sends_.fetch_add(1) == fail_at_) {
      return absl::UnavailableError("injected send failure");
    }
    return inner_->Send(tag, src, n);
  }
  absl::Status Recv(const MessageTag& tag, float* dst, size_t n) override {
    return inner_->Recv(tag, dst, n);
  }
  bool Arrived(const MessageTag& tag) override { return inner_->Arrived(tag); }
  bool SupportsConcurrentStages() const override { return true; }
  void Cancel() override { inner_->Cancel(); }
  void Reset() override { inner_->Reset(); }

 private:
  std::unique_ptr<StageTransport> inner_;
  const int fail_at_;
  std::atomic<int> sends_{0};
};

TEST(PipelineEquivalence, TransportFailureIsReported) {
  const Problem problem = MakeProblem(FourLayerSpec(), 16, 17);
  std::vector<std::unique_ptr<Backend>> backends;
  for (int s = 0; s < 3; ++s) backends.push_back(MakeCpuBackend());
  TransportFactory factory = [](std::vector<Backend*> stage_backends)
      -> absl::StatusOr<std::unique_ptr<StageTransport>> {
    absl::StatusOr<std::unique_ptr<LocalTransport>> local =
        LocalTransport::Create(std::move(stage_backends));
    if (!local.ok()) return local.status();
    return std::make_unique<FailingTransport>(*std::move(local), 5);
  };
  absl::StatusOr<std::unique_ptr<PipelineModel>> model = PipelineModel::Create(
      problem.spec, std::move(backends), 16,
      Options(3, 4, ScheduleKind::k1F1B, true), factory);
  ASSERT_TRUE(model.ok()) << model.status();
  absl::StatusOr<float> loss = (*model)->ForwardBackward(
      problem.x.data(), problem.labels.data(), 16);
  EXPECT_EQ(loss.status().code(), absl::StatusCode::kUnavailable)
      << loss.status();
}

TEST(PipelineEquivalence, LocalTransportSemantics) {
  std::unique_ptr<Backend> a = MakeCpuBackend();
  std::unique_ptr<Backend> b = MakeCpuBackend();
  absl::StatusOr<std::unique_ptr<LocalTransport>> t =
      LocalTransport::Create({a.get(), b.get()}, absl::Milliseconds(50));
  ASSERT_TRUE(t.ok());
  auto src = *a->Allocate(3);
  auto dst = *b->Allocate(3);
  const std::vector<float> values = {1, 2, 3};
  ASSERT_TRUE(a->CopyFromHost(values, src.get(), 0).ok());
  // Out-of-order receives: mb 1 sent first, both received in either order.
  const MessageTag m0{0, 1, Payload::kActivation, 0};
  const MessageTag m1{0, 1, Payload::kActivation, 1};
  EXPECT_FALSE((*t)->Arrived(m1));
  ASSERT_TRUE((*t)->Send(m1, src->data(), 3).ok());
  ASSERT_TRUE((*t)->Send(m0, src->data(), 3).ok());
  EXPECT_TRUE((*t)->Arrived(m1));
  EXPECT_EQ((*t)->Send(m0, src->data(), 3).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE((*t)->Recv(m0, dst->data(), 3).ok());
  EXPECT_EQ((*t)->Recv(m1, dst->data(), 2).code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<float> out(3);
  ASSERT_TRUE(b->CopyToHost(*dst, 0, absl::MakeSpan(out)).ok());
  EXPECT_EQ(out, values);
  // Not adjacent / wrong direction.
  EXPECT_EQ((*t)->Send({1, 0, Payload::kActivation, 0}, src->data(), 3).code(),
            absl::StatusCode::kInvalidArgument);
  // Nothing sent: times out; cancelled: CANCELLED.
  EXPECT_EQ((*t)->Recv({1, 0, Payload::kActivationGrad, 0}, src->data(), 3)
                .code(),
            absl::StatusCode::kDeadlineExceeded);
  (*t)->Cancel();
  EXPECT_EQ((*t)->Recv({1, 0, Payload::kActivationGrad, 0}, src->data(), 3)
                .code(),
            absl::StatusCode::kCancelled);
  (*t)->Reset();
  EXPECT_FALSE((*t)->Arrived(m1));
}

}  // namespace
}  // namespace shardtrain::worker::pipeline
