// FrameChannel against a hand-driven data port: a FrameListener whose one
// connection the test reads and answers itself.
#include "client/frame_channel.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "wire/frame_header.h"
#include "wire/frame_listener.h"
#include "wire/frame_socket.h"

namespace shardtrain::client {
namespace {

constexpr uint64_t kMaxBytes = 64 << 20;

grpc::ByteBuffer Bytes(const std::string& text) {
  grpc::Slice slice(text);
  return grpc::ByteBuffer(&slice, 1);
}

std::string Text(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& slice : slices) {
    out.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return out;
}

// What one call's `done` saw.
struct Outcome {
  absl::Notification ended;
  std::atomic<int> runs{0};
  grpc::Status status;
  bool reached = false;
  grpc::ByteBuffer response;

  FrameChannel::Done Done() {
    return [this](grpc::Status s, bool r) {
      status = std::move(s);
      reached = r;
      if (runs.fetch_add(1) == 0) ended.Notify();
    };
  }
};

class FrameChannelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<wire::FrameListener>> listener =
        wire::FrameListener::Listen("127.0.0.1:0");
    ASSERT_TRUE(listener.ok()) << listener.status();
    listener_ = *std::move(listener);
    channel_ = std::make_unique<FrameChannel>("127.0.0.1", listener_->port(), kMaxBytes);
  }

  // The shard's end of the channel's connection (after its first call).
  std::unique_ptr<wire::FrameSocket> Accept() {
    absl::StatusOr<std::unique_ptr<wire::FrameSocket>> socket = listener_->Accept();
    EXPECT_TRUE(socket.ok()) << socket.status();
    return socket.ok() ? *std::move(socket) : nullptr;
  }

  static wire::FrameHeader ReadRequest(wire::FrameSocket& shard) {
    wire::FrameHeader header;
    std::string message;
    grpc::ByteBuffer body;
    EXPECT_TRUE(shard.Read(kMaxBytes, 0, absl::Now() + absl::Seconds(10), &header, &message, &body)
                    .ok());
    return header;
  }

  static void Answer(wire::FrameSocket& shard, uint64_t call_id, const std::string& body) {
    wire::FrameHeader header;
    header.response = true;
    header.method = static_cast<uint8_t>(wire::DataMethod::kPull);
    header.call_id = call_id;
    const grpc::ByteBuffer bytes = Bytes(body);
    ASSERT_TRUE(shard.Write(header, "", &bytes, absl::Now() + absl::Seconds(10)).ok());
  }

  std::unique_ptr<wire::FrameListener> listener_;
  std::unique_ptr<FrameChannel> channel_;
};

TEST_F(FrameChannelTest, CancelEndsACallAtOnceAndItsAnswerIsDropped) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  const grpc::ByteBuffer request = Bytes("pull");
  Outcome first, second;
  const uint64_t first_id = channel_->Call(wire::DataMethod::kPull, request, &first.response,
                                           deadline, first.Done());
  const uint64_t second_id = channel_->Call(wire::DataMethod::kPull, request, &second.response,
                                            deadline, second.Done());
  ASSERT_NE(first_id, 0u);
  ASSERT_NE(second_id, 0u);
  std::unique_ptr<wire::FrameSocket> shard = Accept();
  ASSERT_NE(shard, nullptr);
  EXPECT_EQ(ReadRequest(*shard).call_id, first_id);
  EXPECT_EQ(ReadRequest(*shard).call_id, second_id);

  channel_->Cancel(first_id);
  ASSERT_TRUE(first.ended.HasBeenNotified()) << "a cancelled call ends at once";
  EXPECT_EQ(first.status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(first.reached);
  EXPECT_FALSE(second.ended.HasBeenNotified()) << "the connection's other call goes on";

  // The shard answers both: the cancelled call's answer is dropped, the
  // other call gets its own.
  Answer(*shard, first_id, "late");
  Answer(*shard, second_id, "params");
  ASSERT_TRUE(second.ended.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_TRUE(second.status.ok()) << second.status.error_message();
  EXPECT_EQ(Text(second.response), "params");
  EXPECT_EQ(first.runs.load(), 1);
  EXPECT_EQ(first.response.Length(), 0u) << "the late answer went nowhere";

  // Cancelling an ended call, or one that never was, does nothing.
  channel_->Cancel(second_id);
  channel_->Cancel(first_id);
  channel_->Cancel(12345);
  EXPECT_EQ(first.runs.load(), 1);
  EXPECT_EQ(second.runs.load(), 1);
  EXPECT_TRUE(second.status.ok());
}

// A call's AttemptCancel reaches it while its request is still being
// written to a shard that stopped reading: the write is cut short, and
// `done` runs only once the writing thread has let go of the request.
TEST_F(FrameChannelTest, ACancelCutsABlockedWriteShortAndEndsTheCallAfterIt) {
  // Far more than the loopback socket buffers hold.
  const grpc::ByteBuffer request = Bytes(std::string(48 << 20, 'g'));
  AttemptCancel cancel;
  Outcome outcome;
  std::atomic<bool> call_returned{false};
  std::thread caller([&] {
    channel_->Call(wire::DataMethod::kPush, request, &outcome.response,
                   absl::Now() + absl::Seconds(60), outcome.Done(), &cancel);
    call_returned.store(true);
  });
  std::unique_ptr<wire::FrameSocket> shard = Accept();  // and never read
  ASSERT_NE(shard, nullptr);
  absl::SleepFor(absl::Milliseconds(300));
  ASSERT_FALSE(call_returned.load()) << "the write did not block (socket buffers this large?)";
  ASSERT_FALSE(outcome.ended.HasBeenNotified());

  const absl::Time cancelled = absl::Now();
  cancel.Cancel();
  ASSERT_TRUE(outcome.ended.WaitForNotificationWithTimeout(absl::Seconds(10)))
      << "the cancelled call waited for its deadline";
  EXPECT_LT(absl::Now() - cancelled, absl::Seconds(5));
  EXPECT_EQ(outcome.status.error_code(), grpc::StatusCode::CANCELLED);
  caller.join();
  EXPECT_EQ(outcome.runs.load(), 1);
}

// A cancel that comes before the call is sent (AbandonDeparted while the
// attempt was being encoded) ends it as soon as it is registered.
TEST_F(FrameChannelTest, ACancelBeforeTheCallEndsItWhenItIsRegistered) {
  AttemptCancel cancel;
  cancel.Cancel();
  Outcome outcome;
  const grpc::ByteBuffer request = Bytes("push");
  channel_->Call(wire::DataMethod::kPush, request, &outcome.response,
                 absl::Now() + absl::Seconds(30), outcome.Done(), &cancel);
  ASSERT_TRUE(outcome.ended.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(outcome.status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(outcome.runs.load(), 1);
}

TEST_F(FrameChannelTest, AnUnansweredCallEndsAtItsDeadline) {
  Outcome outcome;
  const grpc::ByteBuffer request = Bytes("pull");
  const absl::Time start = absl::Now();
  channel_->Call(wire::DataMethod::kPull, request, &outcome.response,
                 start + absl::Milliseconds(200), outcome.Done());
  std::unique_ptr<wire::FrameSocket> shard = Accept();
  ASSERT_NE(shard, nullptr);
  ASSERT_TRUE(outcome.ended.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(outcome.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(200));
}

// A port on 127.0.0.1 whose connects hang: a listener with a backlog of 0
// whose one queue slot is taken and never accepted (the kernel drops the
// SYNs after it). Closes its sockets when it goes.
class HangingPort {
 public:
  HangingPort() {
    listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    EXPECT_EQ(::bind(listener_, reinterpret_cast<sockaddr*>(&address), length), 0);
    EXPECT_EQ(::listen(listener_, 0), 0);
    EXPECT_EQ(::getsockname(listener_, reinterpret_cast<sockaddr*>(&address), &length), 0);
    port_ = ntohs(address.sin_port);
    queued_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    EXPECT_EQ(::connect(queued_, reinterpret_cast<sockaddr*>(&address), length), 0);
  }
  ~HangingPort() { Close(); }
  // The port refuses connects from now on.
  void Close() {
    if (listener_ < 0) return;
    ::close(queued_);
    ::close(listener_);
    listener_ = queued_ = -1;
  }
  int port() const { return port_; }

 private:
  int listener_ = -1;
  int queued_ = -1;
  int port_ = 0;
};

// A connect to a host that does not answer holds up only the calls that
// need it, each no longer than its own deadline: set_port, Cancel and
// the channel's other calls go on meanwhile.
TEST_F(FrameChannelTest, AConnectThatHangsHoldsUpNoOneElse) {
  HangingPort hanging;
  FrameChannel channel("127.0.0.1", hanging.port(), kMaxBytes,
                       /*connect_timeout=*/absl::Seconds(20));
  const grpc::ByteBuffer request = Bytes("pull");
  Outcome connecting;
  std::thread caller([&] {
    channel.Call(wire::DataMethod::kPull, request, &connecting.response,
                 absl::Now() + absl::Seconds(30), connecting.Done());
  });
  absl::SleepFor(absl::Milliseconds(200));
  ASSERT_FALSE(connecting.ended.HasBeenNotified()) << "the connect did not hang";

  // Another call waits for that connect no longer than its deadline.
  Outcome waiting;
  const absl::Time start = absl::Now();
  channel.Call(wire::DataMethod::kPull, request, &waiting.response,
               start + absl::Milliseconds(300), waiting.Done());
  ASSERT_TRUE(waiting.ended.HasBeenNotified());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(waiting.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_FALSE(waiting.reached);

  // The shard moved: set_port and Cancel do not wait for the connect.
  const absl::Time moved = absl::Now();
  channel.set_port(listener_->port());
  channel.Cancel(12345);
  EXPECT_EQ(channel.port(), listener_->port());
  EXPECT_LT(absl::Now() - moved, absl::Seconds(5));

  // The hanging connect ends when the old port refuses its SYN's next
  // retry, and the call ends unsent; the next call goes to the new port.
  ASSERT_FALSE(connecting.ended.HasBeenNotified());
  hanging.Close();
  ASSERT_TRUE(connecting.ended.WaitForNotificationWithTimeout(absl::Seconds(25)));
  caller.join();
  EXPECT_EQ(connecting.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_FALSE(connecting.reached);

  Outcome next;
  const uint64_t id = channel.Call(wire::DataMethod::kPull, request, &next.response,
                                   absl::Now() + absl::Seconds(30), next.Done());
  std::unique_ptr<wire::FrameSocket> shard = Accept();
  ASSERT_NE(shard, nullptr);
  EXPECT_EQ(ReadRequest(*shard).call_id, id);
  Answer(*shard, id, "params");
  ASSERT_TRUE(next.ended.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_TRUE(next.status.ok()) << next.status.error_message();
  EXPECT_EQ(Text(next.response), "params");
}

}  // namespace
}  // namespace shardtrain::client
