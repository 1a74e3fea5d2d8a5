#include "testing/etcd_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "etcd/etcd_client.h"
#include "testing/free_port.h"

namespace shardtrain::testutil {
namespace {

// True when every thread of `pid` is stopped (state T or t in its
// /proc/<pid>/task/<tid>/stat; the state follows the command's closing
// parenthesis, and the command may hold parentheses of its own).
bool AllThreadsStopped(pid_t pid) {
  std::error_code error;
  const std::filesystem::path tasks = absl::StrCat("/proc/", pid, "/task");
  bool any = false;
  for (const auto& task : std::filesystem::directory_iterator(tasks, error)) {
    std::ifstream in(task.path() / "stat");
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t paren = stat.rfind(')');
    if (paren == std::string::npos || paren + 2 >= stat.size()) return false;
    const char state = stat[paren + 2];
    if (state != 'T' && state != 't') return false;
    any = true;
  }
  return !error && any;
}

constexpr absl::Duration kStartTimeout = absl::Seconds(15);
constexpr int kStartAttempts = 3;

std::string Url(int port, const std::string& host = "127.0.0.1", bool tls = false) {
  return absl::StrCat(tls ? "https://" : "http://", host, ":", port);
}

std::string ReadPem(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

bool EtcdProcess::Available() { return access(kBinary, X_OK) == 0; }

absl::StatusOr<std::unique_ptr<EtcdProcess>> EtcdProcess::Start(
    const std::string& client_host, const Tls& tls) {
  absl::Status last = absl::InternalError("could not pick two distinct free ports");
  for (int attempt = 0; attempt < kStartAttempts; ++attempt) {
    ASSIGN_OR_RETURN(int client_port, PickFreePort());
    ASSIGN_OR_RETURN(int peer_port, PickFreePort());
    if (peer_port == client_port) continue;
    ASSIGN_OR_RETURN(std::string dir, MakeDir());
    std::unique_ptr<EtcdProcess> etcd(new EtcdProcess(std::move(dir), client_host, client_port,
                                                      peer_port, "t",
                                                      absl::StrCat("t=", Url(peer_port)), tls));
    last = etcd->Spawn();
    if (last.ok()) last = etcd->WaitServing(kStartTimeout);
    if (last.ok()) return etcd;
  }
  return last;
}

absl::StatusOr<std::vector<std::unique_ptr<EtcdProcess>>> EtcdProcess::StartCluster(int members) {
  if (members < 1) return absl::InvalidArgumentError("a cluster needs at least one member");
  absl::Status last = absl::InternalError("could not pick distinct free ports");
  for (int attempt = 0; attempt < kStartAttempts; ++attempt) {
    std::vector<int> ports;  // client, peer, client, peer, ...
    for (int i = 0; i < 2 * members; ++i) {
      ASSIGN_OR_RETURN(int port, PickFreePort());
      ports.push_back(port);
    }
    if (absl::flat_hash_set<int>(ports.begin(), ports.end()).size() != ports.size()) continue;
    std::vector<std::string> initial;
    for (int i = 0; i < members; ++i) {
      initial.push_back(absl::StrCat("m", i, "=", Url(ports[2 * i + 1])));
    }
    std::vector<std::unique_ptr<EtcdProcess>> cluster;
    last = absl::OkStatus();
    // All members first: none answers before a quorum has elected a leader.
    for (int i = 0; i < members && last.ok(); ++i) {
      ASSIGN_OR_RETURN(std::string dir, MakeDir());
      cluster.emplace_back(new EtcdProcess(std::move(dir), "127.0.0.1", ports[2 * i],
                                           ports[2 * i + 1],
                                           absl::StrCat("m", i), absl::StrJoin(initial, ",")));
      last = cluster.back()->Spawn();
    }
    for (size_t i = 0; i < cluster.size() && last.ok(); ++i) {
      last = cluster[i]->WaitServing(kStartTimeout);
    }
    if (last.ok()) return cluster;
  }
  return last;
}

std::string EtcdProcess::Endpoints(const std::vector<std::unique_ptr<EtcdProcess>>& cluster) {
  std::vector<std::string> endpoints;
  for (const std::unique_ptr<EtcdProcess>& member : cluster) {
    endpoints.push_back(member->endpoint());
  }
  return absl::StrJoin(endpoints, ",");
}

absl::StatusOr<std::string> EtcdProcess::MakeDir() {
  std::string pattern =
      (std::filesystem::temp_directory_path() / "shardtrain_etcd_XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp: ", strerror(errno)));
  }
  return pattern;
}

EtcdProcess::EtcdProcess(std::string dir, std::string client_host, int client_port,
                         int peer_port, std::string name, std::string initial_cluster, Tls tls)
    : dir_(std::move(dir)),
      client_host_(std::move(client_host)),
      client_port_(client_port),
      peer_port_(peer_port),
      name_(std::move(name)),
      initial_cluster_(std::move(initial_cluster)),
      tls_(std::move(tls)) {
  if (!tls_.cert_file.empty()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = ReadPem(tls_.client_ca_file);
    ssl.pem_cert_chain = ReadPem(tls_.cert_file);
    ssl.pem_private_key = ReadPem(tls_.key_file);
    credentials_ = grpc::SslCredentials(ssl);
  }
}

EtcdProcess::~EtcdProcess() {
  Kill().IgnoreError();
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

std::string EtcdProcess::endpoint() const {
  return absl::StrCat(client_host_, ":", client_port_);
}

absl::Status EtcdProcess::Spawn() {
  if (pid_ > 0) return absl::FailedPreconditionError("etcd is already running");
  const std::string data_dir = dir_ + "/data";
  const std::string log_path = dir_ + "/etcd.log";
  std::vector<std::string> args = {
      kBinary,
      "--name", name_,
      "--data-dir", data_dir,
      "--listen-client-urls", Url(client_port_, client_host_, credentials_ != nullptr),
      "--advertise-client-urls", Url(client_port_, client_host_, credentials_ != nullptr),
      "--listen-peer-urls", Url(peer_port_),
      "--initial-advertise-peer-urls", Url(peer_port_),
      "--initial-cluster", initial_cluster_,
      // Fast elections let leases as short as 1 s be granted.
      "--heartbeat-interval", "25", "--election-timeout", "250",
  };
  if (credentials_ != nullptr) {
    args.insert(args.end(), {"--cert-file", tls_.cert_file, "--key-file", tls_.key_file,
                             "--client-cert-auth", "--trusted-ca-file", tls_.client_ca_file});
  }
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);

  const int log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) return absl::InternalError(absl::StrCat("open ", log_path, ": ", strerror(errno)));
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    close(log_fd);
    return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
  }
  if (pid == 0) {
    // Die with the test, even when it crashes before the destructor runs.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    dup2(log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    execv(kBinary, argv.data());
    _exit(127);
  }
  close(log_fd);
  pid_ = pid;
  return absl::OkStatus();
}

absl::Status EtcdProcess::WaitServing(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Status last = absl::DeadlineExceededError("not tried");
  while (absl::Now() < deadline) {
    int wstatus = 0;
    if (pid_ > 0 && waitpid(pid_, &wstatus, WNOHANG) == pid_) {
      pid_ = -1;
      return absl::UnavailableError(
          absl::StrCat("etcd exited during start (status ", wstatus, "); log:\n", LogTail()));
    }
    etcd::EtcdClient::Options options;
    options.endpoints = endpoint();
    options.credentials = credentials_;
    options.connect_timeout = absl::Milliseconds(200);
    options.rpc_timeout = absl::Milliseconds(500);
    absl::StatusOr<std::unique_ptr<etcd::EtcdClient>> client = etcd::EtcdClient::Create(options);
    if (client.ok()) {
      absl::StatusOr<etcd::KeyValue> probe = (*client)->Get("/shardtrain-test-probe");
      if (probe.ok() || absl::IsNotFound(probe.status())) return absl::OkStatus();
      last = probe.status();
    } else {
      last = client.status();
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError(absl::StrCat("etcd on ", endpoint(), " did not answer within ",
                                                  absl::FormatDuration(timeout), " (", last.ToString(),
                                                  "); log:\n", LogTail()));
}

std::string EtcdProcess::LogTail() const {
  std::ifstream in(dir_ + "/etcd.log");
  std::stringstream buffer;
  buffer << in.rdbuf();
  std::string log = buffer.str();
  constexpr size_t kTail = 2000;
  return log.size() > kTail ? log.substr(log.size() - kTail) : log;
}

absl::Status EtcdProcess::Pause() {
  if (pid_ <= 0 || kill(pid_, SIGSTOP) != 0) return absl::FailedPreconditionError("etcd not running");
  // kill() returns before every thread has stopped; until then etcd may
  // still answer a request (EtcdClientTest saw a Put succeed right after).
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (!AllThreadsStopped(pid_)) {
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat("etcd ", pid_, " did not stop within 5 s"));
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
  return absl::OkStatus();
}

absl::Status EtcdProcess::Resume() {
  if (pid_ <= 0 || kill(pid_, SIGCONT) != 0) return absl::FailedPreconditionError("etcd not running");
  return absl::OkStatus();
}

absl::Status EtcdProcess::Kill() {
  if (pid_ <= 0) return absl::OkStatus();
  kill(pid_, SIGKILL);
  int wstatus = 0;
  while (waitpid(pid_, &wstatus, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
  return absl::OkStatus();
}

absl::Status EtcdProcess::Restart() {
  RETURN_IF_ERROR(Kill());
  RETURN_IF_ERROR(Spawn());
  return WaitServing(kStartTimeout);
}

absl::Status EtcdProcess::RestartEmpty() {
  RETURN_IF_ERROR(Kill());
  std::error_code error;
  std::filesystem::remove_all(dir_ + "/data", error);
  if (error) return absl::InternalError(absl::StrCat("deleting etcd's data: ", error.message()));
  RETURN_IF_ERROR(Spawn());
  return WaitServing(kStartTimeout);
}

}  // namespace shardtrain::testutil
