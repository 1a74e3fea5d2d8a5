#include "tests/cluster_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "chain/chain_reader.h"

extern char** environ;

namespace shardtrain::testutil {

ProcessGroup::~ProcessGroup() { StopAll(); }

absl::StatusOr<pid_t> ProcessGroup::Start(const std::vector<std::string>& argv,
                                          const std::string& log_path) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path.c_str(),
                                   O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  std::vector<char*> args;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int err = posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (err != 0) {
    return absl::InternalError(absl::StrCat("cannot start ", argv[0], ": ", std::strerror(err)));
  }
  running_.push_back(pid);
  exited_.erase(pid);  // a reused pid
  return pid;
}

absl::StatusOr<int> ProcessGroup::Wait(pid_t pid, absl::Duration timeout) {
  if (auto it = exited_.find(pid); it != exited_.end()) return it->second;
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    int status = 0;
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) {
      running_.erase(std::remove(running_.begin(), running_.end(), pid), running_.end());
      const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      exited_[pid] = code;
      return code;
    }
    if (done < 0) return absl::InternalError(std::strerror(errno));
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat("process ", pid, " still running"));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
}

absl::Status ProcessGroup::Signal(pid_t pid, int signal) {
  if (std::find(running_.begin(), running_.end(), pid) == running_.end()) {
    return absl::NotFoundError(absl::StrCat("process ", pid, " is not running in this group"));
  }
  if (kill(pid, signal) != 0) {
    return absl::InternalError(absl::StrCat("kill ", pid, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

void ProcessGroup::StopAll() {
  for (pid_t pid : running_) {
    kill(pid, SIGTERM);
    kill(pid, SIGCONT);  // a stopped process sees its SIGTERM only when it runs
  }
  const std::vector<pid_t> pids = running_;
  for (pid_t pid : pids) {
    if (!Wait(pid, absl::Seconds(5)).ok()) {
      kill(pid, SIGKILL);
      (void)Wait(pid, absl::Seconds(5));
    }
  }
  running_.clear();
}

absl::StatusOr<std::vector<int>> ReadPortFile(const std::string& path,
                                              absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    std::ifstream in(path);
    std::vector<int> ports;
    int port;
    while (in >> port) ports.push_back(port);
    if (!ports.empty()) return ports;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError(absl::StrCat("no port file at ", path));
}

absl::StatusOr<std::string> HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError("socket");
  timeval timeout{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("connect to port ", port, ": ", std::strerror(errno)));
  }
  const std::string request =
      absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
  if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    close(fd);
    return absl::UnavailableError("send failed");
  }
  std::string response;
  char buffer[16384];
  ssize_t n;
  while ((n = recv(fd, buffer, sizeof(buffer), 0)) > 0) response.append(buffer, n);
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  if (response.rfind("HTTP/1.", 0) != 0 || body == std::string::npos) {
    return absl::DataLossError("malformed HTTP response");
  }
  if (response.find(" 200 ") > body) {
    return absl::UnavailableError(response.substr(0, response.find("\r\n")));
  }
  return response.substr(body + 4);
}

std::map<std::string, double> SumByName(const std::string& exposition) {
  std::map<std::string, double> sums;
  for (absl::string_view line : absl::StrSplit(exposition, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    const size_t name_end = line.find_first_of("{ ");
    const size_t value_start = line.rfind(' ');
    if (name_end == absl::string_view::npos || value_start == absl::string_view::npos) continue;
    double value = 0;
    if (!absl::SimpleAtod(line.substr(value_start + 1), &value)) continue;
    sums[std::string(line.substr(0, name_end))] += value;
  }
  return sums;
}

bool WaitForChains(etcd::EtcdClient& etcd, const std::string& job, int num_groups,
                   const std::function<bool(const chain::ChainConfig&)>& ok,
                   absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    bool all = true;
    for (int g = 0; g < num_groups && all; ++g) {
      absl::StatusOr<chain::ChainConfig> chain = chain::ReadChain(etcd, job, g);
      all = chain.ok() && ok(*chain);
    }
    if (all) return true;
    absl::SleepFor(absl::Milliseconds(100));
  }
  return false;
}

}  // namespace shardtrain::testutil
