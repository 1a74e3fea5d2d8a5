// FrameChannel against a hand-driven data port: a FrameListener whose one
// connection the test reads and answers itself.
#include "wire/frame_channel.h"

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
#include "wire/testing/hanging_port.h"

namespace shardtrain::wire {
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
    absl::StatusOr<std::unique_ptr<FrameListener>> listener =
        FrameListener::Listen("127.0.0.1:0");
    ASSERT_TRUE(listener.ok()) << listener.status();
    listener_ = *std::move(listener);
    channel_ = std::make_unique<FrameChannel>("127.0.0.1", listener_->port(), kMaxBytes);
  }

  // The shard's end of the channel's connection (after its first call).
  std::unique_ptr<FrameSocket> Accept() {
    absl::StatusOr<std::unique_ptr<FrameSocket>> socket = listener_->Accept();
    EXPECT_TRUE(socket.ok()) << socket.status();
    return socket.ok() ? *std::move(socket) : nullptr;
  }

  static FrameHeader ReadRequest(FrameSocket& shard) {
    FrameHeader header;
    std::string message;
    grpc::ByteBuffer body;
    EXPECT_TRUE(shard.Read(kMaxBytes, 0, absl::Now() + absl::Seconds(10), &header, &message, &body)
                    .ok());
    return header;
  }

  static void Answer(FrameSocket& shard, uint64_t call_id, const std::string& body) {
    FrameHeader header;
    header.response = true;
    header.method = static_cast<uint8_t>(DataMethod::kPull);
    header.call_id = call_id;
    const grpc::ByteBuffer bytes = Bytes(body);
    ASSERT_TRUE(shard.Write(header, "", &bytes, absl::Now() + absl::Seconds(10)).ok());
  }

  std::unique_ptr<FrameListener> listener_;
  std::unique_ptr<FrameChannel> channel_;
};

TEST_F(FrameChannelTest, CancelEndsACallAtOnceAndItsAnswerIsDropped) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  const grpc::ByteBuffer request = Bytes("pull");
  Outcome first, second;
  const uint64_t first_id = channel_->Call(DataMethod::kPull, request, &first.response,
                                           deadline, first.Done());
  const uint64_t second_id = channel_->Call(DataMethod::kPull, request, &second.response,
                                            deadline, second.Done());
  ASSERT_NE(first_id, 0u);
  ASSERT_NE(second_id, 0u);
  std::unique_ptr<FrameSocket> shard = Accept();
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
    channel_->Call(DataMethod::kPush, request, &outcome.response,
                   absl::Now() + absl::Seconds(60), outcome.Done(), &cancel);
    call_returned.store(true);
  });
  std::unique_ptr<FrameSocket> shard = Accept();  // and never read
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
  channel_->Call(DataMethod::kPush, request, &outcome.response,
                 absl::Now() + absl::Seconds(30), outcome.Done(), &cancel);
  ASSERT_TRUE(outcome.ended.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(outcome.status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(outcome.runs.load(), 1);
}

TEST_F(FrameChannelTest, AnUnansweredCallEndsAtItsDeadline) {
  Outcome outcome;
  const grpc::ByteBuffer request = Bytes("pull");
  const absl::Time start = absl::Now();
  channel_->Call(DataMethod::kPull, request, &outcome.response,
                 start + absl::Milliseconds(200), outcome.Done());
  std::unique_ptr<FrameSocket> shard = Accept();
  ASSERT_NE(shard, nullptr);
  ASSERT_TRUE(outcome.ended.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(outcome.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(200));
}

// A connect to a host that does not answer holds up only the calls that
// need it, each no longer than its own deadline: Cancel and the channel's
// other calls go on meanwhile, and set_port cuts the connect short.
TEST_F(FrameChannelTest, AConnectThatHangsHoldsUpNoOneElse) {
  HangingPort hanging;
  FrameChannel channel("127.0.0.1", hanging.port(), kMaxBytes,
                       /*connect_timeout=*/absl::Seconds(20));
  const grpc::ByteBuffer request = Bytes("pull");
  Outcome connecting;
  std::thread caller([&] {
    channel.Call(DataMethod::kPull, request, &connecting.response,
                 absl::Now() + absl::Seconds(30), connecting.Done());
  });
  absl::SleepFor(absl::Milliseconds(200));
  ASSERT_FALSE(connecting.ended.HasBeenNotified()) << "the connect did not hang";

  // Another call waits for that connect no longer than its deadline.
  Outcome waiting;
  const absl::Time start = absl::Now();
  channel.Call(DataMethod::kPull, request, &waiting.response,
               start + absl::Milliseconds(300), waiting.Done());
  ASSERT_TRUE(waiting.ended.HasBeenNotified());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(waiting.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_FALSE(waiting.reached);

  // Cancel does not wait for the connect.
  const absl::Time cancelled = absl::Now();
  channel.Cancel(12345);
  EXPECT_LT(absl::Now() - cancelled, absl::Seconds(5));
  ASSERT_FALSE(connecting.ended.HasBeenNotified());

  // The shard moved: set_port cuts the connect to the old port short, and
  // its call ends unsent (the caller may send it by gRPC); the next call
  // goes to the new port.
  const absl::Time moved = absl::Now();
  channel.set_port(listener_->port());
  EXPECT_EQ(channel.port(), listener_->port());
  ASSERT_TRUE(connecting.ended.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_LT(absl::Now() - moved, absl::Seconds(5));
  caller.join();
  EXPECT_EQ(connecting.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_FALSE(connecting.reached);

  Outcome next;
  const uint64_t id = channel.Call(DataMethod::kPull, request, &next.response,
                                   absl::Now() + absl::Seconds(30), next.Done());
  std::unique_ptr<FrameSocket> shard = Accept();
  ASSERT_NE(shard, nullptr);
  EXPECT_EQ(ReadRequest(*shard).call_id, id);
  Answer(*shard, id, "params");
  ASSERT_TRUE(next.ended.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_TRUE(next.status.ok()) << next.status.error_message();
  EXPECT_EQ(Text(next.response), "params");
}

// A routed call whose shard left the chain is cancelled (AbandonDeparted)
// while it connects, or while it waits for another call's connect: either
// ends at once with CANCELLED, reached (not to be sent by gRPC instead),
// not when the connect times out; the other call goes on waiting.
TEST_F(FrameChannelTest, ACancelEndsACallThatConnectsOrWaitsForAConnect) {
  HangingPort hanging;
  FrameChannel channel("127.0.0.1", hanging.port(), kMaxBytes,
                       /*connect_timeout=*/absl::Seconds(20));
  const grpc::ByteBuffer request = Bytes("push");
  // A routed push on a thread of its own, blocked in its connect.
  struct Attempt {
    AttemptCancel cancel;
    Outcome outcome;
    std::thread caller;
  };
  auto start = [&](Attempt& attempt) {
    attempt.caller = std::thread([&] {
      channel.Call(DataMethod::kPush, request, &attempt.outcome.response,
                   absl::Now() + absl::Seconds(30), attempt.outcome.Done(), &attempt.cancel);
    });
    absl::SleepFor(absl::Milliseconds(200));
    ASSERT_FALSE(attempt.outcome.ended.HasBeenNotified()) << "the connect did not hang";
  };
  // Cancels it: it ends at once, CANCELLED and reached.
  auto cancel = [](Attempt& attempt) {
    const absl::Time cancelled = absl::Now();
    attempt.cancel.Cancel();
    ASSERT_TRUE(attempt.outcome.ended.WaitForNotificationWithTimeout(absl::Seconds(5)));
    EXPECT_LT(absl::Now() - cancelled, absl::Seconds(5));
    attempt.caller.join();
    EXPECT_EQ(attempt.outcome.status.error_code(), grpc::StatusCode::CANCELLED)
        << attempt.outcome.status.error_message();
    EXPECT_TRUE(attempt.outcome.reached);
    EXPECT_EQ(attempt.outcome.runs.load(), 1);
  };
  Attempt connecting;
  Attempt waiting;
  ASSERT_NO_FATAL_FAILURE(start(connecting));
  ASSERT_NO_FATAL_FAILURE(start(waiting));
  ASSERT_NO_FATAL_FAILURE(cancel(waiting));
  EXPECT_FALSE(connecting.outcome.ended.HasBeenNotified());
  ASSERT_NO_FATAL_FAILURE(cancel(connecting));
}

// A cancel after the call was sent still reaches it: the cancel the call
// registered while it connected is replaced by the sent call's.
TEST_F(FrameChannelTest, ACancelAfterTheConnectEndsTheSentCall) {
  AttemptCancel cancel;
  Outcome outcome;
  const grpc::ByteBuffer request = Bytes("pull");
  const uint64_t id = channel_->Call(DataMethod::kPull, request, &outcome.response,
                                     absl::Now() + absl::Seconds(30), outcome.Done(), &cancel);
  ASSERT_NE(id, 0u);
  std::unique_ptr<FrameSocket> shard = Accept();
  ASSERT_NE(shard, nullptr);
  EXPECT_EQ(ReadRequest(*shard).call_id, id);
  EXPECT_FALSE(outcome.ended.HasBeenNotified());
  cancel.Cancel();
  ASSERT_TRUE(outcome.ended.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_EQ(outcome.status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(outcome.reached);
  // The connection is still good for the next call.
  Outcome next;
  const uint64_t next_id = channel_->Call(DataMethod::kPull, request, &next.response,
                                          absl::Now() + absl::Seconds(30), next.Done());
  EXPECT_EQ(ReadRequest(*shard).call_id, next_id);
  Answer(*shard, next_id, "params");
  ASSERT_TRUE(next.ended.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_TRUE(next.status.ok()) << next.status.error_message();
}

}  // namespace
}  // namespace shardtrain::wire
