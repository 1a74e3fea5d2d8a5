// The Echo baseline (bench/echo.proto) in gRPC's other threading models, so
// that a benchmark can tell what gRPC itself costs in each: EchoServer and
// EchoClient (bench_util.h) use the callback API, where a message is read on
// one thread and the reaction runs on another; here are
//   SyncEchoServer    the synchronous API: a handler per call on gRPC's own
//                     sync-server thread pool (its default sizes)
//   CqEchoServer      the async API: a few threads, each polling its own
//                     completion queue and answering inline (request ->
//                     reply in the polling thread, then the next call is
//                     requested again)
//   SyncEchoClient    blocking stub calls (the calling thread waits on a
//                     per-call queue of gRPC's)
//   CqEchoClient      an async stub whose one completion queue the calling
//                     thread drives (Finish, then Next)
// All of them carry the bytes as EchoServer and EchoClient do: protobuf
// bytes fields whose buffers are reused from call to call where the API lets
// them (not by the sync server, whose messages gRPC makes per call), the
// reply copied from a buffer filled at start-up, the same maximum message
// size (kMaxMessageBytes).
//
//   ASSIGN_OR_RETURN(std::unique_ptr<CqEchoServer> server,
//                    CqEchoServer::Start(max_reply_bytes, /*threads=*/1));
//   CqEchoClient client(absl::StrCat("127.0.0.1:", server->port()));
//   RETURN_IF_ERROR(client.Call(source, request_bytes, reply_bytes));
#ifndef SHARDTRAIN_BENCH_ECHO_MODELS_H_
#define SHARDTRAIN_BENCH_ECHO_MODELS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/completion_queue.h>
#include <grpcpp/server.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "bench/echo.grpc.pb.h"

namespace shardtrain::bench {

// The Echo service on gRPC's synchronous API and its server on `address`
// (port 0: chosen free). Thread-safe.
class SyncEchoServer {
 public:
  static absl::StatusOr<std::unique_ptr<SyncEchoServer>> Start(
      int64_t max_reply_bytes, const std::string& address = "127.0.0.1:0");
  ~SyncEchoServer();

  int port() const { return port_; }

 private:
  // Answers every Echo with `reply_bytes` bytes of a buffer filled at
  // start-up. Thread-safe.
  class Service final : public Echo::Service {
   public:
    explicit Service(int64_t max_reply_bytes);
    grpc::Status Echo(grpc::ServerContext* context, const EchoRequest* request,
                      EchoReply* reply) override;

   private:
    const std::string source_;
  };

  explicit SyncEchoServer(int64_t max_reply_bytes) : service_(max_reply_bytes) {}

  Service service_;  // outlives server_
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

// The Echo service on gRPC's async API: `threads` threads, each owning one
// completion queue, polling it with Next() and running the handler in the
// polling thread. Each queue keeps a few calls requested; a finished call's
// messages are cleared and reused for the next request. Thread-safe.
class CqEchoServer {
 public:
  // REQUIRES: threads >= 1.
  static absl::StatusOr<std::unique_ptr<CqEchoServer>> Start(
      int64_t max_reply_bytes, int threads, const std::string& address = "127.0.0.1:0");
  // Shuts the server down, then drains and joins every queue's thread.
  ~CqEchoServer();

  int port() const { return port_; }

 private:
  class Call;

  explicit CqEchoServer(int64_t max_reply_bytes);

  // One polling thread's loop over `cq`, until the queue is shut down.
  static void Poll(grpc::ServerCompletionQueue* cq);
  // Requests `call`'s next Echo unless the server is shutting down.
  void Request(Call* call);

  // Constant after Start. Declared so that the server goes before the
  // service and the queues, as gRPC requires.
  const std::string source_;
  std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> cqs_;
  Echo::AsyncService service_;
  std::unique_ptr<grpc::Server> server_;
  std::vector<std::unique_ptr<Call>> calls_;
  std::vector<std::thread> threads_;
  int port_ = 0;

  // Held while a call is requested, so that no request follows the
  // server's shutdown.
  absl::Mutex mu_;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
};

// One blocking Echo call at a time; the request and reply messages are
// reused. Thread-compatible.
class SyncEchoClient {
 public:
  explicit SyncEchoClient(const std::string& address);

  // As EchoClient::Call. REQUIRES: request_bytes <= source.size().
  absl::Status Call(const std::string& source, int64_t request_bytes, int64_t reply_bytes);

 private:
  std::unique_ptr<Echo::Stub> stub_;
  EchoRequest request_;
  EchoReply reply_;
};

// One Echo call at a time over the async stub, completed by the calling
// thread polling the client's own completion queue; the request and reply
// messages are reused. Thread-compatible.
class CqEchoClient {
 public:
  explicit CqEchoClient(const std::string& address);
  ~CqEchoClient();

  // As EchoClient::Call. REQUIRES: request_bytes <= source.size().
  absl::Status Call(const std::string& source, int64_t request_bytes, int64_t reply_bytes);

 private:
  std::unique_ptr<Echo::Stub> stub_;
  grpc::CompletionQueue cq_;
  EchoRequest request_;
  EchoReply reply_;
};

}  // namespace shardtrain::bench

#endif  // SHARDTRAIN_BENCH_ECHO_MODELS_H_
