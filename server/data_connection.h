// DataConnection: one client connection to a shard's data port
// (server/data_port.h). Its thread reads call frames (wire/frame_socket.h)
// and runs each through the service's data-path handlers
// (ParameterServerService::HandlePush and the others) itself, so a call
// answered at once (a push, a pull that is ready) is read, applied and
// answered on this one thread, with no hand-off. A call answered later on
// another thread (a parked pull woken by another worker's push, a push the
// replica chain acknowledged, a forward that waited for one behind it) is
// written by the connection's writer thread, so a client that stops
// reading stalls only its own connection.
//
// On a shard serving TLS the connection's thread first runs the handshake
// and, when the shard has a shared token, reads the client's hello
// (wire::DataMethod::kHello) and checks its token, all within
// write_timeout; a connection that fails either ends before any call is
// read (a wrong or missing token is counted, as a gRPC call's is).
//
// Calls on one connection may overlap (each frame names its call id);
// at most max_calls_in_flight are unanswered at a time, after which the
// connection stops reading until one is answered. A frame that is not a
// request of this protocol, a body over max_message_bytes and a call id
// already in flight end the connection. When it ends (the client closed
// it, a bad frame, Shutdown), its calls still waiting are cancelled as a
// gRPC call's are when its client goes away, and Serve returns once every
// call has been answered.
//
//   DataConnection connection(std::move(socket), service, limits, metrics);
//   connection.Serve();  // on its own thread, until the connection ends
//
// Shutdown may be called from any thread.
#ifndef SHARDTRAIN_SERVER_DATA_CONNECTION_H_
#define SHARDTRAIN_SERVER_DATA_CONNECTION_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <thread>
#include <utility>

#include <grpcpp/support/status.h>
#include <prometheus/counter.h>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/parameter_server_service.h"
#include "wire/frame_socket.h"
#include "wire/tls_context.h"

namespace shardtrain::server {

struct DataConnectionLimits {
  // Largest request body read (--max_message_mb, as for gRPC).
  uint64_t max_message_bytes = uint64_t{256} << 20;
  // Unanswered calls per connection before it stops reading
  // (--max_data_calls_per_connection).
  int max_calls_in_flight = 64;
  // An answer not taken by the client within this ends the connection, as
  // does a TLS handshake with its hello not done within it
  // (--data_write_timeout_s).
  absl::Duration write_timeout = absl::Seconds(30);
};

class DataConnection {
 public:
  // `service` is not owned and must outlive the connection. `tls` (a server
  // context; null: plaintext) secures it; `auth_failures` (optional, must
  // outlive it) counts hellos refused for their token.
  DataConnection(std::unique_ptr<wire::FrameSocket> socket, ParameterServerService* service,
                 const DataConnectionLimits& limits,
                 std::shared_ptr<const wire::TlsContext> tls = nullptr,
                 prometheus::Counter* auth_failures = nullptr);
  ~DataConnection();
  DataConnection(const DataConnection&) = delete;
  DataConnection& operator=(const DataConnection&) = delete;

  // Serves the connection until it ends (see the file comment).
  void Serve();
  // Ends the connection: Serve returns once its calls are answered.
  void Shutdown();

 private:
  class Call;

  // The TLS handshake and, with a token, the hello: whether the
  // connection may carry calls.
  bool Secure();
  // Runs `call` through the service's handler of its method.
  void Dispatch(Call* call);
  // Call::Finish: writes the answer now (on the reading thread) or hands
  // it to the writer thread.
  void Finished(Call* call, const grpc::Status& status);
  // Writes `call`'s answer frame (nothing once the connection is broken).
  void WriteAnswer(Call* call, const grpc::Status& status);
  // After its answer: drops the connection's references to `call`.
  void Answered(Call* call);
  void Unref(Call* call);
  // The writer thread: writes the answers of calls finished elsewhere.
  void WriteQueued();

  const std::unique_ptr<wire::FrameSocket> socket_;
  ParameterServerService* const service_;
  const DataConnectionLimits limits_;
  const std::shared_ptr<const wire::TlsContext> tls_;
  prometheus::Counter* const auth_failures_;
  std::thread::id reader_;
  std::thread writer_;
  std::atomic<bool> broken_{false};
  // One frame written at a time.
  absl::Mutex write_mu_;

  absl::Mutex mu_;
  // Calls not answered yet, by call id.
  absl::flat_hash_map<uint64_t, Call*> in_flight_ ABSL_GUARDED_BY(mu_);
  // Calls alive (answered or not): Serve waits for none.
  int live_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<std::pair<Call*, grpc::Status>> to_write_ ABSL_GUARDED_BY(mu_);
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_writer_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace shardtrain::server

#endif  // SHARDTRAIN_SERVER_DATA_CONNECTION_H_
