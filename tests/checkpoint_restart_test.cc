// A shard stopped (as on SIGTERM) writes a final checkpoint, and a shard
// started on the same directory resumes from it with identical state; the
// Checkpoint RPC writes one on demand and is refused when disabled.
#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <vector>

#include "common/payload.h"
#include "gtest/gtest.h"
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

}  // namespace
}  // namespace shardtrain
