// PsClient with replicated shards (replicas 2 of 3 shards): routing by the
// chains in a real etcd, Register's versions from each group's tail, and a
// dead member that does not stop the worker. The shards are small test
// services that log what reaches them; what replication itself does is the
// server's and is tested there.
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>
#include <grpcpp/security/server_credentials.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "chain/placement.h"
#include "client/ps_client.h"
#include "client/testing/etcd_chains.h"
#include "common/partition.h"
#include "common/payload.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/shardtrain.grpc.pb.h"

namespace shardtrain::client {
namespace {

using ::shardtrain::client::testing::EtcdChains;
using ::shardtrain::testutil::EtcdProcess;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kJob[] = "replicatest";
constexpr int kShards = 3;
constexpr int kReplicas = 2;
constexpr int64_t kMaxPartitionElements = 4;
constexpr int64_t kElements = 24;  // "w": 6 partitions, 2 per group

// One partition of a request as a shard saw it.
struct Op {
  int shard = 0;
  std::string method;
  uint64_t chain_epoch = 0;
  int group = 0;
  int64_t version = 0;  // a push part's "computed from" version
};

// The chains as the test shards see them: the test changes them here and
// in etcd together.
class Chains {
 public:
  explicit Chains(EtcdChains* etcd) : etcd_(etcd) {}
  absl::Status Put(int group, std::vector<int> shards) {
    RETURN_IF_ERROR(etcd_->Put(group, shards).status());
    absl::MutexLock lock(&mu_);
    chains_[group] = std::move(shards);
    return absl::OkStatus();
  }
  absl::Status Change(int group, std::vector<int> shards) {
    RETURN_IF_ERROR(etcd_->Change(group, shards).status());
    absl::MutexLock lock(&mu_);
    chains_[group] = std::move(shards);
    return absl::OkStatus();
  }
  std::vector<int> Of(int group) const {
    absl::MutexLock lock(&mu_);
    auto it = chains_.find(group);
    return it == chains_.end() ? std::vector<int>() : it->second;
  }

 private:
  EtcdChains* const etcd_;
  mutable absl::Mutex mu_;
  std::map<int, std::vector<int>> chains_ ABSL_GUARDED_BY(mu_);
};

// A shard that holds the partitions of every group whose chain it is in.
// Register reports version 100 * shard + group for each; a pull answers
// values equal to the shard index, version 1000 + shard.
class TestShard final : public ParameterServer::CallbackService {
 public:
  TestShard(int index, const Chains* chains) : index_(index), chains_(chains) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
  }
  ~TestShard() override { Stop(); }
  void Stop() { server_->Shutdown(std::chrono::system_clock::now()); }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  std::vector<Op> ops() const {
    absl::MutexLock lock(&mu_);
    return ops_;
  }
  int calls(const std::string& method) const {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(std::count(calls_.begin(), calls_.end(), method));
  }

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* context,
                                     const RegisterRequest* request,
                                     RegisterResponse* response) override {
    const common::PartitionConfig config{kMaxPartitionElements, kShards};
    for (const TensorSpec& spec : request->tensors()) {
      int64_t elements = 1;
      for (int64_t dim : spec.shape()) elements *= dim;
      for (const common::PlacedPartition& placed :
           common::PlaceTensor(spec.name(), elements, config)) {
        const std::vector<int> chain = chains_->Of(placed.shard);
        if (std::find(chain.begin(), chain.end(), index_) == chain.end()) continue;
        PartitionInfo* info = response->add_partitions();
        info->set_tensor(spec.name());
        info->set_partition(static_cast<uint32_t>(placed.partition));
        info->set_offset(placed.range.offset);
        info->set_size(placed.range.size);
        info->set_version(100 * index_ + placed.shard);
        absl::MutexLock lock(&mu_);
        sizes_[{spec.name(), placed.partition}] = placed.range.size;
      }
    }
    response->set_incarnation(1);
    return Answer(context, "Register");
  }

  grpc::ServerUnaryReactor* Push(grpc::CallbackServerContext* context,
                                 const PushRequest* request, PushResponse*) override {
    for (const GradientPart& part : request->parts()) {
      Note({index_, "Push", request->chain_epoch(), GroupOf(part.key()), part.version()});
    }
    return Answer(context, "Push");
  }

  grpc::ServerUnaryReactor* Pull(grpc::CallbackServerContext* context,
                                 const PullRequest* request,
                                 PullResponse* response) override {
    FillPull("Pull", *request, response);
    return Answer(context, "Pull");
  }

  grpc::ServerUnaryReactor* PushPull(grpc::CallbackServerContext* context,
                                     const PushPullRequest* request,
                                     PushPullResponse* response) override {
    for (const GradientPart& part : request->push().parts()) {
      Note({index_, "PushPull.push", request->push().chain_epoch(), GroupOf(part.key()),
            part.version()});
    }
    FillPull("PushPull.pull", request->pull(), response->mutable_pull());
    return Answer(context, "PushPull");
  }

  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const HeartbeatRequest* request,
                                      HeartbeatResponse* response) override {
    WorkerState* worker = response->add_workers();
    worker->set_worker(request->worker());
    worker->set_clock(request->clock());
    worker->set_live(true);
    return Answer(context, "Heartbeat");
  }

  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* context,
                                   const StatusRequest*, StatusResponse* response) override {
    response->set_shard(index_);
    response->set_num_shards(kShards);
    response->set_mode("async");
    return Answer(context, "Status");
  }

 private:
  static int GroupOf(const PartitionKey& key) {
    return common::ReplicaGroupFor(key.tensor(), key.partition(), kShards);
  }
  void FillPull(const char* method, const PullRequest& request, PullResponse* response) {
    for (const PartitionKey& key : request.parts()) {
      Note({index_, method, request.chain_epoch(), GroupOf(key), 0});
      int64_t size;
      {
        absl::MutexLock lock(&mu_);
        size = sizes_[{key.tensor(), key.partition()}];
      }
      ParameterPart* part = response->add_parts();
      *part->mutable_key() = key;
      part->set_version(1000 + index_);
      part->mutable_value()->set_dtype(DTYPE_F32);
      common::EncodeDense(std::vector<float>(size, static_cast<float>(index_)), DTYPE_F32,
                          part->mutable_value()->mutable_data());
    }
  }
  void Note(Op op) {
    absl::MutexLock lock(&mu_);
    ops_.push_back(std::move(op));
  }
  grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* context, const char* method,
                                   grpc::Status status = grpc::Status::OK) {
    {
      absl::MutexLock lock(&mu_);
      calls_.push_back(method);
    }
    auto* reactor = context->DefaultReactor();
    reactor->Finish(status);
    return reactor;
  }

  const int index_;
  const Chains* const chains_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  mutable absl::Mutex mu_;
  std::map<std::pair<std::string, int64_t>, int64_t> sizes_ ABSL_GUARDED_BY(mu_);
  std::vector<Op> ops_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> calls_ ABSL_GUARDED_BY(mu_);
};

class PsClientReplicasTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!EtcdProcess::Available()) GTEST_SKIP() << EtcdProcess::kMissingMessage;
    ASSERT_OK_AND_ASSIGN(etcd_, EtcdChains::Start(kJob));
    chains_ = std::make_unique<Chains>(etcd_.get());
    for (int s = 0; s < kShards; ++s) {
      shards_.push_back(std::make_unique<TestShard>(s, chains_.get()));
    }
    spec_.set_name("w");
    spec_.add_shape(kElements);
    spec_.set_dtype(DTYPE_F32);
  }

  // The initial chains: group g on [g, g + 1], head first.
  void PutInitialChains() {
    for (int g = 0; g < kShards; ++g) {
      ASSERT_OK(chains_->Put(g, chain::InitialChain(g, kShards, kReplicas)));
    }
  }

  PsClientOptions Options() const {
    PsClientOptions options;
    for (const auto& shard : shards_) options.servers.push_back(shard->address());
    options.replicas = kReplicas;
    options.etcd_endpoints = etcd_->endpoint();
    options.job = kJob;
    options.max_partition_elements = kMaxPartitionElements;
    options.channels_per_shard = 1;
    options.initial_backoff = absl::Milliseconds(10);
    options.max_backoff = absl::Milliseconds(100);
    options.reconnect_timeout = absl::Seconds(20);
    options.member_timeout = absl::Milliseconds(500);
    return options;
  }

  // Every op of `method` on any shard.
  std::vector<Op> Ops(const std::string& method) const {
    std::vector<Op> out;
    for (const auto& shard : shards_) {
      for (const Op& op : shard->ops()) {
        if (op.method == method) out.push_back(op);
      }
    }
    return out;
  }
  void ClearOps() {
    // Fresh shards would lose the registration; remember the count instead.
    for (const auto& shard : shards_) seen_[shard.get()] = shard->ops().size();
  }
  std::vector<Op> NewOps(const std::string& method) const {
    std::vector<Op> out;
    for (const auto& shard : shards_) {
      const std::vector<Op> ops = shard->ops();
      auto it = seen_.find(shard.get());
      const size_t from = it == seen_.end() ? 0 : it->second;
      for (size_t i = from; i < ops.size(); ++i) {
        if (ops[i].method == method) out.push_back(ops[i]);
      }
    }
    return out;
  }

  std::unique_ptr<EtcdChains> etcd_;
  std::unique_ptr<Chains> chains_;
  std::vector<std::unique_ptr<TestShard>> shards_;
  std::map<const TestShard*, size_t> seen_;
  TensorSpec spec_;
  std::vector<float> grad_ = std::vector<float>(kElements, 1.0f);
  std::vector<float> params_ = std::vector<float>(kElements, -1.0f);
};

TEST_F(PsClientReplicasTest, PushesGoToEachGroupsHeadAndPullsToItsTail) {
  PutInitialChains();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PsClient> client, PsClient::Create(Options(), nullptr));
  ASSERT_OK(client->Register({spec_}));
  for (const auto& shard : shards_) EXPECT_EQ(shard->calls("Register"), 1);

  const std::vector<absl::Span<const float>> grads = {grad_};
  const std::vector<absl::Span<float>> params = {absl::MakeSpan(params_)};
  PushStats push_stats;
  PullStats pull_stats;
  ASSERT_OK(client->Push(1, grads, &push_stats));
  std::vector<Op> pushes = Ops("Push");
  ASSERT_EQ(pushes.size(), 6u);
  for (const Op& op : pushes) {
    EXPECT_EQ(op.shard, op.group) << "group " << op.group << "'s head";
    EXPECT_EQ(op.chain_epoch, 1u);
    // Computed from the versions its tail (shard group + 1) registered.
    EXPECT_EQ(op.version, 100 * ((op.group + 1) % kShards) + op.group);
  }

  ASSERT_OK(client->Pull(1, 0, params, &pull_stats));
  std::vector<Op> pulls = Ops("Pull");
  ASSERT_EQ(pulls.size(), 6u);
  for (const Op& op : pulls) {
    EXPECT_EQ(op.shard, (op.group + 1) % kShards) << "group " << op.group << "'s tail";
    EXPECT_EQ(op.chain_epoch, 1u);
  }
  EXPECT_EQ(pull_stats.min_version, 1000);
  const common::PartitionConfig config{kMaxPartitionElements, kShards};
  for (const common::PlacedPartition& placed : common::PlaceTensor("w", kElements, config)) {
    EXPECT_EQ(params_[placed.range.offset], (placed.shard + 1) % kShards);
  }

  // PushPull is one call to the head, which answers the pull half too.
  ClearOps();
  ASSERT_OK(client->PushPull(2, 0, grads, params, &push_stats, &pull_stats));
  EXPECT_EQ(NewOps("Push").size(), 0u);
  EXPECT_EQ(NewOps("Pull").size(), 0u);
  ASSERT_EQ(NewOps("PushPull.push").size(), 6u);
  ASSERT_EQ(NewOps("PushPull.pull").size(), 6u);
  for (const Op& op : NewOps("PushPull.push")) {
    EXPECT_EQ(op.shard, op.group);
    EXPECT_EQ(op.chain_epoch, 1u);
  }
  for (const Op& op : NewOps("PushPull.pull")) {
    EXPECT_EQ(op.shard, op.group) << "group " << op.group << "'s head";
    EXPECT_EQ(op.chain_epoch, 1u);
  }
  for (const common::PlacedPartition& placed : common::PlaceTensor("w", kElements, config)) {
    EXPECT_EQ(params_[placed.range.offset], placed.shard);
  }

  // So does the overlapped exchange of an async job.
  ClearOps();
  client->StartExchange(0, 3, 0, grad_, nullptr, absl::MakeSpan(params_));
  ASSERT_OK(client->FinishExchanges(&push_stats, &pull_stats));
  EXPECT_EQ(NewOps("Push").size(), 0u);
  EXPECT_EQ(NewOps("Pull").size(), 0u);
  for (const Op& op : NewOps("PushPull.pull")) EXPECT_EQ(op.shard, op.group);
  EXPECT_EQ(NewOps("PushPull.push").size(), 6u);
  EXPECT_EQ(NewOps("PushPull.pull").size(), 6u);

  // So does a sync job's: the head answers the pull half once the step is
  // complete.
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PsClient> sync_client,
                       PsClient::Create(Options(), nullptr));
  sync_client->set_sync_mode(true);
  ASSERT_OK(sync_client->Register({spec_}));
  ClearOps();
  sync_client->StartExchange(0, 1, 1, grad_, nullptr, absl::MakeSpan(params_));
  ASSERT_OK(sync_client->FinishExchanges(&push_stats, &pull_stats));
  for (const Op& op : NewOps("PushPull.pull")) EXPECT_EQ(op.shard, op.group);
  EXPECT_EQ(NewOps("PushPull.push").size(), 6u);
  EXPECT_EQ(NewOps("PushPull.pull").size(), 6u);
  EXPECT_EQ(NewOps("Push").size(), 0u);
  EXPECT_EQ(NewOps("Pull").size(), 0u);

  // Heartbeats reach every member.
  ASSERT_OK_AND_ASSIGN(HeartbeatResponse beat, client->Heartbeat(3, false, absl::InfiniteDuration()));
  ASSERT_EQ(beat.workers_size(), 1);
  EXPECT_EQ(beat.workers(0).clock(), 3);
  for (const auto& shard : shards_) EXPECT_GE(shard->calls("Heartbeat"), 1);
}

TEST_F(PsClientReplicasTest, ADeadMemberDoesNotStopTheWorker) {
  PutInitialChains();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PsClient> client, PsClient::Create(Options(), nullptr));
  ASSERT_OK(client->Register({spec_}));
  // Shard 2 dies: the tail of group 1 and the head of group 2.
  shards_[2]->Stop();

  absl::Time start = absl::Now();
  ASSERT_OK(client->Heartbeat(1, false, absl::InfiniteDuration()).status());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  std::vector<int> unreachable;
  ASSERT_OK_AND_ASSIGN(std::vector<StatusResponse> status, client->ClusterStatus(&unreachable));
  ASSERT_EQ(status.size(), 2u);
  EXPECT_EQ(status[0].shard(), 0u);
  EXPECT_EQ(status[1].shard(), 1u);
  EXPECT_THAT(unreachable, ElementsAre(2));

  // Its lease expires a little later and its chains drop it.
  std::thread reconfigure([this] {
    absl::SleepFor(absl::Milliseconds(300));
    EXPECT_OK(chains_->Change(1, {1}));
    EXPECT_OK(chains_->Change(2, {0}));
  });
  ClearOps();
  const std::vector<absl::Span<const float>> grads = {grad_};
  const std::vector<absl::Span<float>> params = {absl::MakeSpan(params_)};
  PushStats push_stats;
  PullStats pull_stats;
  start = absl::Now();
  EXPECT_OK(client->PushPull(1, 0, grads, params, &push_stats, &pull_stats));
  reconfigure.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  // One call per group, at its head: group 2's is shard 0 once shard 2 is
  // out of its chain.
  for (const char* half : {"PushPull.push", "PushPull.pull"}) {
    for (const Op& op : NewOps(half)) {
      if (op.group == 2) {
        EXPECT_EQ(op.shard, 0) << half;
        EXPECT_EQ(op.chain_epoch, 2u) << half;
      } else {
        EXPECT_EQ(op.shard, op.group) << half;
      }
    }
    EXPECT_EQ(NewOps(half).size(), 6u) << half;
  }
  ASSERT_OK(client->router()->WaitForGroups(kShards, absl::ZeroDuration()));
  EXPECT_THAT(client->router()->MemberShards(), ElementsAre(0, 1));
}

TEST_F(PsClientReplicasTest, RegisterWaitsForADeadTailToBeReplaced) {
  PutInitialChains();
  // Shard 1 is dead before the worker starts: the tail of group 0.
  shards_[1]->Stop();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PsClient> client, PsClient::Create(Options(), nullptr));
  std::thread reconfigure([this] {
    absl::SleepFor(absl::Milliseconds(300));
    EXPECT_OK(chains_->Change(0, {0}));
    EXPECT_OK(chains_->Change(1, {2}));
  });
  ASSERT_OK(client->Register({spec_}));
  reconfigure.join();
  const std::vector<absl::Span<const float>> grads = {grad_};
  PushStats push_stats;
  ASSERT_OK(client->Push(1, grads, &push_stats));
  // Each group's versions came from its tail as the chains are now:
  // group 0 from shard 0, group 1 from shard 2, group 2 ([2, 0]) from 0.
  const std::vector<Op> pushes = Ops("Push");
  ASSERT_EQ(pushes.size(), 6u);
  for (const Op& op : pushes) {
    const int tail = op.group == 1 ? 2 : 0;
    EXPECT_EQ(op.version, 100 * tail + op.group) << "group " << op.group;
  }
}

TEST_F(PsClientReplicasTest, CreateChecksTheChainsAndTheOptions) {
  ASSERT_OK(chains_->Put(0, {0, 1}));
  ASSERT_OK(chains_->Put(1, {1, 2}));
  PsClientOptions options = Options();
  options.reconnect_timeout = absl::Milliseconds(300);
  const absl::Status missing = PsClient::Create(options, nullptr).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(missing.message(), HasSubstr("group 2 after"));

  ASSERT_OK(chains_->Put(2, {2, 0}));
  options.replicas = 3;
  const absl::Status mismatch = PsClient::Create(options, nullptr).status();
  EXPECT_EQ(mismatch.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(mismatch.message(), HasSubstr("--replicas"));

  options.replicas = 4;  // more than the shards
  EXPECT_EQ(PsClient::Create(options, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.replicas = 2;
  options.etcd_endpoints.clear();
  EXPECT_EQ(PsClient::Create(options, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardtrain::client
