#include "wire/frame_channel.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <utility>
#include <vector>

#include <glog/logging.h>
#include <grpcpp/support/slice.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace shardtrain::wire {

namespace {

// The longest status message taken from a shard.
constexpr uint32_t kMaxStatusMessage = 64 << 10;
// How often an idle reader looks for calls past their deadline.
constexpr absl::Duration kExpiryTick = absl::Milliseconds(50);
// A frame whose first bytes arrived must be whole within this.
constexpr absl::Duration kFrameTimeout = absl::Seconds(60);

grpc::Status ToGrpc(const absl::Status& status) {
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

}  // namespace

FrameChannel::FrameChannel(std::string host, int port, uint64_t max_message_bytes,
                           absl::Duration connect_timeout,
                           std::shared_ptr<const TlsContext> tls)
    : host_(std::move(host)),
      max_message_bytes_(max_message_bytes),
      connect_timeout_(connect_timeout),
      tls_(std::move(tls)),
      port_(port) {}

FrameChannel::~FrameChannel() {
  std::vector<std::shared_ptr<Connection>> all;
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;
    // A connect in progress (a call on another thread, made before this
    // destructor) is cut short and installs nothing once it sees closing_.
    if (connect_interrupter_ != nullptr) connect_interrupter_->Trigger();
    mu_.Await(absl::Condition(
        +[](bool* connecting) { return !*connecting; }, &connecting_));
    if (connection_ != nullptr) all.push_back(std::move(connection_));
    all.insert(all.end(), retired_.begin(), retired_.end());
    retired_.clear();
  }
  for (const auto& connection : all) connection->socket->Shutdown();
  for (const auto& connection : all) {
    if (connection->reader.joinable()) connection->reader.join();
  }
  // Calls whose connection never opened a reader (none) or that were
  // registered after the last reader ended.
  std::vector<Pending> left;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, pending] : pending_) left.push_back(std::move(pending));
    pending_.clear();
  }
  for (Pending& pending : left) {
    pending.done(grpc::Status(grpc::StatusCode::CANCELLED, "the frame channel was closed"),
                 /*reached=*/true);
  }
}

int FrameChannel::port() const {
  absl::MutexLock lock(&mu_);
  return port_;
}

void FrameChannel::set_port(int port) {
  std::shared_ptr<Connection> old;
  {
    absl::MutexLock lock(&mu_);
    if (port == port_) return;
    port_ = port;
    old = connection_;
    // A connect to the old port would be dropped when it ends.
    if (connect_interrupter_ != nullptr) connect_interrupter_->Trigger();
  }
  // Its reader fails its calls and retires it.
  if (old != nullptr) old->socket->Shutdown();
}

absl::StatusOr<std::shared_ptr<FrameChannel::Connection>> FrameChannel::Open(
    absl::Time deadline, AttemptCancel* cancel, bool* cancelled) {
  {
    absl::MutexLock lock(&mu_);
    if (closing_) return absl::CancelledError("the frame channel is closing");
    if (connection_ != nullptr && !connection_->failed) return connection_;
  }
  // The call waits for a connect, its own or another call's: its cancel
  // ends that wait (until Call registers the call's own Cancel instead).
  auto wait = std::make_shared<OpenWait>();
  if (cancel != nullptr) cancel->OnCancel([this, wait] { CancelOpen(wait.get()); });
  int port = 0;
  std::shared_ptr<Interrupter> interrupter;
  {
    absl::MutexLock lock(&mu_);
    // One connect at a time: the others wait for its connection (or, when
    // it failed, try their own), each no longer than its deadline.
    auto settled = [this, &wait]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return wait->cancelled || ConnectSettled();
    };
    mu_.AwaitWithDeadline(absl::Condition(&settled), deadline);
    if (closing_) return absl::CancelledError("the frame channel is closing");
    if (wait->cancelled) {
      *cancelled = true;
      return absl::CancelledError("the call was cancelled while it waited for a connect");
    }
    if (connection_ != nullptr && !connection_->failed) return connection_;
    if (connecting_) return absl::DeadlineExceededError("deadline passed waiting for a connect");
    // Readers that have ended are joined (not this thread's own: a call
    // started from a `done` runs on a reader).
    for (auto it = retired_.begin(); it != retired_.end();) {
      if ((*it)->reader_done.load() && (*it)->reader.get_id() != std::this_thread::get_id()) {
        (*it)->reader.join();
        it = retired_.erase(it);
      } else {
        ++it;
      }
    }
    if (connection_ != nullptr) retired_.push_back(std::move(connection_));
    connecting_ = true;
    wait->connecting = true;
    interrupter = connect_interrupter_ = std::make_shared<Interrupter>();
    port = port_;
  }
  // Outside mu_: a connect to a host that does not answer takes up to
  // connect_timeout_, and meanwhile Cancel, set_port and the readers'
  // ends must not wait for it.
  const absl::Duration timeout = std::min(connect_timeout_, deadline - absl::Now());
  const absl::Time connect_deadline = absl::Now() + std::max(timeout, absl::ZeroDuration());
  absl::StatusOr<std::unique_ptr<FrameSocket>> socket = FrameSocket::Connect(
      host_, port, std::max(timeout, absl::ZeroDuration()), interrupter.get());
  if (socket.ok() && tls_ != nullptr) {
    absl::Status secured = (*socket)->StartTls(*tls_, host_, connect_deadline, interrupter.get());
    if (secured.ok() && !tls_->token().empty()) {
      // The shard takes no call before the token; it answers none either.
      FrameHeader hello;
      hello.method = static_cast<uint8_t>(DataMethod::kHello);
      grpc::Slice token(tls_->token());
      const grpc::ByteBuffer body(&token, 1);
      secured = (*socket)->Write(hello, "", &body, connect_deadline);
    }
    if (!secured.ok()) socket = std::move(secured);
  }
  absl::MutexLock lock(&mu_);
  connecting_ = false;
  wait->connecting = false;
  connect_interrupter_ = nullptr;
  if (closing_) return absl::CancelledError("the frame channel is closing");
  if (port != port_) {
    return absl::UnavailableError(absl::StrCat("the data port moved to ", port_));
  }
  if (socket.ok()) {
    // Opened even if this call was cancelled meanwhile: the next ones use it.
    auto connection = std::make_shared<Connection>();
    connection->socket = *std::move(socket);
    Connection* raw = connection.get();
    connection->reader = std::thread([this, raw] { Read(raw); });
    connection_ = std::move(connection);
  }
  if (wait->cancelled) {
    *cancelled = true;
    return absl::CancelledError("the call was cancelled while it connected");
  }
  if (!socket.ok()) return socket.status();
  return connection_;
}

void FrameChannel::CancelOpen(OpenWait* wait) {
  std::shared_ptr<Interrupter> interrupter;
  {
    absl::MutexLock lock(&mu_);
    wait->cancelled = true;  // wakes the call if it waits for a connect
    if (wait->connecting) interrupter = connect_interrupter_;
  }
  if (interrupter != nullptr) interrupter->Trigger();
}

bool FrameChannel::ConnectSettled() const { return !connecting_ || closing_; }

uint64_t FrameChannel::Call(DataMethod method, const grpc::ByteBuffer& request,
                            grpc::ByteBuffer* response, absl::Time deadline, Done done,
                            AttemptCancel* cancel) {
  bool cancelled = false;
  absl::StatusOr<std::shared_ptr<Connection>> opened = Open(deadline, cancel, &cancelled);
  if (cancelled) {
    // Reached: the caller must not send it another way (it was cancelled).
    done(ToGrpc(absl::CancelledError(absl::StrCat("data port ", host_, ":", port(), ": ",
                                                  opened.status().message()))),
         /*reached=*/true);
    return 0;
  }
  if (!opened.ok()) {
    done(ToGrpc(absl::UnavailableError(absl::StrCat(
             "data port ", host_, ":", port(), " unreachable: ", opened.status().message()))),
         /*reached=*/false);
    return 0;
  }
  const std::shared_ptr<Connection>& connection = *opened;
  FrameHeader header;
  header.method = static_cast<uint8_t>(method);
  if (deadline != absl::InfiniteFuture()) {
    const double ms = std::ceil(absl::ToDoubleMilliseconds(deadline - absl::Now()));
    header.timeout_ms = static_cast<uint32_t>(
        std::clamp(ms, 1.0, static_cast<double>(std::numeric_limits<uint32_t>::max())));
  }
  bool failed = false;
  {
    absl::MutexLock lock(&mu_);
    failed = connection->failed;
    if (!failed) {
      header.call_id = next_id_++;
      Pending pending;
      pending.response = response;
      pending.deadline = deadline;
      pending.done = std::move(done);
      pending.connection = connection;
      pending_.emplace(header.call_id, std::move(pending));
    }
  }
  if (failed) {
    // Failed between Open and here: nothing was sent on it.
    done(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                      absl::StrCat("data port ", host_, ": the connection failed")),
         /*reached=*/false);
    return 0;
  }
  if (cancel != nullptr) {
    cancel->OnCancel([this, id = header.call_id] { Cancel(id); });
  }
  absl::Status written;
  {
    absl::MutexLock lock(&connection->write_mu);
    written = connection->socket->Write(header, "", &request, deadline);
  }
  // An end that came while the request was written is delivered now.
  Pending ended;
  {
    absl::MutexLock lock(&mu_);
    auto it = pending_.find(header.call_id);
    if (it != pending_.end()) {
      it->second.writing = false;
      if (it->second.ended) {
        ended = std::move(it->second);
        pending_.erase(it);
      }
    }
  }
  if (!written.ok()) {
    // The reader fails the connection's calls, this one among them.
    connection->socket->Shutdown();
  }
  if (ended.done) ended.done(ended.status, ended.reached);
  return header.call_id;
}

void FrameChannel::Cancel(uint64_t call_id) {
  std::vector<Pending> ended;
  std::shared_ptr<Connection> cut;
  {
    absl::MutexLock lock(&mu_);
    auto it = pending_.find(call_id);
    if (it == pending_.end() || it->second.ended) return;
    // The write may be blocked on a shard that stopped reading.
    if (it->second.writing) cut = it->second.connection.lock();
    EndLocked(it, grpc::Status(grpc::StatusCode::CANCELLED,
                               absl::StrCat("data port ", host_, ": call cancelled")),
              /*reached=*/true, &ended);
  }
  if (cut != nullptr) cut->socket->Shutdown();
  for (Pending& pending : ended) pending.done(pending.status, pending.reached);
}

void FrameChannel::EndLocked(absl::flat_hash_map<uint64_t, Pending>::iterator it,
                             grpc::Status status, bool reached, std::vector<Pending>* ended) {
  Pending& pending = it->second;
  if (pending.ended) return;
  pending.status = std::move(status);
  pending.reached = reached;
  if (pending.writing) {
    pending.ended = true;
    return;
  }
  ended->push_back(std::move(pending));
  pending_.erase(it);
}

void FrameChannel::Read(Connection* connection) {
  FrameSocket* socket = connection->socket.get();
  // Calls past their deadline are looked for once per kExpiryTick, not
  // with every answer.
  absl::Time next_expiry = absl::Now() + kExpiryTick;
  while (true) {
    absl::Status ready = socket->WaitReadable(next_expiry);
    if (const absl::Time now = absl::Now(); now >= next_expiry) {
      Expire(now);
      next_expiry = now + kExpiryTick;
    }
    if (absl::IsDeadlineExceeded(ready)) continue;
    FrameHeader header;
    std::string message;
    grpc::ByteBuffer body;
    absl::Status read = ready;
    if (read.ok()) {
      read = socket->Read(max_message_bytes_, kMaxStatusMessage, absl::Now() + kFrameTimeout,
                          &header, &message, &body);
    }
    if (read.ok() && !header.response) {
      read = absl::UnavailableError("the shard sent a request frame");
    }
    if (!read.ok()) {
      Fail(connection, ToGrpc(absl::Status(
                           absl::IsResourceExhausted(read) ? read.code()
                                                           : absl::StatusCode::kUnavailable,
                           absl::StrCat("data port ", host_, ": ", read.message()))));
      connection->reader_done.store(true);
      return;
    }
    std::vector<Pending> answered;
    {
      absl::MutexLock lock(&mu_);
      connection->answered_any = true;
      auto it = pending_.find(header.call_id);
      // Past its deadline or cancelled: dropped.
      if (it == pending_.end() || it->second.ended) continue;
      if (header.status == 0) *it->second.response = std::move(body);
      EndLocked(it,
                header.status == 0
                    ? grpc::Status::OK
                    : grpc::Status(static_cast<grpc::StatusCode>(header.status), message),
                /*reached=*/true, &answered);
    }
    for (Pending& pending : answered) pending.done(pending.status, pending.reached);
  }
}

void FrameChannel::Fail(Connection* connection, const grpc::Status& status) {
  std::vector<Pending> failed;
  bool reached = true;
  {
    absl::MutexLock lock(&mu_);
    if (connection->failed) return;
    connection->failed = true;
    reached = connection->answered_any;
    // Every call in flight was sent on this connection (a new one opens
    // only once this one is marked failed), but for ended ones a Call()
    // has still to deliver.
    for (auto it = pending_.begin(); it != pending_.end();) {
      auto next = std::next(it);
      EndLocked(it, status, reached, &failed);
      it = next;
    }
  }
  connection->socket->Shutdown();
  for (Pending& pending : failed) pending.done(pending.status, pending.reached);
}

void FrameChannel::Expire(absl::Time now) {
  std::vector<Pending> expired;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = pending_.begin(); it != pending_.end();) {
      auto next = std::next(it);
      if (it->second.deadline <= now) {
        EndLocked(it,
                  grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                               absl::StrCat("data port ", host_, ": deadline exceeded")),
                  /*reached=*/true, &expired);
      }
      it = next;
    }
  }
  for (Pending& pending : expired) pending.done(pending.status, pending.reached);
}

}  // namespace shardtrain::wire
