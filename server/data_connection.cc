#include "server/data_connection.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include <glog/logging.h>
#include <grpcpp/support/slice.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/credentials.h"
#include "server/server_call.h"
#include "wire/frame_header.h"

namespace shardtrain::server {

namespace {

// The longest status message sent back: the client takes up to 64 KiB.
constexpr size_t kMaxStatusMessage = 16 << 10;
// The largest hello read: a token is a line of printable ASCII.
constexpr uint64_t kMaxHelloBytes = 4 << 10;

}  // namespace

// One call read from the connection. Alive until both its answer has been
// written (or dropped) and the connection no longer lists it: two
// references, one for each.
class DataConnection::Call final : public ServerCall {
 public:
  Call(DataConnection* connection, const wire::FrameHeader& header, grpc::ByteBuffer request,
       absl::Time deadline)
      : connection_(connection),
        method_(header.method),
        id_(header.call_id),
        deadline_(deadline),
        request_(std::move(request)) {}
  ~Call() override = default;

  absl::Time deadline() const override { return deadline_; }
  grpc::ByteBuffer* response() override { return &response_; }
  void Finish(const grpc::Status& status) override { connection_->Finished(this, status); }

  // The client went away.
  void Cancel() { Cancelled(); }

  uint8_t method() const { return method_; }
  uint64_t id() const { return id_; }
  const grpc::ByteBuffer& request() const { return request_; }
  std::atomic<int>& refs() { return refs_; }

 private:
  DataConnection* const connection_;
  const uint8_t method_;
  const uint64_t id_;
  const absl::Time deadline_;
  const grpc::ByteBuffer request_;
  grpc::ByteBuffer response_;
  std::atomic<int> refs_{2};
};

DataConnection::DataConnection(std::unique_ptr<wire::FrameSocket> socket,
                               ParameterServerService* service,
                               const DataConnectionLimits& limits,
                               std::shared_ptr<const wire::TlsContext> tls,
                               prometheus::Counter* auth_failures)
    : socket_(std::move(socket)),
      service_(service),
      limits_(limits),
      tls_(std::move(tls)),
      auth_failures_(auth_failures) {}

DataConnection::~DataConnection() {
  if (writer_.joinable()) writer_.join();
}

void DataConnection::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;
  }
  socket_->Shutdown();
}

bool DataConnection::Secure() {
  if (tls_ == nullptr) return true;
  const absl::Time deadline = absl::Now() + limits_.write_timeout;
  if (absl::Status shook = socket_->StartTls(*tls_, "", deadline); !shook.ok()) {
    // As gRPC logs its failed handshakes: a worker or peer whose
    // certificate this shard does not take shows here, not only in its
    // own log.
    LOG_EVERY_N(WARNING, 100) << "data port: a TLS handshake failed: " << shook;
    return false;
  }
  if (tls_->token().empty()) return true;
  wire::FrameHeader header;
  std::string message;
  grpc::ByteBuffer body;
  const absl::Status read = socket_->Read(kMaxHelloBytes, /*max_message_bytes=*/0, deadline,
                                          &header, &message, &body);
  std::string token;
  if (read.ok() && body.Valid()) {
    std::vector<grpc::Slice> slices;
    if (body.Dump(&slices).ok()) {
      for (const grpc::Slice& slice : slices) {
        token.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
      }
    }
  }
  const bool hello =
      read.ok() && !header.response && header.method == static_cast<uint8_t>(wire::DataMethod::kHello);
  if (hello && common::TokensEqual(token, tls_->token())) return true;
  if (read.ok() || absl::IsResourceExhausted(read)) {
    // A client that got through TLS and then sent no token, or the wrong
    // one.
    if (auth_failures_ != nullptr) auth_failures_->Increment();
    LOG_EVERY_N(WARNING, 100) << "data port: a connection without the auth token is closed";
  } else {
    VLOG(1) << "data connection ends before its hello: " << read;
  }
  return false;
}

void DataConnection::Serve() {
  reader_ = std::this_thread::get_id();
  if (!Secure()) {
    socket_->Shutdown();
    return;
  }
  writer_ = std::thread([this] { WriteQueued(); });
  bool first = true;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      // Back-pressure: a client with too many calls waiting is not read.
      mu_.Await(absl::Condition(
          +[](DataConnection* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->mu_) {
            return c->closing_ || c->live_ < std::max(1, c->limits_.max_calls_in_flight);
          },
          this));
      if (closing_) break;
    }
    wire::FrameHeader header;
    std::string message;
    grpc::ByteBuffer body;
    const absl::Status read = socket_->Read(limits_.max_message_bytes, /*max_message_bytes=*/0,
                                            absl::InfiniteFuture(), &header, &message, &body);
    if (!read.ok()) {
      if (!absl::IsOutOfRange(read)) VLOG(1) << "data connection ends: " << read;
      break;
    }
    if (header.response) {
      VLOG(1) << "data connection ends: the client sent a response frame";
      break;
    }
    const bool was_first = std::exchange(first, false);
    if (header.method == static_cast<uint8_t>(wire::DataMethod::kHello)) {
      // A client's token that this shard does not ask for (it has none,
      // or it took the hello in Secure) is let pass once, first.
      if (was_first && (tls_ == nullptr || tls_->token().empty())) continue;
      VLOG(1) << "data connection ends: a hello after its start";
      break;
    }
    const absl::Time deadline = header.timeout_ms == 0
                                    ? absl::InfiniteFuture()
                                    : absl::Now() + absl::Milliseconds(header.timeout_ms);
    auto* call = new Call(this, header, std::move(body), deadline);
    {
      absl::MutexLock lock(&mu_);
      if (!in_flight_.emplace(call->id(), call).second) {
        VLOG(1) << "data connection ends: call id " << call->id() << " is already in flight";
        delete call;
        break;
      }
      ++live_;
    }
    Dispatch(call);
  }
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;
  }
  broken_.store(true);
  socket_->Shutdown();
  // The calls still waiting end as a gRPC call's do when its client goes
  // away; the others end as they are answered.
  std::vector<Call*> waiting;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, call] : in_flight_) waiting.push_back(call);
    in_flight_.clear();
  }
  for (Call* call : waiting) {
    call->Cancel();
    Unref(call);
  }
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](DataConnection* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->mu_) { return c->live_ == 0; },
      this));
  stop_writer_ = true;
}

void DataConnection::Dispatch(Call* call) {
  const grpc::ByteBuffer& request = call->request();
  switch (static_cast<wire::DataMethod>(call->method())) {
    case wire::DataMethod::kPush:
      service_->HandlePush(call, request);
      return;
    case wire::DataMethod::kPull:
      service_->HandlePull(call, request);
      return;
    case wire::DataMethod::kPushPull:
      service_->HandlePushPull(call, request);
      return;
    case wire::DataMethod::kLookup:
      service_->HandleLookup(call, request);
      return;
    case wire::DataMethod::kPushSparse:
      service_->HandlePushSparse(call, request);
      return;
    case wire::DataMethod::kReplicate:
      // A forward that must wait for one behind it waits off this thread
      // (Replicator::Replicate).
      service_->HandleReplicate(call, request);
      return;
    case wire::DataMethod::kHello:
      break;  // not a call (Serve takes it before Dispatch)
  }
  call->Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                            absl::StrCat("method ", call->method(),
                                         " is not served on the data port (1-6 are)")));
}

void DataConnection::Finished(Call* call, const grpc::Status& status) {
  if (std::this_thread::get_id() == reader_) {
    WriteAnswer(call, status);
    Answered(call);
    return;
  }
  absl::MutexLock lock(&mu_);
  to_write_.emplace_back(call, status);
}

void DataConnection::WriteAnswer(Call* call, const grpc::Status& status) {
  if (broken_.load()) return;
  wire::FrameHeader header;
  header.response = true;
  header.method = call->method();
  header.status = static_cast<uint16_t>(status.error_code());
  header.call_id = call->id();
  const std::string& message = status.error_message();
  absl::MutexLock lock(&write_mu_);
  const absl::Status written =
      socket_->Write(header,
                     absl::string_view(message).substr(0, kMaxStatusMessage),
                     status.ok() ? call->response() : nullptr,
                     absl::Now() + limits_.write_timeout);
  if (!written.ok()) {
    VLOG(1) << "data connection ends: " << written;
    broken_.store(true);
    socket_->Shutdown();  // the reader sees it and ends the connection
  }
}

void DataConnection::Answered(Call* call) {
  bool listed = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = in_flight_.find(call->id());
    if (it != in_flight_.end() && it->second == call) {
      in_flight_.erase(it);
      listed = true;
    }
  }
  if (listed) Unref(call);
  Unref(call);
}

void DataConnection::Unref(Call* call) {
  if (call->refs().fetch_sub(1) != 1) return;
  delete call;
  absl::MutexLock lock(&mu_);
  --live_;
}

void DataConnection::WriteQueued() {
  while (true) {
    std::pair<Call*, grpc::Status> next;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](DataConnection* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->mu_) {
            return c->stop_writer_ || !c->to_write_.empty();
          },
          this));
      if (to_write_.empty()) return;  // stop_writer_
      next = std::move(to_write_.front());
      to_write_.pop_front();
    }
    WriteAnswer(next.first, next.second);
    Answered(next.first);
  }
}

}  // namespace shardtrain::server
