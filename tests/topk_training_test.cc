// TopKTraining: workers that push top-k sparsified gradients with error
// feedback (--topk_ratio). At ratio 1 the sparse path must give exactly the
// parameters the dense path gives; at 5% the worker must still learn while
// putting far fewer gradient bytes on the wire.
#include <iostream>
#include <map>
#include <memory>
#include <string>

#include <prometheus/registry.h>

#include "gtest/gtest.h"
#include "tests/one_worker_job.h"

namespace shardtrain {
namespace {

// Bytes the worker sent in Push and PushPull calls (a step's gradients go
// in one or the other), from its RPC metrics.
double PushedBytes(prometheus::Registry& registry) {
  double bytes = 0;
  for (const prometheus::MetricFamily& family : registry.Collect()) {
    if (family.name != "shardtrain_rpc_sent_bytes_total") continue;
    for (const prometheus::ClientMetric& metric : family.metric) {
      for (const prometheus::ClientMetric::Label& label : metric.label) {
        if (label.name == "method" && (label.value == "Push" || label.value == "PushPull")) {
          bytes += metric.counter.value;
        }
      }
    }
  }
  return bytes;
}

class TopKTraining : public ::testing::TestWithParam<bool> {};

TEST_P(TopKTraining, RatioOneIsExactlyDense) {
  testutil::OneWorkerJob job;
  job.overlap = GetParam();
  auto dense = testutil::RunOneWorkerJob(job);
  ASSERT_TRUE(dense.ok()) << dense.status();
  job.client.topk_ratio = 1.0;
  auto sparse = testutil::RunOneWorkerJob(job);
  ASSERT_TRUE(sparse.ok()) << sparse.status();
  ASSERT_EQ(sparse->params.size(), dense->params.size());
  for (size_t i = 0; i < dense->params.size(); ++i) {
    EXPECT_EQ(sparse->params[i], dense->params[i]) << "parameter " << i;
  }
}

TEST_P(TopKTraining, FivePercentStillLearnsOnAFractionOfTheBytes) {
  testutil::OneWorkerJob job;
  job.overlap = GetParam();
  job.steps = 60;
  job.batch = 16;
  prometheus::Registry dense_registry, sparse_registry;
  common::RpcMetrics dense_metrics(dense_registry, "client");
  common::RpcMetrics sparse_metrics(sparse_registry, "client");
  job.rpc_metrics = &dense_metrics;
  auto dense = testutil::RunOneWorkerJob(job);
  ASSERT_TRUE(dense.ok()) << dense.status();
  job.client.topk_ratio = 0.05;
  job.rpc_metrics = &sparse_metrics;
  auto sparse = testutil::RunOneWorkerJob(job);
  ASSERT_TRUE(sparse.ok()) << sparse.status();

  // The data is random, so "learning" is fitting it: the loss of the last
  // 10 steps against the first 10 (both jobs see the same batches).
  auto mean = [](const std::vector<float>& v, size_t from, size_t to) {
    double sum = 0;
    for (size_t i = from; i < to; ++i) sum += v[i];
    return sum / static_cast<double>(to - from);
  };
  const double sparse_first = mean(sparse->losses, 0, 10);
  const double sparse_last = mean(sparse->losses, 50, 60);
  std::cout << "loss first/last 10 steps: dense " << mean(dense->losses, 0, 10) << " -> "
            << mean(dense->losses, 50, 60) << ", top-5% " << sparse_first << " -> "
            << sparse_last << "; push bytes dense " << PushedBytes(dense_registry)
            << ", top-5% " << PushedBytes(sparse_registry) << std::endl;
  EXPECT_LT(sparse_last, 0.9 * sparse_first);
  // And about as well as dense pushes do on the same batches.
  EXPECT_LT(sparse_last, 1.05 * mean(dense->losses, 50, 60));
  // 5% of the values plus as many 4-byte indices is a tenth of dense; the
  // tensor names, keys and versions of every part, and each PushPull's pull
  // half (the same either way), add several hundred bytes a step to both, a
  // lot for this 924-parameter model: with overlap, a step makes a call per
  // tensor and shard (0.28x the dense bytes here).
  EXPECT_LT(PushedBytes(sparse_registry), 0.33 * PushedBytes(dense_registry));
}

TEST(TopKTrainingOptions, RatioOutsideZeroOneIsRejected) {
  for (double ratio : {-0.5, 1.5}) {
    testutil::OneWorkerJob job;
    job.client.topk_ratio = ratio;
    EXPECT_EQ(testutil::RunOneWorkerJob(job).status().code(),
              absl::StatusCode::kInvalidArgument)
        << ratio;
  }
}

INSTANTIATE_TEST_SUITE_P(Overlap, TopKTraining, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? std::string("Overlapped")
                                             : std::string("Sequential");
                         });

}  // namespace
}  // namespace shardtrain
