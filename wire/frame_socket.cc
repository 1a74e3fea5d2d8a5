#include "wire/frame_socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <vector>

#include <grpcpp/support/slice.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "wire/buffer_pool.h"
#include "wire/internal/openssl_reason.h"

namespace shardtrain::wire {
namespace {

// Bodies this large come from BufferPool::Default(), whose blocks are
// reused: malloc gives them fresh pages from the kernel on every frame
// (its mmap threshold is at most 32 MiB, app/malloc_tuning.h), and on a
// virtual machine faulting in 64 MiB of 4 KiB pages cost a 64 MiB push ten
// times the CPU of a 16 MiB one per MB (bench/results/wire_large_frames_cpu.txt).
constexpr size_t kPooledBodyBytes = size_t{32} << 20;

void ReleaseBody(void* block) { BufferPool::Release(static_cast<char*>(block)); }

absl::Status Failed(const char* what, int err) {
  return absl::UnavailableError(absl::StrCat("frame socket: ", what, ": ", std::strerror(err)));
}

// Waits until `fd` is ready for `events` or `deadline` passes; CANCELLED
// once `interrupt` (an Interrupter's eventfd; -1: none) is readable.
absl::Status WaitFor(int fd, short events, absl::Time deadline, int interrupt = -1) {
  while (true) {
    int timeout_ms = -1;
    if (deadline != absl::InfiniteFuture()) {
      const double left = absl::ToDoubleMilliseconds(deadline - absl::Now());
      if (left <= 0) return absl::DeadlineExceededError("frame socket: deadline exceeded");
      timeout_ms = static_cast<int>(std::min(std::ceil(left), double{INT_MAX}));
    }
    pollfd entries[2] = {{fd, events, 0}, {interrupt, POLLIN, 0}};
    const int ready = ::poll(entries, interrupt >= 0 ? 2 : 1, timeout_ms);
    if (ready > 0 && entries[1].revents != 0) {
      return absl::CancelledError("frame socket: interrupted");
    }
    if (ready > 0) return absl::OkStatus();  // an error shows in the next call
    if (ready == 0) continue;                // the deadline check above ends it
    if (errno != EINTR) return Failed("poll", errno);
  }
}

using internal::OpenSslReason;

// The peer closed the connection: between frames (nothing of this frame
// read: `started` false, `done` 0) a clean end, else a frame cut short.
absl::Status PeerClosed(bool started, size_t done) {
  if (!started && done == 0) return absl::OutOfRangeError("frame socket: closed by the peer");
  return absl::UnavailableError("frame socket: closed by the peer within a frame");
}

// TLS records carry at most 16 KiB: pieces smaller than this are copied
// into one buffer and written together rather than each in its own record.
constexpr size_t kTlsStageBytes = 16 << 10;

void SetNonBlocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

void SetNoDelay(int fd) {
  const int one = 1;
  // Fails harmlessly on a socket that is not TCP (a socketpair).
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

}  // namespace

absl::StatusOr<std::unique_ptr<FrameSocket>> FrameSocket::Connect(const std::string& host,
                                                                 int port,
                                                                 absl::Duration timeout,
                                                                 const Interrupter* interrupter) {
  const absl::Time deadline = absl::Now() + timeout;
  const int interrupt = interrupter != nullptr ? interrupter->fd() : -1;
  if (interrupter != nullptr && interrupter->triggered()) {
    return absl::CancelledError(
        absl::StrCat("frame socket: connect to ", host, ":", port, " interrupted"));
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int err = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found); err != 0) {
    return absl::UnavailableError(
        absl::StrCat("frame socket: cannot resolve ", host, ": ", ::gai_strerror(err)));
  }
  absl::Status last = absl::UnavailableError(absl::StrCat("frame socket: no address for ", host));
  for (addrinfo* address = found; address != nullptr; address = address->ai_next) {
    const int fd = ::socket(address->ai_family, address->ai_socktype | SOCK_CLOEXEC,
                            address->ai_protocol);
    if (fd < 0) {
      last = Failed("socket", errno);
      continue;
    }
    auto socket = std::make_unique<FrameSocket>(fd);  // closes fd on failure
    if (::connect(fd, address->ai_addr, address->ai_addrlen) != 0) {
      if (errno != EINPROGRESS) {
        last = Failed("connect", errno);
        continue;
      }
      last = WaitFor(fd, POLLOUT, deadline, interrupt);
      if (!last.ok()) {
        if (absl::IsDeadlineExceeded(last) || absl::IsCancelled(last)) break;
        continue;
      }
      int err = 0;
      socklen_t length = sizeof(err);
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &length);
      if (err != 0) {
        last = Failed("connect", err);
        continue;
      }
    }
    ::freeaddrinfo(found);
    return socket;
  }
  ::freeaddrinfo(found);
  return absl::Status(last.code(), absl::StrCat(last.message(), " (", host, ":", port, ")"));
}

FrameSocket::FrameSocket(int fd) : fd_(fd) {
  SetNonBlocking(fd_);
  SetNoDelay(fd_);
}

FrameSocket::~FrameSocket() {
  if (ssl_ != nullptr) SSL_free(ssl_);
  ::close(fd_);
}

template <typename Op>
absl::Status FrameSocket::RunTls(const char* what, Op op, absl::Time deadline, int interrupt,
                                 bool* closed) {
  while (true) {
    int error = SSL_ERROR_NONE;
    int saved_errno = 0;
    std::string reason;
    {
      absl::MutexLock lock(&ssl_mu_);
      ERR_clear_error();
      errno = 0;
      const int result = op(ssl_);
      if (result == 1) return absl::OkStatus();
      error = SSL_get_error(ssl_, result);
      saved_errno = errno;
      if (error == SSL_ERROR_SSL) {
        reason = OpenSslReason("protocol error");
        if (const long verified = SSL_get_verify_result(ssl_); verified != X509_V_OK) {
          absl::StrAppend(&reason, " (", X509_verify_cert_error_string(verified), ")");
        }
      } else {
        ERR_clear_error();
      }
    }
    switch (error) {
      case SSL_ERROR_WANT_READ:
        if (absl::Status ready = WaitFor(fd_, POLLIN, deadline, interrupt); !ready.ok()) {
          return ready;
        }
        continue;
      case SSL_ERROR_WANT_WRITE:
        if (absl::Status ready = WaitFor(fd_, POLLOUT, deadline, interrupt); !ready.ok()) {
          return ready;
        }
        continue;
      case SSL_ERROR_SYSCALL:
        if (saved_errno == EINTR) continue;
        if (saved_errno != 0) return Failed(what, saved_errno);
        [[fallthrough]];  // an end without close_notify
      case SSL_ERROR_ZERO_RETURN:
        if (closed != nullptr) *closed = true;
        return absl::UnavailableError(absl::StrCat("frame socket: TLS ", what, ": closed by the peer"));
      default:
        return absl::UnavailableError(absl::StrCat("frame socket: TLS ", what, ": ", reason));
    }
  }
}

absl::Status FrameSocket::StartTls(const TlsContext& tls, const std::string& peer_host,
                                   absl::Time deadline, const Interrupter* interrupter) {
  if (ssl_ != nullptr) return absl::FailedPreconditionError("frame socket: TLS already started");
  SSL* ssl = SSL_new(tls.native());
  // Reads straight from the socket (OpenSSL reads ahead, many records at
  // a time); writes through a buffer that Write flushes at the end of each
  // frame, so that a frame's records go out in large writes, not one
  // syscall per 16 KiB record.
  BIO* reads = BIO_new_socket(fd_, BIO_NOCLOSE);
  BIO* buffer = BIO_new(BIO_f_buffer());
  BIO* writes = BIO_new_socket(fd_, BIO_NOCLOSE);
  if (ssl == nullptr || reads == nullptr || buffer == nullptr || writes == nullptr ||
      // Encrypted records are gathered up to this before they are written.
      BIO_set_write_buffer_size(buffer, static_cast<long>(tls.buffer_bytes())) != 1) {
    for (BIO* bio : {reads, buffer, writes}) {
      if (bio != nullptr) BIO_free(bio);
    }
    if (ssl != nullptr) SSL_free(ssl);
    return absl::InternalError(
        absl::StrCat("frame socket: SSL_new: ", OpenSslReason("out of memory")));
  }
  SSL_set_bio(ssl, reads, BIO_push(buffer, writes));  // the SSL owns them
  if (tls.server()) {
    SSL_set_accept_state(ssl);
  } else {
    // The shard's certificate must name what it was reached by, as gRPC
    // checks it: an address (IP SAN) or a host name (DNS SAN).
    const std::string& name = tls.server_name().empty() ? peer_host : tls.server_name();
    in6_addr address;
    const bool ip = ::inet_pton(AF_INET, name.c_str(), &address) == 1 ||
                    ::inet_pton(AF_INET6, name.c_str(), &address) == 1;
    const bool named =
        ip ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), name.c_str()) == 1
           : SSL_set1_host(ssl, name.c_str()) == 1 &&
                 SSL_set_tlsext_host_name(ssl, const_cast<char*>(name.c_str())) == 1;
    if (!named) {
      SSL_free(ssl);
      return absl::InvalidArgumentError(
          absl::StrCat("frame socket: cannot verify the shard as '", name, "'"));
    }
    SSL_set_connect_state(ssl);
  }
  ssl_ = ssl;  // before any other thread has the socket
  const absl::Status shook =
      RunTls("handshake", [](SSL* s) { return SSL_do_handshake(s); }, deadline,
             interrupter != nullptr ? interrupter->fd() : -1);
  if (!shook.ok() && absl::IsDeadlineExceeded(shook)) {
    return absl::DeadlineExceededError("frame socket: TLS handshake not finished in time");
  }
  return shook;
}

absl::Status FrameSocket::WaitReadable(absl::Time deadline) {
  if (ssl_ == nullptr) return WaitFor(fd_, POLLIN, deadline);
  // What the socket holds may be TLS records other than data: only a
  // record that carries data (or the end) makes the next Read return.
  char byte;
  size_t peeked = 0;
  const absl::Status peek =
      RunTls("read", [&](SSL* s) { return SSL_peek_ex(s, &byte, 1, &peeked); }, deadline);
  if (absl::IsDeadlineExceeded(peek)) return peek;
  return absl::OkStatus();  // data, or an end that the next Read reports
}

absl::Status FrameSocket::FlushTls(absl::Time deadline) {
  while (true) {
    bool retry = false;
    int saved_errno = 0;
    {
      absl::MutexLock lock(&ssl_mu_);
      BIO* out = SSL_get_wbio(ssl_);
      errno = 0;
      if (BIO_flush(out) == 1) return absl::OkStatus();
      retry = BIO_should_retry(out);
      saved_errno = errno;
    }
    if (!retry) return Failed("write", saved_errno != 0 ? saved_errno : EPIPE);
    RETURN_IF_ERROR(WaitFor(fd_, POLLOUT, deadline));
  }
}

absl::Status FrameSocket::WriteTls(const char* data, size_t bytes, absl::Time deadline) {
  size_t done = 0;
  while (done < bytes) {
    size_t written = 0;
    RETURN_IF_ERROR(RunTls(
        "write",
        [&](SSL* s) { return SSL_write_ex(s, data + done, bytes - done, &written); }, deadline));
    done += written;
  }
  return absl::OkStatus();
}

void FrameSocket::Shutdown() { ::shutdown(fd_, SHUT_RDWR); }

absl::Status FrameSocket::Write(FrameHeader header, absl::string_view message,
                                const grpc::ByteBuffer* body, absl::Time deadline) {
  std::vector<grpc::Slice> slices;
  if (body != nullptr && body->Valid()) {
    const grpc::Status dumped = body->Dump(&slices);
    if (!dumped.ok()) return absl::InternalError("frame socket: cannot read the body's slices");
  }
  header.message_bytes = static_cast<uint32_t>(message.size());
  header.body_bytes = 0;
  for (const grpc::Slice& slice : slices) header.body_bytes += slice.size();
  char encoded[FrameHeader::kBytes];
  header.Encode(encoded);

  std::vector<iovec> pieces;
  pieces.reserve(2 + slices.size());
  pieces.push_back({encoded, sizeof(encoded)});
  if (!message.empty()) pieces.push_back({const_cast<char*>(message.data()), message.size()});
  for (const grpc::Slice& slice : slices) {
    if (slice.size() > 0) {
      pieces.push_back({const_cast<uint8_t*>(slice.begin()), slice.size()});
    }
  }
  if (ssl_ != nullptr) {
    // Small pieces (the header, a message, small bodies) share records;
    // large ones are encrypted from where they are.
    std::string staged;
    for (const iovec& piece : pieces) {
      const char* data = static_cast<const char*>(piece.iov_base);
      if (staged.size() + piece.iov_len <= kTlsStageBytes) {
        staged.append(data, piece.iov_len);
        continue;
      }
      if (!staged.empty()) {
        RETURN_IF_ERROR(WriteTls(staged.data(), staged.size(), deadline));
        staged.clear();
      }
      RETURN_IF_ERROR(WriteTls(data, piece.iov_len, deadline));
    }
    if (!staged.empty()) RETURN_IF_ERROR(WriteTls(staged.data(), staged.size(), deadline));
    // What the write buffer still holds goes out now: the frame is whole.
    return FlushTls(deadline);
  }
  size_t next = 0;
  while (next < pieces.size()) {
    msghdr out{};
    out.msg_iov = pieces.data() + next;
    out.msg_iovlen = std::min<size_t>(pieces.size() - next, IOV_MAX);
    const ssize_t sent = ::sendmsg(fd_, &out, MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (absl::Status ready = WaitFor(fd_, POLLOUT, deadline); !ready.ok()) return ready;
        continue;
      }
      return Failed("write", errno);
    }
    size_t left = static_cast<size_t>(sent);
    while (next < pieces.size() && left >= pieces[next].iov_len) {
      left -= pieces[next].iov_len;
      ++next;
    }
    if (left > 0) {
      pieces[next].iov_base = static_cast<char*>(pieces[next].iov_base) + left;
      pieces[next].iov_len -= left;
    }
  }
  return absl::OkStatus();
}

absl::Status FrameSocket::ReadExactly(char* out, size_t bytes, absl::Time deadline,
                                      bool started) {
  size_t done = 0;
  if (ssl_ != nullptr) {
    while (done < bytes) {
      size_t got = 0;
      bool closed = false;
      const absl::Status read = RunTls(
          "read", [&](SSL* s) { return SSL_read_ex(s, out + done, bytes - done, &got); },
          deadline, -1, &closed);
      if (closed) return PeerClosed(started, done);
      if (!read.ok()) return read;
      done += got;
    }
    return absl::OkStatus();
  }
  while (done < bytes) {
    const ssize_t got = ::recv(fd_, out + done, bytes - done, 0);
    if (got > 0) {
      done += static_cast<size_t>(got);
      continue;
    }
    if (got == 0) return PeerClosed(started, done);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (absl::Status ready = WaitFor(fd_, POLLIN, deadline); !ready.ok()) return ready;
      continue;
    }
    return Failed("read", errno);
  }
  return absl::OkStatus();
}

absl::Status FrameSocket::Read(uint64_t max_body_bytes, uint32_t max_message_bytes,
                               absl::Time deadline, FrameHeader* header, std::string* message,
                               grpc::ByteBuffer* body) {
  char encoded[FrameHeader::kBytes];
  if (absl::Status read = ReadExactly(encoded, sizeof(encoded), deadline, /*started=*/false);
      !read.ok()) {
    return read;
  }
  absl::StatusOr<FrameHeader> decoded =
      FrameHeader::Decode(encoded, max_body_bytes, max_message_bytes);
  if (!decoded.ok()) return decoded.status();
  *header = *decoded;
  message->resize(header->message_bytes);
  if (absl::Status read = ReadExactly(message->data(), message->size(), deadline, true);
      !read.ok()) {
    return read;
  }
  body->Clear();
  if (header->body_bytes == 0) return absl::OkStatus();
  // Uninitialised, and filled by the socket: the one copy, out of the kernel.
  const size_t bytes = static_cast<size_t>(header->body_bytes);
  grpc::Slice slice = bytes >= kPooledBodyBytes
                          ? grpc::Slice(BufferPool::Default().Allocate(bytes), bytes, ReleaseBody)
                          : grpc::Slice(bytes);
  if (absl::Status read = ReadExactly(reinterpret_cast<char*>(const_cast<uint8_t*>(slice.begin())),
                                      slice.size(), deadline, true);
      !read.ok()) {
    return read;
  }
  *body = grpc::ByteBuffer(&slice, 1);
  return absl::OkStatus();
}

}  // namespace shardtrain::wire
