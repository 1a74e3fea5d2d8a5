#include "bench/tcp_echo.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace shardtrain::bench {
namespace {

constexpr size_t kRequestHeaderBytes = 16;
constexpr size_t kReplyHeaderBytes = 8;

void PutU64(uint64_t value, char* out) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(value >> (8 * i));
}

uint64_t GetU64(const char* in) {
  uint64_t value = 0;
  for (int i = 0; i < 8; ++i) value |= uint64_t{static_cast<unsigned char>(in[i])} << (8 * i);
  return value;
}

absl::Status SocketError(const char* what) {
  const int err = errno;
  if (err == EAGAIN || err == EWOULDBLOCK) {
    return absl::DeadlineExceededError(absl::StrCat("tcp echo: ", what, " timed out"));
  }
  return absl::UnavailableError(absl::StrCat("tcp echo: ", what, ": ", std::strerror(err)));
}

// Writes every byte of `iov[0..count)` (modified as it goes).
absl::Status WriteAll(int fd, iovec* iov, int count) {
  while (count > 0) {
    const ssize_t n = ::writev(fd, iov, count);
    if (n < 0) {
      if (errno == EINTR) continue;
      return SocketError("write");
    }
    size_t left = static_cast<size_t>(n);
    while (count > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      ++iov;
      --count;
    }
    if (count > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
  }
  return absl::OkStatus();
}

// Reads exactly `bytes` bytes into `out`. UNAVAILABLE (with "closed") when
// the peer closes first.
absl::Status ReadAll(int fd, char* out, size_t bytes) {
  while (bytes > 0) {
    const ssize_t n = ::recv(fd, out, bytes, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return SocketError("read");
    }
    if (n == 0) return absl::UnavailableError("tcp echo: connection closed");
    out += n;
    bytes -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

void NoDelay(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

}  // namespace

// ---------------------------------------------------------------------------
// TcpEchoServer.

TcpEchoServer::TcpEchoServer(int64_t max_bytes)
    : max_bytes_(max_bytes), source_(static_cast<size_t>(max_bytes), '\x5a') {}

absl::StatusOr<std::unique_ptr<TcpEchoServer>> TcpEchoServer::Start(int64_t max_bytes) {
  std::unique_ptr<TcpEchoServer> server(new TcpEchoServer(max_bytes));
  server->listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (server->listen_fd_ < 0) return SocketError("socket");
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  if (::bind(server->listen_fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      ::listen(server->listen_fd_, 16) != 0 ||
      ::getsockname(server->listen_fd_, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    return SocketError("listen");
  }
  server->port_ = ntohs(address.sin_port);
  server->acceptor_ = std::thread([s = server.get()] { s->Accept(); });
  return server;
}

TcpEchoServer::~TcpEchoServer() {
  std::vector<std::thread> servers;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (int fd : connections_) ::shutdown(fd, SHUT_RDWR);
    servers.swap(servers_);
  }
  if (listen_fd_ >= 0) ::shutdown(listen_fd_, SHUT_RDWR);
  if (acceptor_.joinable()) acceptor_.join();
  for (std::thread& thread : servers) thread.join();
  {
    // A connection accepted while stopping has no thread; close it here.
    absl::MutexLock lock(&mu_);
    for (std::thread& thread : servers_) thread.join();
    for (int fd : connections_) ::close(fd);
  }
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

void TcpEchoServer::Accept() {
  while (true) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return;  // shut down
    }
    NoDelay(fd);
    absl::MutexLock lock(&mu_);
    connections_.push_back(fd);
    if (stopping_) {
      ::shutdown(fd, SHUT_RDWR);
      return;
    }
    servers_.emplace_back([this, fd] { Serve(fd); });
  }
}

void TcpEchoServer::Serve(int fd) {
  std::vector<char> request;
  char header[kRequestHeaderBytes];
  while (ReadAll(fd, header, sizeof(header)).ok()) {
    const uint64_t request_bytes = GetU64(header);
    const uint64_t reply_bytes = GetU64(header + 8);
    const uint64_t max_bytes = static_cast<uint64_t>(max_bytes_);
    if (request_bytes > max_bytes || reply_bytes > max_bytes) break;
    if (request.size() < request_bytes) request.resize(request_bytes);
    if (!ReadAll(fd, request.data(), request_bytes).ok()) break;
    char reply_header[kReplyHeaderBytes];
    PutU64(reply_bytes, reply_header);
    iovec iov[2] = {{reply_header, sizeof(reply_header)},
                    {const_cast<char*>(source_.data()), reply_bytes}};
    if (!WriteAll(fd, iov, reply_bytes > 0 ? 2 : 1).ok()) break;
  }
  // The destructor closes the socket, once no thread uses it.
  ::shutdown(fd, SHUT_RDWR);
}

// ---------------------------------------------------------------------------
// TcpEchoClient.

absl::StatusOr<std::unique_ptr<TcpEchoClient>> TcpEchoClient::Connect(int port,
                                                                       absl::Duration timeout) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return SocketError("socket");
  std::unique_ptr<TcpEchoClient> client(new TcpEchoClient(fd));
  const timeval limit = absl::ToTimeval(timeout);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof(limit));
  NoDelay(fd);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(port));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    return SocketError("connect");
  }
  return client;
}

TcpEchoClient::~TcpEchoClient() { ::close(fd_); }

absl::Status TcpEchoClient::Call(const std::string& source, int64_t request_bytes,
                                 int64_t reply_bytes) {
  char header[kRequestHeaderBytes];
  PutU64(static_cast<uint64_t>(request_bytes), header);
  PutU64(static_cast<uint64_t>(reply_bytes), header + 8);
  iovec iov[2] = {{header, sizeof(header)},
                  {const_cast<char*>(source.data()), static_cast<size_t>(request_bytes)}};
  if (absl::Status written = WriteAll(fd_, iov, request_bytes > 0 ? 2 : 1); !written.ok()) {
    return written;
  }
  char reply_header[kReplyHeaderBytes];
  if (absl::Status read = ReadAll(fd_, reply_header, sizeof(reply_header)); !read.ok()) {
    return read;
  }
  const uint64_t bytes = GetU64(reply_header);
  if (bytes != static_cast<uint64_t>(reply_bytes)) {
    return absl::InternalError("tcp echo: the reply has the wrong size");
  }
  if (reply_.size() < bytes) reply_.resize(bytes);
  return ReadAll(fd_, reply_.data(), bytes);
}

}  // namespace shardtrain::bench
