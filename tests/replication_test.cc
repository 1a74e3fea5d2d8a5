// Replicated shards with real processes (issue 10): a real etcd, three
// ps-server processes with --replicas 2 and two ps-workers. Shards are
// SIGKILLed, restarted and SIGSTOPped mid-run and etcd is stopped; the
// job must finish with no worker exiting and no acknowledged update lost,
// proven from the replicas' state itself (FetchGroupState from each group's
// tail): in sync mode bit-identical to a fault-free run; in async mode
// every partition's version equals the number of pushes the workers made.
// Every process is stopped when the test ends, pass or fail.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "chain/chain_config.h"
#include "chain/chain_reader.h"
#include "chain/placement.h"
#include "chain/replication_keys.h"
#include "etcd/etcd_client.h"
#include "gtest/gtest.h"
#include "proto/shardtrain.grpc.pb.h"
#include "testing/chain_waits.h"
#include "testing/etcd_process.h"
#include "testing/files.h"
#include "testing/free_port.h"
#include "testing/local_cluster.h"
#include "testing/metrics_scrape.h"
#include "testing/net_ns.h"
#include "testing/process_group.h"

namespace shardtrain {
namespace {

using testutil::EtcdProcess;
using testutil::LocalCluster;
using testutil::LocalClusterOptions;
using testutil::ProcessGroup;

constexpr int kShards = 3;
constexpr int kWorkers = 2;
constexpr int kBatch = 16;
constexpr int kTrainExamples = 9600;
constexpr int kStepsPerEpoch = kTrainExamples / kWorkers / kBatch;  // 300
// The bar of an async job's final accuracy after 2 epochs with shards
// killed (AsyncKillPrimaryRejoinAsTail says what was measured).
constexpr double kAsyncKillsAccuracy = 0.75;

LocalClusterOptions Job(const std::string& mode, const std::string& job,
                        const std::string& etcd_endpoints, int epochs, int replicas = 2,
                        double heartbeat_timeout_s = 30) {
  LocalClusterOptions options;
  options.bin_dir = SHARDTRAIN_BIN_DIR;
  options.mode = mode;
  options.shards = kShards;
  options.workers = kWorkers;
  options.fixed_ports = true;  // a restarted shard keeps its address
  // The data path on the shards' data ports, as the shipped replicated
  // setups run it: routed calls there are cancelled when their shard
  // leaves the chain (MutualTlsChainLosesNothing keeps it on gRPC).
  options.data_port = true;
  const std::vector<std::string> replication = {
      absl::StrCat("--replicas=", replicas), "--etcd_endpoints=" + etcd_endpoints,
      "--job=" + job};
  options.server_flags = {"--optimizer=adam", "--lr=0.002", "--lease_ttl_s=1",
                          absl::StrCat("--heartbeat_timeout_s=", heartbeat_timeout_s)};
  options.server_flags.insert(options.server_flags.end(), replication.begin(),
                              replication.end());
  options.worker_flags = {absl::StrCat("--epochs=", epochs), absl::StrCat("--batch=", kBatch),
                          absl::StrCat("--max_train_examples=", kTrainExamples),
                          "--max_test_examples=2000", "--reconnect_timeout_s=60"};
  options.worker_flags.insert(options.worker_flags.end(), replication.begin(),
                              replication.end());
  return options;
}

std::unique_ptr<etcd::EtcdClient> Connect(const std::string& etcd_endpoints) {
  etcd::EtcdClient::Options options;
  options.endpoints = etcd_endpoints;
  absl::StatusOr<std::unique_ptr<etcd::EtcdClient>> client = etcd::EtcdClient::Create(options);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

// Waits until every group's chain satisfies `ok`.
bool WaitForChains(etcd::EtcdClient& client, const std::string& job,
                   const std::function<bool(const chain::ChainConfig&)>& ok,
                   absl::Duration timeout) {
  return testutil::WaitForChains(client, job, kShards, ok, timeout);
}

// Waits (30 s at most) until shard `shard`, dropped from its chains (epoch
// 2), is back in them (epoch 3 or later) and every chain has 2 members.
bool WaitForRejoin(etcd::EtcdClient& client, const std::string& job, int shard) {
  return WaitForChains(
      client, job,
      [shard](const chain::ChainConfig& c) {
        return c.members.size() == 2 && (!c.Contains(shard) || c.epoch >= 3);
      },
      absl::Seconds(30));
}

// Mutual TLS credentials from PEM files.
std::shared_ptr<grpc::ChannelCredentials> TlsCredentials(const std::string& ca,
                                                         const std::string& cert,
                                                         const std::string& key) {
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = testutil::ReadFile(ca);
  ssl.pem_cert_chain = testutil::ReadFile(cert);
  ssl.pem_private_key = testutil::ReadFile(key);
  return grpc::SslCredentials(ssl);
}

// Group `group`'s partitions as shard `shard` holds them (over `credentials`,
// with `token` as the bearer token if not empty): "tensor/partition"
// -> version, parameters and optimizer state.
std::map<std::string, std::string> GroupState(
    const LocalCluster& cluster, int shard, int group, std::map<std::string, int64_t>* versions,
    std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials(),
    const std::string& token = "") {
  auto stub = ParameterServer::NewStub(grpc::CreateChannel(cluster.servers[shard], credentials));
  grpc::ClientContext context;
  if (!token.empty()) {
    context.AddMetadata("authorization", "Bearer " + std::string(absl::StripAsciiWhitespace(token)));
  }
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
  GroupStateRequest request;
  request.set_group(group);
  // The state's parts, put together.
  GroupStateResponse state, part;
  std::unique_ptr<grpc::ClientReader<GroupStateResponse>> reader =
      stub->FetchGroupState(&context, request);
  while (reader->Read(&part)) state.MergeFrom(part);
  const grpc::Status status = reader->Finish();
  EXPECT_TRUE(status.ok()) << "shard " << shard << " group " << group << ": "
                           << status.error_message();
  std::map<std::string, std::string> model;
  for (const CheckpointRecord& record : state.records()) {
    const std::string key = absl::StrCat(record.spec().name(), "/", record.partition());
    std::string bytes = absl::StrCat(record.version(), ":", record.params());
    for (const std::string& slot : record.slots()) bytes += slot;
    model[key] = std::move(bytes);
    if (versions != nullptr) (*versions)[key] = record.version();
  }
  return model;
}

// Every partition's version, parameters and optimizer state, read from the
// tail of its group: "tensor/partition" -> bytes.
std::map<std::string, std::string> Model(etcd::EtcdClient& client, const std::string& job,
                                         const LocalCluster& cluster,
                                         std::map<std::string, int64_t>* versions) {
  std::map<std::string, std::string> model;
  for (int g = 0; g < kShards; ++g) {
    absl::StatusOr<chain::ChainConfig> chain = chain::ReadChain(client, job, g);
    EXPECT_TRUE(chain.ok()) << chain.status();
    if (!chain.ok()) continue;
    model.merge(GroupState(cluster, chain->tail().shard, g, versions));
  }
  return model;
}

// Async mode: every partition, read from its group's tail, is at version
// `pushes` (every push the workers made, each applied once).
void ExpectEveryPushApplied(etcd::EtcdClient& client, const std::string& job,
                            const LocalCluster& cluster, int64_t pushes) {
  std::map<std::string, int64_t> versions;
  Model(client, job, cluster, &versions);
  ASSERT_FALSE(versions.empty());
  for (const auto& [key, version] : versions) {
    EXPECT_EQ(version, pushes) << key << ": updates lost or applied twice";
  }
}

int64_t WorkerSteps(const LocalCluster& cluster, int w) {
  absl::StatusOr<std::string> body =
      testutil::HttpGet(cluster.worker_metrics_ports[w], "/metrics");
  if (!body.ok()) return -1;
  return static_cast<int64_t>(testutil::SumByName(*body)["shardtrain_worker_steps_total"]);
}

void WaitForSteps(const LocalCluster& cluster, int w, int64_t steps) {
  const absl::Time deadline = absl::Now() + absl::Minutes(2);
  while (absl::Now() < deadline && WorkerSteps(cluster, w) < steps) {
    absl::SleepFor(absl::Milliseconds(50));
  }
}

// Right after a fault: the longest time any worker went without a step
// until worker 0 has made `steps` more (at most `timeout`). A member that
// hangs or is cut off sends no reset; calls stuck on it must move to the
// new chain once etcd drops it (about a lease ttl), not wait out their
// deadline or gRPC's keepalive (20 s).
absl::Duration LongestStall(const LocalCluster& cluster, int64_t steps, absl::Duration timeout) {
  const absl::Time start = absl::Now();
  std::vector<int64_t> last(kWorkers, -1);
  std::vector<absl::Time> since(kWorkers, start);
  absl::Duration longest;
  const int64_t until = WorkerSteps(cluster, 0) + steps;
  while (absl::Now() < start + timeout) {
    for (int w = 0; w < kWorkers; ++w) {
      const int64_t now_steps = WorkerSteps(cluster, w);
      const absl::Time now = absl::Now();
      if (now_steps != last[w]) {
        longest = std::max(longest, now - since[w]);
        last[w] = now_steps;
        since[w] = now;
      }
    }
    if (last[0] >= until) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  for (int w = 0; w < kWorkers; ++w) longest = std::max(longest, absl::Now() - since[w]);
  return longest;
}

// With --lease_ttl_s=1: the lease runs out within 1 s, etcd notices within
// 0.5 s more, the chain changes and the workers' watches see it.
constexpr absl::Duration kMaxStall = absl::Seconds(4);

// SIGSTOPs shard 0, which must head group 0 (at *epoch, if given), requires
// that no worker goes kMaxStall without a step while worker 0 makes `steps`
// more, and waits until `job`'s chains have dropped shard 0.
void StopShard0AndMeasureStall(ProcessGroup& group, const LocalCluster& cluster,
                               etcd::EtcdClient& client, const std::string& job, int64_t steps,
                               int64_t* epoch = nullptr) {
  absl::StatusOr<chain::ChainConfig> before = chain::ReadChain(client, job, 0);
  ASSERT_TRUE(before.ok()) << before.status();
  ASSERT_EQ(before->head().shard, 0);
  if (epoch != nullptr) *epoch = before->epoch;
  ASSERT_TRUE(group.Signal(cluster.shards[0], SIGSTOP).ok());
  const absl::Duration stall = LongestStall(cluster, steps, absl::Seconds(30));
  std::printf("SIGSTOP of a head (job %s): the longest a worker went without a step: %s\n",
              job.c_str(), absl::FormatDuration(stall).c_str());
  EXPECT_LE(stall, kMaxStall) << "calls waited on the stopped shard";
  ASSERT_TRUE(WaitForChains(
      client, job, [](const chain::ChainConfig& c) { return !c.Contains(0); },
      absl::Seconds(10)));
}

// Every worker's routed calls reach every shard's data port: each shard
// (the head of one group) but `unreachable` (whose metrics port the test
// cannot reach) has a connection from each worker open, and forwards to
// its successor there.
void ExpectTheDataPortsInUse(const LocalCluster& cluster, int unreachable = -1) {
  for (size_t s = 0; s < cluster.shards.size(); ++s) {
    if (static_cast<int>(s) == unreachable) continue;
    absl::StatusOr<std::string> metrics =
        testutil::HttpGet(cluster.shard_metrics_ports.at(static_cast<int>(s)), "/metrics");
    ASSERT_TRUE(metrics.ok()) << metrics.status();
    EXPECT_GE(testutil::SumByName(*metrics)["shardtrain_data_connections"], kWorkers)
        << "shard " << s << ": the workers' data path is not on its data port";
    EXPECT_GT(testutil::SumByName(*metrics, {"transport=\"frames\""})
                  ["shardtrain_replication_forwards_total"],
              0)
        << "shard " << s << ": forwarded nothing to its successor's data port";
  }
}

// Waits for the chief's accuracy and for every worker to exit 0.
double Finish(ProcessGroup& group, const LocalCluster& cluster) {
  absl::StatusOr<double> accuracy =
      testutil::WaitForFinalAccuracy(group, cluster, absl::Minutes(4));
  EXPECT_TRUE(accuracy.ok()) << accuracy.status();
  for (int w = 0; w < kWorkers; ++w) {
    absl::StatusOr<int> exit = group.Wait(cluster.workers[w], absl::Seconds(60));
    EXPECT_TRUE(exit.ok() && *exit == 0)
        << "worker " << w << " exited with " << (exit.ok() ? *exit : -1) << ":\n"
        << testutil::ReadFile(cluster.WorkerLog(w));
  }
  return accuracy.ok() ? *accuracy : 0;
}

class ReplicationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!EtcdProcess::Available()) GTEST_SKIP() << EtcdProcess::kMissingMessage;
    absl::StatusOr<std::unique_ptr<EtcdProcess>> etcd = EtcdProcess::Start();
    ASSERT_TRUE(etcd.ok()) << etcd.status();
    etcd_ = *std::move(etcd);
    client_ = Connect(etcd_->endpoint());
    ASSERT_NE(client_, nullptr);
  }

  std::unique_ptr<EtcdProcess> etcd_;
  std::unique_ptr<etcd::EtcdClient> client_;
};

// Sync, R=2: shard 1 SIGKILLed mid-run; 20 steps later it restarts, rejoins
// its chains as tail and gets the head of group 1 back. No worker exits,
// and the model the replicas end with is bit-identical to a fault-free
// run's.
constexpr int kBitIdenticalEpochs = 2;

TEST_F(ReplicationTest, ReplicatedBitIdentical) {
  std::map<std::string, std::string> clean;
  {
    ProcessGroup group;
    absl::StatusOr<LocalCluster> cluster =
        testutil::StartLocalCluster(
            group, Job("sync", "clean", etcd_->endpoint(), kBitIdenticalEpochs));
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    Finish(group, *cluster);
    clean = Model(*client_, "clean", *cluster, nullptr);
  }
  ProcessGroup group;
  absl::StatusOr<LocalCluster> cluster =
      testutil::StartLocalCluster(
          group, Job("sync", "faulty", etcd_->endpoint(), kBitIdenticalEpochs));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  WaitForSteps(*cluster, 0, kStepsPerEpoch / 3);
  const absl::Time killed = absl::Now();
  ASSERT_TRUE(group.Signal(cluster->shards[1], SIGKILL).ok());
  (void)group.Wait(cluster->shards[1], absl::Seconds(10));
  const int64_t steps_at_kill = WorkerSteps(*cluster, 0);
  // Training goes on without shard 1.
  WaitForSteps(*cluster, 0, steps_at_kill + 20);
  std::printf("FAILOVER sync R=2: 20 steps after the SIGKILL in %s\n",
              absl::FormatDuration(absl::Now() - killed).c_str());
  ASSERT_TRUE(testutil::RestartShard(group, *cluster, 1).ok());
  const absl::Time restarted = absl::Now();
  ASSERT_TRUE(WaitForChains(
      *client_, "faulty", testutil::InPlacementOrder(kShards, 2),
      absl::Seconds(30)))
      << "the heads did not go back to the placement's order";
  std::printf("HEADS RESTORED sync R=2: %s after the restart; worker 0 at step %lld of %d\n",
              absl::FormatDuration(absl::Now() - restarted).c_str(),
              static_cast<long long>(WorkerSteps(*cluster, 0)),
              kBitIdenticalEpochs * kStepsPerEpoch);
  EXPECT_LT(WorkerSteps(*cluster, 0), kBitIdenticalEpochs * kStepsPerEpoch)
      << "the job ended before the hand-over";
  Finish(group, *cluster);
  const std::map<std::string, std::string> faulty = Model(*client_, "faulty", *cluster, nullptr);
  ASSERT_FALSE(clean.empty());
  EXPECT_EQ(clean.size(), faulty.size());
  int differing = 0;
  for (const auto& [key, bytes] : clean) {
    auto it = faulty.find(key);
    if (it == faulty.end() || it->second != bytes) ++differing;
  }
  EXPECT_EQ(differing, 0) << differing << " of " << clean.size()
                          << " partitions differ from the fault-free run";
}

// Async, R=2: the primary of group 0 is SIGKILLed, restarts and rejoins as a
// tail (the chains are back to 2 members before the job ends), gets group
// 0's head back, then the other member of its chains is killed. Every
// acknowledged push is in the final model: each partition's version is
// exactly the pushes made.
TEST_F(ReplicationTest, AsyncKillPrimaryRejoinAsTail) {
  ProcessGroup group;
  absl::StatusOr<LocalCluster> cluster =
      testutil::StartLocalCluster(group, Job("async", "rejoin", etcd_->endpoint(), 2));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  WaitForSteps(*cluster, 0, kStepsPerEpoch / 3);
  ExpectTheDataPortsInUse(*cluster);
  ASSERT_TRUE(group.Signal(cluster->shards[0], SIGKILL).ok());
  (void)group.Wait(cluster->shards[0], absl::Seconds(10));
  ASSERT_TRUE(WaitForChains(
      *client_, "rejoin",
      [](const chain::ChainConfig& c) { return !c.Contains(0); }, absl::Seconds(10)))
      << "shard 0 was not dropped from its chains";
  ASSERT_TRUE(testutil::RestartShard(group, *cluster, 0).ok());
  const absl::Time restarted = absl::Now();
  ASSERT_TRUE(WaitForChains(
      *client_, "rejoin",
      [](const chain::ChainConfig& c) { return c.members.size() == 2; }, absl::Seconds(30)))
      << "the chains did not get back to 2 members";
  std::printf("REJOIN: chains back to 2 members %s after the restart; worker 0 at step %lld of %d\n",
              absl::FormatDuration(absl::Now() - restarted).c_str(),
              static_cast<long long>(WorkerSteps(*cluster, 0)), 2 * kStepsPerEpoch);
  EXPECT_LT(WorkerSteps(*cluster, 0), 2 * kStepsPerEpoch) << "the job ended before the rejoin";
  ASSERT_TRUE(WaitForChains(
      *client_, "rejoin", testutil::InPlacementOrder(kShards, 2),
      absl::Seconds(30)))
      << "the heads did not go back to the placement's order";
  std::printf("HEADS RESTORED: %s after the restart; worker 0 at step %lld of %d\n",
              absl::FormatDuration(absl::Now() - restarted).c_str(),
              static_cast<long long>(WorkerSteps(*cluster, 0)), 2 * kStepsPerEpoch);
  EXPECT_LT(WorkerSteps(*cluster, 0), 2 * kStepsPerEpoch)
      << "the job ended before the hand-over";
  ASSERT_TRUE(group.Signal(cluster->shards[1], SIGKILL).ok());
  (void)group.Wait(cluster->shards[1], absl::Seconds(10));
  const double accuracy = Finish(group, *cluster);
  ExpectEveryPushApplied(*client_, "rejoin", *cluster, int64_t{kWorkers} * 2 * kStepsPerEpoch);
  // Training went on through the kills (an untrained model scores about
  // 0.1): 0.808-0.831 in 6 runs here, 0.777 in a CI run under load (async:
  // how the workers interleave moves it), once a bar of 0.78.
  EXPECT_GT(accuracy, kAsyncKillsAccuracy);
}

// Async, R=3: the head of every group's chain, then a second shard, are
// SIGKILLed; the last copy carries the job to the end with every
// acknowledged push in it.
TEST_F(ReplicationTest, ThreeReplicasSurviveTwoKills) {
  ProcessGroup group;
  absl::StatusOr<LocalCluster> cluster = testutil::StartLocalCluster(
      group, Job("async", "three", etcd_->endpoint(), 2, /*replicas=*/3));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ASSERT_TRUE(WaitForChains(
      *client_, "three", [](const chain::ChainConfig& c) { return c.members.size() == 3; },
      absl::Seconds(10)))
      << "the chains did not form with 3 members";
  WaitForSteps(*cluster, 0, kStepsPerEpoch / 3);
  for (int victim : {0, 1}) {
    ASSERT_TRUE(group.Signal(cluster->shards[victim], SIGKILL).ok());
    (void)group.Wait(cluster->shards[victim], absl::Seconds(10));
    ASSERT_TRUE(WaitForChains(
        *client_, "three",
        [victim](const chain::ChainConfig& c) { return !c.Contains(victim); },
        absl::Seconds(10)))
        << "shard " << victim << " was not dropped from its chains";
    const int64_t at = WorkerSteps(*cluster, 0);
    EXPECT_LT(at, 2 * kStepsPerEpoch) << "the job ended before kill " << victim;
    WaitForSteps(*cluster, 0, at + 50);
  }
  const double accuracy = Finish(group, *cluster);
  ExpectEveryPushApplied(*client_, "three", *cluster, int64_t{kWorkers} * 2 * kStepsPerEpoch);
  EXPECT_GT(accuracy, kAsyncKillsAccuracy);
}

// Sync, R=2: worker 1 is stopped past the heartbeat timeout, so the heads
// close steps without it (close operations forwarded down the chains),
// then continued: it rejoins, the job finishes, and every group's head and
// tail hold bit-identical state.
TEST_F(ReplicationTest, SyncDepartedWorkerReplicasAgree) {
  constexpr double kHeartbeatS = 2;
  ProcessGroup group;
  absl::StatusOr<LocalCluster> cluster = testutil::StartLocalCluster(
      group, Job("sync", "departed", etcd_->endpoint(), 4, /*replicas=*/2, kHeartbeatS));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  WaitForSteps(*cluster, 0, kStepsPerEpoch / 3);
  ASSERT_TRUE(group.Signal(cluster->workers[1], SIGSTOP).ok());
  const int64_t stopped_at = WorkerSteps(*cluster, 0);
  // The shards drop worker 1 after the heartbeat timeout and worker 0 goes
  // on alone. Polled, not slept: alone, worker 0 could finish the whole job
  // within a fixed sleep on a fast machine.
  const absl::Time deadline = absl::Now() + absl::Seconds(kHeartbeatS + 60);
  int64_t now_at = stopped_at;
  while (absl::Now() < deadline) {
    now_at = WorkerSteps(*cluster, 0);
    if (now_at < 0 || now_at - stopped_at > 20) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_GE(now_at, 0) << "worker 0 exited while worker 1 was stopped";
  const int64_t alone = now_at - stopped_at;
  ASSERT_TRUE(group.Signal(cluster->workers[1], SIGCONT).ok());
  EXPECT_GT(alone, 20) << "worker 0 did not go on without worker 1";
  Finish(group, *cluster);
  int compared = 0;
  for (int g = 0; g < kShards; ++g) {
    absl::StatusOr<chain::ChainConfig> chain = chain::ReadChain(*client_, "departed", g);
    ASSERT_TRUE(chain.ok()) << chain.status();
    ASSERT_EQ(chain->members.size(), 2u);
    const auto head = GroupState(*cluster, chain->head().shard, g, nullptr);
    const auto tail = GroupState(*cluster, chain->tail().shard, g, nullptr);
    ASSERT_FALSE(head.empty());
    EXPECT_TRUE(head == tail) << "group " << g << ": head shard " << chain->head().shard
                              << " and tail shard " << chain->tail().shard << " differ";
    compared += static_cast<int>(head.size());
  }
  std::printf("DEPARTED: worker 0 made %lld steps alone; %d partitions identical on head and tail\n",
              static_cast<long long>(alone), compared);
}

// Async, R=2 over mutual TLS with an auth token, on the data ports: the
// shards forward to each other with their own certificates
// (scripts/make-certs.sh's shard certificate), the workers with theirs, and etcd serves https and takes
// only clients with a certificate of the same CA; a shard is SIGKILLed and
// nothing is lost.
TEST_F(ReplicationTest, MutualTlsChainLosesNothing) {
  const std::string certs = testutil::MakeTempDir("shardtrain-replication-certs-");
  const std::string make = absl::StrCat(SHARDTRAIN_SOURCE_DIR, "/scripts/make-certs.sh ", certs,
                                        " >/dev/null");
  ASSERT_EQ(std::system(make.c_str()), 0) << make;
  absl::StatusOr<std::unique_ptr<EtcdProcess>> etcd = EtcdProcess::Start(
      "127.0.0.1", {certs + "/server.pem", certs + "/server.key", certs + "/ca.pem"});
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  etcd::EtcdClient::Options etcd_options;
  etcd_options.endpoints = (*etcd)->endpoint();
  etcd_options.credentials = (*etcd)->credentials();
  absl::StatusOr<std::unique_ptr<etcd::EtcdClient>> client =
      etcd::EtcdClient::Create(etcd_options);
  ASSERT_TRUE(client.ok()) << client.status();
  // The data ports serve TLS too: the workers' calls and the forwards go
  // there, with the same certificates and token.
  LocalClusterOptions options = Job("async", "mtls", (*etcd)->endpoint(), 1);
  for (const std::string& flag :
       {"--tls_cert=" + certs + "/server.pem", "--tls_key=" + certs + "/server.key",
        "--tls_client_ca=" + certs + "/ca.pem", "--auth_token_file=" + certs + "/token",
        "--etcd_ca=" + certs + "/ca.pem", "--etcd_cert=" + certs + "/server.pem",
        "--etcd_key=" + certs + "/server.key"}) {
    options.server_flags.push_back(flag);
  }
  for (const std::string& flag :
       {"--tls_ca=" + certs + "/ca.pem", "--tls_cert=" + certs + "/client.pem",
        "--tls_key=" + certs + "/client.key", "--auth_token_file=" + certs + "/token",
        "--etcd_ca=" + certs + "/ca.pem", "--etcd_cert=" + certs + "/client.pem",
        "--etcd_key=" + certs + "/client.key"}) {
    options.worker_flags.push_back(flag);
  }
  ProcessGroup group;
  absl::StatusOr<LocalCluster> cluster = testutil::StartLocalCluster(group, options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  WaitForSteps(*cluster, 0, kStepsPerEpoch / 3);
  ExpectTheDataPortsInUse(*cluster);
  ASSERT_TRUE(group.Signal(cluster->shards[1], SIGKILL).ok());
  (void)group.Wait(cluster->shards[1], absl::Seconds(10));
  Finish(group, *cluster);
  // The replicas' state, read the way the workers do: over mutual TLS.
  std::map<std::string, int64_t> versions;
  for (int g = 0; g < kShards; ++g) {
    absl::StatusOr<chain::ChainConfig> chain = chain::ReadChain(**client, "mtls", g);
    ASSERT_TRUE(chain.ok()) << chain.status();
    EXPECT_FALSE(chain->Contains(1));
    GroupState(*cluster, chain->tail().shard, g, &versions,
               TlsCredentials(certs + "/ca.pem", certs + "/client.pem", certs + "/client.key"),
               testutil::ReadFile(certs + "/token"));
  }
  std::filesystem::remove_all(certs);
  ASSERT_FALSE(versions.empty());
  for (const auto& [key, version] : versions) {
    EXPECT_EQ(version, int64_t{kWorkers} * kStepsPerEpoch) << key;
  }
}

// Sync, R=2, with checkpoints: every shard and worker is SIGKILLed at once
// (every copy of every group dies; the chains in etcd still list the dead
// incarnations) and the job is started again with the same flags, ports
// and etcd. The restarted shards take the groups over from their
// checkpoints (one per group; the other rejoins as its tail), the workers
// resume there, and the job ends at a full run's step count with head and
// tail identical.
void RunWholeJobRestart(const EtcdProcess& etcd, etcd::EtcdClient& client,
                        const std::string& job, bool drop_newest_checkpoints) {
  constexpr int kEpochs = 2;
  const std::string dir = testutil::MakeTempDir("shardtrain-replicated-resume-");
  LocalClusterOptions options = Job("sync", job, etcd.endpoint(), kEpochs);
  options.dir = dir;
  options.server_flags.push_back("--checkpoint_dir=" + dir + "/checkpoints");
  options.server_flags.push_back("--checkpoint_every_steps=50");
  ProcessGroup group;
  absl::StatusOr<LocalCluster> first = testutil::StartLocalCluster(group, options);
  ASSERT_TRUE(first.ok()) << first.status();
  WaitForSteps(*first, 0, kStepsPerEpoch + 20);
  for (pid_t pid : first->workers) ASSERT_TRUE(group.Signal(pid, SIGKILL).ok());
  for (pid_t pid : first->shards) ASSERT_TRUE(group.Signal(pid, SIGKILL).ok());
  group.StopAll();
  if (drop_newest_checkpoints) {
    // Shards 0 and 1 were killed before writing their newest step
    // checkpoint: group 0 restores an older step, and so does every group
    // shard 0 or 1 takes over; one shard 2 takes over is a step interval ahead.
    for (const std::string prefix : {"shard-0-of-", "shard-1-of-"}) {
      std::vector<std::string> files;  // oldest first
      for (const auto& entry : std::filesystem::directory_iterator(dir + "/checkpoints")) {
        const std::string name = entry.path().filename().string();
        if (absl::StartsWith(name, prefix) && absl::EndsWith(name, ".ckpt")) {
          files.push_back(entry.path().string());
        }
      }
      std::sort(files.begin(), files.end());
      ASSERT_GE(files.size(), 2u) << "a shard keeps its previous step checkpoint";
      ASSERT_TRUE(std::filesystem::remove(files.back()));
    }
  }
  for (const std::string& server : first->servers) {
    int port = 0;
    ASSERT_TRUE(absl::SimpleAtoi(server.substr(server.rfind(':') + 1), &port));
    options.shard_ports.push_back(port);
  }
  absl::StatusOr<LocalCluster> second = testutil::StartLocalCluster(group, options);
  ASSERT_TRUE(second.ok()) << second.status();
  Finish(group, *second);
  const std::string chief = testutil::ReadFile(second->WorkerLog(0));
  EXPECT_NE(chief.find("resuming at step"), std::string::npos)
      << "the chief did not resume; its log:\n" << chief;
  int compared = 0;
  for (int g = 0; g < kShards; ++g) {
    absl::StatusOr<chain::ChainConfig> chain = chain::ReadChain(client, job, g);
    ASSERT_TRUE(chain.ok()) << chain.status();
    ASSERT_EQ(chain->members.size(), 2u) << "group " << g << " did not get its replica back";
    std::map<std::string, int64_t> versions;
    const auto head = GroupState(*second, chain->head().shard, g, &versions);
    const auto tail = GroupState(*second, chain->tail().shard, g, nullptr);
    EXPECT_TRUE(head == tail) << "group " << g << ": head and tail differ";
    for (const auto& [key, version] : versions) {
      EXPECT_EQ(version, int64_t{kEpochs} * kStepsPerEpoch) << key;
    }
    compared += static_cast<int>(head.size());
  }
  EXPECT_GT(compared, 0);
  int taken_over = 0;
  for (int s = 0; s < kShards; ++s) {
    const std::string log = testutil::ReadFile(second->ShardLog(s));
    for (size_t at = log.find("takes it over"); at != std::string::npos;
         at = log.find("takes it over", at + 1)) {
      ++taken_over;
    }
  }
  long long resumed = -1;
  const size_t at = chief.find("resuming at step ");
  if (at != std::string::npos) std::sscanf(chief.c_str() + at, "resuming at step %lld", &resumed);
  bool gap = false;
  for (int w = 0; w < kWorkers; ++w) {
    gap = gap || absl::StrContains(testutil::ReadFile(second->WorkerLog(w)),
                                   "restored an older step checkpoint");
  }
  std::printf("WHOLE-JOB RESTART%s: killed after step %d, the chief resumed at step %lld; %d "
              "group(s) taken over by a restarted shard as their last copy; %s\n",
              drop_newest_checkpoints ? " (newest checkpoints of shards 0, 1 dropped)" : "",
              kStepsPerEpoch + 20, resumed, taken_over,
              gap ? "groups restored different steps, the older caught up"
                  : "every group restored the same step");
  // Stopped first: a running shard may rotate a checkpoint while the
  // directory is removed.
  group.StopAll();
  if (!::testing::Test::HasFailure()) std::filesystem::remove_all(dir);
}

TEST_F(ReplicationTest, WholeJobRestartResumesFromCheckpoints) {
  RunWholeJobRestart(*etcd_, *client_, "resume", /*drop_newest_checkpoints=*/false);
}

// The same, the job killed between the shards' writes of a step checkpoint
// (they can be ~0.1 s apart): groups restore different steps; the workers
// go on at the newest, the older groups (head and tail alike) catch up on
// the first push, and the job still ends at a full run's step count with
// every head and tail identical.
TEST_F(ReplicationTest, WholeJobKilledBetweenCheckpointWrites) {
  RunWholeJobRestart(*etcd_, *client_, "resumegap", /*drop_newest_checkpoints=*/true);
}

// A shard SIGSTOPped past its lease is dropped; the workers' calls stuck on
// it (and its successor's forwards to it) go to the new chains at once,
// so no worker stalls much longer than the lease. Once SIGCONTed it
// refuses every push and pull for its old epoch, and the job is not
// confused.
constexpr int kSplitBrainEpochs = 4;

TEST_F(ReplicationTest, SplitBrain) {
  ProcessGroup group;
  absl::StatusOr<LocalCluster> cluster = testutil::StartLocalCluster(
      group, Job("async", "split", etcd_->endpoint(), kSplitBrainEpochs));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  WaitForSteps(*cluster, 0, kStepsPerEpoch / 3);
  StatusResponse status;
  {
    auto stub = ParameterServer::NewStub(
        grpc::CreateChannel(cluster->servers[0], grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    StatusRequest request;
    request.set_max_partitions(1000);
    ASSERT_TRUE(stub->Status(&context, request, &status).ok());
  }
  int64_t epoch = 0;
  StopShard0AndMeasureStall(group, *cluster, *client_, "split", 200, &epoch);
  if (HasFatalFailure()) return;
  EXPECT_LT(WorkerSteps(*cluster, 0), kSplitBrainEpochs * kStepsPerEpoch);
  ASSERT_TRUE(group.Signal(cluster->shards[0], SIGCONT).ok());
  // Straight away, with the epoch it was head at.
  auto stub = ParameterServer::NewStub(
      grpc::CreateChannel(cluster->servers[0], grpc::InsecureChannelCredentials()));
  PushRequest push;
  push.set_worker(0);
  push.set_clock(1);
  push.set_chain_epoch(static_cast<uint64_t>(epoch));
  PullRequest pull;
  pull.set_worker(0);
  pull.set_chain_epoch(static_cast<uint64_t>(epoch));
  for (const PartitionInfo& info : status.partitions()) {
    GradientPart& part = *push.add_parts();
    part.mutable_key()->set_tensor(info.tensor());
    part.mutable_key()->set_partition(info.partition());
    part.set_version(info.version());
    part.mutable_grad()->set_dtype(DTYPE_F32);
    part.mutable_grad()->set_data(std::string(static_cast<size_t>(info.size()) * 4, '\0'));
    break;  // one partition of group 0
  }
  ASSERT_GT(push.parts_size(), 0);
  *pull.add_parts() = push.parts(0).key();
  {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    PushResponse response;
    const grpc::Status refused = stub->Push(&context, push, &response);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE) << refused.error_message();
  }
  {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    PullResponse response;
    const grpc::Status refused = stub->Pull(&context, pull, &response);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE) << refused.error_message();
  }
  Finish(group, *cluster);
  ExpectEveryPushApplied(*client_, "split", *cluster,
                         int64_t{kWorkers} * kSplitBrainEpochs * kStepsPerEpoch);
}

// Sync, R=2: the head of group 0 SIGSTOPped mid-run (no reset reaches
// anyone). A sync step needs every group, so every worker waits on it
// until its chains drop it: no longer than for a SIGKILL. SIGCONTed, it
// finds its lease gone and rejoins as a tail. Every step is applied once
// (each partition's version is the job's step count) and every group's
// head and tail end bit-identical.
constexpr int kSyncHangEpochs = 3;

TEST_F(ReplicationTest, SyncHeadHangs) {
  ProcessGroup group;
  absl::StatusOr<LocalCluster> cluster = testutil::StartLocalCluster(
      group, Job("sync", "synchang", etcd_->endpoint(), kSyncHangEpochs));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  WaitForSteps(*cluster, 0, kStepsPerEpoch / 3);
  StopShard0AndMeasureStall(group, *cluster, *client_, "synchang", 100);
  if (HasFatalFailure()) return;
  ASSERT_TRUE(group.Signal(cluster->shards[0], SIGCONT).ok());
  ASSERT_TRUE(WaitForRejoin(*client_, "synchang", 0))
      << "shard 0 did not rejoin its chains:\n"
      << testutil::ReadFile(cluster->ShardLog(0));
  EXPECT_LT(WorkerSteps(*cluster, 0), kSyncHangEpochs * kStepsPerEpoch)
      << "the job ended before shard 0 rejoined";
  Finish(group, *cluster);
  std::map<std::string, int64_t> versions;
  int compared = 0;
  for (int g = 0; g < kShards; ++g) {
    absl::StatusOr<chain::ChainConfig> chain = chain::ReadChain(*client_, "synchang", g);
    ASSERT_TRUE(chain.ok()) << chain.status();
    ASSERT_EQ(chain->members.size(), 2u);
    const auto head = GroupState(*cluster, chain->head().shard, g, nullptr);
    const auto tail = GroupState(*cluster, chain->tail().shard, g, &versions);
    ASSERT_FALSE(head.empty());
    EXPECT_TRUE(head == tail) << "group " << g << ": head shard " << chain->head().shard
                              << " and tail shard " << chain->tail().shard << " differ";
    compared += static_cast<int>(head.size());
  }
  ASSERT_FALSE(versions.empty());
  for (const auto& [key, version] : versions) {
    EXPECT_EQ(version, kSyncHangEpochs * kStepsPerEpoch) << key << ": steps lost or applied twice";
  }
  std::printf("SYNC HANG: %d partitions identical on head and tail\n", compared);
}

// Async, two faults in a row: every shard but 0 is SIGKILLed (group 0's
// chain is shard 0 alone), then shard 0, now group 0's only copy, is
// SIGSTOPped and the others restarted: they rejoin group 0 as tails and
// cannot copy the state from the stopped shard 0, whose lease runs out.
// None of them may drop shard 0 and serve group 0 with what it restored
// (its checkpoint or nothing): they wait (--last_copy_wait_s) for shard 0,
// which is SIGCONTed after 6 s (the tails would have dropped it after
// about 2), resumes as head and hands the state over. With R=3 the second
// tail finds the first one still copying. Every push is applied once.
constexpr int kLastCopyEpochs = 6;

void RunLastCopyHangs(const EtcdProcess& etcd, etcd::EtcdClient& client, const std::string& job,
                      int replicas) {
  ProcessGroup group;
  absl::StatusOr<LocalCluster> cluster = testutil::StartLocalCluster(
      group, Job("async", job, etcd.endpoint(), kLastCopyEpochs, replicas));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  WaitForSteps(*cluster, 0, kStepsPerEpoch / 3);
  for (int s = 1; s < replicas; ++s) {
    ASSERT_TRUE(group.Signal(cluster->shards[s], SIGKILL).ok());
    (void)group.Wait(cluster->shards[s], absl::Seconds(10));
  }
  ASSERT_TRUE(WaitForChains(
      client, job,
      [](const chain::ChainConfig& c) { return c.group != 0 || c.members.size() == 1; },
      absl::Seconds(10)));
  ASSERT_TRUE(group.Signal(cluster->shards[0], SIGSTOP).ok());
  const absl::Time stopped = absl::Now();
  for (int s = 1; s < replicas; ++s) ASSERT_TRUE(testutil::RestartShard(group, *cluster, s).ok());
  absl::SleepFor(stopped + absl::Seconds(6) - absl::Now());
  absl::StatusOr<chain::ChainConfig> waiting = chain::ReadChain(client, job, 0);
  ASSERT_TRUE(waiting.ok()) << waiting.status();
  EXPECT_TRUE(waiting->Contains(0)) << "a tail still copying dropped group 0's only copy";
  ASSERT_TRUE(group.Signal(cluster->shards[0], SIGCONT).ok());
  ASSERT_TRUE(WaitForChains(
      client, job,
      [replicas](const chain::ChainConfig& c) {
        return static_cast<int>(c.members.size()) == replicas;
      },
      absl::Seconds(30)))
      << "the chains did not get back to " << replicas << " members:\n"
      << testutil::ReadFile(cluster->ShardLog(1));
  // Which tail logs it first depends on the order they joined the chains in.
  bool waited = false;
  for (int s = 1; s < replicas; ++s) {
    waited = waited || absl::StrContains(testutil::ReadFile(cluster->ShardLog(s)),
                                         "for it to come back");
  }
  EXPECT_TRUE(waited) << "no rejoining tail waited for shard 0";
  EXPECT_LT(WorkerSteps(*cluster, 0), kLastCopyEpochs * kStepsPerEpoch)
      << "the job ended before group 0 was whole again";
  Finish(group, *cluster);
  ExpectEveryPushApplied(client, job, *cluster,
                         int64_t{kWorkers} * kLastCopyEpochs * kStepsPerEpoch);
}

TEST_F(ReplicationTest, RejoiningTailWaitsForTheLastCopy) {
  RunLastCopyHangs(*etcd_, *client_, "lastcopy", 2);
}

TEST_F(ReplicationTest, TwoRejoiningTailsWaitForTheLastCopy) {
  RunLastCopyHangs(*etcd_, *client_, "lastcopy3", 3);
}

// Async, R=2, with checkpoints every second: shard 1 is SIGKILLed, shard 0
// trains group 0 alone for 4 s (and checkpoints it), is SIGSTOPped (the
// workers are stopped there too: they cannot yet follow a group that goes
// back to a checkpoint, see the README), shard 1 restarts and rejoins group
// 0 as a tail that cannot copy the state; then shard 0 is SIGKILLed and
// restarted from its checkpoint. It finds the only member left still
// copying and takes group 0 over with its checkpoint, not shard 1's older
// one: group 0 comes back at a version from after shard 1 died.
TEST_F(ReplicationTest, RestartedLastCopyTakesOverFromItsCheckpoint) {
  const std::string dir = testutil::MakeTempDir("shardtrain-lastcheckpoint-");
  LocalClusterOptions options = Job("async", "lastckpt", etcd_->endpoint(), 20);
  options.dir = dir;
  options.server_flags.push_back("--checkpoint_dir=" + dir + "/checkpoints");
  options.server_flags.push_back("--checkpoint_interval_s=1");
  ProcessGroup group;
  absl::StatusOr<LocalCluster> cluster = testutil::StartLocalCluster(group, options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  WaitForSteps(*cluster, 0, kStepsPerEpoch / 3);
  ASSERT_TRUE(group.Signal(cluster->shards[1], SIGKILL).ok());
  (void)group.Wait(cluster->shards[1], absl::Seconds(10));
  int64_t at_kill = 0;
  for (int w = 0; w < kWorkers; ++w) at_kill += WorkerSteps(*cluster, w);
  ASSERT_TRUE(WaitForChains(
      *client_, "lastckpt",
      [](const chain::ChainConfig& c) { return c.group != 0 || c.members.size() == 1; },
      absl::Seconds(10)));
  absl::SleepFor(absl::Seconds(4));
  int64_t at_stop = 0;
  for (int w = 0; w < kWorkers; ++w) at_stop += WorkerSteps(*cluster, w);
  ASSERT_GT(at_stop - at_kill, 400) << "too few pushes while shard 0 held group 0 alone";
  ASSERT_TRUE(group.Signal(cluster->shards[0], SIGSTOP).ok());
  for (pid_t worker : cluster->workers) ASSERT_TRUE(group.Signal(worker, SIGKILL).ok());
  ASSERT_TRUE(testutil::RestartShard(group, *cluster, 1).ok());
  absl::SleepFor(absl::Seconds(3));
  ASSERT_TRUE(group.Signal(cluster->shards[0], SIGKILL).ok());
  (void)group.Wait(cluster->shards[0], absl::Seconds(10));
  ASSERT_TRUE(testutil::RestartShard(group, *cluster, 0).ok());
  ASSERT_TRUE(WaitForChains(
      *client_, "lastckpt",
      [](const chain::ChainConfig& c) {
        return c.members.size() == 2 && (c.group != 0 || c.epoch >= 4);
      },
      absl::Seconds(20)))
      << "the chains did not get back to 2 members; shard 1's log:\n"
      << testutil::ReadFile(cluster->ShardLog(1));
  EXPECT_NE(testutil::ReadFile(cluster->ShardLog(0)).find("the members left were still copying"),
            std::string::npos)
      << "the restarted shard 0 did not take group 0 over";
  absl::StatusOr<chain::ChainConfig> chain = chain::ReadChain(*client_, "lastckpt", 0);
  ASSERT_TRUE(chain.ok()) << chain.status();
  EXPECT_EQ(chain->head().shard, 0);
  std::map<std::string, int64_t> versions;
  GroupState(*cluster, chain->head().shard, 0, &versions);  // the tail may still copy it
  ASSERT_FALSE(versions.empty());
  int64_t oldest = std::numeric_limits<int64_t>::max();
  for (const auto& [key, version] : versions) oldest = std::min(oldest, version);
  std::printf("LAST CHECKPOINT: group 0 at version %lld after the takeover; %lld pushes when "
              "shard 1 died, %lld when shard 0 stopped\n",
              static_cast<long long>(oldest), static_cast<long long>(at_kill),
              static_cast<long long>(at_stop));
  EXPECT_GT(oldest, at_kill + (at_stop - at_kill) / 4)
      << "group 0 went back to before shard 1 died (shard 1's checkpoint)";
  // Stopped first: a running shard may rotate a checkpoint while the
  // directory is removed.
  group.StopAll();
  if (!::testing::Test::HasFailure()) std::filesystem::remove_all(dir);
}

// A job with one shard in a network namespace of its own (see NetNs), and
// etcd, the other shards and the workers on this side of its link.
struct IsolatedShardJob {
  std::unique_ptr<testutil::NetNs> ns;
  std::unique_ptr<EtcdProcess> etcd;
  std::unique_ptr<etcd::EtcdClient> client;
  ProcessGroup group;  // stopped before etcd and the namespace go
  LocalCluster cluster;
};

// Starts `name` (async, R=2, `epochs`) with shard `isolated` in its own
// namespace and `server_flags` added, waits until worker 0 is a third
// into its first epoch and checks that shard 0 heads group 0. Returns why the test must skip (no network
// namespaces), else empty; a failure to start is a fatal test failure.
std::string StartIsolatedShardJob(const std::string& name, int epochs, int isolated,
                                  const std::vector<std::string>& server_flags,
                                  IsolatedShardJob& job) {
  absl::StatusOr<std::unique_ptr<testutil::NetNs>> ns = testutil::NetNs::Create();
  if (!ns.ok()) return "network namespaces are not available: " + ns.status().ToString();
  job.ns = *std::move(ns);
  absl::StatusOr<std::unique_ptr<EtcdProcess>> etcd = EtcdProcess::Start(job.ns->host_addr());
  [&] { ASSERT_TRUE(etcd.ok()) << etcd.status(); }();
  if (!etcd.ok()) return "";
  job.etcd = *std::move(etcd);
  job.client = Connect(job.etcd->endpoint());
  if (job.client == nullptr) return "";
  LocalClusterOptions options = Job("async", name, job.etcd->endpoint(), epochs);
  options.server_flags.insert(options.server_flags.end(), server_flags.begin(),
                              server_flags.end());
  options.listen_host = job.ns->host_addr();
  options.shard_listen_host[isolated] = job.ns->ns_addr();
  options.shard_prefix[isolated] = job.ns->Exec();
  absl::StatusOr<LocalCluster> cluster = testutil::StartLocalCluster(job.group, options);
  [&] { ASSERT_TRUE(cluster.ok()) << cluster.status(); }();
  if (!cluster.ok()) return "";
  job.cluster = *std::move(cluster);
  WaitForSteps(job.cluster, 0, kStepsPerEpoch / 3);
  absl::StatusOr<chain::ChainConfig> chain = chain::ReadChain(*job.client, name, 0);
  [&] {
    ASSERT_TRUE(chain.ok()) << chain.status();
    ASSERT_EQ(chain->head().shard, 0) << "group 0's chain is not headed by shard 0";
  }();
  return "";
}

// Async, R=2: shard 0 runs in its own network namespace, and its link is
// cut for 5 s: no reset reaches anyone, and it keeps running. Its chains
// drop it, the workers' calls stuck on it go to the new heads (no worker
// stalls much longer than the lease), and once the link is back it finds
// its lease gone, stops serving its old chains, takes a new lease and
// rejoins them as a tail. Nothing is lost.
constexpr int kCutOffEpochs = 16;

TEST_F(ReplicationTest, HeadCutOff) {
  if (access("/usr/sbin/ip", X_OK) != 0) GTEST_SKIP() << "no /usr/sbin/ip";
  IsolatedShardJob job;
  const std::string skip = StartIsolatedShardJob("cutoff", kCutOffEpochs, 0, {}, job);
  if (!skip.empty()) GTEST_SKIP() << skip;
  ASSERT_FALSE(HasFatalFailure());
  // Frames calls, then, are what gets stuck on shard 0 (in its namespace).
  ExpectTheDataPortsInUse(job.cluster, /*unreachable=*/0);

  ASSERT_TRUE(job.ns->SetLink(false).ok());
  const absl::Time cut = absl::Now();
  const absl::Duration stall = LongestStall(job.cluster, 200, absl::Seconds(30));
  std::printf("LINK CUT: the longest a worker went without a step: %s\n",
              absl::FormatDuration(stall).c_str());
  EXPECT_LE(stall, kMaxStall) << "calls waited on the cut-off shard";
  ASSERT_TRUE(WaitForChains(
      *job.client, "cutoff", [](const chain::ChainConfig& c) { return !c.Contains(0); },
      absl::Seconds(10)))
      << "shard 0 was not dropped from its chains";
  absl::SleepFor(cut + absl::Seconds(5) - absl::Now());
  absl::Status restored = job.ns->SetLink(true);
  ASSERT_TRUE(restored.ok()) << restored;
  const absl::Time back = absl::Now();
  ASSERT_TRUE(WaitForRejoin(*job.client, "cutoff", 0))
      << "shard 0 did not rejoin its chains:\n"
      << testutil::ReadFile(job.cluster.ShardLog(0));
  std::printf("LINK BACK: shard 0 back in its chains %s later; worker 0 at step %lld of %d\n",
              absl::FormatDuration(absl::Now() - back).c_str(),
              static_cast<long long>(WorkerSteps(job.cluster, 0)), kCutOffEpochs * kStepsPerEpoch);
  EXPECT_LT(WorkerSteps(job.cluster, 0), kCutOffEpochs * kStepsPerEpoch)
      << "the job ended before shard 0 rejoined";
  EXPECT_NE(testutil::ReadFile(job.cluster.ShardLog(0)).find("lease expired"), std::string::npos)
      << "shard 0 did not notice its lease had expired";
  Finish(job.group, job.cluster);
  ExpectEveryPushApplied(*job.client, "cutoff", job.cluster,
                         int64_t{kWorkers} * kCutOffEpochs * kStepsPerEpoch);
}

// Shard 1, group 0's tail (behind shard 0), stops answering for 3 s with its
// etcd lease alive, so it stays in the chain: its gRPC port and its data
// port (where the head's forwards go) are silenced (no reset), as when a
// container network took 30-50 s to resolve a peer's name. With
// --forward_timeout_s=1 the head's forwards outlive their timeout: the
// workers are told to retry, the forwards go on, and the job goes on once
// shard 1 answers, with every push applied once. Before, the head dropped
// the forwards at the timeout: shard 1 waited forever for the operations it
// never got and the job made no progress.
TEST_F(ReplicationTest, SuccessorSilentPastTheForwardTimeout) {
  if (access("/usr/sbin/ip", X_OK) != 0 || access("/usr/sbin/iptables", X_OK) != 0) {
    GTEST_SKIP() << "no /usr/sbin/ip or /usr/sbin/iptables";
  }
  constexpr int kEpochs = 2;
  IsolatedShardJob job;
  const std::string skip =
      StartIsolatedShardJob("silent", kEpochs, 1, {"--forward_timeout_s=1"}, job);
  if (!skip.empty()) GTEST_SKIP() << skip;
  ASSERT_FALSE(HasFatalFailure());
  absl::StatusOr<chain::ChainConfig> before = chain::ReadChain(*job.client, "silent", 0);
  ASSERT_TRUE(before.ok()) << before.status();
  ASSERT_EQ(before->tail().shard, 1);
  int port = 0;
  const std::string& address = job.cluster.servers[1];
  ASSERT_TRUE(absl::SimpleAtoi(address.substr(address.rfind(':') + 1), &port)) << address;
  StatusResponse status;
  {
    auto stub =
        ParameterServer::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    StatusRequest request;
    request.set_max_partitions(1);
    ASSERT_TRUE(stub->Status(&context, request, &status).ok());
  }
  const int data_port = static_cast<int>(status.data_port());
  ASSERT_GT(data_port, 0) << "shard 1 opened no data port";

  ASSERT_TRUE(job.ns->SetPortOpen(port, false).ok());
  ASSERT_TRUE(job.ns->SetPortOpen(data_port, false).ok());
  absl::SleepFor(absl::Seconds(3));
  absl::Status reopened = job.ns->SetPortOpen(data_port, true);
  ASSERT_TRUE(reopened.ok()) << reopened;
  reopened = job.ns->SetPortOpen(port, true);
  ASSERT_TRUE(reopened.ok()) << reopened;
  const int64_t steps_at_reopen = WorkerSteps(job.cluster, 0);
  absl::StatusOr<std::string> metrics =
      testutil::HttpGet(job.cluster.shard_metrics_ports[0], "/metrics");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  const double late = testutil::SumByName(*metrics)["shardtrain_replication_late_forwards_total"];
  std::printf("PORT SILENT 3 s: %.0f pushes not at the tail within 1 s; worker 0 at step %lld\n",
              late, static_cast<long long>(steps_at_reopen));
  EXPECT_GT(late, 0) << "no forward outlived its timeout: the test did not test it";
  WaitForSteps(job.cluster, 0, steps_at_reopen + 50);
  EXPECT_GE(WorkerSteps(job.cluster, 0), steps_at_reopen + 50)
      << "no progress once shard 1 answered again";
  absl::StatusOr<chain::ChainConfig> after = chain::ReadChain(*job.client, "silent", 0);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_TRUE(after->Contains(1)) << "shard 1 was dropped: its lease did not stay alive";
  Finish(job.group, job.cluster);
  ExpectEveryPushApplied(*job.client, "silent", job.cluster,
                         int64_t{kWorkers} * kEpochs * kStepsPerEpoch);
}

// etcd stopped for 10 s: training goes on. A shard killed meanwhile is
// dropped once etcd is back, and nothing is lost.
constexpr int kEtcdDownEpochs = 6;

TEST_F(ReplicationTest, EtcdDown) {
  ProcessGroup group;
  absl::StatusOr<LocalCluster> cluster =
      testutil::StartLocalCluster(
          group, Job("async", "etcddown", etcd_->endpoint(), kEtcdDownEpochs));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  WaitForSteps(*cluster, 0, kStepsPerEpoch / 4);
  ASSERT_TRUE(etcd_->Pause().ok());
  const int64_t paused_at = WorkerSteps(*cluster, 0);
  absl::SleepFor(absl::Seconds(3));
  const int64_t after_3s = WorkerSteps(*cluster, 0);
  EXPECT_GT(after_3s, paused_at + 20) << "training stalled while etcd was down";
  std::printf("ETCD DOWN: worker 0 went from step %lld to %lld in 3 s with etcd stopped\n",
              static_cast<long long>(paused_at), static_cast<long long>(after_3s));
  ASSERT_TRUE(group.Signal(cluster->shards[2], SIGKILL).ok());
  (void)group.Wait(cluster->shards[2], absl::Seconds(10));
  absl::SleepFor(absl::Seconds(7));  // etcd down 10 s in all
  ASSERT_TRUE(etcd_->Resume().ok());
  ASSERT_TRUE(WaitForChains(
      *client_, "etcddown", [](const chain::ChainConfig& c) { return !c.Contains(2); },
      absl::Seconds(20)))
      << "shard 2 was not dropped once etcd was back";
  Finish(group, *cluster);
  // Every lease expired during the outage; the shards re-take theirs before
  // changing any chain, so the chains change a few times, not in a storm of
  // members dropping and re-adding each other (it once lost updates).
  for (int g = 0; g < kShards; ++g) {
    absl::StatusOr<chain::ChainConfig> chain = chain::ReadChain(*client_, "etcddown", g);
    ASSERT_TRUE(chain.ok()) << chain.status();
    EXPECT_LE(chain->epoch, 6) << "group " << g << "'s chain changed " << chain->epoch - 1
                               << " times";
  }
  ExpectEveryPushApplied(*client_, "etcddown", *cluster,
                         int64_t{kWorkers} * kEtcdDownEpochs * kStepsPerEpoch);
}

// etcd loses its data mid-run (restarted empty, as after a lost volume):
// every key, lease and revision is gone. The shards take new leases and put
// back the chains they hold, an epoch later, training goes on, a shard
// killed afterwards is still dropped from its chains, and nothing is lost.
constexpr int kEtcdWipedEpochs = 8;

TEST_F(ReplicationTest, EtcdLosesItsData) {
  ProcessGroup group;
  absl::StatusOr<LocalCluster> cluster = testutil::StartLocalCluster(
      group, Job("async", "wiped", etcd_->endpoint(), kEtcdWipedEpochs));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  WaitForSteps(*cluster, 0, kStepsPerEpoch / 4);
  std::vector<int64_t> epochs;
  for (int g = 0; g < kShards; ++g) {
    absl::StatusOr<chain::ChainConfig> chain = chain::ReadChain(*client_, "wiped", g);
    ASSERT_TRUE(chain.ok()) << chain.status();
    epochs.push_back(chain->epoch);
  }
  // A job that has run a while: etcd's revision is far past what it
  // starts again from.
  for (int i = 0; i < 300; ++i) ASSERT_TRUE(client_->Put("/elsewhere", "x").ok());
  ASSERT_TRUE(etcd_->RestartEmpty().ok());
  const absl::Time wiped = absl::Now();
  ASSERT_TRUE(WaitForChains(
      *client_, "wiped",
      [&epochs](const chain::ChainConfig& c) {
        return c.members.size() == 2 && c.epoch > epochs[c.group];
      },
      absl::Seconds(20)))
      << "the chains were not put back:\n" << testutil::ReadFile(cluster->ShardLog(0));
  std::printf("ETCD WIPED: the chains were back %s later\n",
              absl::FormatDuration(absl::Now() - wiped).c_str());
  const int64_t back_at = WorkerSteps(*cluster, 0);
  WaitForSteps(*cluster, 0, back_at + 100);
  EXPECT_GE(WorkerSteps(*cluster, 0), back_at + 100) << "training did not go on";
  EXPECT_LT(WorkerSteps(*cluster, 0), kEtcdWipedEpochs * kStepsPerEpoch)
      << "the job ended before the shard kill";
  ASSERT_TRUE(group.Signal(cluster->shards[2], SIGKILL).ok());
  (void)group.Wait(cluster->shards[2], absl::Seconds(10));
  ASSERT_TRUE(WaitForChains(
      *client_, "wiped", [](const chain::ChainConfig& c) { return !c.Contains(2); },
      absl::Seconds(10)))
      << "shard 2 was not dropped after the wipe";
  Finish(group, *cluster);
  ExpectEveryPushApplied(*client_, "wiped", *cluster,
                         int64_t{kWorkers} * kEtcdWipedEpochs * kStepsPerEpoch);
}

// A second ps-server started as shard 0 of a running job (another job on
// the same etcd that kept the same --job, or a shard started twice) refuses
// to start, naming the live shard 0, within about two lease ttls; the job
// does not notice. Then shard 0 is SIGKILLed and restarted at once, its
// old lease still alive: it waits that lease out, takes its place and
// rejoins its chains; nothing is lost.
constexpr int kDuplicateEpochs = 10;

TEST_F(ReplicationTest, DuplicateShardIsRefused) {
  ProcessGroup group;
  absl::StatusOr<LocalCluster> cluster = testutil::StartLocalCluster(
      group, Job("async", "dup", etcd_->endpoint(), kDuplicateEpochs));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  WaitForSteps(*cluster, 0, kStepsPerEpoch / 4);
  std::vector<std::string> argv = cluster->shard_argv[0];
  absl::StatusOr<int> port = testutil::PickFreePort();
  ASSERT_TRUE(port.ok()) << port.status();
  for (std::string& arg : argv) {
    if (absl::StartsWith(arg, "--listen=")) arg = absl::StrCat("--listen=127.0.0.1:", *port);
    if (absl::StartsWith(arg, "--port_file=")) arg += ".duplicate";
  }
  const std::string log = cluster->dir + "/duplicate.log";
  const absl::Time started = absl::Now();
  absl::StatusOr<pid_t> duplicate = group.Start(argv, log);
  ASSERT_TRUE(duplicate.ok()) << duplicate.status();
  absl::StatusOr<int> exit = group.Wait(*duplicate, absl::Seconds(20));
  ASSERT_TRUE(exit.ok()) << "the second shard 0 is still running:\n" << testutil::ReadFile(log);
  std::printf("DUPLICATE: the second shard 0 exited with %d after %s\n", *exit,
              absl::FormatDuration(absl::Now() - started).c_str());
  EXPECT_NE(*exit, 0);
  const std::string expected =
      "shard 0 of job 'dup' is already live at " + cluster->servers[0];
  EXPECT_NE(testutil::ReadFile(log).find(expected), std::string::npos)
      << "no \"" << expected << "\" in its log:\n" << testutil::ReadFile(log);
  EXPECT_LT(WorkerSteps(*cluster, 0), kDuplicateEpochs * kStepsPerEpoch)
      << "the job ended before the second shard 0 gave up";
  for (int g = 0; g < kShards; ++g) {
    absl::StatusOr<chain::ChainConfig> chain = chain::ReadChain(*client_, "dup", g);
    ASSERT_TRUE(chain.ok()) << chain.status();
    EXPECT_EQ(chain->epoch, 1) << "group " << g << "'s chain changed";
  }

  ASSERT_TRUE(group.Signal(cluster->shards[0], SIGKILL).ok());
  (void)group.Wait(cluster->shards[0], absl::Seconds(10));
  ASSERT_TRUE(testutil::RestartShard(group, *cluster, 0).ok());
  ASSERT_TRUE(WaitForRejoin(*client_, "dup", 0))
      << "the restarted shard 0 did not rejoin its chains:\n"
      << testutil::ReadFile(cluster->ShardLog(0));
  EXPECT_LT(WorkerSteps(*cluster, 0), kDuplicateEpochs * kStepsPerEpoch)
      << "the job ended before shard 0 rejoined";
  Finish(group, *cluster);
  ExpectEveryPushApplied(*client_, "dup", *cluster,
                         int64_t{kWorkers} * kDuplicateEpochs * kStepsPerEpoch);
}

// Async, R=2: a shard started again for the same job with another layout (a
// mistyped restart): --replicas=3, --num_shards=4, --num_shards=2. Each exits at once
// naming what etcd's chains keep, before it takes a lease or touches a
// chain; the job goes on.
TEST_F(ReplicationTest, ChangedLayoutIsRefused) {
  ProcessGroup group;
  absl::StatusOr<LocalCluster> cluster =
      testutil::StartLocalCluster(group, Job("async", "relayout", etcd_->endpoint(), 2));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  WaitForSteps(*cluster, 0, kStepsPerEpoch / 4);
  struct Relayout {
    int shard;
    std::string from, to, expected;
  };
  const std::string shards_flag = absl::StrCat("--num_shards=", kShards);
  const Relayout relayouts[] = {
      {2, "--replicas=2", "--replicas=3",
       "keeps 2 replicas, but this shard was started with --replicas=3"},
      // Group 2's chain is [2, 0]; with 4 shards it would be [2, 3].
      {2, shards_flag, "--num_shards=4",
       "has shard 0 as a member, which a job of --num_shards=4 --replicas=2 never places in "
       "that group"},
      {1, shards_flag, "--num_shards=2",
       "holds a chain of group 2 of job 'relayout' (/shardtrain/relayout/chains/2), which a "
       "job of --num_shards=2 does not have"},
  };
  for (int r = 0; r < 3; ++r) {
    const Relayout& relayout = relayouts[r];
    std::vector<std::string> argv = cluster->shard_argv[relayout.shard];
    absl::StatusOr<int> port = testutil::PickFreePort();
    ASSERT_TRUE(port.ok()) << port.status();
    bool changed = false;
    for (std::string& arg : argv) {
      if (absl::StartsWith(arg, "--listen=")) arg = absl::StrCat("--listen=127.0.0.1:", *port);
      if (absl::StartsWith(arg, "--port_file=")) arg += absl::StrCat(".relayout", r);
      if (arg == relayout.from) {
        arg = relayout.to;
        changed = true;
      }
    }
    ASSERT_TRUE(changed) << relayout.from << " is not among the shard's flags";
    const std::string log = absl::StrCat(cluster->dir, "/relayout", r, ".log");
    absl::StatusOr<pid_t> shard = group.Start(argv, log);
    ASSERT_TRUE(shard.ok()) << shard.status();
    absl::StatusOr<int> exit = group.Wait(*shard, absl::Seconds(20));
    ASSERT_TRUE(exit.ok()) << "the shard with " << relayout.to << " is still running:\n"
                           << testutil::ReadFile(log);
    EXPECT_NE(*exit, 0);
    const std::string text = testutil::ReadFile(log);
    size_t at = text.find("etcd's chain of group");
    if (at == std::string::npos) at = text.find("etcd holds a chain of group");
    std::printf("RELAYOUT %s: exit %d: %s\n", relayout.to.c_str(), *exit,
                at == std::string::npos ? "(no message)"
                                        : text.substr(at, text.find('\n', at) - at).c_str());
    EXPECT_NE(text.find("of job 'relayout' (/shardtrain/relayout/chains/"), std::string::npos)
        << text;
    EXPECT_NE(text.find("etcdctl del --prefix /shardtrain/relayout/"), std::string::npos)
        << text;
    EXPECT_NE(text.find(relayout.expected), std::string::npos) << text;
  }
  for (int g = 0; g < kShards; ++g) {
    absl::StatusOr<chain::ChainConfig> chain = chain::ReadChain(*client_, "relayout", g);
    ASSERT_TRUE(chain.ok()) << chain.status();
    EXPECT_EQ(chain->epoch, 1) << "group " << g << "'s chain changed";
  }
  Finish(group, *cluster);
  ExpectEveryPushApplied(*client_, "relayout", *cluster, int64_t{kWorkers} * 2 * kStepsPerEpoch);
}

// Async, R=2, a three-member etcd, every shard and worker given all three
// members: the member they all use is SIGKILLed mid-run. They go on through
// the other two with their leases, watches and chains intact (no chain
// changes, no shard is dropped), and a shard SIGKILLed after that is
// dropped from its chains as fast as with a whole etcd. Nothing is lost.
constexpr int kMemberDiesEpochs = 8;

TEST(ReplicationEtcdClusterTest, EtcdMemberDies) {
  if (!EtcdProcess::Available()) GTEST_SKIP() << EtcdProcess::kMissingMessage;
  absl::StatusOr<std::vector<std::unique_ptr<EtcdProcess>>> etcd = EtcdProcess::StartCluster(3);
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  ProcessGroup group;
  absl::StatusOr<LocalCluster> cluster = testutil::StartLocalCluster(
      group, Job("async", "member", EtcdProcess::Endpoints(*etcd), kMemberDiesEpochs));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  WaitForSteps(*cluster, 0, kStepsPerEpoch / 4);
  ASSERT_TRUE((*etcd)[0]->Kill().ok());
  const int64_t killed_at = WorkerSteps(*cluster, 0);
  absl::SleepFor(absl::Seconds(3));  // three lease ttls

  std::unique_ptr<etcd::EtcdClient> client = Connect((*etcd)[1]->endpoint());
  ASSERT_NE(client, nullptr);
  for (int s = 0; s < kShards; ++s) {
    EXPECT_TRUE(client->Get(chain::MemberKey("member", s)).ok())
        << "shard " << s << " lost its lease when one etcd member died";
  }
  for (int g = 0; g < kShards; ++g) {
    absl::StatusOr<chain::ChainConfig> chain = chain::ReadChain(*client, "member", g);
    ASSERT_TRUE(chain.ok()) << chain.status();
    EXPECT_EQ(chain->epoch, 1) << "group " << g << "'s chain changed";
  }
  const int64_t after_3s = WorkerSteps(*cluster, 0);
  std::printf("ETCD MEMBER DIES: worker 0 went from step %lld to %lld in 3 s\n",
              static_cast<long long>(killed_at), static_cast<long long>(after_3s));
  EXPECT_GT(after_3s, killed_at + 20) << "training stalled when an etcd member died";
  ASSERT_LT(after_3s, kMemberDiesEpochs * kStepsPerEpoch) << "the job ended too soon";

  ASSERT_TRUE(group.Signal(cluster->shards[2], SIGKILL).ok());
  (void)group.Wait(cluster->shards[2], absl::Seconds(10));
  const absl::Time killed = absl::Now();
  ASSERT_TRUE(WaitForChains(
      *client, "member", [](const chain::ChainConfig& c) { return !c.Contains(2); },
      absl::Seconds(10)))
      << "shard 2 was not dropped from its chains";
  std::printf("ETCD MEMBER DIES: shard 2 dropped from its chains %s after its SIGKILL\n",
              absl::FormatDuration(absl::Now() - killed).c_str());
  Finish(group, *cluster);
  ExpectEveryPushApplied(*client, "member", *cluster,
                         int64_t{kWorkers} * kMemberDiesEpochs * kStepsPerEpoch);
}

}  // namespace
}  // namespace shardtrain
