// PsClient against shards in this process (client/testing/fake_shard.h) on
// in-process gRPC channels: where each partition goes, what is sent for
// each wire option, and the fault paths (retries, lost answers, a
// restarted shard's resync and sync replay, giving up) without shard
// processes or ports. What the shards do with a push is theirs and is
// tested in server/.
#include "client/ps_client.h"

#include <prometheus/registry.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/types/span.h"
#include "client/ps_client_metrics.h"
#include "client/testing/fake_shard.h"
#include "common/partition.h"
#include "common/payload.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardtrain::client {
namespace {

using ::shardtrain::client::testing::FakeShard;
using ::testing::ElementsAreArray;
using ::testing::Each;
using ::testing::HasSubstr;

constexpr int64_t kMaxPartitionElements = 4;

TensorSpec Spec(const std::string& name, int64_t elements) {
  TensorSpec spec;
  spec.set_name(name);
  spec.add_shape(elements);
  spec.set_dtype(DTYPE_F32);
  return spec;
}

class PsClientTest : public ::testing::Test {
 protected:
  void StartShards(int n, int placement_shards = 0) {
    for (int s = 0; s < n; ++s) {
      shards_.push_back(std::make_unique<FakeShard>(
          s, placement_shards > 0 ? placement_shards : n, kMaxPartitionElements));
    }
  }

  PsClientOptions Options() {
    PsClientOptions options;
    for (size_t s = 0; s < shards_.size(); ++s) {
      options.servers.push_back("fake-" + std::to_string(s));
    }
    options.max_partition_elements = kMaxPartitionElements;
    options.channels_per_shard = 1;
    options.initial_backoff = absl::Milliseconds(1);
    options.max_backoff = absl::Milliseconds(10);
    options.reconnect_timeout = absl::Seconds(10);
    options.rpc_timeout = absl::Seconds(10);
    options.pull_timeout = absl::Seconds(10);
    options.connect = [this](int shard, int) { return shards_[shard]->Channel(); };
    return options;
  }

  // Replaces the shards with one of `partition`-element partitions that
  // counts a split push's calls or not (an older shard), and returns the
  // options of a client reaching it over two connections.
  PsClientOptions OneShardOverTwoConnections(int64_t partition, bool counts_clock_parts) {
    shards_.clear();
    shards_.push_back(std::make_unique<FakeShard>(0, 1, partition));
    shards_[0]->set_counts_clock_parts(counts_clock_parts);
    PsClientOptions options = Options();
    options.max_partition_elements = partition;
    options.channels_per_shard = 2;
    return options;
  }

  std::unique_ptr<PsClient> Client(const PsClientOptions& options) {
    absl::StatusOr<std::unique_ptr<PsClient>> client =
        PsClient::Create(options, /*rpc_metrics=*/nullptr, &metrics_);
    EXPECT_OK(client.status());
    return client.ok() ? *std::move(client) : nullptr;
  }

  // What the shards hold of `tensor` (of `elements`), gathered by placement.
  std::vector<float> Held(const std::string& tensor, int64_t elements) const {
    std::vector<float> out(static_cast<size_t>(elements), 0.0f);
    const common::PartitionConfig config{kMaxPartitionElements,
                                         static_cast<int>(shards_.size())};
    for (const common::PlacedPartition& placed :
         common::PlaceTensor(tensor, elements, config)) {
      const std::vector<float> values = shards_[placed.shard]->values(tensor, placed.partition);
      EXPECT_EQ(values.size(), static_cast<size_t>(placed.range.size))
          << tensor << "/" << placed.partition << " on shard " << placed.shard;
      for (size_t i = 0; i < values.size() && i < static_cast<size_t>(placed.range.size); ++i) {
        out[placed.range.offset + i] = values[i];
      }
    }
    return out;
  }

  static std::vector<float> Negated(const std::vector<float>& values) {
    std::vector<float> out;
    for (float v : values) out.push_back(-v);
    return out;
  }

  prometheus::Registry registry_;
  PsClientMetrics metrics_{registry_};
  std::vector<std::unique_ptr<FakeShard>> shards_;
};

TEST_F(PsClientTest, PushesAndPullsEachPartitionAtTheShardThatHoldsIt) {
  StartShards(2);
  std::unique_ptr<PsClient> client = Client(Options());
  ASSERT_NE(client, nullptr);
  ASSERT_OK(client->Register({Spec("w", 24), Spec("b", 3)}));
  for (const auto& shard : shards_) EXPECT_EQ(shard->calls("Register"), 1);

  std::vector<float> w(24), b = {100, 101, 102};
  for (int i = 0; i < 24; ++i) w[i] = static_cast<float>(i + 1);
  const std::vector<absl::Span<const float>> grads = {w, b};
  PushStats push_stats;
  ASSERT_OK(client->Push(1, grads, &push_stats));
  EXPECT_EQ(client->referenced_slices(), 0);
  // The partitions of a tensor are spread over both shards, and each holds
  // exactly its own, updated once (SGD at lr 1 on zeros).
  EXPECT_GT(shards_[0]->applied(), 0);
  EXPECT_GT(shards_[1]->applied(), 0);
  EXPECT_THAT(Held("w", 24), ElementsAreArray(Negated(w)));
  EXPECT_THAT(Held("b", 3), ElementsAreArray(Negated(b)));

  std::vector<float> w_out(24, 7), b_out(3, 7);
  const std::vector<absl::Span<float>> params = {absl::MakeSpan(w_out), absl::MakeSpan(b_out)};
  PullStats pull_stats;
  ASSERT_OK(client->Pull(1, 0, params, &pull_stats));
  EXPECT_THAT(w_out, ElementsAreArray(Negated(w)));
  EXPECT_THAT(b_out, ElementsAreArray(Negated(b)));
  EXPECT_EQ(client->known_versions(), std::make_pair(int64_t{1}, int64_t{1}));
  EXPECT_EQ(pull_stats.min_version, 1);
}

TEST_F(PsClientTest, RegisterRefusesAShardThatHoldsOtherPartitions) {
  StartShards(2, /*placement_shards=*/3);  // shards placing for a 3-shard job
  std::unique_ptr<PsClient> client = Client(Options());
  ASSERT_NE(client, nullptr);
  const absl::Status status = client->Register({Spec("w", 24)});
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr("fake-"));
}

TEST_F(PsClientTest, RetriesAnUnreachableShardAndTheRetryCarriesTheSameSequence) {
  StartShards(2);
  std::unique_ptr<PsClient> client = Client(Options());
  ASSERT_NE(client, nullptr);
  ASSERT_OK(client->Register({Spec("w", 24)}));
  shards_[1]->FailNext("Push", 2, grpc::StatusCode::UNAVAILABLE);
  const std::vector<float> w(24, 1.0f);
  PushStats stats;
  ASSERT_OK(client->Push(1, {absl::MakeConstSpan(w)}, &stats));
  EXPECT_EQ(shards_[1]->calls("Push"), 3);
  EXPECT_EQ(shards_[1]->applied(), 1);
  // The refused attempts reached no handler; the one that did names this
  // worker's incarnation and a sequence.
  const std::vector<PushRequest> pushes = shards_[1]->pushes();
  ASSERT_EQ(pushes.size(), 1u);
  EXPECT_EQ(pushes[0].worker_incarnation(), client->worker_incarnation());
  EXPECT_NE(pushes[0].sequence(), 0u);
  EXPECT_EQ(pushes[0].shard_incarnation(), shards_[1]->incarnation());
  EXPECT_EQ(metrics_.retries("Push").Value(), 2);
  EXPECT_THAT(Held("w", 24), Each(-1.0f));
}

TEST_F(PsClientTest, APushWhoseAnswerWasLostIsSentAgainAndAppliedOnce) {
  StartShards(1);
  std::unique_ptr<PsClient> client = Client(Options());
  ASSERT_NE(client, nullptr);
  ASSERT_OK(client->Register({Spec("w", 8)}));
  shards_[0]->LoseNextAnswers(1);
  const std::vector<float> w(8, 2.0f);
  PushStats stats;
  ASSERT_OK(client->Push(1, {absl::MakeConstSpan(w)}, &stats));
  const std::vector<PushRequest> pushes = shards_[0]->pushes();
  ASSERT_EQ(pushes.size(), 2u);
  EXPECT_EQ(pushes[0].sequence(), pushes[1].sequence());
  EXPECT_EQ(shards_[0]->applied(), 1);
  EXPECT_THAT(Held("w", 8), Each(-2.0f));
  // The next push is a new one.
  ASSERT_OK(client->Push(2, {absl::MakeConstSpan(w)}, &stats));
  EXPECT_GT(shards_[0]->pushes().back().sequence(), pushes[0].sequence());
  EXPECT_THAT(Held("w", 8), Each(-4.0f));
}

TEST_F(PsClientTest, ARestartedShardIsRegisteredAgainAndItsLostUpdatesCounted) {
  StartShards(2);
  std::unique_ptr<PsClient> client = Client(Options());
  ASSERT_NE(client, nullptr);
  ASSERT_OK(client->Register({Spec("w", 24)}));
  const std::vector<float> w(24, 1.0f);
  PushStats stats;
  ASSERT_OK(client->Push(1, {absl::MakeConstSpan(w)}, &stats));
  std::vector<float> out(24);
  PullStats pull_stats;
  ASSERT_OK(client->Pull(1, 0, {absl::MakeSpan(out)}, &pull_stats));
  const uint64_t before = shards_[0]->incarnation();
  shards_[0]->Restart(/*lost=*/1);  // back to before that push

  ASSERT_OK(client->Push(2, {absl::MakeConstSpan(w)}, &stats));
  EXPECT_EQ(shards_[0]->calls("Register"), 2);
  EXPECT_EQ(shards_[1]->calls("Register"), 1);
  // Refused once for naming the old incarnation, then sent to the new one.
  const std::vector<PushRequest> pushes = shards_[0]->pushes();
  ASSERT_EQ(pushes.size(), 3u);
  EXPECT_EQ(pushes[1].shard_incarnation(), before);
  EXPECT_EQ(pushes[2].shard_incarnation(), shards_[0]->incarnation());
  EXPECT_EQ(metrics_.shard_restarts(0).Value(), 1);
  // Each of shard 0's partitions lost the one update this worker knew of.
  int shard0_partitions = 0;
  for (const common::PlacedPartition& placed :
       common::PlaceTensor("w", 24, {kMaxPartitionElements, 2})) {
    if (placed.shard == 0) ++shard0_partitions;
  }
  EXPECT_EQ(metrics_.lost_updates(0).Value(), shard0_partitions);
  EXPECT_EQ(metrics_.lost_updates(1).Value(), 0);
  // Shard 0 has the second push only; shard 1 both.
  ASSERT_OK(client->Pull(2, 0, {absl::MakeSpan(out)}, &pull_stats));
  const std::vector<float> held = Held("w", 24);
  for (const common::PlacedPartition& placed :
       common::PlaceTensor("w", 24, {kMaxPartitionElements, 2})) {
    const float expected = placed.shard == 0 ? -1.0f : -2.0f;
    for (int64_t i = 0; i < placed.range.size; ++i) {
      EXPECT_EQ(held[placed.range.offset + i], expected);
      EXPECT_EQ(out[placed.range.offset + i], expected);
    }
  }
}

TEST_F(PsClientTest, SyncSendsAnAcknowledgedPushAgainToAShardThatLostIt) {
  StartShards(1);
  std::unique_ptr<PsClient> client = Client(Options());
  ASSERT_NE(client, nullptr);
  client->set_sync_mode(true);
  ASSERT_OK(client->Register({Spec("w", 8)}));
  const std::vector<float> w(8, 3.0f);
  PushStats stats;
  ASSERT_OK(client->Push(1, {absl::MakeConstSpan(w)}, &stats));
  // The shard dies after acknowledging the push, before step 1 is pulled.
  shards_[0]->Restart(/*lost=*/1);
  ASSERT_EQ(shards_[0]->version("w", 0), 0);

  std::vector<float> out(8);
  PullStats pull_stats;
  ASSERT_OK(client->Pull(1, 1, {absl::MakeSpan(out)}, &pull_stats));
  EXPECT_EQ(shards_[0]->calls("Register"), 2);
  EXPECT_EQ(shards_[0]->applied(), 2);  // the push, and its replay
  const std::vector<PushRequest> pushes = shards_[0]->pushes();
  ASSERT_EQ(pushes.size(), 2u);
  EXPECT_EQ(pushes[1].sequence(), pushes[0].sequence());
  EXPECT_EQ(pushes[1].clock(), 1);
  EXPECT_THAT(out, Each(-3.0f));
  EXPECT_EQ(client->replay_references(0), 0);
}

TEST_F(PsClientTest, GivesUpOnAShardThatStaysUnreachableAndNamesIt) {
  StartShards(2);
  PsClientOptions options = Options();
  options.reconnect_timeout = absl::Milliseconds(300);
  std::unique_ptr<PsClient> client = Client(options);
  ASSERT_NE(client, nullptr);
  ASSERT_OK(client->Register({Spec("w", 24)}));
  shards_[1]->FailNext("Push", 1 << 20, grpc::StatusCode::UNAVAILABLE);
  const std::vector<float> w(24, 1.0f);
  PushStats stats;
  const absl::Time start = absl::Now();
  const absl::Status status = client->Push(1, {absl::MakeConstSpan(w)}, &stats);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(), HasSubstr("fake-1"));
  EXPECT_THAT(status.message(), HasSubstr("Push"));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(300));
  EXPECT_GT(shards_[1]->calls("Push"), 2);
  EXPECT_EQ(shards_[1]->applied(), 0);
  EXPECT_EQ(client->referenced_slices(), 0);
}

TEST_F(PsClientTest, AnErrorThatIsNotAnOutageEndsTheCallAtOnce) {
  StartShards(1);
  std::unique_ptr<PsClient> client = Client(Options());
  ASSERT_NE(client, nullptr);
  ASSERT_OK(client->Register({Spec("w", 8)}));
  shards_[0]->FailNext("Push", 1, grpc::StatusCode::INVALID_ARGUMENT);
  const std::vector<float> w(8, 1.0f);
  PushStats stats;
  EXPECT_EQ(client->Push(1, {absl::MakeConstSpan(w)}, &stats).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(shards_[0]->calls("Push"), 1);
  EXPECT_EQ(metrics_.retries("Push").Value(), 0);
}

TEST_F(PsClientTest, Bf16OnTheWireSendsTwoBytesPerElementBothWays) {
  StartShards(1);
  PsClientOptions options = Options();
  options.wire_dtype = DTYPE_BF16;
  std::unique_ptr<PsClient> client = Client(options);
  ASSERT_NE(client, nullptr);
  ASSERT_OK(client->Register({Spec("w", 8)}));
  // bf16 holds these exactly, so nothing is rounded either way.
  const std::vector<float> w = {1, -2, 0.5f, 4, 8, -16, 0.25f, 3};
  PushStats stats;
  ASSERT_OK(client->Push(1, {absl::MakeConstSpan(w)}, &stats));
  const std::vector<PushRequest> pushes = shards_[0]->pushes();
  ASSERT_EQ(pushes.size(), 1u);
  for (const GradientPart& part : pushes[0].parts()) {
    EXPECT_EQ(part.grad().dtype(), DTYPE_BF16);
    EXPECT_EQ(part.grad().data().size(), static_cast<size_t>(2 * kMaxPartitionElements));
  }
  std::vector<float> out(8);
  PullStats pull_stats;
  ASSERT_OK(client->Pull(1, 0, {absl::MakeSpan(out)}, &pull_stats));
  EXPECT_THAT(out, ElementsAreArray(Negated(w)));
}

TEST_F(PsClientTest, TopKSendsTheLargestEntriesAndCarriesTheRestOver) {
  StartShards(1);
  PsClientOptions options = Options();
  options.topk_ratio = 0.25;  // one of each partition's four entries
  std::unique_ptr<PsClient> client = Client(options);
  ASSERT_NE(client, nullptr);
  ASSERT_OK(client->Register({Spec("w", 8)}));
  const std::vector<float> w = {1, 2, 3, 40, 5, 60, 7, 8};
  PushStats stats;
  ASSERT_OK(client->Push(1, {absl::MakeConstSpan(w)}, &stats));
  const std::vector<PushRequest> pushes = shards_[0]->pushes();
  ASSERT_EQ(pushes.size(), 1u);
  for (const GradientPart& part : pushes[0].parts()) {
    EXPECT_EQ(part.grad().encoding(), ENCODING_SPARSE);
  }
  EXPECT_THAT(Held("w", 8), ElementsAreArray({0, 0, 0, -40, 0, -60, 0, 0}));
  // With a zero gradient next, the largest of what was held back goes.
  const std::vector<float> zero(8, 0.0f);
  ASSERT_OK(client->Push(2, {absl::MakeConstSpan(zero)}, &stats));
  EXPECT_THAT(Held("w", 8), ElementsAreArray({0, 0, -3, -40, 0, -60, 0, -8}));
}

TEST_F(PsClientTest, PushPullIsOneCallPerShardConnection) {
  StartShards(2);
  std::unique_ptr<PsClient> client = Client(Options());
  ASSERT_NE(client, nullptr);
  ASSERT_OK(client->Register({Spec("w", 24)}));
  std::vector<float> w(24);
  for (int i = 0; i < 24; ++i) w[i] = static_cast<float>(i);
  std::vector<float> out(24, 9);
  PushStats push_stats;
  PullStats pull_stats;
  ASSERT_OK(client->PushPull(1, 0, {absl::MakeConstSpan(w)}, {absl::MakeSpan(out)},
                             &push_stats, &pull_stats));
  for (const auto& shard : shards_) {
    EXPECT_EQ(shard->calls("PushPull"), 1);
    EXPECT_EQ(shard->calls("Push"), 0);
    EXPECT_EQ(shard->calls("Pull"), 0);
  }
  EXPECT_THAT(out, ElementsAreArray(Negated(w)));
  EXPECT_EQ(client->referenced_slices(), 0);
}

// Async, a push split over two connections to one shard: a shard that
// counts the calls is told how many there are and gets this step's clock in
// each, with no Heartbeat after; an older shard gets the clock before the
// step in each part and the new one in a Heartbeat once both are applied.
TEST_F(PsClientTest, AnAsyncPushSplitOverConnectionsTellsTheShardHowManyCallsItIs) {
  constexpr int64_t kPartition = 64 * 1024;  // 4 partitions: 2 per connection
  for (const bool counts : {true, false}) {
    SCOPED_TRACE(counts ? "a shard that counts the calls" : "an older shard");
    std::unique_ptr<PsClient> client = Client(OneShardOverTwoConnections(kPartition, counts));
    ASSERT_NE(client, nullptr);
    ASSERT_OK(client->Register({Spec("w", 4 * kPartition)}));
    const std::vector<float> w(4 * kPartition, 1.0f);
    std::vector<float> out(4 * kPartition, 0.0f);
    PushStats push_stats;
    PullStats pull_stats;
    ASSERT_OK(client->Push(3, {absl::MakeConstSpan(w)}, &push_stats));
    ASSERT_OK(client->PushPull(4, 0, {absl::MakeConstSpan(w)}, {absl::MakeSpan(out)},
                               &push_stats, &pull_stats));
    const std::vector<PushRequest> pushes = shards_[0]->pushes();
    ASSERT_EQ(pushes.size(), 4u);
    for (size_t p = 0; p < pushes.size(); ++p) {
      const int64_t step = p < 2 ? 3 : 4;
      EXPECT_EQ(pushes[p].parts_size(), 2) << "push " << p;
      EXPECT_EQ(pushes[p].clock(), counts ? step : step - 1) << "push " << p;
      EXPECT_EQ(pushes[p].clock_parts(), counts ? 2u : 0u) << "push " << p;
    }
    EXPECT_EQ(shards_[0]->calls("Heartbeat"), counts ? 0 : 2);
    // To an older shard the PushPull goes as a push, the Heartbeat and a
    // pull: a pull half sent with the push would wait for that Heartbeat.
    EXPECT_EQ(shards_[0]->calls("PushPull"), counts ? 2 : 0);
    EXPECT_EQ(shards_[0]->calls("Pull"), counts ? 0 : 2);
    EXPECT_THAT(out, Each(-2.0f));
  }
}

TEST_F(PsClientTest, ExchangesSendEachTensorAndFillItsParameters) {
  StartShards(2);
  std::unique_ptr<PsClient> client = Client(Options());
  ASSERT_NE(client, nullptr);
  ASSERT_OK(client->Register({Spec("w", 24), Spec("b", 3)}));
  const std::vector<float> w(24, 1.0f), b(3, 5.0f);
  std::vector<float> w_out(24), b_out(3);
  // The second tensor first, as backward produces them; b's gradient is
  // ready only once its GradReady returns.
  bool b_ready = false;
  client->StartExchange(1, 1, 0, b,
                        [&b_ready] {
                          b_ready = true;
                          return absl::OkStatus();
                        },
                        absl::MakeSpan(b_out));
  client->StartExchange(0, 1, 0, w, nullptr, absl::MakeSpan(w_out));
  PushStats push_stats;
  PullStats pull_stats;
  ASSERT_OK(client->FinishExchanges(&push_stats, &pull_stats));
  EXPECT_TRUE(b_ready);
  EXPECT_THAT(w_out, Each(-1.0f));
  EXPECT_THAT(b_out, Each(-5.0f));
  EXPECT_THAT(Held("w", 24), Each(-1.0f));
  EXPECT_EQ(client->referenced_slices(), 0);
}

// Async, overlapped exchanges that cover every tensor every step: a shard
// that counts a split push's calls is told the step's calls to it, over all
// tensors, so that it moves the worker's clock with the last. Without the
// promise, or to a shard that does not count, each call moves it at once.
TEST_F(PsClientTest, ExchangesCoveringEveryTensorTellTheShardTheStepsCalls) {
  constexpr int64_t kPartition = 64 * 1024;  // w: 4 partitions, 2 per connection
  for (const bool counts : {true, false}) {
    for (const bool every_tensor : {true, false}) {
      SCOPED_TRACE(absl::StrCat(counts ? "counting shard" : "older shard",
                                every_tensor ? ", every tensor" : ", a subset allowed"));
      PsClientOptions options = OneShardOverTwoConnections(kPartition, counts);
      options.exchanges_cover_every_tensor = every_tensor;
      std::unique_ptr<PsClient> client = Client(options);
      ASSERT_NE(client, nullptr);
      ASSERT_OK(client->Register({Spec("w", 4 * kPartition), Spec("b", 3)}));
      const std::vector<float> w(4 * kPartition, 1.0f), b(3, 5.0f);
      std::vector<float> w_out(4 * kPartition), b_out(3);
      client->StartExchange(1, 7, 0, b, nullptr, absl::MakeSpan(b_out));
      client->StartExchange(0, 7, 0, w, nullptr, absl::MakeSpan(w_out));
      PushStats push_stats;
      PullStats pull_stats;
      ASSERT_OK(client->FinishExchanges(&push_stats, &pull_stats));
      const std::vector<PushRequest> pushes = shards_[0]->pushes();
      ASSERT_EQ(pushes.size(), 3u);  // b's one call, w's two
      for (size_t p = 0; p < pushes.size(); ++p) {
        EXPECT_EQ(pushes[p].clock(), 7) << "push " << p;
        EXPECT_EQ(pushes[p].clock_parts(), counts && every_tensor ? 3u : 0u) << "push " << p;
      }
      EXPECT_EQ(shards_[0]->calls("Heartbeat"), 0);
      EXPECT_THAT(w_out, Each(-1.0f));
      EXPECT_THAT(b_out, Each(-5.0f));
    }
  }
}

TEST_F(PsClientTest, HeartbeatReachesEveryShardAndAnswersShardZerosView) {
  StartShards(2);
  std::unique_ptr<PsClient> client = Client(Options());
  ASSERT_NE(client, nullptr);
  ASSERT_OK_AND_ASSIGN(const HeartbeatResponse response,
                       client->Heartbeat(5, /*done=*/false, absl::Seconds(5)));
  for (const auto& shard : shards_) EXPECT_EQ(shard->calls("Heartbeat"), 1);
  EXPECT_EQ(response.incarnation(), shards_[0]->incarnation());
  ASSERT_EQ(response.workers_size(), 1);
  EXPECT_EQ(response.workers(0).clock(), 5);
  EXPECT_EQ(response.workers(0).incarnation(), client->worker_incarnation());
}

}  // namespace
}  // namespace shardtrain::client
