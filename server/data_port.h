// DataPort: a shard's data port, the data path without HTTP/2. Workers
// send Push, Pull, PushPull, Lookup and PushSparse here, and a chain's
// members forward pushes to their successors (Replicate), as frames on plain
// TCP connections (wire/frame_header.h, wire/frame_socket.h), each frame's
// body the same protobuf message the gRPC method carries; the control calls
// (Register, Heartbeat, Status, ...) stay on gRPC, whose Register and
// Heartbeat answers name this port (data_port) so that workers find it.
//
// Why: gRPC's HTTP/2 framing and its hand-offs between threads cost about
// twice a plain TCP connection's CPU per MB at the sizes a step moves
// (bench/results/wire_tcp_echo_cpu.txt). Here one thread per connection
// reads a call and runs it through the same handlers as the gRPC methods
// (ParameterServerService::Handle*: the same checks, limits, push paths,
// parked pulls and metrics), then writes the answer itself
// (server/data_connection.h).
//
// A shard serving TLS serves its data port in TLS too, with the same
// certificate, client CA and token (wire/tls_context.h): its workers and
// predecessors reach it there as they reach its gRPC port. At most
// max_connections connections are served at a time; more are closed at
// once (the client then uses gRPC).
//
//   ASSIGN_OR_RETURN(auto port, DataPort::Start(options, service, registry));
//   ... port->port() ...
//   port->Shutdown();  // before the service goes
//
// Thread-safe.
#ifndef SHARDTRAIN_SERVER_DATA_PORT_H_
#define SHARDTRAIN_SERVER_DATA_PORT_H_

#include <list>
#include <memory>
#include <string>
#include <thread>

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/data_connection.h"
#include "server/parameter_server_service.h"
#include "wire/frame_listener.h"
#include "wire/tls_context.h"

namespace shardtrain::server {

struct DataPortOptions {
  // host:port; port 0 picks a free port (--data_listen).
  std::string listen_address = "127.0.0.1:0";
  // Connections served at a time (--max_data_connections).
  int max_connections = 256;
  DataConnectionLimits limits;
  // The shard's TLS (a server context); null: plaintext.
  std::shared_ptr<const wire::TlsContext> tls;
  // Counts connections refused for their token (optional; must outlive
  // the port): the shard's shardtrain_rpc_unauthenticated_total.
  prometheus::Counter* auth_failures = nullptr;
};

class DataPort {
 public:
  // `service` is not owned and must outlive the port; the metrics go to
  // `registry`.
  static absl::StatusOr<std::unique_ptr<DataPort>> Start(const DataPortOptions& options,
                                                        ParameterServerService* service,
                                                        prometheus::Registry& registry);
  ~DataPort();  // Shutdown
  DataPort(const DataPort&) = delete;
  DataPort& operator=(const DataPort&) = delete;

  int port() const { return listener_->port(); }
  // Connections open now.
  int connections() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return open_;
  }

  // Stops accepting, ends every connection (their waiting calls are
  // cancelled) and joins the threads. Idempotent.
  void Shutdown();

 private:
  struct Served {
    std::unique_ptr<DataConnection> connection;
    std::thread thread;
    bool ended = false;
  };

  DataPort(const DataPortOptions& options, ParameterServerService* service,
           std::unique_ptr<wire::FrameListener> listener, prometheus::Registry& registry);
  void AcceptLoop();
  // Joins the connections that have ended.
  void Reap();

  const DataPortOptions options_;
  ParameterServerService* const service_;
  const std::unique_ptr<wire::FrameListener> listener_;
  prometheus::Gauge& connections_gauge_;
  prometheus::Counter& refused_;
  std::thread acceptor_;

  absl::Mutex mu_;
  std::list<Served> served_ ABSL_GUARDED_BY(mu_);
  int open_ ABSL_GUARDED_BY(mu_) = 0;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace shardtrain::server

#endif  // SHARDTRAIN_SERVER_DATA_PORT_H_
