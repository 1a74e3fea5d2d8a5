// BadInput: every malformed request a peer can send gets a specific gRPC
// status with a message naming the problem, and leaves the shard's state
// (parameters, optimizer slots, accumulators, versions) exactly as it was.
#include <cmath>
#include <limits>
#include <vector>

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include "absl/synchronization/notification.h"
#include "common/payload.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/shardtrain.grpc.pb.h"
#include "server/bad_body_interceptor.h"
#include "server/ps_server.h"

namespace shardtrain {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kElements = 1000;
constexpr int kMaxMessageBytes = 1 << 20;

class BadInput : public ::testing::TestWithParam<server::ConsistencyMode> {
 protected:
  void SetUp() override {
    server::PsServerOptions options;
    options.metrics_address = "";
    options.max_message_bytes = kMaxMessageBytes;
    options.shard.mode = GetParam();
    options.shard.num_workers = 2;
    options.shard.optimizer.name = "adam";
    auto server = server::PsServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(64 << 20);  // so the server is the one to refuse
    stub_ = ParameterServer::NewStub(grpc::CreateCustomChannel(
        "127.0.0.1:" + std::to_string(server_->port()),
        grpc::InsecureChannelCredentials(), args));

    RegisterRequest request;
    for (const char* name : {"w", "b"}) {
      TensorSpec* spec = request.add_tensors();
      spec->set_name(name);
      spec->add_shape(kElements);
      spec->set_dtype(DTYPE_F32);
      spec->mutable_init()->set_kind(Initializer::KIND_UNIFORM);
      spec->mutable_init()->set_scale(0.1f);
    }
    RegisterResponse response;
    ASSERT_TRUE(Call(&ParameterServer::Stub::Register, request, &response).ok());
    // One good gradient from worker 0, so accumulators and slots are in play.
    ASSERT_TRUE(Push(GoodPush()).ok());
  }

  template <typename Method, typename Request, typename Response>
  grpc::Status Call(Method method, const Request& request, Response* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return ((*stub_).*method)(&context, request, response);
  }

  grpc::Status Push(const PushRequest& request) {
    PushResponse response;
    return Call(&ParameterServer::Stub::Push, request, &response);
  }

  static GradientPart MakePart(const std::string& tensor, int64_t elements,
                               float value = 0.01f) {
    GradientPart part;
    part.mutable_key()->set_tensor(tensor);
    part.mutable_grad()->set_dtype(DTYPE_F32);
    std::vector<float> grad(elements, value);
    common::EncodeDense(grad, DTYPE_F32, part.mutable_grad()->mutable_data());
    return part;
  }

  static PushRequest GoodPush(uint32_t worker = 0) {
    PushRequest request;
    request.set_worker(worker);
    request.set_clock(1);
    *request.add_parts() = MakePart("w", kElements);
    *request.add_parts() = MakePart("b", kElements);
    return request;
  }

  // Sends `request`, expects `code` with `message` in the text, and checks
  // the shard did not change.
  void ExpectRejected(const PushRequest& request, grpc::StatusCode code,
                      const std::string& message) {
    const uint64_t before = server_->shard().Checksum();
    const grpc::Status status = Push(request);
    EXPECT_EQ(status.error_code(), code) << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr(message));
    EXPECT_EQ(server_->shard().Checksum(), before) << "state changed";
  }

  std::unique_ptr<server::PsServer> server_;
  std::unique_ptr<ParameterServer::Stub> stub_;
};

TEST_P(BadInput, WrongSize) {
  PushRequest request = GoodPush(1);
  *request.mutable_parts(1) = MakePart("b", kElements - 1);
  ExpectRejected(request, grpc::StatusCode::INVALID_ARGUMENT, "3996 bytes");
}

TEST_P(BadInput, WrongDtype) {
  for (int dtype : {static_cast<int>(DTYPE_UNSPECIFIED), 42}) {
    PushRequest request = GoodPush(1);
    request.mutable_parts(1)->mutable_grad()->set_dtype(static_cast<DType>(dtype));
    ExpectRejected(request, grpc::StatusCode::INVALID_ARGUMENT, "dtype");
  }
  // f16 data labelled f32 has half the bytes needed.
  PushRequest request = GoodPush(1);
  std::vector<float> grad(kElements, 0.01f);
  common::EncodeDense(grad, DTYPE_F16,
                      request.mutable_parts(0)->mutable_grad()->mutable_data());
  ExpectRejected(request, grpc::StatusCode::INVALID_ARGUMENT, "2000 bytes");
}

TEST_P(BadInput, UnknownTensorAndPartition) {
  PushRequest request = GoodPush(1);
  request.mutable_parts(1)->mutable_key()->set_tensor("nope");
  ExpectRejected(request, grpc::StatusCode::NOT_FOUND, "unknown tensor 'nope'");
  request = GoodPush(1);
  request.mutable_parts(1)->mutable_key()->set_partition(9);
  ExpectRejected(request, grpc::StatusCode::NOT_FOUND, "partition 9");
}

TEST_P(BadInput, NanAndInfGradients) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(),
                    std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    PushRequest request = GoodPush(1);
    std::vector<float> grad(kElements, 0.01f);
    grad[123] = bad;
    common::EncodeDense(grad, DTYPE_F32,
                        request.mutable_parts(1)->mutable_grad()->mutable_data());
    ExpectRejected(request, grpc::StatusCode::INVALID_ARGUMENT, "element 123");
  }
}

TEST_P(BadInput, VersionFromTheFuture) {
  PushRequest request = GoodPush(1);
  request.mutable_parts(0)->set_version(7);
  ExpectRejected(request, grpc::StatusCode::OUT_OF_RANGE, "version 7");
  request = GoodPush(1);
  request.mutable_parts(0)->set_version(-1);
  ExpectRejected(request, grpc::StatusCode::INVALID_ARGUMENT, "version -1 is not in [0, ");
}

TEST_P(BadInput, EmptyMessages) {
  ExpectRejected(PushRequest(), grpc::StatusCode::INVALID_ARGUMENT,
                 "no gradients");
  PushRequest request = GoodPush(1);
  request.mutable_parts(0)->mutable_grad()->clear_data();
  ExpectRejected(request, grpc::StatusCode::INVALID_ARGUMENT, "0 bytes");
  PullRequest pull;
  PullResponse response;
  const grpc::Status status = Call(&ParameterServer::Stub::Pull, pull, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  RegisterRequest no_tensors;
  RegisterResponse registered;
  EXPECT_EQ(Call(&ParameterServer::Stub::Register, no_tensors, &registered).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_P(BadInput, OversizeMessage) {
  PushRequest request = GoodPush(1);
  request.mutable_parts(0)->mutable_grad()->mutable_data()->resize(kMaxMessageBytes + 1);
  const uint64_t before = server_->shard().Checksum();
  const grpc::Status status = Push(request);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << status.error_message();
  EXPECT_EQ(server_->shard().Checksum(), before);
}

TEST_P(BadInput, UnknownWorkerAndDuplicatePartition) {
  ExpectRejected(GoodPush(5), grpc::StatusCode::INVALID_ARGUMENT, "worker 5");
  PushRequest request = GoodPush(1);
  *request.add_parts() = MakePart("w", kElements);
  ExpectRejected(request, grpc::StatusCode::INVALID_ARGUMENT, "twice");
}

TEST_P(BadInput, BadPullInPushPullAppliesNothing) {
  PushPullRequest request;
  *request.mutable_push() = GoodPush(1);
  request.mutable_pull()->set_worker(1);
  request.mutable_pull()->add_parts()->set_tensor("missing");
  PushPullResponse response;
  const uint64_t before = server_->shard().Checksum();
  const grpc::Status status = Call(&ParameterServer::Stub::PushPull, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(server_->shard().Checksum(), before);
}

TEST_P(BadInput, BadRegistrations) {
  RegisterRequest request;
  TensorSpec* spec = request.add_tensors();
  spec->set_name("w");  // exists with shape [1000]
  spec->add_shape(10);
  spec->set_dtype(DTYPE_F32);
  RegisterResponse response;
  const uint64_t before = server_->shard().Checksum();
  grpc::Status status = Call(&ParameterServer::Stub::Register, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  spec->set_name("z");
  spec->set_shape(0, -3);
  status = Call(&ParameterServer::Stub::Register, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(server_->shard().Checksum(), before);
}

TEST_P(BadInput, LatePushInSyncMode) {
  if (GetParam() != server::ConsistencyMode::kSync) GTEST_SKIP() << "sync only";
  ASSERT_TRUE(Push(GoodPush(1)).ok());  // completes step 0
  ExpectRejected(GoodPush(0), grpc::StatusCode::FAILED_PRECONDITION, "finished");
}

// Sends `body` as the raw request of `method` and returns the status.
grpc::Status CallRaw(int port, const std::string& method, const std::string& body) {
  grpc::GenericStub stub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                             grpc::InsecureChannelCredentials()));
  grpc::Slice slice(body);
  grpc::ByteBuffer request(&slice, 1), response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  absl::Notification done;
  grpc::Status result;
  stub.UnaryCall(&context, method, grpc::StubOptions(), &request, &response,
                 [&](grpc::Status status) {
                   result = std::move(status);
                   done.Notify();
                 });
  done.WaitForNotification();
  return result;
}

// A body that is not the method's request message is INVALID_ARGUMENT
// naming the type (gRPC's callback handlers alone answer UNIMPLEMENTED with
// no message), and changes nothing.
TEST_P(BadInput, UnparsableBody) {
  std::string truncated;
  ASSERT_TRUE(GoodPush(1).SerializeToString(&truncated));
  truncated.resize(truncated.size() - 3);
  const std::string garbage("\xff\xff\xff\xff\x0f not a protobuf");
  const uint64_t before = server_->shard().Checksum();
  for (const auto& [method, type] :
       std::vector<std::pair<std::string, std::string>>{
           {"/shardtrain.ParameterServer/Push", "shardtrain.PushRequest"},
           {"/shardtrain.ParameterServer/Pull", "shardtrain.PullRequest"},
           {"/shardtrain.ParameterServer/PushPull", "shardtrain.PushPullRequest"},
           {"/shardtrain.ParameterServer/Register", "shardtrain.RegisterRequest"},
           {"/shardtrain.ParameterServer/Status", "shardtrain.StatusRequest"}}) {
    for (const std::string& body : {garbage, truncated}) {
      const grpc::Status status = CallRaw(server_->port(), method, body);
      EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
          << method << ": " << status.error_message();
      EXPECT_EQ(status.error_message(), "request body is not a valid " + type) << method;
    }
  }
  EXPECT_EQ(server_->shard().Checksum(), before) << "state changed";
  // A method the server does not have is still UNIMPLEMENTED, and good
  // requests still work.
  EXPECT_EQ(CallRaw(server_->port(), "/shardtrain.ParameterServer/Nope", "").error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_TRUE(Push(GoodPush(1)).ok());
  EXPECT_EQ(server::RequestTypeOf("/shardtrain.ParameterServer/Heartbeat"),
            "shardtrain.HeartbeatRequest");
  EXPECT_EQ(server::RequestTypeOf("/shardtrain.ParameterServer/Nope"), "");
  EXPECT_EQ(server::RequestTypeOf(nullptr), "");
}

INSTANTIATE_TEST_SUITE_P(Modes, BadInput,
                         ::testing::Values(server::ConsistencyMode::kSync,
                                           server::ConsistencyMode::kAsync),
                         [](const auto& info) {
                           return info.param == server::ConsistencyMode::kSync
                                      ? std::string("Sync")
                                      : std::string("Async");
                         });

}  // namespace
}  // namespace shardtrain
