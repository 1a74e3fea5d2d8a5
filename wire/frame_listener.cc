#include "wire/frame_listener.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace shardtrain::wire {

absl::Status SplitHostPort(const std::string& address, std::string* host, int* port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("address \"", address, "\" is not host:port"));
  }
  *host = address.substr(0, colon);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
  if (!absl::SimpleAtoi(address.substr(colon + 1), port) || *port < 0 || *port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("address \"", address, "\" has no port in [0, 65535]"));
  }
  return absl::OkStatus();
}

std::optional<std::string> DataPortHost(const std::string& grpc_address) {
  std::string host;
  int port = 0;
  if (!SplitHostPort(grpc_address, &host, &port).ok() || host.find('/') != std::string::npos) {
    return std::nullopt;
  }
  return host;
}

absl::StatusOr<std::unique_ptr<FrameListener>> FrameListener::Listen(
    const std::string& address) {
  std::string host;
  int port = 0;
  if (absl::Status split = SplitHostPort(address, &host, &port); !split.ok()) return split;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string service = absl::StrCat(port);
  const int resolved =
      ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found);
  if (resolved != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve \"", host, "\": ", ::gai_strerror(resolved)));
  }
  std::string error = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      error = std::strerror(errno);
      continue;
    }
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_storage bound{};
    socklen_t length = sizeof(bound);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, 128) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length) != 0) {
      error = std::strerror(errno);
      ::close(fd);
      continue;
    }
    ::freeaddrinfo(found);
    const int bound_port =
        bound.ss_family == AF_INET6
            ? ntohs(reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port)
            : ntohs(reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);
    return std::unique_ptr<FrameListener>(new FrameListener(fd, bound_port));
  }
  ::freeaddrinfo(found);
  return absl::UnavailableError(absl::StrCat("cannot listen on ", address, ": ", error));
}

FrameListener::~FrameListener() { ::close(fd_); }

absl::StatusOr<std::unique_ptr<FrameSocket>> FrameListener::Accept() {
  while (true) {
    if (shut_down_.load()) return absl::CancelledError("the listener was shut down");
    const int fd = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) {
      if (shut_down_.load()) {
        ::close(fd);
        return absl::CancelledError("the listener was shut down");
      }
      return std::make_unique<FrameSocket>(fd);
    }
    // A connection reset before it was accepted, or a signal: the next.
    if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
    if (shut_down_.load()) return absl::CancelledError("the listener was shut down");
    // Out of descriptors: the process is at its limit; wait a little
    // rather than spin.
    if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
      ::usleep(10000);
      continue;
    }
    return absl::UnavailableError(absl::StrCat("accept: ", std::strerror(errno)));
  }
}

void FrameListener::Shutdown() {
  shut_down_.store(true);
  // Wakes a blocked accept (Linux answers it with EINVAL).
  ::shutdown(fd_, SHUT_RDWR);
}

}  // namespace shardtrain::wire
