// EtcdProcess: a real etcd server for tests (a single-member cluster, or one
// member of a cluster made by StartCluster), on 127.0.0.1 (or another
// local address for its clients) ports chosen free
// at run time and a temporary data directory, killed by its PID when the
// object goes away. It can also pause (SIGSTOP), resume,
// kill and restart etcd on the same ports and data, to test failures.
//
//   if (!EtcdProcess::Available()) GTEST_SKIP() << EtcdProcess::kMissingMessage;
//   ASSERT_OK_AND_ASSIGN(std::unique_ptr<EtcdProcess> etcd, EtcdProcess::Start());
//   EtcdClient::Options options;
//   options.endpoints = etcd->endpoint();
//   ASSERT_OK_AND_ASSIGN(auto client, EtcdClient::Create(options));
//   ASSERT_OK(etcd->Kill());
//   ASSERT_OK(etcd->Restart());  // same endpoint, same keys
//
//   ASSERT_OK_AND_ASSIGN(auto cluster, EtcdProcess::StartCluster(3));
//   options.endpoints = EtcdProcess::Endpoints(cluster);  // all three
//
// Not thread-safe: one test thread drives it.
#ifndef SHARDTRAIN_TESTING_ETCD_PROCESS_H_
#define SHARDTRAIN_TESTING_ETCD_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include <grpcpp/security/credentials.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace shardtrain::testutil {

class EtcdProcess {
 public:
  // The etcd binary of Debian's etcd-server package.
  static constexpr char kBinary[] = "/usr/bin/etcd";
  static constexpr char kMissingMessage[] =
      "etcd is not installed (/usr/bin/etcd from Debian's etcd-server package); "
      "skipping the tests that need a real etcd";

  // Whether kBinary exists and is executable.
  static bool Available();

  // TLS for etcd's clients: it serves https with this certificate and key
  // and demands client certificates signed by client_ca_file
  // (--client-cert-auth). All empty: plaintext.
  struct Tls {
    std::string cert_file;
    std::string key_file;
    std::string client_ca_file;
  };

  // Starts etcd and waits (bounded) until it answers a read, on ports
  // picked below the kernel's ephemeral range (PickFreePort), so that a
  // Restart finds them free; retries with other ports when one was taken
  // between choosing and binding it.
  // Clients reach it at `client_host` (an address of this host, e.g. one
  // end of a veth pair for processes in a network namespace). With `tls`,
  // the read that checks it is up verifies etcd against client_ca_file and
  // presents cert_file (it must also be good for client auth, as
  // scripts/make-certs.sh's server certificate is).
  static absl::StatusOr<std::unique_ptr<EtcdProcess>> Start(
      const std::string& client_host = "127.0.0.1", const Tls& tls = {});
  // Starts a cluster of `members` etcd processes and waits (bounded) until
  // every member answers a read.
  static absl::StatusOr<std::vector<std::unique_ptr<EtcdProcess>>> StartCluster(int members);
  // The members' endpoints, comma-separated, in order.
  static std::string Endpoints(const std::vector<std::unique_ptr<EtcdProcess>>& cluster);

  // Kills etcd (if running) and deletes its data directory.
  ~EtcdProcess();
  EtcdProcess(const EtcdProcess&) = delete;
  EtcdProcess& operator=(const EtcdProcess&) = delete;

  // "<client host>:<client port>".
  std::string endpoint() const;
  // What the read at start used: null for plaintext.
  std::shared_ptr<grpc::ChannelCredentials> credentials() const { return credentials_; }

  // SIGSTOP / SIGCONT: etcd keeps its connections but answers nothing.
  absl::Status Pause();
  absl::Status Resume();
  // SIGKILL, and waits until it is gone.
  absl::Status Kill();
  // Starts etcd again on the same ports and data directory (after Kill).
  absl::Status Restart();
  // Kills etcd, deletes its data (every key, lease and revision: an etcd
  // that lost its volume) and starts it again, empty, on the same ports.
  absl::Status RestartEmpty();

 private:
  // `initial_cluster`: etcd's --initial-cluster, naming this member `name`.
  EtcdProcess(std::string dir, std::string client_host, int client_port, int peer_port,
              std::string name, std::string initial_cluster, Tls tls = {});
  // A temporary directory for one member's data and log.
  static absl::StatusOr<std::string> MakeDir();

  absl::Status Spawn();
  // Waits until etcd answers, or fails when it exits or the time is up.
  absl::Status WaitServing(absl::Duration timeout);
  // The last lines of etcd's log, for error messages.
  std::string LogTail() const;

  const std::string dir_;  // Owned: data directory and log live under it.
  const std::string client_host_;
  const int client_port_;
  const int peer_port_;
  const std::string name_;
  const std::string initial_cluster_;
  const Tls tls_;
  std::shared_ptr<grpc::ChannelCredentials> credentials_;  // null: plaintext
  pid_t pid_ = -1;  // -1 when not running.
};

}  // namespace shardtrain::testutil

#endif  // SHARDTRAIN_TESTING_ETCD_PROCESS_H_
