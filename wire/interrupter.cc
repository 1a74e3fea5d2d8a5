#include "wire/interrupter.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

#include <glog/logging.h>

namespace shardtrain::wire {

Interrupter::Interrupter() : fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
  if (fd_ < 0) {
    PLOG(WARNING) << "eventfd: a connect cannot be interrupted, it ends at its timeout";
  }
}

Interrupter::~Interrupter() {
  if (fd_ >= 0) ::close(fd_);
}

void Interrupter::Trigger() {
  if (triggered_.exchange(true) || fd_ < 0) return;
  const uint64_t one = 1;
  // Cannot block or fail short of a counter overflow: written once.
  while (::write(fd_, &one, sizeof(one)) < 0 && errno == EINTR) {
  }
}

}  // namespace shardtrain::wire
