// LateGradCopy: gradient copies that land after the call that started them,
// as a GPU's do (they run on a copy stream while backward goes on). The
// trainer must send each gradient only once its copy has landed, with and
// without overlapped push/pull, and must report a failed copy as an error.
//
// The copies here land on another thread after a delay, into memory that is
// NaN until then: a gradient sent too early is refused by the shards
// (non-finite), or, if a race let part of it through, changes the result,
// which must equal that of the same training with synchronous copies.
#include <chrono>
#include <cmath>
#include <future>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "server/ps_server.h"
#include "worker/cpu/cpu_backend.h"
#include "worker/mlp.h"
#include "worker/ps_client.h"
#include "worker/trainer.h"

namespace shardtrain {
namespace {

constexpr int kShards = 2;
constexpr int kBatch = 8;
constexpr int kSteps = 6;
constexpr int64_t kPartition = 200;  // Small, so tensors span both shards.

// Passes when a copy running on its own thread has landed.
class LateFence final : public worker::Fence {
 public:
  explicit LateFence(std::future<absl::Status> landed)
      : landed_(landed.share()) {}
  absl::Status Wait() override { return landed_.get(); }

 private:
  std::shared_future<absl::Status> landed_;
};

// An Mlp whose StartGradCopy lands its copy 3 ms later on another thread,
// or fails with `copy_error` when that is not OK.
class LateCopyModel final : public worker::Model {
 public:
  LateCopyModel(std::unique_ptr<worker::Mlp> mlp, absl::Status copy_error)
      : mlp_(std::move(mlp)),
        copy_error_(std::move(copy_error)),
        host_(mlp_->params().size()) {}

  const std::vector<worker::ParamInfo>& params() const override { return mlp_->params(); }
  absl::Status SetParam(int index, absl::Span<const float> values) override {
    return mlp_->SetParam(index, values);
  }
  absl::Status GetParam(int index, absl::Span<float> out) const override {
    return mlp_->GetParam(index, out);
  }
  absl::StatusOr<float> ForwardBackward(const float* x, const int32_t* labels, int batch,
                                        const std::function<void(int)>& on_grad_ready) override {
    return mlp_->ForwardBackward(x, labels, batch, on_grad_ready);
  }
  absl::Status GetGrad(int index, absl::Span<float> out) const override {
    return mlp_->GetGrad(index, out);
  }
  absl::StatusOr<int> CountCorrect(const float* x, const int32_t* labels, int batch) override {
    return mlp_->CountCorrect(x, labels, batch);
  }

  absl::StatusOr<worker::PendingGrad> StartGradCopy(int index) override {
    std::vector<float>& host = host_[index];
    host.assign(worker::NumElements(mlp_->params()[index]),
                std::numeric_limits<float>::quiet_NaN());
    std::vector<float> grad(host.size());
    absl::Status got = mlp_->GetGrad(index, absl::MakeSpan(grad));
    if (!got.ok()) return got;
    std::future<absl::Status> landed = std::async(
        std::launch::async, [&host, grad = std::move(grad), error = copy_error_] {
          std::this_thread::sleep_for(std::chrono::milliseconds(3));
          if (!error.ok()) return error;
          std::copy(grad.begin(), grad.end(), host.begin());
          return absl::OkStatus();
        });
    return worker::PendingGrad{host, std::make_unique<LateFence>(std::move(landed))};
  }

 private:
  std::unique_ptr<worker::Mlp> mlp_;
  const absl::Status copy_error_;
  std::vector<std::vector<float>> host_;  // Per parameter; sized once.
};

class LateGradCopy : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    std::mt19937 rng(3);
    std::normal_distribution<float> normal;
    x_.resize(size_t{kSteps} * kBatch * 30);
    for (float& v : x_) v = normal(rng);
    for (int i = 0; i < kSteps * kBatch; ++i) labels_.push_back(static_cast<int32_t>(rng() % 4));
  }

  // Fresh sync shards for one worker.
  absl::StatusOr<std::vector<std::unique_ptr<server::PsServer>>> StartShards() {
    std::vector<std::unique_ptr<server::PsServer>> shards;
    for (int s = 0; s < kShards; ++s) {
      server::PsServerOptions options;
      options.shard.shard_index = s;
      options.metrics_address = "";
      options.shard.partitioning = {kPartition, kShards};
      options.shard.mode = server::ConsistencyMode::kSync;
      options.shard.num_workers = 1;
      options.shard.optimizer.name = "momentum";
      options.shard.optimizer.learning_rate = 0.05f;
      auto shard = server::PsServer::Start(options);
      if (!shard.ok()) return shard.status();
      shards.push_back(std::move(*shard));
    }
    return shards;
  }

  // Trains kSteps with one worker; `late` wraps the model in LateCopyModel.
  // Returns the parameters afterwards, or the first error.
  absl::StatusOr<std::vector<std::vector<float>>> Train(bool late, absl::Status copy_error) {
    auto shards = StartShards();
    if (!shards.ok()) return shards.status();
    worker::PsClientOptions client_options;
    for (const auto& shard : *shards) {
      client_options.servers.push_back("127.0.0.1:" + std::to_string(shard->port()));
    }
    client_options.max_partition_elements = kPartition;
    client_options.pull_timeout = absl::Seconds(30);
    auto client = worker::PsClient::Create(client_options, nullptr);
    if (!client.ok()) return client.status();
    worker::TrainerOptions options;
    options.sync = true;
    options.overlap = GetParam();
    options.batch = kBatch;
    const worker::ModelSpec spec = worker::ModelSpec::Parse("mlp:30-20-12-4").value();
    worker::ModelFactory make_model =
        [&, late, copy_error](int max_batch) -> absl::StatusOr<std::unique_ptr<worker::Model>> {
      auto mlp = worker::Mlp::Create(spec, backend_.get(), max_batch);
      if (!mlp.ok()) return mlp.status();
      if (!late) return std::unique_ptr<worker::Model>(std::move(*mlp));
      return std::unique_ptr<worker::Model>(
          std::make_unique<LateCopyModel>(std::move(*mlp), copy_error));
    };
    auto trainer = worker::Trainer::Create(options, make_model, client->get(), nullptr);
    if (!trainer.ok()) return trainer.status();
    if (absl::Status s = (*trainer)->Initialize(); !s.ok()) return s;
    for (int step = 0; step < kSteps; ++step) {
      absl::StatusOr<float> loss = (*trainer)->Step(
          &x_[size_t{30} * kBatch * step], &labels_[size_t{kBatch} * step], kBatch);
      if (!loss.ok()) return loss.status();
    }
    if (absl::Status s = (*trainer)->PullParameters(kSteps); !s.ok()) return s;
    return (*trainer)->params();
  }

  std::unique_ptr<worker::Backend> backend_ = worker::MakeCpuBackend();
  std::vector<float> x_;
  std::vector<int32_t> labels_;
};

TEST_P(LateGradCopy, SendsEachGradientOnlyOnceItsCopyHasLanded) {
  auto late = Train(/*late=*/true, absl::OkStatus());
  ASSERT_TRUE(late.ok()) << late.status();
  auto prompt = Train(/*late=*/false, absl::OkStatus());
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  ASSERT_EQ(late->size(), prompt->size());
  for (size_t i = 0; i < late->size(); ++i) {
    EXPECT_EQ((*late)[i], (*prompt)[i]) << "parameter " << i;
  }
}

TEST_P(LateGradCopy, AFailedCopyFailsTheStep) {
  auto trained = Train(/*late=*/true, absl::DataLossError("device lost"));
  ASSERT_FALSE(trained.ok());
  EXPECT_EQ(trained.status().code(), absl::StatusCode::kDataLoss) << trained.status();
  EXPECT_NE(trained.status().message().find("device lost"), std::string::npos)
      << trained.status();
}

INSTANTIATE_TEST_SUITE_P(Overlap, LateGradCopy, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? std::string("Overlapped")
                                             : std::string("Sequential");
                         });

}  // namespace
}  // namespace shardtrain
