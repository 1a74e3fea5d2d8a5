// PsClient::Register against real in-process shards: a registration the
// shards do not agree with changes nothing in the client, which still
// refuses pushes cleanly and can register correctly afterwards; a
// registration with initial values (KIND_VALUES) from worker 1 waits until
// worker 0's values have created the tensor.
#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"

#include "client/ps_client.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/in_process_shards.h"

namespace shardtrain {
namespace {

using ::testing::HasSubstr;

TensorSpec Spec() {
  TensorSpec spec;
  spec.set_name("w");
  spec.add_shape(1000);
  spec.set_dtype(DTYPE_F32);
  return spec;
}

TEST(PsClientRegister, AMismatchLeavesTheClientUnregistered) {
  server::ShardOptions options;
  options.partitioning.max_partition_elements = 100;
  ASSERT_OK_AND_ASSIGN(testutil::InProcessShards cluster,
                       testutil::StartInProcessShards(options, 2));

  client::PsClientOptions wrong;
  wrong.servers = cluster.addresses;
  wrong.max_partition_elements = 300;  // the shards cut at 100
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<client::PsClient> client,
                       client::PsClient::Create(wrong, nullptr));
  const absl::Status refused = client->Register({Spec()});
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("--max_partition_elements"));

  // Nothing was adopted: a push is refused as for an unregistered client.
  const std::vector<float> grad(1000, 1.0f);
  const std::vector<absl::Span<const float>> grads = {grad};
  client::PushStats stats;
  EXPECT_EQ(client->Push(1, grads, &stats).code(), absl::StatusCode::kInvalidArgument);

  client::PsClientOptions right = wrong;
  right.max_partition_elements = 100;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<client::PsClient> fixed,
                       client::PsClient::Create(right, nullptr));
  ASSERT_OK(fixed->Register({Spec()}));
  EXPECT_OK(fixed->Push(1, grads, &stats));
}

TensorSpec ValuesSpec(const std::vector<float>& values) {
  TensorSpec spec = Spec();
  spec.mutable_init()->set_kind(Initializer::KIND_VALUES);
  spec.set_values(std::string(reinterpret_cast<const char*>(values.data()),
                              values.size() * sizeof(float)));
  return spec;
}

client::PsClientOptions WorkerOptions(const testutil::InProcessShards& cluster, int worker) {
  client::PsClientOptions options;
  options.servers = cluster.addresses;
  options.max_partition_elements = 100;
  options.worker_index = worker;
  options.num_workers = 2;
  options.reconnect_timeout = absl::Seconds(20);
  options.max_backoff = absl::Milliseconds(200);
  return options;
}

TEST(PsClientRegister, WorkerOneWaitsForWorkerZerosValues) {
  server::ShardOptions options;
  options.partitioning.max_partition_elements = 100;
  options.num_workers = 2;
  ASSERT_OK_AND_ASSIGN(testutil::InProcessShards cluster,
                       testutil::StartInProcessShards(options, 2));
  std::vector<float> values(1000), other(1000, 9.0f);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.001f * static_cast<float>(i) - 0.3f;

  ASSERT_OK_AND_ASSIGN(std::unique_ptr<client::PsClient> worker1,
                       client::PsClient::Create(WorkerOptions(cluster, 1), nullptr));
  absl::Status registered1 = absl::UnknownError("not done");
  absl::Notification done1;
  std::thread registering([&] {
    registered1 = worker1->Register({ValuesSpec(other)});
    done1.Notify();
  });
  // Worker 1 is refused (UNAVAILABLE) and keeps retrying.
  EXPECT_FALSE(done1.WaitForNotificationWithTimeout(absl::Milliseconds(600)));

  ASSERT_OK_AND_ASSIGN(std::unique_ptr<client::PsClient> worker0,
                       client::PsClient::Create(WorkerOptions(cluster, 0), nullptr));
  ASSERT_OK(worker0->Register({ValuesSpec(values)}));
  EXPECT_TRUE(done1.WaitForNotificationWithTimeout(absl::Seconds(15)));
  registering.join();
  ASSERT_OK(registered1);

  // Both see worker 0's values.
  for (client::PsClient* client : {worker0.get(), worker1.get()}) {
    std::vector<float> pulled(1000, -1.0f);
    const std::vector<absl::Span<float>> params = {absl::MakeSpan(pulled)};
    client::PullStats stats;
    ASSERT_OK(client->Pull(0, 0, params, &stats));
    EXPECT_EQ(pulled, values);
  }
}

TEST(PsClientRegister, WorkerOneGivesUpWithoutWorkerZero) {
  server::ShardOptions options;
  options.partitioning.max_partition_elements = 100;
  options.num_workers = 2;
  ASSERT_OK_AND_ASSIGN(testutil::InProcessShards cluster,
                       testutil::StartInProcessShards(options, 2));
  client::PsClientOptions worker1_options = WorkerOptions(cluster, 1);
  worker1_options.reconnect_timeout = absl::Milliseconds(500);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<client::PsClient> worker1,
                       client::PsClient::Create(worker1_options, nullptr));
  TensorSpec spec = ValuesSpec({});
  const absl::Status refused = worker1->Register({spec});
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("waiting for worker 0"));
}

}  // namespace
}  // namespace shardtrain
