// FrameListener: a listening TCP socket whose connections become
// FrameSockets (wire/frame_socket.h): the accepting end of the data path's
// framed connections.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<FrameListener> listener,
//                    FrameListener::Listen("127.0.0.1:0"));
//   ... listener->port() ...
//   while (true) {
//     absl::StatusOr<std::unique_ptr<FrameSocket>> socket = listener->Accept();
//     if (!socket.ok()) break;  // Shutdown, or the socket failed
//     ...
//   }
//
// Accept blocks one thread; Shutdown (any thread) makes it return
// CANCELLED. Thread-safe.
#ifndef SHARDTRAIN_WIRE_FRAME_LISTENER_H_
#define SHARDTRAIN_WIRE_FRAME_LISTENER_H_

#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "wire/frame_socket.h"

namespace shardtrain::wire {

class FrameListener {
 public:
  // Listens on `address`, "host:port" ("[v6]:port"; port 0 picks a free
  // one; host 0.0.0.0 or [::] listens on every interface). INVALID_ARGUMENT
  // for an address that does not parse or resolve, UNAVAILABLE when it
  // cannot be bound (the port is in use).
  static absl::StatusOr<std::unique_ptr<FrameListener>> Listen(const std::string& address);

  ~FrameListener();  // closes it
  FrameListener(const FrameListener&) = delete;
  FrameListener& operator=(const FrameListener&) = delete;

  // The port it listens on.
  int port() const { return port_; }

  // Waits for the next connection. CANCELLED after Shutdown.
  absl::StatusOr<std::unique_ptr<FrameSocket>> Accept();

  // Stops accepting; a blocked Accept returns.
  void Shutdown();

 private:
  FrameListener(int fd, int port) : fd_(fd), port_(port) {}

  const int fd_;
  const int port_;
  std::atomic<bool> shut_down_{false};
};

// Splits "host:port" or "[v6]:port" into its host and port.
// INVALID_ARGUMENT when it does not.
absl::Status SplitHostPort(const std::string& address, std::string* host, int* port);

// The host of a gRPC address that is host:port, where that server's data
// port is reached; none for an address that is not (a Unix socket, a
// resolver's URI), whose server is reached over gRPC only.
std::optional<std::string> DataPortHost(const std::string& grpc_address);

}  // namespace shardtrain::wire

#endif  // SHARDTRAIN_WIRE_FRAME_LISTENER_H_
