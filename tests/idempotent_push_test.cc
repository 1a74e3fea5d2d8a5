// IdempotentPush: a push whose response is lost after the shard applied it
// is sent again with the same (worker, worker_incarnation, sequence), and
// the shard applies it once. A client interceptor turns the status of the
// first Push into UNAVAILABLE after the shard answered OK; the client
// retries, and the shard must report one update and one duplicate.
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/client_interceptor.h>
#include <grpcpp/support/interceptor.h>

#include "absl/synchronization/mutex.h"
#include "client/ps_client.h"
#include "gtest/gtest.h"
#include "server/ps_server.h"

namespace shardtrain {
namespace {

constexpr int64_t kElements = 250;

// What the interceptor saw of every Push attempt.
struct PushLog {
  absl::Mutex mu;
  std::vector<uint64_t> sequences ABSL_GUARDED_BY(mu);
  std::vector<uint64_t> incarnations ABSL_GUARDED_BY(mu);
  int responses_dropped ABSL_GUARDED_BY(mu) = 0;
  int to_drop ABSL_GUARDED_BY(mu) = 1;
};

// Records each Push's sequence and, while log->to_drop > 0, replaces an OK
// answer with UNAVAILABLE: the shard applied the push, the client never
// hears of it.
class DropFirstPushResponse : public grpc::experimental::Interceptor {
 public:
  DropFirstPushResponse(PushLog* log, bool is_push) : log_(log), is_push_(is_push) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    using grpc::experimental::InterceptionHookPoints;
    if (is_push_ &&
        methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_MESSAGE)) {
      // The client sends raw bytes (grpc::GenericStub): parse a copy of them
      // (it shares the slices) as the shard would.
      grpc::ByteBuffer* sent = methods->GetSerializedSendMessage();
      PushRequest request;
      if (sent != nullptr) {
        grpc::ByteBuffer copy = *sent;
        EXPECT_TRUE((grpc::GenericDeserialize<grpc::ProtoBufferReader, PushRequest>(
                         &copy, &request))
                        .ok());
        absl::MutexLock lock(&log_->mu);
        log_->sequences.push_back(request.sequence());
        log_->incarnations.push_back(request.worker_incarnation());
      }
    }
    if (is_push_ &&
        methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_STATUS)) {
      grpc::Status* status = methods->GetRecvStatus();
      absl::MutexLock lock(&log_->mu);
      if (status->ok() && log_->to_drop > 0) {
        --log_->to_drop;
        ++log_->responses_dropped;
        *status = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                               "test: response lost after the shard applied the push");
      }
    }
    methods->Proceed();
  }

 private:
  PushLog* const log_;
  const bool is_push_;
};

class DropFirstPushResponseFactory
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit DropFirstPushResponseFactory(PushLog* log) : log_(log) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* info) override {
    return new DropFirstPushResponse(
        log_, std::string(info->method()) == "/shardtrain.ParameterServer/Push");
  }

 private:
  PushLog* const log_;
};

TEST(IdempotentPush, ARetriedPushIsAppliedOnce) {
  server::PsServerOptions options;
  options.metrics_address = "";
  options.shard.partitioning = {100, 1};
  options.shard.mode = server::ConsistencyMode::kAsync;
  options.shard.num_workers = 1;
  auto shard = server::PsServer::Start(options);
  ASSERT_TRUE(shard.ok()) << shard.status();

  PushLog log;
  client::PsClientOptions client_options;
  client_options.servers = {"127.0.0.1:" + std::to_string((*shard)->port())};
  client_options.max_partition_elements = 100;
  client_options.reconnect_timeout = absl::Seconds(10);
  // One Push RPC per push, so the log below counts attempts of that one.
  client_options.channels_per_shard = 1;
  client_options.interceptors = [&log](int) {
    std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>>
        factories;
    factories.push_back(std::make_unique<DropFirstPushResponseFactory>(&log));
    return factories;
  };
  auto client = client::PsClient::Create(client_options, nullptr).value();
  TensorSpec spec;
  spec.set_name("w");
  spec.add_shape(kElements);
  spec.set_dtype(DTYPE_F32);
  ASSERT_TRUE(client->Register({spec}).ok());

  std::vector<float> grad(kElements, 0.5f);
  std::vector<absl::Span<const float>> grads = {grad};
  client::PushStats stats;
  ASSERT_TRUE(client->Push(1, grads, &stats).ok());

  {
    absl::MutexLock lock(&log.mu);
    // The client sent the push twice, with one sequence number.
    EXPECT_EQ(log.responses_dropped, 1);
    ASSERT_EQ(log.sequences.size(), 2u);
    EXPECT_EQ(log.sequences[0], 1u);
    EXPECT_EQ(log.sequences[1], log.sequences[0]);
    EXPECT_NE(log.incarnations[0], 0u);
    EXPECT_EQ(log.incarnations[1], log.incarnations[0]);
  }
  StatusResponse status;
  (*shard)->shard().FillStatus(StatusRequest(), &status);
  // 250 elements in partitions of 100: three partitions, each updated once.
  ASSERT_EQ(status.partitions_size(), 3);
  for (const PartitionInfo& info : status.partitions()) EXPECT_EQ(info.version(), 1);
  EXPECT_EQ(status.updates_applied(), 3) << "the retried push was applied twice";
  EXPECT_EQ(status.duplicate_pushes(), 1);

  // The next push is a new one.
  ASSERT_TRUE(client->Push(2, grads, &stats).ok());
  {
    absl::MutexLock lock(&log.mu);
    ASSERT_EQ(log.sequences.size(), 3u);
    EXPECT_EQ(log.sequences[2], 2u);
  }
  status.Clear();
  (*shard)->shard().FillStatus(StatusRequest(), &status);
  for (const PartitionInfo& info : status.partitions()) {
    EXPECT_EQ(info.version(), 2) << "the second push applies once more";
  }
  EXPECT_TRUE((*shard)->Shutdown().ok());
}

}  // namespace
}  // namespace shardtrain
