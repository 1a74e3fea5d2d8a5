// async: a shard stopped (as on SIGTERM) writes a final checkpoint, and a
// shard started on the same directory resumes from it with identical state;
// the Checkpoint RPC writes one on demand and is refused when disabled.
// sync: checkpoints are written at every N-th step only (not on demand
// between them, not at shutdown) and a restart resumes at that step.
#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <dirent.h>

#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "server/checkpoint.h"

#include "common/payload.h"
#include "gtest/gtest.h"
#include "server/checkpoint_test_util.h"
#include "proto/shardtrain.grpc.pb.h"
#include "server/ps_server.h"

namespace shardtrain {
namespace {

server::PsServerOptions Options(const std::string& dir) {
  server::PsServerOptions options;
  options.metrics_address = "";
  options.checkpoint_dir = dir;
  options.checkpoint_interval = absl::Hours(1);
  options.shard.optimizer.name = "momentum";
  return options;
}

std::unique_ptr<ParameterServer::Stub> Connect(const server::PsServer& server) {
  return ParameterServer::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string(server.port()), grpc::InsecureChannelCredentials()));
}

TEST(CheckpointRestart, StopWritesAndStartRestores) {
  std::string dir = ::testing::TempDir() + "/restartXXXXXX";
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  uint64_t checksum = 0;
  {
    auto server = server::PsServer::Start(Options(dir));
    ASSERT_TRUE(server.ok()) << server.status();
    auto stub = Connect(**server);
    RegisterRequest request;
    TensorSpec* spec = request.add_tensors();
    spec->set_name("w");
    spec->add_shape(100);
    spec->set_dtype(DTYPE_F32);
    RegisterResponse registered;
    grpc::ClientContext register_context;
    ASSERT_TRUE(stub->Register(&register_context, request, &registered).ok());
    for (int step = 0; step < 3; ++step) {
      PushRequest push;
      push.set_clock(step + 1);
      GradientPart* part = push.add_parts();
      part->mutable_key()->set_tensor("w");
      part->set_version(step);
      part->mutable_grad()->set_dtype(DTYPE_F32);
      std::vector<float> grad(100, 0.5f);
      common::EncodeDense(grad, DTYPE_F32, part->mutable_grad()->mutable_data());
      PushResponse pushed;
      grpc::ClientContext context;
      ASSERT_TRUE(stub->Push(&context, push, &pushed).ok());
    }
    CheckpointResponse written;
    grpc::ClientContext context;
    ASSERT_TRUE(stub->Checkpoint(&context, CheckpointRequest(), &written).ok());
    EXPECT_EQ(written.partitions(), 1);
    checksum = (*server)->shard().Checksum();
    ASSERT_TRUE((*server)->Shutdown().ok());
  }
  auto restarted = server::PsServer::Start(Options(dir));
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  EXPECT_EQ((*restarted)->shard().Checksum(), checksum);
  StatusResponse status;
  grpc::ClientContext context;
  ASSERT_TRUE(Connect(**restarted)->Status(&context, StatusRequest(), &status).ok());
  ASSERT_EQ(status.partitions_size(), 1);
  EXPECT_EQ(status.partitions(0).version(), 3);
  EXPECT_GE(status.seconds_since_checkpoint(), 0);
}

TEST(CheckpointRestart, CheckpointRpcWithoutADirectoryIsRefused) {
  auto server = server::PsServer::Start(Options(""));
  ASSERT_TRUE(server.ok());
  CheckpointResponse response;
  grpc::ClientContext context;
  const grpc::Status status =
      Connect(**server)->Checkpoint(&context, CheckpointRequest(), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
}

std::vector<std::string> CheckpointFiles(const std::string& dir) {
  std::vector<std::string> files;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return files;
  while (const dirent* entry = readdir(d)) {
    if (server::ParseCheckpointName(entry->d_name)) files.push_back(dir + "/" + entry->d_name);
  }
  closedir(d);
  std::sort(files.begin(), files.end());
  return files;
}

server::PsServerOptions SyncOptions(const std::string& dir) {
  server::PsServerOptions options = Options(dir);
  options.shard.mode = server::ConsistencyMode::kSync;
  options.shard.optimizer.name = "adam";
  options.shard.partitioning.max_partition_elements = 40;
  options.shard.checkpoint_every_steps = 2;
  options.housekeeping_interval = absl::Milliseconds(10);
  options.checkpoint_interval = absl::Milliseconds(10);  // unused in sync mode
  return options;
}

// One sync step of worker 0 on every partition of "w" (100 elements).
grpc::Status SyncStep(ParameterServer::Stub& stub, const RegisterResponse& registered,
                      int step) {
  const PushRequest push =
      server::SyncPushOfEveryPartition(registered, "w", step, 0.25f * (step + 1));
  PushResponse pushed;
  grpc::ClientContext context;
  return stub.Push(&context, push, &pushed);
}

std::string Serialized(const std::vector<CheckpointRecord>& records) {
  std::string bytes;
  for (const CheckpointRecord& record : records) bytes += record.SerializeAsString();
  return bytes;
}

TEST(CheckpointRestart, SyncCheckpointsAreTakenAtStepBoundaries) {
  std::string dir = ::testing::TempDir() + "/syncXXXXXX";
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  std::string at_step_4;
  {
    auto server = server::PsServer::Start(SyncOptions(dir));
    ASSERT_TRUE(server.ok()) << server.status();
    auto stub = Connect(**server);
    RegisterRequest request;
    request.set_num_workers(1);
    TensorSpec* spec = request.add_tensors();
    spec->set_name("w");
    spec->add_shape(100);
    spec->set_dtype(DTYPE_F32);
    RegisterResponse registered;
    grpc::ClientContext register_context;
    ASSERT_TRUE(stub->Register(&register_context, request, &registered).ok());
    ASSERT_EQ(registered.partitions_size(), 3);

    // Between step checkpoints the RPC explains why it writes nothing.
    ASSERT_TRUE(SyncStep(*stub, registered, 0).ok());
    CheckpointResponse written;
    {
      grpc::ClientContext context;
      const grpc::Status refused = stub->Checkpoint(&context, CheckpointRequest(), &written);
      EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
      EXPECT_NE(refused.error_message().find("step boundaries, every 2 steps"),
                std::string::npos) << refused.error_message();
    }
    EXPECT_TRUE(CheckpointFiles(dir).empty());
    // The housekeeping thread writes each complete step (2, then 4).
    auto wait_for_files = [&](size_t count) {
      const absl::Time deadline = absl::Now() + absl::Seconds(10);
      while (CheckpointFiles(dir).size() < count) {
        ASSERT_LT(absl::Now(), deadline) << "step checkpoint not written";
        absl::SleepFor(absl::Milliseconds(5));
      }
    };
    ASSERT_TRUE(SyncStep(*stub, registered, 1).ok());
    wait_for_files(1);
    ASSERT_TRUE(SyncStep(*stub, registered, 2).ok());
    ASSERT_TRUE(SyncStep(*stub, registered, 3).ok());
    at_step_4 = Serialized((*server)->shard().Snapshot());
    ASSERT_TRUE(SyncStep(*stub, registered, 4).ok());  // version 5: not a boundary

    wait_for_files(2);
    const std::vector<std::string> files = CheckpointFiles(dir);
    ASSERT_EQ(files.size(), 2u);
    auto newest = server::ReadCheckpointFile(files.back());
    ASSERT_TRUE(newest.ok()) << newest.status();
    EXPECT_EQ(newest->header.mode(), "sync");
    EXPECT_EQ(newest->header.step(), 4);
    EXPECT_EQ(newest->header.records(), 3);
    ASSERT_EQ(newest->header.worker_clocks_size(), 1);
    EXPECT_LE(newest->header.worker_clocks(0), 4);
    EXPECT_EQ(Serialized(newest->records), at_step_4);
    auto older = server::ReadCheckpointFile(files.front());
    ASSERT_TRUE(older.ok());
    EXPECT_EQ(older->header.step(), 2);
    {
      grpc::ClientContext context;
      const grpc::Status refused = stub->Checkpoint(&context, CheckpointRequest(), &written);
      EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
      EXPECT_NE(refused.error_message().find("step 4 is on disk"), std::string::npos)
          << refused.error_message();
    }
    // Shutdown keeps the step checkpoint: no file for version 5.
    ASSERT_TRUE((*server)->Shutdown().ok());
    EXPECT_EQ(CheckpointFiles(dir), files);
  }
  auto restarted = server::PsServer::Start(SyncOptions(dir));
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  EXPECT_EQ(Serialized((*restarted)->shard().Snapshot()), at_step_4);
  StatusResponse status;
  grpc::ClientContext context;
  ASSERT_TRUE(Connect(**restarted)->Status(&context, StatusRequest(), &status).ok());
  for (const PartitionInfo& info : status.partitions()) EXPECT_EQ(info.version(), 4);
}

TEST(CheckpointRestart, AFailedStartWritesNothing) {
  std::string dir = ::testing::TempDir() + "/failXXXXXX";
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  {
    auto server = server::PsServer::Start(Options(dir));
    ASSERT_TRUE(server.ok());
    RegisterRequest request;
    TensorSpec* spec = request.add_tensors();
    spec->set_name("w");
    spec->add_shape(10);
    spec->set_dtype(DTYPE_F32);
    RegisterResponse registered;
    grpc::ClientContext context;
    ASSERT_TRUE(Connect(**server)->Register(&context, request, &registered).ok());
    ASSERT_TRUE((*server)->Shutdown().ok());
  }
  const std::vector<std::string> files = CheckpointFiles(dir);
  ASSERT_EQ(files.size(), 1u);
  // Another optimizer: refused; a listen address that cannot be used after
  // a good restore: refused too; neither writes or prunes anything.
  server::PsServerOptions typo = Options(dir);
  typo.shard.optimizer.name = "sgd";
  EXPECT_EQ(server::PsServer::Start(typo).status().code(),
            absl::StatusCode::kFailedPrecondition);
  server::PsServerOptions unlistenable = Options(dir);
  unlistenable.listen_address = "256.0.0.1:1";
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(server::PsServer::Start(unlistenable).ok());
  EXPECT_EQ(CheckpointFiles(dir), files);
}

}  // namespace
}  // namespace shardtrain
