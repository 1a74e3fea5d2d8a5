// ZeroCopy: the reuse rule of PsClient against real in-process shards. A
// dense f32 gradient is sent from the caller's memory; once Push, PushPull
// or FinishExchanges returns, gRPC holds no slice of it any more (and, in
// sync mode, no push noted for replay still refers to it), so the caller
// may overwrite it without changing what the shards received. Run with
// several connections per shard, whose calls split each shard's partitions,
// over gRPC and over the shards' data ports (frames, server/data_port.h).
#include <cmath>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "client/ps_client.h"
#include "common/payload.h"
#include "common/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "tests/in_process_shards.h"

namespace shardtrain {
namespace {

constexpr int64_t kElements = 5000;
constexpr int64_t kPartition = 700;
constexpr float kLearningRate = 0.5f;

struct Case {
  bool sync;
  DType dtype;
  int channels;
  bool frames = false;  // through the shards' data ports
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << (c.sync ? "sync " : "async ") << common::DTypeName(c.dtype) << " x" << c.channels
      << (c.frames ? " frames" : "");
}

class ZeroCopy : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    server::ShardOptions options;
    options.partitioning.max_partition_elements = kPartition;
    options.mode = GetParam().sync ? server::ConsistencyMode::kSync
                                   : server::ConsistencyMode::kAsync;
    options.num_workers = 1;
    options.optimizer.name = "sgd";
    options.optimizer.learning_rate = kLearningRate;
    ASSERT_OK_AND_ASSIGN(cluster_,
                         testutil::StartInProcessShards(options, 2, GetParam().frames));
    client::PsClientOptions client_options;
    client_options.servers = cluster_.addresses;
    client_options.max_partition_elements = kPartition;
    client_options.wire_dtype = GetParam().dtype;
    client_options.channels_per_shard = GetParam().channels;
    client_options.pull_timeout = absl::Seconds(30);
    ASSERT_OK_AND_ASSIGN(client_, client::PsClient::Create(client_options, nullptr));
    client_->set_sync_mode(GetParam().sync);
    TensorSpec spec;
    spec.set_name("w");
    spec.add_shape(kElements);
    spec.set_dtype(DTYPE_F32);
    ASSERT_OK(client_->Register({spec}));
    ASSERT_OK(Pull(0, &before_));
  }

  absl::Status Pull(int64_t clock, std::vector<float>* params) {
    params->assign(kElements, -1);
    const std::vector<absl::Span<float>> spans = {absl::MakeSpan(*params)};
    client::PullStats stats;
    return client_->Pull(clock, GetParam().sync ? clock : 0, spans, &stats);
  }

  // A gradient every wire dtype carries exactly.
  static std::vector<float> Gradient() {
    std::vector<float> grad(kElements);
    for (int64_t i = 0; i < kElements; ++i) grad[i] = 0.25f * static_cast<float>(i % 16) - 2;
    return grad;
  }

  void ExpectApplied(const std::vector<float>& after, const std::vector<float>& grad) {
    ASSERT_EQ(after.size(), before_.size());
    int wrong = 0;
    for (int64_t i = 0; i < kElements; ++i) {
      const float expected = before_[i] - kLearningRate * grad[i];
      // f16/bf16 parameters come back rounded.
      const float tolerance = GetParam().dtype == DTYPE_F32 ? 1e-6f : 2e-2f;
      if (std::abs(after[i] - expected) > tolerance * (1 + std::abs(expected))) ++wrong;
    }
    EXPECT_EQ(wrong, 0) << "of " << kElements << " parameters";
  }

  void ExpectNothingReferenced() {
    EXPECT_EQ(client_->referenced_slices(), 0);
    for (int s = 0; s < 2; ++s) EXPECT_EQ(client_->replay_references(s), 0);
    // The calls went where the case says.
    for (int s = 0; s < 2; ++s) {
      EXPECT_EQ(cluster_.shards[s]->data_connections() > 0, GetParam().frames) << "shard " << s;
    }
  }

  testutil::InProcessShards cluster_;
  std::unique_ptr<client::PsClient> client_;
  std::vector<float> before_;
};

TEST_P(ZeroCopy, APushedGradientMayBeOverwrittenOncePushReturns) {
  const std::vector<float> sent = Gradient();
  std::vector<float> grad = sent;
  const std::vector<absl::Span<const float>> grads = {grad};
  client::PushStats stats;
  ASSERT_OK(client_->Push(1, grads, &stats));
  ExpectNothingReferenced();
  std::fill(grad.begin(), grad.end(), 1e6f);  // the caller reuses its buffer
  std::vector<float> after;
  ASSERT_OK(Pull(1, &after));
  ExpectApplied(after, sent);
}

TEST_P(ZeroCopy, APushPullsGradientMayBeOverwrittenOnceItReturns) {
  const std::vector<float> sent = Gradient();
  std::vector<float> grad = sent;
  std::vector<float> after(kElements, -1);
  const std::vector<absl::Span<const float>> grads = {grad};
  const std::vector<absl::Span<float>> params = {absl::MakeSpan(after)};
  client::PushStats push;
  client::PullStats pull;
  ASSERT_OK(client_->PushPull(1, GetParam().sync ? 1 : 0, grads, params, &push, &pull));
  ExpectNothingReferenced();
  std::fill(grad.begin(), grad.end(), 1e6f);
  ExpectApplied(after, sent);
}

TEST_P(ZeroCopy, AnExchangedGradientMayBeOverwrittenOnceFinishReturns) {
  const std::vector<float> sent = Gradient();
  std::vector<float> grad = sent;
  std::vector<float> after(kElements, -1);
  client_->StartExchange(0, 1, GetParam().sync ? 1 : 0, grad, nullptr, absl::MakeSpan(after));
  client::PushStats push;
  client::PullStats pull;
  ASSERT_OK(client_->FinishExchanges(&push, &pull));
  ExpectNothingReferenced();
  std::fill(grad.begin(), grad.end(), 1e6f);
  ExpectApplied(after, sent);
  // And the shards still hold what was sent.
  std::vector<float> again;
  ASSERT_OK(Pull(1, &again));
  ExpectApplied(again, sent);
}

INSTANTIATE_TEST_SUITE_P(
    Paths, ZeroCopy,
    ::testing::Values(Case{false, DTYPE_F32, 1}, Case{false, DTYPE_F32, 3},
                      Case{true, DTYPE_F32, 2}, Case{false, DTYPE_BF16, 2},
                      Case{true, DTYPE_F16, 1}, Case{false, DTYPE_F32, 3, true},
                      Case{true, DTYPE_F32, 2, true}, Case{true, DTYPE_BF16, 1, true}),
    [](const ::testing::TestParamInfo<Case>& info) {
      return std::string(info.param.sync ? "Sync" : "Async") +
             common::DTypeName(info.param.dtype) + "x" + std::to_string(info.param.channels) +
             (info.param.frames ? "Frames" : "");
    });

}  // namespace
}  // namespace shardtrain
