#include "wire/frame_socket.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/support/slice.h>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "wire/buffer_pool.h"
#include "wire/frame_header.h"
#include "wire/frame_listener.h"
#include "wire/interrupter.h"
#include "wire/testing/flatten.h"
#include "wire/testing/hanging_port.h"

namespace shardtrain::wire {
namespace {

constexpr uint64_t kMaxBody = 64 << 20;
constexpr uint32_t kMaxMessage = 4096;

// Two connected frame sockets.
struct Pair {
  Pair() {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    a = std::make_unique<FrameSocket>(fds[0]);
    b = std::make_unique<FrameSocket>(fds[1]);
  }
  std::unique_ptr<FrameSocket> a;
  std::unique_ptr<FrameSocket> b;
};

absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

// Writes `count` frames of `body` (calls 0 .. count - 1) on a thread of
// their own, so that the reader can drain a socket they overfill.
std::thread WriteFrames(FrameSocket* socket, const grpc::ByteBuffer* body, uint64_t count) {
  return std::thread([socket, body, count] {
    FrameHeader header;
    header.method = 1;
    for (uint64_t call = 0; call < count; ++call) {
      header.call_id = call;
      ASSERT_TRUE(socket->Write(header, "", body, Soon()).ok());
    }
  });
}

// Reads the `count` frames WriteFrames sends and checks each one's call and
// body; each body is released before the next is read.
void ReadFrames(FrameSocket* socket, const std::string& payload, uint64_t count) {
  for (uint64_t call = 0; call < count; ++call) {
    FrameHeader header;
    std::string message;
    grpc::ByteBuffer read;
    ASSERT_TRUE(socket->Read(kMaxBody, kMaxMessage, Soon(), &header, &message, &read).ok());
    EXPECT_EQ(header.call_id, call);
    EXPECT_TRUE(Flatten(read) == payload) << "call " << call;
  }
}

TEST(FrameHeaderTest, EncodesEveryFieldAndRefusesWhatNoPeerSends) {
  FrameHeader header;
  header.response = true;
  header.method = 3;
  header.status = 14;
  header.timeout_ms = 0x01020304;
  header.call_id = 0x1122334455667788;
  header.message_bytes = 17;
  header.body_bytes = (uint64_t{1} << 33) + 5;
  char bytes[FrameHeader::kBytes];
  header.Encode(bytes);
  EXPECT_EQ(std::string(bytes, 4), "STF1");
  absl::StatusOr<FrameHeader> read = FrameHeader::Decode(bytes, uint64_t{1} << 34, 100);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_TRUE(read->response);
  EXPECT_EQ(read->method, 3);
  EXPECT_EQ(read->status, 14);
  EXPECT_EQ(read->timeout_ms, 0x01020304u);
  EXPECT_EQ(read->call_id, 0x1122334455667788u);
  EXPECT_EQ(read->message_bytes, 17u);
  EXPECT_EQ(read->body_bytes, (uint64_t{1} << 33) + 5);

  // Limits, before anything of the body or message is read.
  EXPECT_EQ(FrameHeader::Decode(bytes, uint64_t{1} << 33, 100).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(FrameHeader::Decode(bytes, uint64_t{1} << 34, 16).status().code(),
            absl::StatusCode::kResourceExhausted);
  // Another protocol, unknown flags, method 0, a request with a status.
  char bad[FrameHeader::kBytes];
  std::memcpy(bad, bytes, sizeof(bad));
  bad[0] = 'G';
  EXPECT_EQ(FrameHeader::Decode(bad, ~uint64_t{0}, ~0u).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::memcpy(bad, bytes, sizeof(bad));
  bad[4] = 3;
  EXPECT_EQ(FrameHeader::Decode(bad, ~uint64_t{0}, ~0u).status().code(),
            absl::StatusCode::kInvalidArgument);
  header.method = 0;
  header.Encode(bad);
  EXPECT_EQ(FrameHeader::Decode(bad, ~uint64_t{0}, ~0u).status().code(),
            absl::StatusCode::kInvalidArgument);
  header.method = 1;
  header.response = false;
  header.Encode(bad);
  EXPECT_EQ(FrameHeader::Decode(bad, ~uint64_t{0}, ~0u).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(FrameSocketTest, AFrameOfSeveralSlicesArrivesWholeInOneSlice) {
  Pair pair;
  const std::string first(1000, 'x');
  const std::string second = "tail";
  grpc::Slice slices[2] = {grpc::Slice(first), grpc::Slice(second)};
  const grpc::ByteBuffer body(slices, 2);
  FrameHeader request;
  request.method = 2;
  request.call_id = 42;
  request.timeout_ms = 5000;
  ASSERT_TRUE(pair.a->Write(request, "", &body, Soon()).ok());

  FrameHeader header;
  std::string message;
  grpc::ByteBuffer read;
  ASSERT_TRUE(pair.b->Read(kMaxBody, kMaxMessage, Soon(), &header, &message, &read).ok());
  EXPECT_FALSE(header.response);
  EXPECT_EQ(header.method, 2);
  EXPECT_EQ(header.call_id, 42u);
  EXPECT_EQ(header.timeout_ms, 5000u);
  EXPECT_EQ(header.body_bytes, first.size() + second.size());
  EXPECT_TRUE(message.empty());
  std::vector<grpc::Slice> parts;
  ASSERT_TRUE(read.Dump(&parts).ok());
  EXPECT_EQ(parts.size(), 1u) << "read into one slice, wrapped without a copy";
  EXPECT_EQ(Flatten(read), first + second);

  // A failed call's answer: its status and message, no body.
  FrameHeader response;
  response.response = true;
  response.method = 2;
  response.call_id = 42;
  response.status = 3;
  ASSERT_TRUE(pair.b->Write(response, "bad partition", nullptr, Soon()).ok());
  ASSERT_TRUE(pair.a->Read(kMaxBody, kMaxMessage, Soon(), &header, &message, &read).ok());
  EXPECT_TRUE(header.response);
  EXPECT_EQ(header.status, 3);
  EXPECT_EQ(message, "bad partition");
  EXPECT_EQ(header.body_bytes, 0u);
  EXPECT_EQ(Flatten(read), "");
}

TEST(FrameSocketTest, LargeFramesCrossAFullSocket) {
  Pair pair;
  // Larger than any socket buffer: written in many partial writes while
  // the other side reads.
  std::string payload(24 << 20, '\0');
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<char>(i * 131 + 7);
  const grpc::Slice slice(payload.data(), payload.size(), grpc::Slice::STATIC_SLICE);
  const grpc::ByteBuffer body(&slice, 1);
  std::thread writer = WriteFrames(pair.a.get(), &body, 3);
  ReadFrames(pair.b.get(), payload, 3);
  writer.join();
}

TEST(FrameSocketTest, BodiesFrom32MiBUpReuseThePoolsBlocks) {
  // malloc maps such a body fresh from the kernel on every frame, and its
  // page faults cost ten times the rest of the frame's CPU: the reader takes
  // it from BufferPool::Default(), where the next frame finds it again.
  Pair pair;
  std::string payload((32 << 20) + 100, '\0');
  for (size_t i = 0; i < payload.size(); i += 4096) payload[i] = static_cast<char>(i / 4096 + 1);
  const grpc::Slice slice(payload.data(), payload.size(), grpc::Slice::STATIC_SLICE);
  const grpc::ByteBuffer body(&slice, 1);
  const BufferPool::Stats before = BufferPool::Default().stats();
  std::thread writer = WriteFrames(pair.a.get(), &body, 3);
  ReadFrames(pair.b.get(), payload, 3);  // each body goes back to the pool as the next is read
  writer.join();
  const BufferPool::Stats after = BufferPool::Default().stats();
  EXPECT_EQ(after.allocated - before.allocated + after.reused - before.reused, 3);
  EXPECT_GE(after.reused - before.reused, 2);
}

TEST(FrameSocketTest, SmallerBodiesStayOffThePool) {
  Pair pair;
  const std::string payload(1 << 20, 'x');
  const grpc::Slice slice(payload.data(), payload.size(), grpc::Slice::STATIC_SLICE);
  const grpc::ByteBuffer body(&slice, 1);
  const BufferPool::Stats before = BufferPool::Default().stats();
  std::thread writer = WriteFrames(pair.a.get(), &body, 1);
  ReadFrames(pair.b.get(), payload, 1);
  writer.join();
  const BufferPool::Stats after = BufferPool::Default().stats();
  EXPECT_EQ(after.allocated, before.allocated);
  EXPECT_EQ(after.reused, before.reused);
}

TEST(FrameSocketTest, LimitsDeadlinesAndEndsAreTold) {
  FrameHeader header;
  std::string message;
  grpc::ByteBuffer read;
  {
    // A body over the limit is refused from its header.
    Pair pair;
    const grpc::Slice slice(std::string(1000, 'y'));
    const grpc::ByteBuffer body(&slice, 1);
    FrameHeader request;
    request.method = 1;
    ASSERT_TRUE(pair.a->Write(request, "", &body, Soon()).ok());
    EXPECT_EQ(pair.b->Read(999, kMaxMessage, Soon(), &header, &message, &read).code(),
              absl::StatusCode::kResourceExhausted);
  }
  {
    // Nothing arrives: the deadline ends the wait.
    Pair pair;
    const absl::Time start = absl::Now();
    EXPECT_EQ(pair.b->Read(kMaxBody, kMaxMessage, absl::Now() + absl::Milliseconds(100),
                           &header, &message, &read)
                  .code(),
              absl::StatusCode::kDeadlineExceeded);
    EXPECT_GE(absl::Now() - start, absl::Milliseconds(90));
  }
  {
    // A close between frames is a clean end; within a frame it is not.
    Pair pair;
    pair.a.reset();
    EXPECT_EQ(pair.b->Read(kMaxBody, kMaxMessage, Soon(), &header, &message, &read).code(),
              absl::StatusCode::kOutOfRange);
  }
  {
    int fds[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    FrameSocket reader(fds[1]);
    FrameHeader request;
    request.method = 1;
    request.body_bytes = 100;
    char bytes[FrameHeader::kBytes];
    request.Encode(bytes);
    ASSERT_EQ(::write(fds[0], bytes, sizeof(bytes)), static_cast<ssize_t>(sizeof(bytes)));
    ASSERT_EQ(::write(fds[0], "partial", 7), 7);
    ::close(fds[0]);
    EXPECT_EQ(reader.Read(kMaxBody, kMaxMessage, Soon(), &header, &message, &read).code(),
              absl::StatusCode::kUnavailable);
  }
  {
    // Shutdown wakes a reader blocked in another thread.
    Pair pair;
    absl::Status status;
    std::thread reader([&] {
      status = pair.b->Read(kMaxBody, kMaxMessage, Soon(), &header, &message, &read);
    });
    absl::SleepFor(absl::Milliseconds(50));
    const absl::Time start = absl::Now();
    pair.b->Shutdown();
    reader.join();
    EXPECT_LT(absl::Now() - start, absl::Seconds(5));
    EXPECT_FALSE(status.ok());
  }
  {
    // Writing to a closed peer fails (and raises no SIGPIPE).
    Pair pair;
    pair.b.reset();
    const grpc::Slice slice(std::string(1 << 20, 'z'));
    const grpc::ByteBuffer body(&slice, 1);
    FrameHeader request;
    request.method = 1;
    EXPECT_EQ(pair.a->Write(request, "", &body, Soon()).code(), absl::StatusCode::kUnavailable);
  }
}

TEST(FrameListenerTest, AddressesSplitAndDataPortHostsAreOnlyTcpOnes) {
  std::string host;
  int port = -1;
  ASSERT_TRUE(SplitHostPort("127.0.0.1:8470", &host, &port).ok());
  EXPECT_EQ(host, "127.0.0.1");
  EXPECT_EQ(port, 8470);
  ASSERT_TRUE(SplitHostPort("[::1]:0", &host, &port).ok());
  EXPECT_EQ(host, "::1");
  EXPECT_EQ(port, 0);
  EXPECT_EQ(SplitHostPort("localhost", &host, &port).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SplitHostPort("h:70000", &host, &port).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SplitHostPort("h:-1", &host, &port).code(), absl::StatusCode::kInvalidArgument);

  EXPECT_EQ(DataPortHost("ps-0.ps:8470"), "ps-0.ps");
  EXPECT_EQ(DataPortHost("[::1]:8470"), "::1");
  // A Unix socket and an address without a port have no data port.
  EXPECT_EQ(DataPortHost("unix:/tmp/ps.sock"), std::nullopt);
  EXPECT_EQ(DataPortHost("unix:///run/ps.sock"), std::nullopt);
  EXPECT_EQ(DataPortHost("localhost"), std::nullopt);
  // Nor has a resolver's URI, whose addresses gRPC finds.
  EXPECT_EQ(DataPortHost("dns:///ps-0.ps:8470"), std::nullopt);
}

TEST(FrameSocketTest, ConnectsOverTcpAndTellsARefusal) {
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(::listen(listener, 4), 0);
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length), 0);
  const int port = ntohs(address.sin_port);

  absl::StatusOr<std::unique_ptr<FrameSocket>> client =
      FrameSocket::Connect("127.0.0.1", port, absl::Seconds(10));
  ASSERT_TRUE(client.ok()) << client.status();
  const int accepted = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
  ASSERT_GE(accepted, 0);
  FrameSocket server(accepted);
  const grpc::Slice slice(std::string("ping"));
  const grpc::ByteBuffer body(&slice, 1);
  FrameHeader request;
  request.method = 9;
  request.call_id = 1;
  ASSERT_TRUE((*client)->Write(request, "", &body, Soon()).ok());
  FrameHeader header;
  std::string message;
  grpc::ByteBuffer read;
  ASSERT_TRUE(server.Read(kMaxBody, kMaxMessage, Soon(), &header, &message, &read).ok());
  EXPECT_EQ(Flatten(read), "ping");
  ::close(listener);

  // Nothing listens there any more.
  EXPECT_EQ(FrameSocket::Connect("127.0.0.1", port, absl::Seconds(10)).status().code(),
            absl::StatusCode::kUnavailable);
}

// A connect that hangs (the host does not answer) ends as soon as its
// Interrupter fires, not at its timeout; one fired before never starts.
TEST(FrameSocketTest, AnInterruptEndsAConnectThatHangs) {
  HangingPort hanging;
  Interrupter interrupter;
  std::thread trigger([&] {
    absl::SleepFor(absl::Milliseconds(200));
    interrupter.Trigger();
  });
  const absl::Time start = absl::Now();
  const absl::Status status =
      FrameSocket::Connect("127.0.0.1", hanging.port(), absl::Seconds(20), &interrupter).status();
  trigger.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled) << status;
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(150));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_TRUE(interrupter.triggered());

  interrupter.Trigger();  // idempotent
  EXPECT_EQ(FrameSocket::Connect("127.0.0.1", hanging.port(), absl::Seconds(20), &interrupter)
                .status()
                .code(),
            absl::StatusCode::kCancelled);
  // Without one, the same connect runs to its timeout.
  EXPECT_EQ(FrameSocket::Connect("127.0.0.1", hanging.port(), absl::Milliseconds(200))
                .status()
                .code(),
            absl::StatusCode::kDeadlineExceeded);
}

}  // namespace
}  // namespace shardtrain::wire
