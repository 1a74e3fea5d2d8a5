// SyncEquivalence: N workers in sync mode, talking to real shards over
// gRPC, must end with the same parameters as one process that trains on the
// union of their batches with the same optimizer.
#include <iostream>
#include <random>
#include <thread>
#include <tuple>
#include <vector>

#include "client/ps_client.h"
#include "common/initializer.h"
#include "common/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "server/optimizer.h"
#include "server/ps_server.h"
#include "tests/in_process_shards.h"
#include "worker/device/cpu/cpu_backend.h"
#include "worker/model/mlp.h"
#include "worker/model/model_test_util.h"
#include "worker/model/pipeline/pipeline_model.h"
#include "worker/model/tensor_specs.h"
#include "worker/trainer.h"

namespace shardtrain {
namespace {

constexpr int kSteps = 20;
constexpr int kBatch = 8;
constexpr int kShards = 2;
constexpr int64_t kPartition = 300;  // small, so every tensor spans shards
constexpr uint64_t kSeed = 11;

struct Data {
  std::vector<float> x;
  std::vector<int32_t> y;
};

Data MakeData(int examples, int features, int classes) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  Data data;
  for (int i = 0; i < examples * features; ++i) data.x.push_back(normal(rng));
  for (int i = 0; i < examples; ++i) data.y.push_back(static_cast<int32_t>(rng() % classes));
  return data;
}

server::OptimizerOptions Optimizer() {
  server::OptimizerOptions options;
  options.name = "momentum";
  options.learning_rate = 0.05f;
  options.momentum = 0.9f;
  options.weight_decay = 1e-3f;
  return options;
}

// One process, batch = the union of the workers' batches.
std::vector<std::vector<float>> TrainReference(const worker::ModelSpec& spec,
                                               const Data& data, int workers) {
  auto backend = worker::MakeCpuBackend();
  auto mlp = worker::Mlp::Create(spec, backend.get(), kBatch * workers).value();
  auto optimizer = server::Optimizer::Create(Optimizer()).value();
  const auto specs = worker::TensorSpecsFor(mlp->params(), kSeed);
  std::vector<std::vector<float>> params, grads;
  std::vector<std::vector<std::vector<float>>> slots;
  for (const TensorSpec& tensor : specs) {
    params.emplace_back(common::NumElements(tensor));
    common::FillInitialValues(tensor, 0, absl::MakeSpan(params.back()));
    grads.emplace_back(params.back().size());
    slots.emplace_back(optimizer->num_slots(),
                       std::vector<float>(params.back().size(), 0.0f));
  }
  const int features = spec.layer_sizes.front();
  for (int step = 0; step < kSteps; ++step) {
    const int first = step * workers * kBatch;
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_TRUE(mlp->SetParam(static_cast<int>(i), params[i]).ok());
    }
    EXPECT_TRUE(mlp->ForwardBackward(&data.x[static_cast<size_t>(first) * features],
                                     &data.y[first], workers * kBatch)
                    .ok());
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_TRUE(mlp->GetGrad(static_cast<int>(i), absl::MakeSpan(grads[i])).ok());
      std::vector<float*> slot_ptrs;
      for (auto& slot : slots[i]) slot_ptrs.push_back(slot.data());
      optimizer->Apply(step, 1.0f, absl::MakeSpan(params[i]), grads[i],
                       absl::MakeConstSpan(slot_ptrs));
    }
  }
  return params;
}

absl::StatusOr<std::vector<std::vector<float>>> TrainDistributed(
    const worker::ModelSpec& spec, const Data& data, int workers, bool overlap,
    bool pipelined) {
  server::ShardOptions options;
  options.partitioning.max_partition_elements = kPartition;
  options.mode = server::ConsistencyMode::kSync;
  options.num_workers = workers;
  options.optimizer = Optimizer();
  ASSIGN_OR_RETURN(testutil::InProcessShards cluster,
                   testutil::StartInProcessShards(options, kShards));
  const std::vector<std::string>& addresses = cluster.addresses;
  std::vector<std::unique_ptr<worker::Backend>> backends;
  std::vector<std::unique_ptr<client::PsClient>> clients;
  std::vector<std::unique_ptr<worker::Trainer>> trainers;
  for (int w = 0; w < workers; ++w) {
    client::PsClientOptions client_options;
    client_options.servers = addresses;
    client_options.worker_index = w;
    client_options.max_partition_elements = kPartition;
    client_options.pull_timeout = absl::Seconds(30);
    clients.push_back(client::PsClient::Create(client_options, nullptr).value());
    backends.push_back(worker::MakeCpuBackend());
    worker::TrainerOptions options;
    options.worker_index = w;
    options.num_workers = workers;
    options.sync = true;
    options.overlap = overlap;
    options.batch = kBatch;
    options.seed = kSeed;
    worker::ModelFactory make_model = worker::MlpFactory(spec, backends.back().get());
    if (pipelined) {
      // 3 stages x 4 microbatches, each stage on its own thread.
      make_model = [spec](int max_batch) -> absl::StatusOr<std::unique_ptr<worker::Model>> {
        worker::pipeline::PipelineOptions pipeline;
        pipeline.stages = 3;
        pipeline.microbatches = 4;
        auto model = worker::pipeline::PipelineModel::CreateCpu(spec, max_batch, pipeline);
        if (!model.ok()) return model.status();
        return std::unique_ptr<worker::Model>(std::move(*model));
      };
    }
    trainers.push_back(
        worker::Trainer::Create(options, make_model, clients.back().get(), nullptr).value());
    EXPECT_TRUE(trainers.back()->Initialize().ok());
  }
  const int features = spec.layer_sizes.front();
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      for (int step = 0; step < kSteps; ++step) {
        const int first = (step * workers + w) * kBatch;
        auto loss = trainers[w]->Step(&data.x[static_cast<size_t>(first) * features],
                                      &data.y[first], kBatch);
        ASSERT_TRUE(loss.ok()) << loss.status();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_TRUE(trainers[0]->PullParameters(kSteps).ok());
  return trainers[0]->params();
}

// (workers, overlapped push/pull, pipelined model)
class SyncEquivalence
    : public ::testing::TestWithParam<std::tuple<int, bool, bool>> {};

TEST_P(SyncEquivalence, MatchesOneProcessOnTheUnionOfBatches) {
  const auto [workers, overlap, pipelined] = GetParam();
  ASSERT_OK_AND_ASSIGN(const worker::ModelSpec spec,
                       worker::ModelSpec::Parse("mlp:40-24-16-5"));
  const Data data = MakeData(kSteps * workers * kBatch, 40, 5);
  const auto expected = TrainReference(spec, data, workers);
  ASSERT_OK_AND_ASSIGN(const auto actual,
                       TrainDistributed(spec, data, workers, overlap, pipelined));
  ASSERT_EQ(actual.size(), expected.size());
  float max_diff = 0, max_moved = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    ASSERT_EQ(actual[i].size(), expected[i].size());
    for (size_t j = 0; j < expected[i].size(); ++j) {
      max_diff = std::max(max_diff, std::abs(actual[i][j] - expected[i][j]));
    }
  }
  // The comparison means something only if training moved the parameters.
  const auto specs = worker::TensorSpecsFor(
      worker::Mlp::Create(spec, worker::MakeCpuBackend().get(), 1).value()->params(),
      kSeed);
  std::vector<float> initial(common::NumElements(specs[0]));
  common::FillInitialValues(specs[0], 0, absl::MakeSpan(initial));
  for (size_t j = 0; j < initial.size(); ++j) {
    max_moved = std::max(max_moved, std::abs(expected[0][j] - initial[j]));
  }
  std::cout << workers << " workers, overlap " << overlap << ", pipelined "
            << pipelined << ": max |distributed - reference| = " << max_diff
            << ", max parameter change = " << max_moved << std::endl;
  EXPECT_GT(max_moved, 1e-2f);
  EXPECT_LE(max_diff, 1e-5f) << workers << " workers";
}

INSTANTIATE_TEST_SUITE_P(Workers, SyncEquivalence,
                         ::testing::Combine(::testing::Values(2, 3), ::testing::Bool(),
                                            ::testing::Bool()));

}  // namespace
}  // namespace shardtrain
