// PsClient::Register against real in-process shards: a registration the
// shards do not agree with changes nothing in the client, which still
// refuses pushes cleanly and can register correctly afterwards.
#include <memory>
#include <vector>

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

}  // namespace
}  // namespace shardtrain
