// ShardProcess: one real ps-server process on 127.0.0.1 for tests that send
// it raw requests, with a gRPC stub, its pid and its memory use. The process
// is stopped when the ShardProcess is destroyed.
#ifndef SHARDTRAIN_TESTING_SHARD_PROCESS_H_
#define SHARDTRAIN_TESTING_SHARD_PROCESS_H_

#include <sys/types.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "proto/shardtrain.grpc.pb.h"
#include "testing/files.h"
#include "testing/port_file.h"
#include "testing/process_group.h"

namespace shardtrain::testutil {

class ShardProcess {
 public:
  // Starts `bin_dir`/ps-server with `flags` (plus a port file and a log in
  // a fresh directory) and waits up to 30 s for it to serve.
  absl::Status Start(const std::string& bin_dir, const std::vector<std::string>& flags) {
    dir_ = MakeTempDir("shard_process");
    const std::string port_file = dir_ + "/ports";
    std::vector<std::string> argv = {bin_dir + "/ps-server", "--port_file=" + port_file};
    argv.insert(argv.end(), flags.begin(), flags.end());
    absl::StatusOr<pid_t> pid = group_.Start(argv, dir_ + "/ps-server.log");
    if (!pid.ok()) return pid.status();
    pid_ = *pid;
    absl::StatusOr<std::vector<int>> ports =
        WaitForPorts(group_, pid_, port_file, dir_ + "/ps-server.log", absl::Seconds(30));
    if (!ports.ok()) return ports.status();
    if (ports->size() < 2) {
      return absl::UnavailableError(absl::StrCat("ps-server did not start: ", log()));
    }
    metrics_port_ = (*ports)[1];
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(512 << 20);  // so the server is the one to refuse
    args.SetMaxReceiveMessageSize(512 << 20);
    stub_ = ParameterServer::NewStub(grpc::CreateCustomChannel(
        absl::StrCat("127.0.0.1:", (*ports)[0]), grpc::InsecureChannelCredentials(), args));
    return absl::OkStatus();
  }

  ParameterServer::Stub& stub() { return *stub_; }
  pid_t pid() const { return pid_; }
  int metrics_port() const { return metrics_port_; }
  std::string log() const { return ReadFile(dir_ + "/ps-server.log"); }

  // Resident memory of the process in bytes (VmRSS), or -1.
  int64_t Rss() const {
    std::ifstream status("/proc/" + std::to_string(pid_) + "/status");
    std::string line;
    while (std::getline(status, line)) {
      if (line.rfind("VmRSS:", 0) != 0) continue;
      std::vector<std::string> fields =
          absl::StrSplit(line, ' ', absl::SkipWhitespace());
      int64_t kib = 0;
      if (fields.size() >= 2 && absl::SimpleAtoi(fields[1], &kib)) return kib << 10;
    }
    return -1;
  }

  // Calls `method` with a deadline of `timeout`.
  template <typename Method, typename Request, typename Response>
  grpc::Status Call(Method method, const Request& request, Response* response,
                    absl::Duration timeout = absl::Seconds(10)) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         absl::ToChronoMilliseconds(timeout));
    return ((*stub_).*method)(&context, request, response);
  }

 private:
  ProcessGroup group_;
  std::string dir_;
  pid_t pid_ = 0;
  int metrics_port_ = 0;
  std::unique_ptr<ParameterServer::Stub> stub_;
};

}  // namespace shardtrain::testutil

#endif  // SHARDTRAIN_TESTING_SHARD_PROCESS_H_
