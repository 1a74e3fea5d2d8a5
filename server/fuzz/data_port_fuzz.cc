// data_port_fuzz: libFuzzer target over a shard's data port
// (server/data_port.h): the frames reader and dispatch of
// server/data_connection.h and, behind them, the service's data-path
// handlers (ParameterServerService::Handle*).
//
// One in-process shard (async, sgd, one worker, a tensor "w" of
// kDataPortElements f32 and a sparse table "t" of dim 4) serves every
// input. An input is the byte stream of one client connection: it is
// written on a fresh connection, whose write side is then closed, and
// everything the shard sends back is read until the shard closes it.
// Besides the sanitizers it checks:
//  - the shard closes the connection within 10 s of the input's end, so
//    no call of a client that went away is left waiting (a parked pull is
//    cancelled with its connection);
//  - what the shard sent is a sequence of whole response frames, each
//    answering a call id the input sent.
// A broken promise aborts, which libFuzzer reports as a crash. Seeds:
// data_port_fuzz_seeds (<dir>/server/fuzz/data_port_seeds).
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include <glog/logging.h>
#include <google/protobuf/stubs/logging.h>

#include "absl/container/flat_hash_set.h"
#include "absl/time/clock.h"
#include "proto/shardtrain.pb.h"
#include "server/fuzz/data_port_frames.h"
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
    options.data_listen = "127.0.0.1:0";
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
    if (!(*started)->shard().Register(request, &response).ok()) Fail("Register failed");
    RegisterTablesRequest tables;
    TableSpec* table = tables.add_tables();
    table->set_name("t");
    table->set_dim(4);
    table->set_capacity(1 << 10);
    if (!(*started)->shard().tables().Register(tables).ok()) Fail("RegisterTables failed");
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
  const int port = Shard()->data_port();
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    Fail("cannot connect to the data port");
  }
  // Inputs are small (libFuzzer's -max_len): the socket buffer takes one
  // whole, so the write does not wait for the shard to read.
  const std::string input(reinterpret_cast<const char*>(data), size);
  size_t sent = 0;
  std::string answers;
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  bool closed = false;
  while (!closed) {
    pollfd entry{fd, static_cast<short>(POLLIN | (sent < input.size() ? POLLOUT : 0)), 0};
    const int left_ms = static_cast<int>(absl::ToInt64Milliseconds(give_up - absl::Now()));
    if (left_ms <= 0 || ::poll(&entry, 1, left_ms) <= 0) {
      Fail("the shard did not close the connection within 10 s of the input's end");
    }
    if ((entry.revents & POLLOUT) != 0 && sent < input.size()) {
      const ssize_t n = ::send(fd, input.data() + sent, input.size() - sent, MSG_NOSIGNAL);
      if (n > 0) sent += static_cast<size_t>(n);
      if (n < 0) sent = input.size();  // the shard closed it early
      if (sent == input.size()) ::shutdown(fd, SHUT_WR);
    }
    if ((entry.revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
      char buffer[1 << 16];
      const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
      if (n <= 0) {
        closed = true;
      } else {
        answers.append(buffer, static_cast<size_t>(n));
      }
    }
    if (input.empty() && sent == 0) {
      ::shutdown(fd, SHUT_WR);
      sent = 1;
    }
  }
  ::close(fd);
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
