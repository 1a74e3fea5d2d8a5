// End to end: real ps-server and ps-worker processes on 127.0.0.1 train a
// subset of Fashion-MNIST to a stated accuracy, and every process's /metrics
// endpoint serves the shardtrain families with non-zero values. Every
// process is stopped when the test ends, pass or fail.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include "absl/strings/str_cat.h"
#include "common/payload.h"
#include "gtest/gtest.h"
#include "proto/shardtrain.grpc.pb.h"
#include "testing/local_cluster.h"
#include "testing/metrics_scrape.h"
#include "testing/process_group.h"

namespace shardtrain {
namespace {

using testutil::ProcessGroup;

constexpr int kShards = 2;
constexpr int kWorkers = 2;

// 2 shards and 2 workers with run-local.sh's flags, on a subset.
absl::StatusOr<testutil::LocalCluster> StartCluster(ProcessGroup& group,
                                                   const std::string& mode) {
  testutil::LocalClusterOptions options;
  options.bin_dir = SHARDTRAIN_BIN_DIR;
  options.mode = mode;
  options.shards = kShards;
  options.workers = kWorkers;
  options.server_flags = {"--optimizer=adam", "--lr=0.002", "--max_staleness=4"};
  options.worker_flags = {"--epochs=3", "--batch=32", "--max_train_examples=8000",
                          "--max_test_examples=2000", "--linger_s=60"};
  return testutil::StartLocalCluster(group, options);
}

// Waits for the chief's results; meanwhile records the most live workers
// any shard reported.
double WaitForResults(ProcessGroup& group, const testutil::LocalCluster& cluster,
                      double* max_live_workers) {
  absl::StatusOr<double> accuracy =
      testutil::WaitForFinalAccuracy(group, cluster, absl::Minutes(4), [&] {
        for (int port : cluster.shard_metrics_ports) {
          auto body = testutil::HttpGet(port, "/metrics");
          if (body.ok()) {
            *max_live_workers = std::max(
                *max_live_workers, testutil::SumByName(*body)["shardtrain_live_workers"]);
          }
        }
      });
  if (!accuracy.ok()) {
    ADD_FAILURE() << accuracy.status();
    return 0;
  }
  return *accuracy;
}

void ExpectNonZero(const std::map<std::string, double>& sums,
                   const std::vector<std::string>& names, const std::string& who) {
  for (const std::string& name : names) {
    auto it = sums.find(name);
    ASSERT_NE(it, sums.end()) << who << " lacks " << name;
    EXPECT_GT(it->second, 0) << who << ": " << name;
  }
}

// Keeps the cluster's logs only when the test failed.
class ClusterTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (!HasFailure() && !dir_.empty()) std::filesystem::remove_all(dir_);
  }
  std::string dir_;
};

TEST_F(ClusterTest, AsyncClusterTrainsAndExportsMetrics) {
  ProcessGroup group;
  auto started = StartCluster(group, "async");
  ASSERT_TRUE(started.ok()) << started.status();
  const testutil::LocalCluster& cluster = *started;
  dir_ = cluster.dir;
  double max_live = 0;
  const double accuracy = WaitForResults(group, cluster, &max_live);
  EXPECT_GE(accuracy, 0.75) << "3 epochs on 8000 examples";
  EXPECT_EQ(max_live, kWorkers);  // as seen by the busiest shard

  for (int s = 0; s < kShards; ++s) {
    auto body = testutil::HttpGet(cluster.shard_metrics_ports[s], "/metrics");
    ASSERT_TRUE(body.ok()) << body.status();
    ExpectNonZero(testutil::SumByName(*body),
                  {"shardtrain_rpc_requests_total",
                   "shardtrain_rpc_received_bytes_total",
                   "shardtrain_rpc_sent_bytes_total",
                   "shardtrain_rpc_duration_seconds_count",
                   "shardtrain_updates_applied_total",
                   "shardtrain_gradient_staleness_count",
                   "shardtrain_partition_version",
                   "shardtrain_shard_parameters",
                   "shardtrain_buffer_pool_max_kept_bytes"},
                  absl::StrCat("shard ", s));
    EXPECT_NE(body->find("shardtrain_dropped_gradients_total"), std::string::npos);
    // Async workers without overlap push with PushPull.
    EXPECT_TRUE(body->find("method=\"Push\"") != std::string::npos ||
                body->find("method=\"PushPull\"") != std::string::npos);
    EXPECT_NE(body->find("method=\"Pull\""), std::string::npos);
  }
  for (int w = 0; w < kWorkers; ++w) {
    auto body = testutil::HttpGet(cluster.worker_metrics_ports[w], "/metrics");
    ASSERT_TRUE(body.ok()) << body.status();
    std::vector<std::string> names = {
        "shardtrain_worker_phase_seconds_count", "shardtrain_worker_step_seconds_count",
        "shardtrain_worker_samples_per_second", "shardtrain_worker_loss",
        "shardtrain_worker_steps_total", "shardtrain_rpc_requests_total",
        "shardtrain_buffer_pool_max_kept_bytes"};
    if (w == 0) names.push_back("shardtrain_worker_test_accuracy");
    ExpectNonZero(testutil::SumByName(*body), names, absl::StrCat("worker ", w));
    for (const char* phase : {"compute", "push", "pull", "wait"}) {
      EXPECT_NE(body->find(absl::StrCat("phase=\"", phase, "\"")), std::string::npos);
    }
  }
}

TEST_F(ClusterTest, SyncClusterTrainsAndCountsLateGradients) {
  ProcessGroup group;
  auto started = StartCluster(group, "sync");
  ASSERT_TRUE(started.ok()) << started.status();
  const testutil::LocalCluster& cluster = *started;
  dir_ = cluster.dir;
  double max_live = 0;
  const double accuracy = WaitForResults(group, cluster, &max_live);
  EXPECT_GE(accuracy, 0.75);

  // A gradient for step 0, long finished, must be dropped and counted.
  auto stub = ParameterServer::NewStub(
      grpc::CreateChannel(cluster.servers[0], grpc::InsecureChannelCredentials()));
  StatusResponse status;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub->Status(&context, StatusRequest(), &status).ok());
  }
  ASSERT_GT(status.partitions_size(), 0);
  const PartitionInfo& part = status.partitions(0);
  EXPECT_GT(part.version(), 0);
  PushRequest late;
  late.set_worker(1);
  late.set_clock(1);
  GradientPart* gradient = late.add_parts();
  gradient->mutable_key()->set_tensor(part.tensor());
  gradient->mutable_key()->set_partition(part.partition());
  gradient->set_version(0);
  gradient->mutable_grad()->set_dtype(DTYPE_F32);
  std::vector<float> zeros(part.size(), 0.0f);
  common::EncodeDense(zeros, DTYPE_F32, gradient->mutable_grad()->mutable_data());
  PushResponse response;
  grpc::ClientContext context;
  EXPECT_EQ(stub->Push(&context, late, &response).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  auto body = testutil::HttpGet(cluster.shard_metrics_ports[0], "/metrics");
  ASSERT_TRUE(body.ok());
  ExpectNonZero(testutil::SumByName(*body), {"shardtrain_dropped_gradients_total"},
                "shard 0");
}

}  // namespace
}  // namespace shardtrain

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (access((std::string(shardtrain::testutil::kFashionMnistDir) +
              "/train-images-idx3-ubyte.gz")
                 .c_str(),
             R_OK) != 0) {
    std::fprintf(stderr, "Fashion-MNIST is not installed (dataset-fashion-mnist)\n");
    return 1;
  }
  return RUN_ALL_TESTS();
}
