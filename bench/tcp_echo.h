// The Echo baseline without gRPC: what a plain TCP parameter server's
// transport (ps-lite, BytePS's) costs in this process model, so that
// wire_bench can show how far gRPC's HTTP/2 stands from the socket itself
// on request/response calls, beside iperf3's one-way stream.
//
// A call is a frame of the data path's framed TCP connections
// (wire/frame_socket.h: a 32-byte header, the body read into one slice of
// its own) whose body is the reply's size (a little-endian u64) and the
// request's bytes, answered by a frame holding the reply's bytes, on one
// connection (TCP_NODELAY) that carries one call at a time. The server runs
// a thread per connection that reads a call and writes the reply from a
// buffer filled at start-up with one sendmsg, in the same thread: no
// hand-off between threads, no framing but the headers. The client writes
// in the calling thread and reads the reply there.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<TcpEchoServer> server,
//                    TcpEchoServer::Start(max_reply_bytes));
//   ASSIGN_OR_RETURN(std::unique_ptr<TcpEchoClient> client,
//                    TcpEchoClient::Connect(server->port(), absl::Seconds(30)));
//   RETURN_IF_ERROR(client->Call(source, request_bytes, reply_bytes));
#ifndef SHARDTRAIN_BENCH_TCP_ECHO_H_
#define SHARDTRAIN_BENCH_TCP_ECHO_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "wire/frame_listener.h"
#include "wire/frame_socket.h"

namespace shardtrain::bench {

// Listens on 127.0.0.1 (a free port) and answers every call on every
// connection with `reply bytes` bytes of a buffer filled at start-up.
// Requests and replies larger than `max_bytes` end their connection.
// Thread-safe.
class TcpEchoServer {
 public:
  static absl::StatusOr<std::unique_ptr<TcpEchoServer>> Start(int64_t max_bytes);
  // Stops listening, ends every connection and joins every thread.
  ~TcpEchoServer();

  int port() const { return listener_->port(); }

 private:
  explicit TcpEchoServer(int64_t max_bytes);

  // Accepts connections until the listening socket is shut down.
  void Accept();
  // Answers the calls of `connection` until it ends or the server stops.
  void Serve(wire::FrameSocket* connection);

  const int64_t max_bytes_;
  const std::string source_;
  std::unique_ptr<wire::FrameListener> listener_;
  std::thread acceptor_;

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::unique_ptr<wire::FrameSocket>> connections_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> servers_ ABSL_GUARDED_BY(mu_);
};

// One call at a time on one connection. With `hand_off`, a thread of the
// client's writes and reads each call and wakes the caller, one hand-off
// each way, as a client whose calls end in callbacks (PsClient's
// BatchCall) would; without, the calling thread does. Thread-compatible.
class TcpEchoClient {
 public:
  // Connects to 127.0.0.1:`port`; a call that hears nothing for `timeout`
  // fails with DEADLINE_EXCEEDED.
  static absl::StatusOr<std::unique_ptr<TcpEchoClient>> Connect(int port,
                                                                absl::Duration timeout,
                                                                bool hand_off = false);
  ~TcpEchoClient();
  TcpEchoClient(const TcpEchoClient&) = delete;
  TcpEchoClient& operator=(const TcpEchoClient&) = delete;

  // Sends the first `request_bytes` bytes of `source` and asks for
  // `reply_bytes` back, which it reads into a buffer of its own and checks
  // for size. REQUIRES: request_bytes <= source.size().
  absl::Status Call(const std::string& source, int64_t request_bytes, int64_t reply_bytes);

 private:
  // A call handed to the client's thread.
  struct HandedOff {
    const std::string* source = nullptr;
    int64_t request_bytes = 0;
    int64_t reply_bytes = 0;
    bool done = false;
    absl::Status status;
  };

  TcpEchoClient(std::unique_ptr<wire::FrameSocket> socket, absl::Duration timeout)
      : socket_(std::move(socket)), timeout_(timeout) {}

  // Writes the call and reads its reply in this thread.
  absl::Status CallHere(const std::string& source, int64_t request_bytes, int64_t reply_bytes);
  // The hand-off thread: runs each handed-off call until the client goes.
  void RunHandedOff();

  const std::unique_ptr<wire::FrameSocket> socket_;
  const absl::Duration timeout_;
  uint64_t calls_ = 0;  // used by one thread at a time: the caller or the hand-off thread

  absl::Mutex mu_;
  HandedOff* handed_off_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // with hand_off only
};

}  // namespace shardtrain::bench

#endif  // SHARDTRAIN_BENCH_TCP_ECHO_H_
