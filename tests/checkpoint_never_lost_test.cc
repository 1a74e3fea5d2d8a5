// CheckpointNeverLost: real ps-server processes on one checkpoint directory.
// A good checkpoint survives an optimizer typo, corrupt files, a changed
// --num_shards and an unusable directory (each is a startup error that
// changes no file), --allow_fresh_start starts fresh without touching the
// old files, and a final checkpoint that cannot be written makes ps-server
// exit non-zero.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <dirent.h>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/payload.h"
#include "gtest/gtest.h"
#include "proto/shardtrain.grpc.pb.h"
#include "server/checkpoint_test_util.h"
#include "testing/files.h"
#include "testing/metrics_scrape.h"
#include "testing/port_file.h"
#include "testing/process_group.h"

namespace shardtrain {
namespace {

using testutil::ProcessGroup;

constexpr int kElements = 3000;  // 3 partitions of 1000



// Partition -> (version, parameter bytes).
using Model = std::map<uint32_t, std::pair<int64_t, std::string>>;

class CheckpointNeverLost : public ::testing::Test {
 protected:
  struct Running {
    pid_t pid = 0;
    int port = 0;
    int metrics_port = 0;
    std::string log;
    std::unique_ptr<ParameterServer::Stub> stub;
  };

  void SetUp() override { dir_ = testutil::MakeTempDir("never_lost") + "/ckpt"; }

  std::vector<std::string> Argv(const std::string& dir,
                                const std::vector<std::string>& extra,
                                const std::string& port_file) {
    std::vector<std::string> argv = {
        std::string(SHARDTRAIN_BIN_DIR) + "/ps-server", "--optimizer=adam",
        "--lr=0.01", "--max_partition_elements=1000", "--checkpoint_dir=" + dir,
        "--checkpoint_interval_s=3600", "--port_file=" + port_file};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return argv;
  }

  std::string NextLog() {
    return absl::StrCat(testutil::MakeTempDir("never_lost_log"), "/ps-server-",
                        ++runs_, ".log");
  }

  // Starts a shard that must come up.
  absl::StatusOr<Running> Start(const std::vector<std::string>& extra = {},
                                const std::string& dir = "") {
    Running running;
    running.log = NextLog();
    const std::string port_file = running.log + ".port";
    auto pid = group_.Start(Argv(dir.empty() ? dir_ : dir, extra, port_file), running.log);
    if (!pid.ok()) return pid.status();
    running.pid = *pid;
    auto ports = testutil::ReadPortFile(port_file, absl::Seconds(30));
    if (!ports.ok() || ports->size() != 2) {
      return absl::UnavailableError(absl::StrCat("ps-server did not start: ",
                                                 testutil::ReadFile(running.log)));
    }
    running.port = (*ports)[0];
    running.metrics_port = (*ports)[1];
    running.stub = ParameterServer::NewStub(grpc::CreateChannel(
        absl::StrCat("127.0.0.1:", running.port), grpc::InsecureChannelCredentials()));
    return running;
  }

  // Runs a shard that must refuse to start; returns its exit code and log.
  std::pair<int, std::string> RunRefused(const std::vector<std::string>& extra,
                                         const std::string& dir = "") {
    const std::string log = NextLog();
    auto pid = group_.Start(Argv(dir.empty() ? dir_ : dir, extra, log + ".port"), log);
    EXPECT_TRUE(pid.ok());
    if (!pid.ok()) return {-1, ""};
    auto code = group_.Wait(*pid, absl::Seconds(30));
    EXPECT_TRUE(code.ok()) << "ps-server kept running: " << testutil::ReadFile(log);
    return {code.ok() ? *code : -1, testutil::ReadFile(log)};
  }

  // SIGTERM; returns the exit code.
  int Stop(Running& running) {
    running.stub.reset();  // no open connection for the server to wait out
    kill(running.pid, SIGTERM);
    auto code = group_.Wait(running.pid, absl::Seconds(30));
    EXPECT_TRUE(code.ok()) << code.status();
    return code.ok() ? *code : -1;
  }

  // Registers "w" and pushes `steps` async gradients.
  void Train(Running& running, int steps) {
    RegisterRequest request;
    request.set_num_workers(1);
    TensorSpec* spec = request.add_tensors();
    spec->set_name("w");
    spec->add_shape(kElements);
    spec->set_dtype(DTYPE_F32);
    spec->mutable_init()->set_kind(Initializer::KIND_UNIFORM);
    spec->mutable_init()->set_scale(0.5f);
    spec->mutable_init()->set_seed(7);
    RegisterResponse registered;
    grpc::ClientContext register_context;
    ASSERT_TRUE(running.stub->Register(&register_context, request, &registered).ok());
    ASSERT_EQ(registered.partitions_size(), 3);
    for (int i = 0; i < steps; ++i) {
      PushRequest push;
      push.set_clock(registered.partitions(0).version() + i + 1);
      for (const PartitionInfo& info : registered.partitions()) {
        GradientPart* part = push.add_parts();
        part->mutable_key()->set_tensor("w");
        part->mutable_key()->set_partition(info.partition());
        part->set_version(info.version() + i);
        part->mutable_grad()->set_dtype(DTYPE_F32);
        std::vector<float> grad(info.size());
        for (size_t e = 0; e < grad.size(); ++e) grad[e] = 0.001f * ((e + i) % 13) - 0.006f;
        common::EncodeDense(grad, DTYPE_F32, part->mutable_grad()->mutable_data());
      }
      PushResponse pushed;
      grpc::ClientContext context;
      const grpc::Status status = running.stub->Push(&context, push, &pushed);
      ASSERT_TRUE(status.ok()) << status.error_message();
    }
  }

  Model Pull(Running& running) {
    StatusRequest status_request;
    StatusResponse status;
    grpc::ClientContext status_context;
    EXPECT_TRUE(running.stub->Status(&status_context, status_request, &status).ok());
    PullRequest request;
    for (const PartitionInfo& info : status.partitions()) {
      PartitionKey* key = request.add_parts();
      key->set_tensor(info.tensor());
      key->set_partition(info.partition());
    }
    Model model;
    if (request.parts().empty()) return model;
    PullResponse response;
    grpc::ClientContext context;
    const grpc::Status pulled = running.stub->Pull(&context, request, &response);
    EXPECT_TRUE(pulled.ok()) << pulled.error_message();
    for (const ParameterPart& part : response.parts()) {
      model[part.key().partition()] = {part.version(), part.value().data()};
    }
    return model;
  }

  std::string Metrics(const Running& running) {
    auto body = testutil::HttpGet(running.metrics_port, "/metrics");
    EXPECT_TRUE(body.ok()) << body.status();
    return body.ok() ? *body : "";
  }

  // A trained Adam shard stopped with SIGTERM: two checkpoints (one on
  // demand, one final). Returns the model it stopped with.
  Model TrainAndStop() {
    Model model;
    auto running = Start();
    EXPECT_TRUE(running.ok()) << running.status();
    if (!running.ok()) return model;
    Train(*running, 5);
    CheckpointResponse written;
    grpc::ClientContext context;
    EXPECT_TRUE(running->stub->Checkpoint(&context, CheckpointRequest(), &written).ok());
    Train(*running, 2);
    model = Pull(*running);
    EXPECT_EQ(Stop(*running), 0) << testutil::ReadFile(running->log);
    EXPECT_EQ(server::DirectoryFiles(dir_).size(), 2u);
    return model;
  }

  ProcessGroup group_;
  std::string dir_;
  int runs_ = 0;
};

TEST_F(CheckpointNeverLost, OptimizerTypoThenTheRightFlagsRestoresTheModel) {
  const Model trained = TrainAndStop();
  ASSERT_EQ(trained.size(), 3u);
  for (const auto& [partition, state] : trained) EXPECT_GT(state.first, 0);
  const auto files = server::DirectoryFiles(dir_);

  auto [code, log] = RunRefused({"--optimizer=sgd"});
  EXPECT_NE(code, 0);
  EXPECT_TRUE(absl::StrContains(log, "optimizer adam (this shard: sgd)")) << log;
  EXPECT_EQ(server::DirectoryFiles(dir_), files) << "a refused start changed the checkpoints";

  auto restored = Start();
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(Pull(*restored), trained);
  const std::string metrics = Metrics(*restored);
  EXPECT_TRUE(absl::StrContains(metrics,
                                "shardtrain_checkpoint_restores_total{result=\"ok\"} 1"))
      << metrics;
  const std::string log2 = testutil::ReadFile(restored->log);
  EXPECT_TRUE(absl::StrContains(log2, "updates applied after it was written are lost"))
      << log2;
  EXPECT_EQ(Stop(*restored), 0);
}

TEST_F(CheckpointNeverLost, BothFilesBadIsAnErrorAndFreshStartKeepsThem) {
  TrainAndStop();
  auto files = server::DirectoryFiles(dir_);
  ASSERT_EQ(files.size(), 2u);
  for (const auto& [name, bytes] : files) server::CorruptMiddleByte(dir_ + "/" + name);
  files = server::DirectoryFiles(dir_);

  auto [code, log] = RunRefused({});
  EXPECT_NE(code, 0);
  for (const auto& [name, bytes] : files) {
    EXPECT_TRUE(absl::StrContains(log, name)) << name << " not named in " << log;
  }
  EXPECT_EQ(server::DirectoryFiles(dir_), files);

  auto fresh = Start({"--allow_fresh_start"});
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_TRUE(Pull(*fresh).empty());
  EXPECT_TRUE(absl::StrContains(Metrics(*fresh),
                                "shardtrain_checkpoint_restores_total{result=\"fresh\"} 1"));
  Train(*fresh, 1);
  for (int i = 0; i < 2; ++i) {
    CheckpointResponse written;
    grpc::ClientContext context;
    ASSERT_TRUE(fresh->stub->Checkpoint(&context, CheckpointRequest(), &written).ok());
  }
  EXPECT_EQ(Stop(*fresh), 0);
  // Three new files, pruned to the newest two among themselves; the
  // unreadable ones are untouched.
  const auto after = server::DirectoryFiles(dir_);
  EXPECT_EQ(after.size(), 4u);
  for (const auto& [name, bytes] : files) {
    ASSERT_EQ(after.count(name), 1u) << name << " was deleted";
    EXPECT_EQ(after.at(name), bytes) << name << " was changed";
  }
}

TEST_F(CheckpointNeverLost, AChangedShardCountIsAnError) {
  const Model trained = TrainAndStop();
  const auto files = server::DirectoryFiles(dir_);
  for (const char* index : {"--shard_index=0", "--shard_index=1"}) {
    auto [code, log] = RunRefused({"--num_shards=2", index});
    EXPECT_NE(code, 0);
    EXPECT_TRUE(absl::StrContains(log, "cluster with 1 shards")) << log;
    EXPECT_TRUE(absl::StrContains(log, "--num_shards=2")) << log;
    EXPECT_EQ(server::DirectoryFiles(dir_), files);
  }
  auto restored = Start();
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(Pull(*restored), trained);
}

TEST_F(CheckpointNeverLost, AnUnusableDirectoryIsAnError) {
  const std::string file = testutil::MakeTempDir("never_lost_file") + "/plain";
  std::ofstream(file) << "not a directory";
  for (const std::string& dir : {file, file + "/sub"}) {
    auto [code, log] = RunRefused({}, dir);
    EXPECT_NE(code, 0);
    EXPECT_TRUE(absl::StrContains(log, "checkpoint directory")) << log;
    EXPECT_TRUE(absl::StrContains(log, dir)) << log;
  }
  EXPECT_EQ(testutil::ReadFile(file), "not a directory");
}

TEST_F(CheckpointNeverLost, AFailedFinalCheckpointExitsNonZero) {
  auto running = Start();
  ASSERT_TRUE(running.ok()) << running.status();
  Train(*running, 3);
  CheckpointResponse written;
  grpc::ClientContext context;
  ASSERT_TRUE(running->stub->Checkpoint(&context, CheckpointRequest(), &written).ok());
  const auto files = server::DirectoryFiles(dir_);
  ASSERT_EQ(files.size(), 1u);
  // The directory is replaced by a plain file (permissions do not stop
  // root): the final checkpoint cannot be written.
  const std::string moved = dir_ + ".moved";
  ASSERT_EQ(rename(dir_.c_str(), moved.c_str()), 0);
  std::ofstream(dir_) << "in the way";
  Train(*running, 1);
  EXPECT_EQ(Stop(*running), 1);
  const std::string log = testutil::ReadFile(running->log);
  EXPECT_TRUE(absl::StrContains(log, "final checkpoint failed")) << log;
  EXPECT_EQ(server::DirectoryFiles(moved), files);
}

}  // namespace
}  // namespace shardtrain
