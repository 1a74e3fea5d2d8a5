// Test helpers shared by the CPU and GPU PipelineModel equivalence tests:
// a random problem, and a check that a PipelineModel's loss and gradients
// match worker::Mlp's on the whole batch.
#ifndef SHARDTRAIN_WORKER_MODEL_PIPELINE_PIPELINE_TEST_UTIL_H_
#define SHARDTRAIN_WORKER_MODEL_PIPELINE_PIPELINE_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "worker/device/cpu/cpu_backend.h"
#include "worker/model/mlp.h"
#include "worker/model/pipeline/pipeline_model.h"

namespace shardtrain::worker::pipeline::testing_util {

struct Problem {
  ModelSpec spec;
  std::vector<std::vector<float>> params;  // In Mlp::params() order.
  std::vector<float> x;
  std::vector<int32_t> labels;
  int batch = 0;
};

inline Problem MakeProblem(const ModelSpec& spec, int batch, uint32_t seed) {
  Problem p;
  p.spec = spec;
  p.batch = batch;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-0.5f, 0.5f);
  const auto& sizes = spec.layer_sizes;
  for (size_t l = 0; l + 1 < sizes.size(); ++l) {
    std::vector<float> w(size_t(sizes[l]) * sizes[l + 1]);
    for (float& v : w) v = uniform(rng);
    std::vector<float> b(sizes[l + 1]);
    for (float& v : b) v = 0.1f * uniform(rng);
    p.params.push_back(std::move(w));
    p.params.push_back(std::move(b));
  }
  p.x.resize(size_t(batch) * sizes.front());
  for (float& v : p.x) v = 2.0f * uniform(rng);
  std::uniform_int_distribution<int32_t> label(0, sizes.back() - 1);
  for (int i = 0; i < batch; ++i) p.labels.push_back(label(rng));
  return p;
}

// max |a - b| <= tol * max(1e-3, max |b|), elementwise over one tensor.
inline ::testing::AssertionResult Close(const std::vector<float>& actual,
                                        const std::vector<float>& expected,
                                        double tol) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure() << "size " << actual.size()
                                         << " != " << expected.size();
  }
  double scale = 1e-3;
  for (float v : expected) scale = std::max(scale, double(std::fabs(v)));
  for (size_t i = 0; i < actual.size(); ++i) {
    if (std::fabs(double(actual[i]) - expected[i]) > tol * scale) {
      return ::testing::AssertionFailure()
             << "element " << i << ": " << actual[i] << " vs " << expected[i]
             << " (scale " << scale << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

// Runs the problem through `model` and through an Mlp on a CPU backend and
// compares the loss and every gradient. Also checks that on_grad_ready fires
// exactly once per parameter with its final gradient.
inline void ExpectMatchesMlp(PipelineModel& model, const Problem& p,
                             double tol) {
  std::unique_ptr<Backend> cpu = MakeCpuBackend();
  absl::StatusOr<std::unique_ptr<Mlp>> mlp = Mlp::Create(p.spec, cpu.get(),
                                                         p.batch);
  ASSERT_TRUE(mlp.ok()) << mlp.status();
  const int num_params = static_cast<int>(p.params.size());
  ASSERT_EQ(model.params().size(), p.params.size());
  for (int i = 0; i < num_params; ++i) {
    ASSERT_TRUE((*mlp)->SetParam(i, p.params[i]).ok());
    ASSERT_TRUE(model.SetParam(i, p.params[i]).ok());
    EXPECT_EQ(model.params()[i].name, (*mlp)->params()[i].name);
  }
  absl::StatusOr<float> want_loss =
      (*mlp)->ForwardBackward(p.x.data(), p.labels.data(), p.batch);
  ASSERT_TRUE(want_loss.ok()) << want_loss.status();

  // Gradients are taken the way the trainer takes them: a host copy started
  // from the callback (asynchronous on a GPU) and waited for afterwards.
  std::vector<int> fired(num_params, 0);
  std::vector<PendingGrad> streamed(num_params);
  absl::StatusOr<float> loss = model.ForwardBackward(
      p.x.data(), p.labels.data(), p.batch, [&](int i) {
        ++fired[i];
        absl::StatusOr<PendingGrad> copy = model.StartGradCopy(i);
        EXPECT_TRUE(copy.ok()) << copy.status();
        if (copy.ok()) streamed[i] = std::move(copy).value();
      });
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_NEAR(*loss, *want_loss, tol * std::max(1.0f, std::fabs(*want_loss)));
  for (int i = 0; i < num_params; ++i) {
    SCOPED_TRACE(model.params()[i].name);
    std::vector<float> want(p.params[i].size());
    std::vector<float> got(p.params[i].size());
    ASSERT_TRUE((*mlp)->GetGrad(i, absl::MakeSpan(want)).ok());
    ASSERT_TRUE(model.GetGrad(i, absl::MakeSpan(got)).ok());
    EXPECT_TRUE(Close(got, want, tol));
    EXPECT_EQ(fired[i], 1);
    ASSERT_NE(streamed[i].ready, nullptr);
    ASSERT_TRUE(streamed[i].ready->Wait().ok());
    EXPECT_EQ(std::vector<float>(streamed[i].values.begin(),
                                 streamed[i].values.end()),
              got);
  }
}

}  // namespace shardtrain::worker::pipeline::testing_util

#endif  // SHARDTRAIN_WORKER_MODEL_PIPELINE_PIPELINE_TEST_UTIL_H_
