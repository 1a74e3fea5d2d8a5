// Security: a shard serving TLS, demanding client certificates from its CA
// (mutual TLS) and a shared token on every call. A worker with the right
// CA, certificate and token trains against it; every other client is
// refused with the right code (UNAVAILABLE for a failed handshake,
// UNAUTHENTICATED for a missing or wrong token), is counted, and changes
// nothing. The shard's data port (frames without HTTP/2) is served in TLS
// with the same certificates and token: the worker's data path goes there,
// and a connection without the token is closed before any call is read.
// Certificates come from scripts/make-certs.sh, run here twice: the
// cluster's CA and a stranger's.
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/support/slice.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "client/ps_client.h"
#include "common/credentials.h"
#include "gtest/gtest.h"
#include "proto/health.grpc.pb.h"
#include "proto/shardtrain.grpc.pb.h"
#include "server/ps_server.h"
#include "testing/files.h"
#include "testing/metrics_scrape.h"
#include "wire/frame_header.h"
#include "wire/frame_socket.h"
#include "wire/tls_context.h"

namespace shardtrain {
namespace {

constexpr int64_t kElements = 100;

class Security : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(testutil::MakeTempDir("shardtrain-certs-"));
    for (const char* which : {"cluster", "stranger"}) {
      const std::string command = absl::StrCat(SHARDTRAIN_SOURCE_DIR, "/scripts/make-certs.sh ",
                                               *dir_, "/", which, " >/dev/null");
      ASSERT_EQ(std::system(command.c_str()), 0) << command;
    }
  }
  static void TearDownTestSuite() {
    // Private keys and tokens: leave none behind.
    std::filesystem::remove_all(*dir_);
    delete dir_;
  }

  static std::string File(const std::string& which, const std::string& name) {
    return absl::StrCat(*dir_, "/", which, "/", name);
  }

  // What a correctly configured worker uses.
  static common::ClientSecurity GoodClient() {
    common::ClientSecurity security;
    security.ca_file = File("cluster", "ca.pem");
    security.cert_file = File("cluster", "client.pem");
    security.key_file = File("cluster", "client.key");
    security.token_file = File("cluster", "token");
    return security;
  }

  void SetUp() override {
    server::PsServerOptions options;
    options.security.cert_file = File("cluster", "server.pem");
    options.security.key_file = File("cluster", "server.key");
    options.security.client_ca_file = File("cluster", "ca.pem");
    options.security.token_file = File("cluster", "token");
    options.data_listen = "127.0.0.1:0";
    // The smallest buffers --data_tls_buffer_kib allows: a read or a write
    // holds one record, and every data-port call here still gets through.
    options.data_tls_buffer_bytes = wire::TlsContext::kMinBufferBytes;
    auto server = server::PsServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
  }

  std::string Address(const std::string& host = "127.0.0.1") const {
    return absl::StrCat(host, ":", server_->port());
  }

  // A Status call with `security`; its gRPC status.
  grpc::Status CallStatus(const common::ClientSecurity& security,
                          const std::string& host = "127.0.0.1") {
    grpc::ChannelArguments args;
    auto credentials = common::MakeChannelCredentials(security, &args);
    EXPECT_TRUE(credentials.ok()) << credentials.status();
    if (!credentials.ok()) return grpc::Status(grpc::StatusCode::INTERNAL, "no credentials");
    auto stub =
        ParameterServer::NewStub(grpc::CreateCustomChannel(Address(host), *credentials, args));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    StatusResponse response;
    return stub->Status(&context, StatusRequest(), &response);
  }

  // A grpc.health.v1 check with `security`; its gRPC status.
  grpc::Status CallHealth(const common::ClientSecurity& security) {
    grpc::ChannelArguments args;
    auto credentials = common::MakeChannelCredentials(security, &args);
    EXPECT_TRUE(credentials.ok()) << credentials.status();
    if (!credentials.ok()) return grpc::Status(grpc::StatusCode::INTERNAL, "no credentials");
    auto stub = grpc::health::v1::Health::NewStub(
        grpc::CreateCustomChannel(Address(), *credentials, args));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::health::v1::HealthCheckResponse response;
    return stub->Check(&context, grpc::health::v1::HealthCheckRequest(), &response);
  }

  // A worker's client with `security` and a small tensor to register.
  std::unique_ptr<client::PsClient> Client(const common::ClientSecurity& security) {
    client::PsClientOptions options;
    options.servers = {Address()};
    options.security = security;
    auto client = client::PsClient::Create(options, nullptr);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? std::move(client).value() : nullptr;
  }
  static TensorSpec SmallTensor() {
    TensorSpec spec;
    spec.set_name("w");
    spec.add_shape(kElements);
    spec.set_dtype(DTYPE_F32);
    return spec;
  }

  double UnauthenticatedCount() {
    auto body = testutil::HttpGet(server_->metrics_port(), "/metrics");
    EXPECT_TRUE(body.ok()) << body.status();
    return body.ok() ? testutil::SumByName(*body)["shardtrain_rpc_unauthenticated_total"] : -1;
  }

  static std::string* dir_;
  std::unique_ptr<server::PsServer> server_;
};

std::string* Security::dir_ = nullptr;

TEST_F(Security, AWorkerWithTheRightCredentialsTrains) {
  std::unique_ptr<client::PsClient> client = Client(GoodClient());
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Register({SmallTensor()}).ok());
  std::vector<float> grad(kElements, 1.0f), params(kElements, 7.0f);
  client::PushStats push;
  client::PullStats pull;
  ASSERT_TRUE(client->Push(1, {absl::MakeConstSpan(grad)}, &push).ok());
  ASSERT_TRUE(client->Pull(1, 1, {absl::MakeSpan(params)}, &pull).ok());
  EXPECT_EQ(pull.min_version, 1);
  EXPECT_FLOAT_EQ(params[0], -0.01f);  // sgd, lr 0.01, from zeros
  // The push and the pull went to the data port, in TLS.
  EXPECT_GE(server_->data_connections(), 1);
  EXPECT_EQ(UnauthenticatedCount(), 0);
}

// Raw frames to the data port: only a TLS connection whose hello carries
// the token has its calls read and answered.
TEST_F(Security, TheDataPortAnswersOnlyTlsConnectionsWithTheToken) {
  ASSERT_NE(server_->data_port(), 0);
  PushRequest push;
  push.set_worker(0);
  push.set_clock(1);
  const std::string bytes = push.SerializeAsString();
  grpc::Slice slice(bytes);
  const grpc::ByteBuffer body(&slice, 1);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  // Connects (in TLS with `security`, unless null), sends the hello with
  // `token` (unless empty) and a Push; whether an answer to it came back.
  auto answered = [&](const common::ClientSecurity* security, const std::string& token) {
    auto socket = wire::FrameSocket::Connect("127.0.0.1", server_->data_port(), absl::Seconds(5));
    EXPECT_TRUE(socket.ok()) << socket.status();
    if (!socket.ok()) return false;
    if (security != nullptr) {
      absl::StatusOr<std::shared_ptr<const wire::TlsContext>> tls =
          wire::TlsContext::ForClient(*security);
      EXPECT_TRUE(tls.ok()) << tls.status();
      if (!tls.ok() || !(*socket)->StartTls(**tls, "127.0.0.1", deadline).ok()) return false;
    }
    if (!token.empty()) {
      wire::FrameHeader hello;
      hello.method = static_cast<uint8_t>(wire::DataMethod::kHello);
      grpc::Slice token_slice(token);
      const grpc::ByteBuffer token_body(&token_slice, 1);
      if (!(*socket)->Write(hello, "", &token_body, deadline).ok()) return false;
    }
    wire::FrameHeader header;
    header.method = static_cast<uint8_t>(wire::DataMethod::kPush);
    header.call_id = 1;
    if (!(*socket)->Write(header, "", &body, deadline).ok()) return false;
    wire::FrameHeader reply;
    std::string message;
    grpc::ByteBuffer answer;
    return (*socket)->Read(1 << 20, 1 << 16, deadline, &reply, &message, &answer).ok() &&
           reply.response && reply.call_id == 1;
  };
  auto token_of = [](const std::string& path) {
    return std::string(absl::StripAsciiWhitespace(testutil::ReadFile(path)));
  };
  const std::string token = token_of(File("cluster", "token"));
  common::ClientSecurity tls = GoodClient();
  tls.token_file.clear();
  EXPECT_FALSE(answered(nullptr, ""));  // plaintext
  EXPECT_FALSE(answered(&tls, ""));     // no hello
  EXPECT_FALSE(answered(&tls, token_of(File("stranger", "token"))));
  common::ClientSecurity stranger_cert = tls;
  stranger_cert.cert_file = File("stranger", "client.pem");
  stranger_cert.key_file = File("stranger", "client.key");
  EXPECT_FALSE(answered(&stranger_cert, token));
  EXPECT_EQ(UnauthenticatedCount(), 2);
  StatusResponse status;
  server_->shard().FillStatus(StatusRequest(), &status);
  EXPECT_EQ(status.partitions_size(), 0);
  // The same frames with the token are read and answered.
  EXPECT_TRUE(answered(&tls, token));
  EXPECT_EQ(UnauthenticatedCount(), 2);
}

TEST_F(Security, TheServerNameIsChecked) {
  EXPECT_TRUE(CallStatus(GoodClient(), "localhost").ok());  // in the certificate
  common::ClientSecurity renamed = GoodClient();
  renamed.server_name = "shard-7.example";  // not in it
  EXPECT_EQ(CallStatus(renamed).error_code(), grpc::StatusCode::UNAVAILABLE);
  renamed.server_name = "localhost";
  EXPECT_TRUE(CallStatus(renamed).ok());
}

TEST_F(Security, FailedHandshakesAreUnavailable) {
  common::ClientSecurity plaintext;  // no TLS at all
  EXPECT_EQ(CallStatus(plaintext).error_code(), grpc::StatusCode::UNAVAILABLE);

  common::ClientSecurity no_client_cert = GoodClient();
  no_client_cert.cert_file.clear();
  no_client_cert.key_file.clear();
  EXPECT_EQ(CallStatus(no_client_cert).error_code(), grpc::StatusCode::UNAVAILABLE);

  common::ClientSecurity stranger_cert = GoodClient();
  stranger_cert.cert_file = File("stranger", "client.pem");
  stranger_cert.key_file = File("stranger", "client.key");
  EXPECT_EQ(CallStatus(stranger_cert).error_code(), grpc::StatusCode::UNAVAILABLE);

  common::ClientSecurity distrusts_server = GoodClient();
  distrusts_server.ca_file = File("stranger", "ca.pem");
  EXPECT_EQ(CallStatus(distrusts_server).error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(Security, MissingOrWrongTokensAreUnauthenticatedAndChangeNothing) {
  common::ClientSecurity no_token = GoodClient();
  no_token.token_file.clear();
  const grpc::Status missing = CallStatus(no_token);
  EXPECT_EQ(missing.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(missing.error_message(), "no auth token");

  common::ClientSecurity wrong_token = GoodClient();
  wrong_token.token_file = File("stranger", "token");
  EXPECT_EQ(CallStatus(wrong_token).error_code(), grpc::StatusCode::UNAUTHENTICATED);

  // A registration with the wrong token must not register anything.
  std::unique_ptr<client::PsClient> client = Client(wrong_token);
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(client->Register({SmallTensor()}).code(), absl::StatusCode::kUnauthenticated);
  StatusResponse status;
  server_->shard().FillStatus(StatusRequest(), &status);
  EXPECT_EQ(status.partitions_size(), 0);

  // The health service is behind the token too.
  EXPECT_EQ(CallHealth(no_token).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(CallHealth(GoodClient()).ok());
  EXPECT_EQ(UnauthenticatedCount(), 4);
}

}  // namespace
}  // namespace shardtrain
