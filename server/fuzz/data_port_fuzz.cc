// data_port_fuzz: libFuzzer target over a shard's data port
// (server/data_port.h): the frames reader and dispatch of
// server/data_connection.h and, behind them, the service's data-path
// handlers (ParameterServerService::Handle*).
//
// One in-process shard (async, sgd, one worker, a tensor "w" of
// kDataPortElements f32 and a sparse table "t" of dim 4) serves every
// input. An input is the byte stream of one client connection: it is
// written on a fresh connection (a socketpair served by a DataConnection
// of the shard's service, as the data port's listener serves what it
// accepts), whose write side is then closed, and everything the shard
// sends back is read until the shard closes it.
// Besides the sanitizers it checks:
//  - the shard closes the connection within 10 s of the input's end, so
//    no call of a client that went away is left waiting (a parked pull is
//    cancelled with its connection);
//  - what the shard sent is a sequence of whole response frames, each
//    answering a call id the input sent.
// A broken promise aborts, which libFuzzer reports as a crash. Seeds:
// data_port_fuzz_seeds (<dir>/server/fuzz/data_port_seeds).
//
// Run by scripts/fuzz.sh. By hand:
//   build-fuzz/bin/data_port_fuzz -max_len=4096 -max_total_time=60 \
//     build-fuzz/server/fuzz/data_port_seeds

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include <glog/logging.h>
#include <google/protobuf/stubs/logging.h>

#include "absl/container/flat_hash_set.h"
#include "absl/time/clock.h"
#include "proto/shardtrain.pb.h"
#include "server/fuzz/data_port_frames.h"
#include "server/data_connection.h"
#include "server/ps_server.h"
#include "wire/frame_header.h"

namespace shardtrain::server::fuzz {
namespace {

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "data_port_fuzz: %s\n", what);
  std::abort();
}

PsServer* Shard() {
  static PsServer* const server = [] {
    PsServerOptions options;
    options.metrics_address = "";
    options.max_message_bytes = 1 << 20;
    options.data_limits.write_timeout = absl::Seconds(2);
    options.shard.num_workers = 1;
    options.shard.optimizer.name = "sgd";
    options.shard.limits.max_stored_elements = 1 << 20;
    options.shard.limits.max_table_rows = 1 << 12;
    // A parked pull gives up soon; its connection's end cancels it anyway.
    options.shard.partitioning.max_partition_elements = kDataPortElements;
    absl::StatusOr<std::unique_ptr<PsServer>> started = PsServer::Start(options);
    if (!started.ok()) Fail("the shard did not start");
    RegisterRequest request;
    TensorSpec* spec = request.add_tensors();
    spec->set_name("w");
    spec->add_shape(kDataPortElements);
    spec->set_dtype(DTYPE_F32);
    RegisterResponse response;
    if (absl::Status s = (*started)->shard().Register(request, &response); !s.ok()) {
      Fail(("Register failed: " + s.ToString()).c_str());
    }
    RegisterTablesRequest tables;
    TableSpec* table = tables.add_tables();
    table->set_name("t");
    table->set_dim(4);
    table->set_capacity(1 << 10);
    table->set_learning_rate(0.1f);
    if (absl::Status s = (*started)->shard().tables().Register(tables); !s.ok()) {
      Fail(("RegisterTables failed: " + s.ToString()).c_str());
    }
    return started->release();
  }();
  return server;
}

// The call ids of the request frames at the start of `input` that parse.
absl::flat_hash_set<uint64_t> CallIds(const std::string& input) {
  absl::flat_hash_set<uint64_t> ids;
  size_t at = 0;
  while (at + wire::FrameHeader::kBytes <= input.size()) {
    absl::StatusOr<wire::FrameHeader> header =
        wire::FrameHeader::Decode(input.data() + at, 1 << 20, 0);
    if (!header.ok() || header->response) break;
    ids.insert(header->call_id);
    at += wire::FrameHeader::kBytes + header->body_bytes;
  }
  return ids;
}

void CheckAnswers(const std::string& input, const std::string& answers) {
  const absl::flat_hash_set<uint64_t> ids = CallIds(input);
  size_t at = 0;
  while (at < answers.size()) {
    if (at + wire::FrameHeader::kBytes > answers.size()) Fail("a partial answer header");
    absl::StatusOr<wire::FrameHeader> header =
        wire::FrameHeader::Decode(answers.data() + at, uint64_t{1} << 32, 1 << 20);
    if (!header.ok()) Fail("an answer header that does not decode");
    if (!header->response) Fail("an answer that is not a response");
    if (!ids.contains(header->call_id)) Fail("an answer to a call id nobody sent");
    at += wire::FrameHeader::kBytes + header->message_bytes + header->body_bytes;
    if (at > answers.size()) Fail("a partial answer");
  }
}

int OneInput(const uint8_t* data, size_t size) {
  // A connection of its own to the shard's service, over a socketpair: what
  // the data port's listener hands a DataConnection, without the churn of
  // a new TCP connection for every input.
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    Fail("socketpair failed");
  }
  DataConnectionLimits limits;
  limits.max_message_bytes = 1 << 20;
  limits.write_timeout = absl::Seconds(2);
  DataConnection connection(std::make_unique<wire::FrameSocket>(fds[0]), &Shard()->service(),
                            limits);
  std::thread serving([&connection] { connection.Serve(); });
  const int fd = fds[1];
  // Inputs are small (libFuzzer's -max_len): the socket buffer takes one
  // whole, so the write does not wait for the shard to read.
  const std::string input(reinterpret_cast<const char*>(data), size);
  size_t sent = 0;
  if (input.empty()) ::shutdown(fd, SHUT_WR);
  std::string answers;
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  bool closed = false;
  while (!closed) {
    pollfd entry{fd, static_cast<short>(POLLIN | (sent < input.size() ? POLLOUT : 0)), 0};
    const int left_ms = static_cast<int>(absl::ToInt64Milliseconds(give_up - absl::Now()));
    const int ready = left_ms > 0 ? ::poll(&entry, 1, left_ms) : 0;
    // libFuzzer's timer (SIGALRM, for -timeout) interrupts the poll now
    // and then: that is no answer and no timeout.
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) {
      std::fprintf(stderr, "data_port_fuzz: sent %zu of %zu bytes, %zu bytes answered\n", sent,
                   input.size(), answers.size());
      Fail("the shard did not close the connection within 10 s of the input's end");
    }
    if ((entry.revents & POLLOUT) != 0 && sent < input.size()) {
      const ssize_t n = ::send(fd, input.data() + sent, input.size() - sent, MSG_NOSIGNAL);
      if (n > 0) sent += static_cast<size_t>(n);
      if (n < 0 && errno != EINTR) sent = input.size();  // the shard closed it early
      if (sent == input.size()) ::shutdown(fd, SHUT_WR);
    }
    if ((entry.revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
      char buffer[1 << 16];
      const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        closed = true;
      } else {
        answers.append(buffer, static_cast<size_t>(n));
      }
    }
  }
  ::close(fd);
  serving.join();
  CheckAnswers(input, answers);
  return 0;
}

}  // namespace
}  // namespace shardtrain::server::fuzz

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  google::InitGoogleLogging("data_port_fuzz");
  FLAGS_minloglevel = 2;  // errors only: refused requests are expected
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return shardtrain::server::fuzz::OneInput(data, size);
}
