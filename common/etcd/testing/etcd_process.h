// EtcdProcess: a real single-member etcd server for tests, on 127.0.0.1
// ports chosen free at run time and a temporary data directory, killed by
// its PID when the object goes away. It can also pause (SIGSTOP), resume,
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
// Not thread-safe: one test thread drives it.
#ifndef SHARDTRAIN_COMMON_ETCD_TESTING_ETCD_PROCESS_H_
#define SHARDTRAIN_COMMON_ETCD_TESTING_ETCD_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace shardtrain::etcd::testing {

class EtcdProcess {
 public:
  // The etcd binary of Debian's etcd-server package.
  static constexpr char kBinary[] = "/usr/bin/etcd";
  static constexpr char kMissingMessage[] =
      "etcd is not installed (/usr/bin/etcd from Debian's etcd-server package); "
      "skipping the tests that need a real etcd";

  // Whether kBinary exists and is executable.
  static bool Available();

  // Starts etcd and waits (bounded) until it answers a read. Retries with
  // other ports when a port was taken between choosing and binding it.
  static absl::StatusOr<std::unique_ptr<EtcdProcess>> Start();

  // Kills etcd (if running) and deletes its data directory.
  ~EtcdProcess();
  EtcdProcess(const EtcdProcess&) = delete;
  EtcdProcess& operator=(const EtcdProcess&) = delete;

  // "127.0.0.1:<client port>".
  std::string endpoint() const;

  // SIGSTOP / SIGCONT: etcd keeps its connections but answers nothing.
  absl::Status Pause();
  absl::Status Resume();
  // SIGKILL, and waits until it is gone.
  absl::Status Kill();
  // Starts etcd again on the same ports and data directory (after Kill).
  absl::Status Restart();

 private:
  EtcdProcess(std::string dir, int client_port, int peer_port);

  absl::Status Spawn();
  // Waits until etcd answers, or fails when it exits or the time is up.
  absl::Status WaitServing(absl::Duration timeout);
  // The last lines of etcd's log, for error messages.
  std::string LogTail() const;

  const std::string dir_;  // Owned: data directory and log live under it.
  const int client_port_;
  const int peer_port_;
  pid_t pid_ = -1;  // -1 when not running.
};

}  // namespace shardtrain::etcd::testing

#endif  // SHARDTRAIN_COMMON_ETCD_TESTING_ETCD_PROCESS_H_
