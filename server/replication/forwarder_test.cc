#include "server/replication/forwarder.h"

#include <memory>
#include <string>

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>
#include <prometheus/registry.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

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

}  // namespace
}  // namespace shardtrain::server
