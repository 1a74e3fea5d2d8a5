#include "testing/port_file.h"

#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "testing/files.h"

namespace shardtrain::testutil {
namespace {

// The ports in `path` now; empty when it has none yet.
std::vector<int> PortsIn(const std::string& path) {
  std::ifstream in(path);
  std::vector<int> ports;
  int port = 0;
  while (in >> port && port > 0) ports.push_back(port);
  return ports;
}

}  // namespace

absl::StatusOr<std::vector<int>> ReadPortFile(const std::string& path,
                                              absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    std::vector<int> ports = PortsIn(path);
    if (!ports.empty()) return ports;
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("no port file at ", path));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
}

absl::StatusOr<std::vector<int>> WaitForPorts(ProcessGroup& group, pid_t pid,
                                              const std::string& path,
                                              const std::string& log_path,
                                              absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    std::vector<int> ports = PortsIn(path);
    if (!ports.empty()) return ports;
    if (absl::StatusOr<int> code = group.Wait(pid, absl::ZeroDuration()); code.ok()) {
      return absl::UnavailableError(absl::StrCat("process ", pid, " exited with ", *code,
                                                 " before writing ", path, "; its log:\n",
                                                 ReadFile(log_path)));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "no ports in ", path, " after ", absl::FormatDuration(timeout), "; log:\n",
          ReadFile(log_path)));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
}

}  // namespace shardtrain::testutil
