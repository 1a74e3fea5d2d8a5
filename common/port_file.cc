#include "common/port_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace shardtrain::common {

absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view contents) {
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot create ", tmp, ": ", std::strerror(errno)));
  }
  size_t written = 0;
  while (written < contents.size()) {
    const ssize_t n = write(fd, contents.data() + written, contents.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      close(fd);
      unlink(tmp.c_str());
      return absl::UnavailableError(
          absl::StrCat("cannot write ", tmp, ": ", std::strerror(err)));
    }
    written += static_cast<size_t>(n);
  }
  if (fsync(fd) != 0 || close(fd) != 0) {
    unlink(tmp.c_str());
    return absl::UnavailableError(absl::StrCat("cannot flush ", tmp));
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    unlink(tmp.c_str());
    return absl::UnavailableError(absl::StrCat("cannot rename ", tmp, " to ",
                                               path, ": ", std::strerror(err)));
  }
  return absl::OkStatus();
}

absl::Status SplitHostPort(absl::string_view address, std::string* host,
                           int* port) {
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("address '", address, "' is not host:port"));
  }
  int value = 0;
  if (!absl::SimpleAtoi(address.substr(colon + 1), &value) || value < 0 ||
      value > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("address '", address, "' has no valid port"));
  }
  *host = std::string(address.substr(0, colon));
  *port = value;
  return absl::OkStatus();
}

}  // namespace shardtrain::common
