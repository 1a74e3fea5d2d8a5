#include "testing/free_port.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace shardtrain::testutil {
namespace {

// Binds a TCP socket to `port` (0: the kernel picks) on every local address
// and returns the port bound, or -1.
int BindAndRelease(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t length = sizeof(addr);
  int bound = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) == 0) {
    bound = static_cast<int>(ntohs(addr.sin_port));
  }
  close(fd);
  return bound;
}

}  // namespace

int EphemeralPortLow() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0;
  if (!(in >> low) || low <= 0) return 32768;
  return low;
}

absl::StatusOr<int> PickFreePort() {
  const int high = EphemeralPortLow() - 1;
  const int low = std::min(10000, high);
  std::mt19937 rng(static_cast<uint32_t>(getpid()) * 2654435761u ^
                   static_cast<uint32_t>(absl::ToUnixNanos(absl::Now())));
  if (high > low) {
    std::uniform_int_distribution<int> pick(low, high);
    for (int attempt = 0; attempt < 64; ++attempt) {
      const int port = BindAndRelease(pick(rng));
      if (port > 0) return port;
    }
  }
  const int port = BindAndRelease(0);
  if (port <= 0) {
    return absl::InternalError(absl::StrCat("cannot pick a free port: ", std::strerror(errno)));
  }
  return port;
}

}  // namespace shardtrain::testutil
