// ShardRestart: a PsClient keeps going across a shard that stops and comes
// back on the same address (in-process PsServer, async mode, checkpoints
// on). While the shard is away a blocking Push is retried: it fails only
// after --reconnect_timeout_s, naming the shard, when the shard stays away,
// and succeeds when the shard is back within it. Both over gRPC and over the
// shard's data port, which the restarted shard opens on another port (the
// client finds it through gRPC and the shard's Register answer).
#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <prometheus/registry.h>

#include "client/ps_client_metrics.h"
#include "client/ps_client.h"
#include "client/shard_channel.h"
#include "gtest/gtest.h"
#include "server/ps_server.h"

namespace shardtrain {
namespace {

constexpr int64_t kElements = 300;

class ShardRestart : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("shard_restart_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Starts the shard on `port` (0: any free one).
  std::unique_ptr<server::PsServer> StartShard(int port) {
    server::PsServerOptions options;
    options.listen_address = "127.0.0.1:" + std::to_string(port);
    options.metrics_address = "";
    options.checkpoint_dir = dir_.string();
    if (GetParam()) options.data_listen = "127.0.0.1:0";
    options.shard.partitioning = {100, 1};
    options.shard.mode = server::ConsistencyMode::kAsync;
    options.shard.num_workers = 1;
    auto shard = server::PsServer::Start(options);
    EXPECT_TRUE(shard.ok()) << shard.status();
    return shard.ok() ? std::move(*shard) : nullptr;
  }

  std::unique_ptr<client::PsClient> Connect(int port, absl::Duration reconnect,
                                            client::PsClientMetrics* metrics) {
    client::PsClientOptions options;
    options.servers = {"127.0.0.1:" + std::to_string(port)};
    options.max_partition_elements = 100;
    options.rpc_timeout = absl::Seconds(2);
    options.pull_timeout = absl::Seconds(5);
    options.reconnect_timeout = reconnect;
    options.keepalive_time = absl::Seconds(1);
    options.keepalive_timeout = absl::Seconds(1);
    auto client = client::PsClient::Create(options, nullptr, metrics);
    EXPECT_TRUE(client.ok()) << client.status();
    TensorSpec spec;
    spec.set_name("w");
    spec.add_shape(kElements);
    spec.set_dtype(DTYPE_F32);
    EXPECT_TRUE((*client)->Register({spec}).ok());
    return std::move(*client);
  }

  static int64_t Version(server::PsServer& shard) {
    StatusResponse status;
    shard.shard().FillStatus(StatusRequest(), &status);
    int64_t version = -1;
    for (const PartitionInfo& info : status.partitions()) {
      version = std::max(version, info.version());
    }
    return version;
  }

  std::filesystem::path dir_;
  std::vector<float> grad_ = std::vector<float>(kElements, 0.01f);
  std::vector<absl::Span<const float>> grads_ = {grad_};
};

TEST_P(ShardRestart, PushFailsAfterTheReconnectTimeoutNamingTheShard) {
  std::unique_ptr<server::PsServer> shard = StartShard(0);
  ASSERT_NE(shard, nullptr);
  const int port = shard->port();
  prometheus::Registry registry;
  client::PsClientMetrics metrics(registry);
  auto client = Connect(port, absl::Seconds(1), &metrics);
  client::PushStats stats;
  ASSERT_TRUE(client->Push(1, grads_, &stats).ok());
  EXPECT_TRUE(shard->Shutdown().ok());

  const absl::Time start = absl::Now();
  const absl::Status pushed = client->Push(2, grads_, &stats);
  const absl::Duration took = absl::Now() - start;
  ASSERT_FALSE(pushed.ok());
  EXPECT_GE(took, absl::Milliseconds(900));
  EXPECT_LT(took, absl::Seconds(6));
  EXPECT_NE(pushed.message().find("shard 0 (127.0.0.1:" + std::to_string(port) + ")"),
            std::string::npos)
      << pushed;
  EXPECT_NE(pushed.message().find("failed for"), std::string::npos) << pushed;
  EXPECT_GE(metrics.retries("Push").Value(), 1);
}

TEST_P(ShardRestart, PushSucceedsWhenTheShardIsBackInTime) {
  std::unique_ptr<server::PsServer> shard = StartShard(0);
  ASSERT_NE(shard, nullptr);
  const int port = shard->port();
  prometheus::Registry registry;
  client::PsClientMetrics metrics(registry);
  auto client = Connect(port, absl::Seconds(20), &metrics);
  client::PushStats stats;
  ASSERT_TRUE(client->Push(1, grads_, &stats).ok());
  ASSERT_EQ(Version(*shard), 1);
  EXPECT_TRUE(shard->Shutdown().ok());  // writes a checkpoint at version 1
  shard.reset();

  std::unique_ptr<server::PsServer> back;
  std::thread restart([&] {
    absl::SleepFor(absl::Milliseconds(700));
    back = StartShard(port);
  });
  const absl::Time start = absl::Now();
  const absl::Status pushed = client->Push(2, grads_, &stats);
  restart.join();
  ASSERT_TRUE(pushed.ok()) << pushed;
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(500));
  ASSERT_NE(back, nullptr);
  // Restored at version 1, then this push.
  EXPECT_EQ(Version(*back), 2);
  EXPECT_GE(metrics.retries("Push").Value(), 1);

  // The client keeps working against the new shard.
  std::vector<float> params(kElements);
  std::vector<absl::Span<float>> spans = {absl::MakeSpan(params)};
  client::PullStats pull;
  ASSERT_TRUE(client->Pull(2, 2, spans, &pull).ok());
  EXPECT_EQ(pull.min_version, 2);
  if (GetParam()) {
    // Once the pause after the old data port refused is over, the calls
    // go to the new one.
    absl::SleepFor(client::ShardChannel::kFramesPause);
    ASSERT_TRUE(client->Pull(2, 2, spans, &pull).ok());
    EXPECT_GT(back->data_connections(), 0);
  }
  EXPECT_TRUE(back->Shutdown().ok());
}

INSTANTIATE_TEST_SUITE_P(Transports, ShardRestart, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "DataPort" : "Grpc");
                         });

}  // namespace
}  // namespace shardtrain
