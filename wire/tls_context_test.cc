// TlsContext and FrameSocket::StartTls: frames in TLS arrive as they were
// written, whatever their size, while both ends read and write at once;
// the shard is verified against the CA and the name it is reached by, a
// mutual-TLS shard refuses a client without a certificate of its CA, and a
// handshake with a peer that never answers ends at its deadline or its
// interrupter. Certificates come from scripts/make-certs.sh, run twice:
// the cluster's and a stranger's.
#include "wire/tls_context.h"

#include <stdlib.h>
#include <sys/socket.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/support/slice.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "wire/frame_header.h"
#include "wire/frame_socket.h"
#include "wire/interrupter.h"
#include "wire/testing/flatten.h"

namespace shardtrain::wire {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kMaxBody = 64 << 20;

absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

// A body of `bytes` bytes in pieces of `piece` bytes, each byte telling
// where it is, so that a piece lost, doubled or swapped shows.
grpc::ByteBuffer Body(size_t bytes, size_t piece) {
  std::vector<grpc::Slice> slices;
  for (size_t at = 0; at < bytes; at += piece) {
    std::string part(std::min(piece, bytes - at), '\0');
    for (size_t i = 0; i < part.size(); ++i) part[i] = static_cast<char>((at + i) * 131 >> 3);
    slices.emplace_back(part);
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

class TlsContextTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string pattern = ::testing::TempDir() + "/tls-context-XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = new std::string(pattern);
    for (const char* which : {"cluster", "stranger"}) {
      const std::string make = absl::StrCat(SHARDTRAIN_SOURCE_DIR, "/scripts/make-certs.sh ",
                                            *dir_, "/", which, " >/dev/null");
      ASSERT_EQ(std::system(make.c_str()), 0) << make;
    }
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);  // private keys: leave none behind
    delete dir_;
  }
  static std::string File(const std::string& which, const std::string& name) {
    return absl::StrCat(*dir_, "/", which, "/", name);
  }

  static common::ServerSecurity Server(bool mutual) {
    common::ServerSecurity security;
    security.cert_file = File("cluster", "server.pem");
    security.key_file = File("cluster", "server.key");
    if (mutual) security.client_ca_file = File("cluster", "ca.pem");
    return security;
  }
  static common::ClientSecurity Client() {
    common::ClientSecurity security;
    security.ca_file = File("cluster", "ca.pem");
    security.cert_file = File("cluster", "client.pem");
    security.key_file = File("cluster", "client.key");
    return security;
  }
  static std::shared_ptr<const TlsContext> ForServer(
      const common::ServerSecurity& security,
      size_t buffer_bytes = TlsContext::kDefaultBufferBytes) {
    absl::StatusOr<std::shared_ptr<const TlsContext>> tls =
        TlsContext::ForServer(security, buffer_bytes);
    EXPECT_TRUE(tls.ok()) << tls.status();
    return tls.ok() ? *tls : nullptr;
  }
  static std::shared_ptr<const TlsContext> ForClient(
      const common::ClientSecurity& security,
      size_t buffer_bytes = TlsContext::kDefaultBufferBytes) {
    absl::StatusOr<std::shared_ptr<const TlsContext>> tls =
        TlsContext::ForClient(security, buffer_bytes);
    EXPECT_TRUE(tls.ok()) << tls.status();
    return tls.ok() ? *tls : nullptr;
  }

  // Connects two frame sockets and runs both handshakes at once, the
  // client's verifying the shard as `peer_host`; their results.
  struct Handshakes {
    absl::Status server;
    absl::Status client;
  };
  Handshakes Connect(const TlsContext& server, const TlsContext& client,
                     const std::string& peer_host = "127.0.0.1") {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    server_ = std::make_unique<FrameSocket>(fds[0]);
    client_ = std::make_unique<FrameSocket>(fds[1]);
    Handshakes result;
    std::thread serving([&] {
      result.server = server_->StartTls(server, "", Soon());
      // A failed handshake closes the connection, as DataConnection does.
      if (!result.server.ok()) server_->Shutdown();
    });
    result.client = client_->StartTls(client, peer_host, Soon());
    serving.join();
    return result;
  }

  // Connects a shard (with mutual TLS or not) and a client configured as a
  // worker is: both handshakes must pass.
  void ConnectVerified(bool mutual, size_t buffer_bytes = TlsContext::kDefaultBufferBytes) {
    server_tls_ = ForServer(Server(mutual), buffer_bytes);
    client_tls_ = ForClient(Client(), buffer_bytes);
    ASSERT_NE(server_tls_, nullptr);
    ASSERT_NE(client_tls_, nullptr);
    const Handshakes shook = Connect(*server_tls_, *client_tls_);
    ASSERT_TRUE(shook.server.ok()) << shook.server;
    ASSERT_TRUE(shook.client.ok()) << shook.client;
  }

  // Writes frames of these {bytes, piece size} from the client on one
  // thread; the shard must read each as written.
  void ExpectFramesArrive(const std::vector<std::pair<size_t, size_t>>& sizes) {
    std::thread writer([&] {
      uint64_t call = 0;
      for (const auto& [bytes, piece] : sizes) {
        FrameHeader header;
        header.method = 3;
        header.call_id = ++call;
        const grpc::ByteBuffer body = Body(bytes, piece);
        EXPECT_TRUE(client_->Write(header, "", &body, Soon()).ok());
      }
    });
    uint64_t call = 0;
    for (const auto& [bytes, piece] : sizes) {
      FrameHeader header;
      std::string message;
      grpc::ByteBuffer body;
      const absl::Status read = server_->Read(kMaxBody, 0, Soon(), &header, &message, &body);
      EXPECT_TRUE(read.ok()) << read;
      if (!read.ok()) break;
      EXPECT_EQ(header.call_id, ++call);
      EXPECT_EQ(header.body_bytes, bytes);
      EXPECT_EQ(Flatten(body), Flatten(Body(bytes, piece))) << bytes;
    }
    writer.join();
  }

  static std::string* dir_;
  std::shared_ptr<const TlsContext> server_tls_;
  std::shared_ptr<const TlsContext> client_tls_;
  std::unique_ptr<FrameSocket> server_;
  std::unique_ptr<FrameSocket> client_;
};

std::string* TlsContextTest::dir_ = nullptr;

TEST_F(TlsContextTest, PlaintextSettingsMakeNoContext) {
  absl::StatusOr<std::shared_ptr<const TlsContext>> server =
      TlsContext::ForServer(common::ServerSecurity());
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ(*server, nullptr);
  absl::StatusOr<std::shared_ptr<const TlsContext>> client =
      TlsContext::ForClient(common::ClientSecurity());
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ(*client, nullptr);
}

TEST_F(TlsContextTest, BadSettingsAreRefused) {
  common::ServerSecurity token_in_plaintext;
  token_in_plaintext.token_file = File("cluster", "token");
  EXPECT_EQ(TlsContext::ForServer(token_in_plaintext).status().code(),
            absl::StatusCode::kInvalidArgument);

  common::ServerSecurity wrong_key = Server(false);
  wrong_key.key_file = File("cluster", "client.key");
  const absl::Status refused = TlsContext::ForServer(wrong_key).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("client.key"));

  common::ClientSecurity no_ca = Client();
  no_ca.ca_file = File("cluster", "missing.pem");
  EXPECT_EQ(TlsContext::ForClient(no_ca).status().code(), absl::StatusCode::kInvalidArgument);

  // Buffers that cannot hold a record, or that would let connections take
  // far more memory than their frames need.
  for (const size_t bytes : {size_t{0}, TlsContext::kMinBufferBytes - 1,
                             TlsContext::kMaxBufferBytes + 1}) {
    const absl::Status server = TlsContext::ForServer(Server(true), bytes).status();
    EXPECT_EQ(server.code(), absl::StatusCode::kInvalidArgument) << bytes;
    EXPECT_THAT(server.message(), HasSubstr("--data_tls_buffer_kib"));
    EXPECT_EQ(TlsContext::ForClient(Client(), bytes).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bytes;
  }
}

// --data_tls_buffer_kib at its smallest: a read or a write holds one record,
// and frames of many records still arrive whole.
TEST_F(TlsContextTest, TheSmallestBuffersCarryFramesOfManyRecords) {
  ConnectVerified(/*mutual=*/true, TlsContext::kMinBufferBytes);
  EXPECT_EQ(server_tls_->buffer_bytes(), TlsContext::kMinBufferBytes);
  ExpectFramesArrive({{0, 1}, {(16 << 10) + 1, 16 << 10}, {1 << 20, 3000}, {4 << 20, 4 << 20}});
}

TEST_F(TlsContextTest, TheTokenComesWithTheContext) {
  common::ServerSecurity server = Server(true);
  server.token_file = File("cluster", "token");
  common::ClientSecurity client = Client();
  client.token = "a-token";
  std::shared_ptr<const TlsContext> served = ForServer(server);
  std::shared_ptr<const TlsContext> calling = ForClient(client);
  ASSERT_NE(served, nullptr);
  ASSERT_NE(calling, nullptr);
  EXPECT_TRUE(served->server());
  EXPECT_FALSE(calling->server());
  EXPECT_EQ(served->token().size(), 64u);  // make-certs.sh: 32 random bytes in hex
  EXPECT_EQ(calling->token(), "a-token");
}

TEST_F(TlsContextTest, FramesOfEverySizeArriveAsWritten) {
  ConnectVerified(/*mutual=*/true);
  EXPECT_TRUE(server_->tls());
  EXPECT_TRUE(client_->tls());
  // Empty, small, a record and a byte, several records in many pieces,
  // and one large piece (past the 32 MiB that come from the buffer pool).
  ExpectFramesArrive(
      {{0, 1}, {100, 100}, {(16 << 10) + 1, 16 << 10}, {1 << 20, 3000}, {33 << 20, 33 << 20}});
  // A response with a status message, the other way.
  FrameHeader answer;
  answer.response = true;
  answer.method = 3;
  answer.call_id = 9;
  answer.status = 5;
  ASSERT_TRUE(server_->Write(answer, "not found", nullptr, Soon()).ok());
  FrameHeader header;
  std::string message;
  grpc::ByteBuffer body;
  const absl::Status read = client_->Read(kMaxBody, 4096, Soon(), &header, &message, &body);
  ASSERT_TRUE(read.ok()) << read;
  EXPECT_EQ(header.status, 5);
  EXPECT_EQ(message, "not found");
  // The peer's close between frames is the clean end, as in plaintext.
  server_.reset();
  EXPECT_EQ(client_->Read(kMaxBody, 4096, Soon(), &header, &message, &body).code(),
            absl::StatusCode::kOutOfRange);
}

// Each end reads on one thread while it writes on another: the OpenSSL
// calls take turns, and neither end stalls the other.
TEST_F(TlsContextTest, BothEndsReadAndWriteAtOnce) {
  ConnectVerified(/*mutual=*/false);
  constexpr int kFrames = 200;
  const grpc::ByteBuffer body = Body(300 << 10, 64 << 10);
  const std::string expected = Flatten(body);
  auto write = [&](FrameSocket* socket) {
    for (int i = 0; i < kFrames; ++i) {
      FrameHeader header;
      header.method = 1;
      header.call_id = i;
      ASSERT_TRUE(socket->Write(header, "", &body, Soon()).ok());
    }
  };
  auto read = [&](FrameSocket* socket) {
    for (int i = 0; i < kFrames; ++i) {
      ASSERT_TRUE(socket->WaitReadable(Soon()).ok());
      FrameHeader header;
      std::string message;
      grpc::ByteBuffer got;
      ASSERT_TRUE(socket->Read(kMaxBody, 0, Soon(), &header, &message, &got).ok());
      ASSERT_EQ(header.call_id, static_cast<uint64_t>(i));
      ASSERT_EQ(Flatten(got), expected);
    }
  };
  std::vector<std::thread> threads;
  threads.emplace_back(write, server_.get());
  threads.emplace_back(write, client_.get());
  threads.emplace_back(read, server_.get());
  threads.emplace_back(read, client_.get());
  for (std::thread& thread : threads) thread.join();
}

TEST_F(TlsContextTest, WaitReadableWaitsForAFrame) {
  ConnectVerified(/*mutual=*/false);
  EXPECT_EQ(client_->WaitReadable(absl::Now() + absl::Milliseconds(50)).code(),
            absl::StatusCode::kDeadlineExceeded);
  FrameHeader header;
  header.response = true;
  header.method = 1;
  header.call_id = 1;
  ASSERT_TRUE(server_->Write(header, "", nullptr, Soon()).ok());
  EXPECT_TRUE(client_->WaitReadable(Soon()).ok());
}

TEST_F(TlsContextTest, TheShardIsVerifiedByItsCaAndName) {
  std::shared_ptr<const TlsContext> server = ForServer(Server(false));
  ASSERT_NE(server, nullptr);
  // In the certificate: its address and "localhost".
  EXPECT_TRUE(Connect(*server, *ForClient(Client()), "localhost").client.ok());

  common::ClientSecurity stranger = Client();
  stranger.ca_file = File("stranger", "ca.pem");
  const absl::Status distrusted = Connect(*server, *ForClient(stranger)).client;
  EXPECT_EQ(distrusted.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(distrusted.message(), HasSubstr("certificate"));

  EXPECT_EQ(Connect(*server, *ForClient(Client()), "10.1.2.3").client.code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(Connect(*server, *ForClient(Client()), "shard-7.example").client.code(),
            absl::StatusCode::kUnavailable);
  common::ClientSecurity renamed = Client();
  renamed.server_name = "localhost";  // what the certificate names, not the address
  EXPECT_TRUE(Connect(*server, *ForClient(renamed), "shard-7.example").client.ok());
}

TEST_F(TlsContextTest, MutualTlsRefusesClientsWithoutTheCasCertificate) {
  std::shared_ptr<const TlsContext> server = ForServer(Server(true));
  ASSERT_NE(server, nullptr);
  EXPECT_TRUE(Connect(*server, *ForClient(Client())).server.ok());

  common::ClientSecurity anonymous = Client();
  anonymous.cert_file.clear();
  anonymous.key_file.clear();
  EXPECT_EQ(Connect(*server, *ForClient(anonymous)).server.code(),
            absl::StatusCode::kUnavailable);
  // TLS 1.3: the client may finish first; its first read then fails.
  FrameHeader header;
  std::string message;
  grpc::ByteBuffer body;
  EXPECT_FALSE(client_->Read(kMaxBody, 0, Soon(), &header, &message, &body).ok());

  common::ClientSecurity stranger = Client();
  stranger.cert_file = File("stranger", "client.pem");
  stranger.key_file = File("stranger", "client.key");
  EXPECT_EQ(Connect(*server, *ForClient(stranger)).server.code(),
            absl::StatusCode::kUnavailable);
}

TEST_F(TlsContextTest, AHandshakeWithASilentPeerEndsAtItsDeadlineOrInterrupter) {
  std::shared_ptr<const TlsContext> client = ForClient(Client());
  ASSERT_NE(client, nullptr);
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  FrameSocket silent(fds[0]);  // never answers
  {
    FrameSocket socket(fds[1]);
    const absl::Time start = absl::Now();
    EXPECT_EQ(socket.StartTls(*client, "127.0.0.1", start + absl::Milliseconds(200)).code(),
              absl::StatusCode::kDeadlineExceeded);
    EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  }
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  FrameSocket silent_too(fds[0]);
  FrameSocket socket(fds[1]);
  Interrupter interrupter;
  std::thread cut([&] {
    absl::SleepFor(absl::Milliseconds(100));
    interrupter.Trigger();
  });
  EXPECT_EQ(socket.StartTls(*client, "127.0.0.1", Soon(), &interrupter).code(),
            absl::StatusCode::kCancelled);
  cut.join();
}

}  // namespace
}  // namespace shardtrain::wire
