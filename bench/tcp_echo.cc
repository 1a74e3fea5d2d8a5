#include "bench/tcp_echo.h"

#include <utility>

#include <grpcpp/support/slice.h>

#include "absl/time/clock.h"

namespace shardtrain::bench {
namespace {

// The frames' method number.
constexpr uint8_t kEchoMethod = 1;
// The request body's prefix: the reply's size.
constexpr size_t kPrefixBytes = 8;

void PutU64(uint64_t value, char* out) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(value >> (8 * i));
}

uint64_t GetU64(const uint8_t* in) {
  uint64_t value = 0;
  for (int i = 0; i < 8; ++i) value |= uint64_t{in[i]} << (8 * i);
  return value;
}

}  // namespace

// ---------------------------------------------------------------------------
// TcpEchoServer.

TcpEchoServer::TcpEchoServer(int64_t max_bytes)
    : max_bytes_(max_bytes), source_(static_cast<size_t>(max_bytes), '\x5a') {}

absl::StatusOr<std::unique_ptr<TcpEchoServer>> TcpEchoServer::Start(int64_t max_bytes) {
  std::unique_ptr<TcpEchoServer> server(new TcpEchoServer(max_bytes));
  absl::StatusOr<std::unique_ptr<wire::FrameListener>> listener =
      wire::FrameListener::Listen("127.0.0.1:0");
  if (!listener.ok()) return listener.status();
  server->listener_ = *std::move(listener);
  server->acceptor_ = std::thread([s = server.get()] { s->Accept(); });
  return server;
}

TcpEchoServer::~TcpEchoServer() {
  std::vector<std::thread> servers;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (const std::unique_ptr<wire::FrameSocket>& connection : connections_) {
      connection->Shutdown();
    }
    servers.swap(servers_);
  }
  if (listener_ != nullptr) listener_->Shutdown();
  if (acceptor_.joinable()) acceptor_.join();
  for (std::thread& thread : servers) thread.join();
  // connections_ close as the server goes, no thread using them.
}

void TcpEchoServer::Accept() {
  while (true) {
    absl::StatusOr<std::unique_ptr<wire::FrameSocket>> accepted = listener_->Accept();
    if (!accepted.ok()) return;  // shut down
    absl::MutexLock lock(&mu_);
    wire::FrameSocket* connection = connections_.emplace_back(*std::move(accepted)).get();
    if (stopping_) {
      connection->Shutdown();
      return;
    }
    servers_.emplace_back([this, connection] { Serve(connection); });
  }
}

void TcpEchoServer::Serve(wire::FrameSocket* connection) {
  const uint64_t max_bytes = static_cast<uint64_t>(max_bytes_);
  wire::FrameHeader header;
  std::string message;
  grpc::ByteBuffer request;
  std::vector<grpc::Slice> slices;
  while (connection
             ->Read(max_bytes + kPrefixBytes, 0, absl::InfiniteFuture(), &header, &message,
                    &request)
             .ok()) {
    slices.clear();
    if (!request.Dump(&slices).ok() || slices.empty() || slices[0].size() < kPrefixBytes) break;
    const uint64_t reply_bytes = GetU64(slices[0].begin());
    if (reply_bytes > max_bytes) break;
    wire::FrameHeader response;
    response.response = true;
    response.method = header.method;
    response.call_id = header.call_id;
    const grpc::Slice reply_slice(source_.data(), reply_bytes, grpc::Slice::STATIC_SLICE);
    const grpc::ByteBuffer reply(&reply_slice, 1);
    if (!connection->Write(response, "", &reply, absl::InfiniteFuture()).ok()) break;
  }
  connection->Shutdown();
}

// ---------------------------------------------------------------------------
// TcpEchoClient.

absl::StatusOr<std::unique_ptr<TcpEchoClient>> TcpEchoClient::Connect(int port,
                                                                       absl::Duration timeout,
                                                                       bool hand_off) {
  absl::StatusOr<std::unique_ptr<wire::FrameSocket>> socket =
      wire::FrameSocket::Connect("127.0.0.1", port, timeout);
  if (!socket.ok()) return socket.status();
  std::unique_ptr<TcpEchoClient> client(new TcpEchoClient(*std::move(socket), timeout));
  if (hand_off) client->thread_ = std::thread([c = client.get()] { c->RunHandedOff(); });
  return client;
}

TcpEchoClient::~TcpEchoClient() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

absl::Status TcpEchoClient::Call(const std::string& source, int64_t request_bytes,
                                 int64_t reply_bytes) {
  if (!thread_.joinable()) return CallHere(source, request_bytes, reply_bytes);
  HandedOff call;
  call.source = &source;
  call.request_bytes = request_bytes;
  call.reply_bytes = reply_bytes;
  absl::MutexLock lock(&mu_);
  handed_off_ = &call;
  mu_.Await(absl::Condition(&call.done));
  return call.status;
}

void TcpEchoClient::RunHandedOff() {
  while (true) {
    HandedOff* call = nullptr;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](TcpEchoClient* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->mu_) {
            return c->stopping_ || c->handed_off_ != nullptr;
          },
          this));
      if (handed_off_ == nullptr) return;  // stopping
      call = handed_off_;
      handed_off_ = nullptr;
    }
    const absl::Status status = CallHere(*call->source, call->request_bytes, call->reply_bytes);
    absl::MutexLock lock(&mu_);
    call->status = status;
    call->done = true;
  }
}

absl::Status TcpEchoClient::CallHere(const std::string& source, int64_t request_bytes,
                                     int64_t reply_bytes) {
  const absl::Time deadline = absl::Now() + timeout_;
  char prefix[kPrefixBytes];
  PutU64(static_cast<uint64_t>(reply_bytes), prefix);
  const grpc::Slice slices[2] = {
      grpc::Slice(prefix, sizeof(prefix), grpc::Slice::STATIC_SLICE),
      grpc::Slice(source.data(), static_cast<size_t>(request_bytes), grpc::Slice::STATIC_SLICE)};
  const grpc::ByteBuffer request(slices, request_bytes > 0 ? 2 : 1);
  wire::FrameHeader header;
  header.method = kEchoMethod;
  header.call_id = ++calls_;
  if (absl::Status written = socket_->Write(header, "", &request, deadline); !written.ok()) {
    return written;
  }
  wire::FrameHeader answer;
  std::string message;
  grpc::ByteBuffer reply;
  if (absl::Status read = socket_->Read(static_cast<uint64_t>(reply_bytes), 0, deadline, &answer,
                                        &message, &reply);
      !read.ok()) {
    return read;
  }
  if (!answer.response || answer.call_id != header.call_id ||
      answer.body_bytes != static_cast<uint64_t>(reply_bytes)) {
    return absl::InternalError("tcp echo: the reply does not answer the call");
  }
  return absl::OkStatus();
}

}  // namespace shardtrain::bench
