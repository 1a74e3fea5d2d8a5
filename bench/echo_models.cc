#include "bench/echo_models.h"

#include <chrono>
#include <optional>
#include <utility>

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/async_unary_call.h>
#include <grpcpp/support/channel_arguments.h>

#include "absl/strings/str_cat.h"
#include "bench/bench_util.h"
#include "common/status_macros.h"

namespace shardtrain::bench {
namespace {

// Calls each completion queue of CqEchoServer keeps requested: one being
// answered and one ready for the client's next call.
constexpr int kCallsPerQueue = 2;

constexpr std::chrono::seconds kCallDeadline(60);

grpc::Status TooLarge() {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                      "reply_bytes is larger than the server's buffer");
}

void FillRequest(const std::string& source, int64_t request_bytes, int64_t reply_bytes,
                 EchoRequest* request) {
  request->mutable_payload()->assign(source.data(), static_cast<size_t>(request_bytes));
  request->set_reply_bytes(static_cast<uint64_t>(reply_bytes));
}

absl::Status CheckReply(const grpc::Status& status, const EchoReply& reply,
                        int64_t reply_bytes) {
  if (!status.ok()) {
    return absl::UnavailableError(absl::StrCat("echo: ", status.error_message()));
  }
  if (reply.payload().size() != static_cast<size_t>(reply_bytes)) {
    return absl::InternalError("echo reply has the wrong size");
  }
  return absl::OkStatus();
}

}  // namespace

// ---------------------------------------------------------------------------
// SyncEchoServer.

SyncEchoServer::Service::Service(int64_t max_reply_bytes)
    : source_(static_cast<size_t>(max_reply_bytes), '\x5a') {}

grpc::Status SyncEchoServer::Service::Echo(grpc::ServerContext* /*context*/,
                                           const EchoRequest* request, EchoReply* reply) {
  if (request->reply_bytes() > source_.size()) return TooLarge();
  reply->mutable_payload()->assign(source_.data(), request->reply_bytes());
  return grpc::Status::OK;
}

absl::StatusOr<std::unique_ptr<SyncEchoServer>> SyncEchoServer::Start(
    int64_t max_reply_bytes, const std::string& address) {
  std::unique_ptr<SyncEchoServer> server(new SyncEchoServer(max_reply_bytes));
  grpc::ServerBuilder builder;
  ConfigureEchoBuilder(address, builder, &server->port_);
  builder.RegisterService(&server->service_);
  ASSIGN_OR_RETURN(server->server_, BuildEchoServer(address, builder, server->port_));
  return server;
}

SyncEchoServer::~SyncEchoServer() {
  if (server_ != nullptr) server_->Shutdown();
}

// ---------------------------------------------------------------------------
// CqEchoServer.

// One requested call on one completion queue, its tag there. Its context and
// responder are made afresh for each call (gRPC's rule); its messages are
// cleared and reused. Used by one polling thread at a time.
class CqEchoServer::Call {
 public:
  Call(CqEchoServer* server, grpc::ServerCompletionQueue* cq) : server_(server), cq_(cq) {}

  // Asks gRPC for the next Echo on this queue.
  // REQUIRES: the server's mu_ is held (CqEchoServer::Request), so that no
  // call is requested once the shutdown has begun. (Not an annotation: the
  // analysis cannot see that server_ is the server whose mu_ is held.)
  void Request() {
    responder_.reset();
    context_.reset();
    request_.Clear();
    reply_.Clear();
    context_.emplace();
    responder_.emplace(&*context_);
    finishing_ = false;
    server_->service_.RequestEcho(&*context_, &request_, &*responder_, cq_, cq_, this);
  }

  // This call's event came out of the queue: a request arrived (ok) or was
  // dropped by the shutdown (!ok), or the reply went out.
  void Proceed(bool ok) {
    if (finishing_) {
      server_->Request(this);
      return;
    }
    if (!ok) return;
    finishing_ = true;
    if (request_.reply_bytes() > server_->source_.size()) {
      responder_->FinishWithError(TooLarge(), this);
      return;
    }
    reply_.mutable_payload()->assign(server_->source_.data(), request_.reply_bytes());
    responder_->Finish(reply_, grpc::Status::OK, this);
  }

 private:
  CqEchoServer* const server_;
  grpc::ServerCompletionQueue* const cq_;
  std::optional<grpc::ServerContext> context_;
  std::optional<grpc::ServerAsyncResponseWriter<EchoReply>> responder_;
  EchoRequest request_;
  EchoReply reply_;
  // Whether the reply was handed to gRPC (the next event is its end).
  bool finishing_ = false;
};

CqEchoServer::CqEchoServer(int64_t max_reply_bytes)
    : source_(static_cast<size_t>(max_reply_bytes), '\x5a') {}

absl::StatusOr<std::unique_ptr<CqEchoServer>> CqEchoServer::Start(int64_t max_reply_bytes,
                                                                  int threads,
                                                                  const std::string& address) {
  if (threads < 1) return absl::InvalidArgumentError("a CqEchoServer needs a thread");
  std::unique_ptr<CqEchoServer> server(new CqEchoServer(max_reply_bytes));
  grpc::ServerBuilder builder;
  ConfigureEchoBuilder(address, builder, &server->port_);
  builder.RegisterService(&server->service_);
  for (int i = 0; i < threads; ++i) server->cqs_.push_back(builder.AddCompletionQueue());
  ASSIGN_OR_RETURN(server->server_, BuildEchoServer(address, builder, server->port_));
  for (const std::unique_ptr<grpc::ServerCompletionQueue>& cq : server->cqs_) {
    for (int i = 0; i < kCallsPerQueue; ++i) {
      server->calls_.push_back(std::make_unique<Call>(server.get(), cq.get()));
      server->Request(server->calls_.back().get());
    }
  }
  for (const std::unique_ptr<grpc::ServerCompletionQueue>& cq : server->cqs_) {
    server->threads_.emplace_back(&CqEchoServer::Poll, cq.get());
  }
  return server;
}

CqEchoServer::~CqEchoServer() {
  {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
  }
  if (server_ != nullptr) server_->Shutdown();
  for (const std::unique_ptr<grpc::ServerCompletionQueue>& cq : cqs_) cq->Shutdown();
  for (std::thread& thread : threads_) thread.join();
}

void CqEchoServer::Poll(grpc::ServerCompletionQueue* cq) {
  void* tag = nullptr;
  bool ok = false;
  while (cq->Next(&tag, &ok)) static_cast<Call*>(tag)->Proceed(ok);
}

void CqEchoServer::Request(Call* call) {
  absl::MutexLock lock(&mu_);
  if (!shutting_down_) call->Request();
}

// ---------------------------------------------------------------------------
// Clients.

SyncEchoClient::SyncEchoClient(const std::string& address) : stub_(NewEchoStub(address)) {}

absl::Status SyncEchoClient::Call(const std::string& source, int64_t request_bytes,
                                  int64_t reply_bytes) {
  FillRequest(source, request_bytes, reply_bytes, &request_);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + kCallDeadline);
  const grpc::Status status = stub_->Echo(&context, request_, &reply_);
  return CheckReply(status, reply_, reply_bytes);
}

CqEchoClient::CqEchoClient(const std::string& address) : stub_(NewEchoStub(address)) {}

CqEchoClient::~CqEchoClient() {
  cq_.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (cq_.Next(&tag, &ok)) {
  }
}

absl::Status CqEchoClient::Call(const std::string& source, int64_t request_bytes,
                                int64_t reply_bytes) {
  FillRequest(source, request_bytes, reply_bytes, &request_);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + kCallDeadline);
  grpc::Status status;
  std::unique_ptr<grpc::ClientAsyncResponseReader<EchoReply>> call =
      stub_->AsyncEcho(&context, request_, &cq_);
  call->Finish(&reply_, &status, this);
  void* tag = nullptr;
  bool ok = false;
  // One call at a time: the only event on the queue is this call's end.
  if (!cq_.Next(&tag, &ok) || tag != this || !ok) {
    return absl::InternalError("echo: the completion queue lost the call");
  }
  return CheckReply(status, reply_, reply_bytes);
}

}  // namespace shardtrain::bench
