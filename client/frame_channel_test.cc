// FrameChannel against a hand-driven data port: a FrameListener whose one
// connection the test reads and answers itself.
#include "client/frame_channel.h"

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

}  // namespace
}  // namespace shardtrain::client
