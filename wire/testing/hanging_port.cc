#include "wire/testing/hanging_port.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <glog/logging.h>

namespace shardtrain::wire {

HangingPort::HangingPort() {
  listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  PCHECK(listener_ >= 0) << "socket";
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  PCHECK(::bind(listener_, reinterpret_cast<sockaddr*>(&address), length) == 0) << "bind";
  PCHECK(::listen(listener_, 0) == 0) << "listen";
  PCHECK(::getsockname(listener_, reinterpret_cast<sockaddr*>(&address), &length) == 0)
      << "getsockname";
  port_ = ntohs(address.sin_port);
  queued_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  PCHECK(queued_ >= 0) << "socket";
  PCHECK(::connect(queued_, reinterpret_cast<sockaddr*>(&address), length) == 0) << "connect";
}

void HangingPort::Close() {
  if (listener_ < 0) return;
  ::close(queued_);
  ::close(listener_);
  listener_ = queued_ = -1;
}

}  // namespace shardtrain::wire
