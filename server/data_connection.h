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

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/parameter_server_service.h"
#include "wire/frame_socket.h"

namespace shardtrain::server {

struct DataConnectionLimits {
  // Largest request body read (--max_message_mb, as for gRPC).
  uint64_t max_message_bytes = uint64_t{256} << 20;
  // Unanswered calls per connection before it stops reading
  // (--max_data_calls_per_connection).
  int max_calls_in_flight = 64;
  // An answer not taken by the client within this ends the connection
  // (--data_write_timeout_s).
  absl::Duration write_timeout = absl::Seconds(30);
};

class DataConnection {
 public:
  // `service` is not owned and must outlive the connection.
  DataConnection(std::unique_ptr<wire::FrameSocket> socket, ParameterServerService* service,
                 const DataConnectionLimits& limits);
  ~DataConnection();
  DataConnection(const DataConnection&) = delete;
  DataConnection& operator=(const DataConnection&) = delete;

  // Serves the connection until it ends (see the file comment).
  void Serve();
  // Ends the connection: Serve returns once its calls are answered.
  void Shutdown();

 private:
  class Call;

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
