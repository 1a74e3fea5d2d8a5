#include "server/replication/forwarder.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>
#include <prometheus/registry.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "chain/chain_config.h"
#include "gtest/gtest.h"
#include "wire/frame_header.h"
#include "wire/frame_listener.h"

namespace shardtrain::server {
namespace {

constexpr int kGroup = 0;

// A predecessor that streams a group's state as `parts` parts of one record
// each (partition i in part i), waiting `gap` before each, and `stall`
// instead before part `stall_at`. Every wait ends when the call does.
class SlowPredecessor : public ParameterServer::Service {
 public:
  SlowPredecessor(int parts, absl::Duration gap, int stall_at = -1,
                  absl::Duration stall = absl::ZeroDuration())
      : parts_(parts), gap_(gap), stall_at_(stall_at), stall_(stall) {}

  grpc::Status FetchGroupState(grpc::ServerContext* context, const GroupStateRequest* request,
                               grpc::ServerWriter<GroupStateResponse>* writer) override {
    if (request->group() != kGroup) return {grpc::StatusCode::NOT_FOUND, "no such group"};
    for (int i = 0; i < parts_; ++i) {
      const absl::Time until = absl::Now() + (i == stall_at_ ? stall_ : gap_);
      while (absl::Now() < until) {
        if (context->IsCancelled()) return grpc::Status::CANCELLED;
        absl::SleepFor(absl::Milliseconds(10));
      }
      GroupStateResponse part;
      CheckpointRecord& record = *part.add_records();
      record.mutable_spec()->set_name("w");
      record.set_partition(static_cast<uint32_t>(i));
      if (!writer->Write(part)) return grpc::Status::CANCELLED;
    }
    return grpc::Status::OK;
  }

 private:
  const int parts_;
  const absl::Duration gap_;
  const int stall_at_;
  const absl::Duration stall_;
};

class ForwarderFetchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    metrics_ = std::make_unique<ReplicationMetrics>(registry_, 2);
    table_ = std::make_unique<ChainTable>(1, /*incarnation=*/5, std::vector<int>{kGroup},
                                          absl::Seconds(60), metrics_.get());
    forwarder_ = std::make_unique<Forwarder>(table_.get(), grpc::InsecureChannelCredentials(),
                                             grpc::ChannelArguments(), metrics_.get());
  }
  void TearDown() override {
    forwarder_->Stop();
    if (server_) server_->Shutdown(std::chrono::system_clock::now());
  }

  // Serves `predecessor` on 127.0.0.1 and returns its address.
  std::string Serve(SlowPredecessor* predecessor) {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(predecessor);
    server_ = builder.BuildAndStart();
    EXPECT_NE(server_, nullptr);
    EXPECT_GT(port, 0);
    return absl::StrCat("127.0.0.1:", port);
  }

  prometheus::Registry registry_;
  std::unique_ptr<ReplicationMetrics> metrics_;
  std::unique_ptr<ChainTable> table_;
  std::unique_ptr<Forwarder> forwarder_;
  std::unique_ptr<grpc::Server> server_;
};

// A copy that takes longer as a whole than one part may (a large group)
// succeeds while its parts keep coming.
TEST_F(ForwarderFetchTest, ACopyLongerThanThePartTimeoutSucceedsWhileItsPartsCome) {
  SlowPredecessor predecessor(8, absl::Milliseconds(150));
  const std::string address = Serve(&predecessor);
  const absl::Time start = absl::Now();
  absl::StatusOr<GroupStateResponse> state = forwarder_->FetchGroupState(
      address, kGroup, 1, absl::Milliseconds(700), absl::Seconds(30));
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_GT(absl::Now() - start, absl::Milliseconds(1000));
  ASSERT_EQ(state->records_size(), 8);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(state->records(i).partition(), i);
}

// A predecessor that stops sending mid-copy fails it after one part
// timeout, not after the whole copy's.
TEST_F(ForwarderFetchTest, APredecessorThatStallsFailsTheCopyAfterThePartTimeout) {
  SlowPredecessor predecessor(4, absl::Milliseconds(10), /*stall_at=*/2, absl::Seconds(20));
  const std::string address = Serve(&predecessor);
  const absl::Time start = absl::Now();
  absl::StatusOr<GroupStateResponse> state = forwarder_->FetchGroupState(
      address, kGroup, 1, absl::Milliseconds(500), absl::Seconds(30));
  const absl::Duration took = absl::Now() - start;
  ASSERT_EQ(state.status().code(), absl::StatusCode::kDeadlineExceeded) << state.status();
  EXPECT_NE(state.status().message().find("no part came within 500ms (2 part(s)"),
            std::string::npos)
      << state.status();
  EXPECT_GE(took, absl::Milliseconds(500));
  EXPECT_LT(took, absl::Seconds(5));
}

// Parts that keep coming do not stretch the copy past its whole timeout.
TEST_F(ForwarderFetchTest, TheWholeCopyIsBoundedToo) {
  SlowPredecessor predecessor(100, absl::Milliseconds(100));
  const std::string address = Serve(&predecessor);
  const absl::Time start = absl::Now();
  absl::StatusOr<GroupStateResponse> state = forwarder_->FetchGroupState(
      address, kGroup, 1, absl::Seconds(2), absl::Seconds(1));
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(state.status().code(), absl::StatusCode::kDeadlineExceeded) << state.status();
  EXPECT_LT(took, absl::Seconds(5));
}

// Nothing listens: the first part's wait fails it (wait_for_ready would
// otherwise wait for the whole copy's timeout).
TEST_F(ForwarderFetchTest, AnAddressWhereNobodyAnswersFailsAfterThePartTimeout) {
  SlowPredecessor predecessor(1, absl::ZeroDuration());
  std::string address = Serve(&predecessor);
  server_->Shutdown(std::chrono::system_clock::now());
  server_.reset();
  const absl::Time start = absl::Now();
  absl::StatusOr<GroupStateResponse> state = forwarder_->FetchGroupState(
      address, kGroup, 1, absl::Milliseconds(500), absl::Seconds(30));
  EXPECT_EQ(state.status().code(), absl::StatusCode::kDeadlineExceeded) << state.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

// The predecessor's refusal comes back with its code.
TEST_F(ForwarderFetchTest, ARefusalKeepsItsCode) {
  SlowPredecessor predecessor(1, absl::ZeroDuration());
  const std::string address = Serve(&predecessor);
  absl::StatusOr<GroupStateResponse> state = forwarder_->FetchGroupState(
      address, /*group=*/7, 1, absl::Seconds(5), absl::Seconds(30));
  EXPECT_EQ(state.status().code(), absl::StatusCode::kNotFound) << state.status();
  EXPECT_NE(state.status().message().find("state of group 7 from " + address),
            std::string::npos)
      << state.status();
}

// A chain successor for forwards: it answers Status with its incarnation
// and its data port, and Replicate over gRPC; its data port (a listener
// driven here) answers Replicate frames, one connection at a time.
class Successor : public ParameterServer::Service {
 public:
  static constexpr uint64_t kIncarnation = 9;

  Successor() {
    absl::StatusOr<std::unique_ptr<wire::FrameListener>> listener =
        wire::FrameListener::Listen("127.0.0.1:0");
    EXPECT_TRUE(listener.ok()) << listener.status();
    listener_ = *std::move(listener);
    data_port_ = listener_->port();
    serving_ = std::thread([this] { ServeFrames(); });
  }
  ~Successor() override { CloseDataPort(); }

  grpc::Status Status(grpc::ServerContext*, const StatusRequest*,
                      StatusResponse* response) override {
    response->set_incarnation(kIncarnation);
    response->set_data_port(static_cast<uint32_t>(data_port_.load()));
    return grpc::Status::OK;
  }
  grpc::Status Replicate(grpc::ServerContext*, const PushRequest*, PushResponse*) override {
    ++grpc_forwards_;
    return grpc::Status::OK;
  }

  // Stops listening and ends the connection: the port refuses from now on.
  void CloseDataPort() {
    if (!serving_.joinable()) return;
    listener_->Shutdown();
    {
      absl::MutexLock lock(&mu_);
      closed_ = true;
      if (socket_ != nullptr) socket_->Shutdown();
    }
    serving_.join();
  }

  int frame_forwards() const { return frame_forwards_.load(); }
  int grpc_forwards() const { return grpc_forwards_.load(); }

 private:
  void ServeFrames() {
    while (true) {
      absl::StatusOr<std::unique_ptr<wire::FrameSocket>> accepted = listener_->Accept();
      if (!accepted.ok()) return;
      wire::FrameSocket* socket = accepted->get();
      {
        absl::MutexLock lock(&mu_);
        if (closed_) return;
        socket_ = *std::move(accepted);
      }
      while (true) {
        wire::FrameHeader header;
        std::string message;
        grpc::ByteBuffer body;
        if (!socket->Read(64 << 20, 0, absl::InfiniteFuture(), &header, &message, &body).ok()) {
          break;
        }
        if (header.method != static_cast<uint8_t>(wire::DataMethod::kReplicate)) break;
        ++frame_forwards_;
        PushResponse response;
        response.set_incarnation(kIncarnation);
        const std::string bytes = response.SerializeAsString();
        grpc::Slice slice(bytes);
        const grpc::ByteBuffer answer(&slice, 1);
        wire::FrameHeader reply;
        reply.response = true;
        reply.method = header.method;
        reply.call_id = header.call_id;
        if (!socket->Write(reply, "", &answer, absl::Now() + absl::Seconds(10)).ok()) break;
      }
    }
  }

  std::unique_ptr<wire::FrameListener> listener_;
  std::atomic<int> data_port_{0};
  std::atomic<int> frame_forwards_{0};
  std::atomic<int> grpc_forwards_{0};
  absl::Mutex mu_;
  std::unique_ptr<wire::FrameSocket> socket_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::thread serving_;
};

// This shard (0, incarnation 5) heads group 0's chain; `successor`, served
// on 127.0.0.1, follows it.
class ForwarderFramesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&successor_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    metrics_ = std::make_unique<ReplicationMetrics>(registry_, 2);
    table_ = std::make_unique<ChainTable>(0, /*incarnation=*/5, std::vector<int>{kGroup},
                                          absl::Seconds(60), metrics_.get());
    absl::StatusOr<chain::ChainConfig> config = chain::MakeChainConfig(
        kGroup, 2,
        {{0, "127.0.0.1:1", 5}, {1, absl::StrCat("127.0.0.1:", port), Successor::kIncarnation}});
    ASSERT_TRUE(config.ok()) << config.status();
    ASSERT_TRUE(table_->Update(*config));
    forwarder_ = std::make_unique<Forwarder>(table_.get(), grpc::InsecureChannelCredentials(),
                                             grpc::ChannelArguments(), metrics_.get(),
                                             /*data_ports=*/true);
  }
  void TearDown() override {
    forwarder_->Stop();
    forwarder_.reset();
    server_->Shutdown(std::chrono::system_clock::now());
    successor_.CloseDataPort();
  }

  // Forwards an empty push of group 0 and waits (10 s at most) for its end.
  absl::Status ForwardOne() {
    auto ended = std::make_shared<absl::Notification>();
    auto status = std::make_shared<absl::Status>(absl::InternalError("done not called"));
    forwarder_->Forward(kGroup, grpc::ByteBuffer(), absl::Seconds(10),
                        [ended, status](absl::Status result) {
                          *status = std::move(result);
                          ended->Notify();
                        });
    if (!ended->WaitForNotificationWithTimeout(absl::Seconds(10))) {
      return absl::DeadlineExceededError("the forward did not end");
    }
    return *status;
  }

  double Forwards(bool frames) { return metrics_->forwards(frames).Value(); }

  Successor successor_;
  std::unique_ptr<grpc::Server> server_;
  prometheus::Registry registry_;
  std::unique_ptr<ReplicationMetrics> metrics_;
  std::unique_ptr<ChainTable> table_;
  std::unique_ptr<Forwarder> forwarder_;
};

// Forwards go by gRPC until the successor's data port is known (asked with
// a Status call), then as frames there; once the port refuses, the forward
// that found it so goes by gRPC at once, and so do the next ones.
TEST_F(ForwarderFramesTest, ForwardsGoToTheSuccessorsDataPortAndByGrpcWhenItRefuses) {
  ASSERT_TRUE(ForwardOne().ok());
  EXPECT_EQ(successor_.grpc_forwards(), 1) << "the port is not known yet";
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (successor_.frame_forwards() == 0 && absl::Now() < deadline) {
    const absl::Status status = ForwardOne();
    ASSERT_TRUE(status.ok()) << status;
  }
  ASSERT_GT(successor_.frame_forwards(), 0) << "no forward came to the data port";
  const int by_grpc = successor_.grpc_forwards();
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(ForwardOne().ok());
  EXPECT_EQ(successor_.grpc_forwards(), by_grpc) << "forwards left a data port that takes them";
  EXPECT_EQ(Forwards(/*frames=*/true), successor_.frame_forwards());

  successor_.CloseDataPort();
  const int frames = successor_.frame_forwards();
  for (int i = 0; i < 3; ++i) {
    const absl::Status status = ForwardOne();
    ASSERT_TRUE(status.ok()) << status;
  }
  EXPECT_EQ(successor_.frame_forwards(), frames);
  EXPECT_EQ(successor_.grpc_forwards(), by_grpc + 3);
  EXPECT_EQ(Forwards(/*frames=*/false), successor_.grpc_forwards());
}

}  // namespace
}  // namespace shardtrain::server
