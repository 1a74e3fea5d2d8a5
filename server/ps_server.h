// PsServer: one running shard — the Shard, its gRPC server (with the health
// and reflection services), its metrics endpoint and its housekeeping thread.
//
//   ASSIGN_OR_RETURN(auto server, PsServer::Start(options));
//   LOG(INFO) << "serving on port " << server->port();
//   ...
//   server->Shutdown();
//
// Thread-safe.
#ifndef SHARDTRAIN_SERVER_PS_SERVER_H_
#define SHARDTRAIN_SERVER_PS_SERVER_H_

#include <cstddef>
#include <memory>
#include <string>
#include <thread>

#include <grpcpp/server.h>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "common/credentials.h"
#include "common/metrics_exposer.h"
#include "common/rpc_metrics.h"
#include "server/checkpoint.h"
#include "server/data_port.h"
#include "server/replication/chain_table.h"
#include "server/replication/coordinator.h"
#include "server/replication/forwarder.h"
#include "server/replication/replication_metrics.h"
#include "server/replication/replicator.h"
#include "server/push_order.h"
#include "server/push_path.h"
#include "server/parameter_server_service.h"
#include "server/shard.h"
#include "server/shard_metrics.h"
#include "server/shard_options.h"
#include "wire/tls_context.h"

namespace shardtrain::server {

struct PsServerOptions {
  ShardOptions shard;
  // gRPC listen address; port 0 picks a free port.
  std::string listen_address = "127.0.0.1:0";
  // Prometheus /metrics address; port 0 picks a free port; empty serves
  // no metrics endpoint.
  std::string metrics_address = "127.0.0.1:0";
  // Largest message accepted or sent; larger ones get RESOURCE_EXHAUSTED.
  int max_message_bytes = 256 << 20;
  // The data port (server/data_port.h): "host:port" (port 0 picks a free
  // port); empty opens none. In TLS with `security`'s files when it has a
  // certificate. Its body limit is max_message_bytes.
  std::string data_listen;
  int max_data_connections = 256;
  DataConnectionLimits data_limits;
  // TLS: each data-port connection's read-ahead and write buffers (each),
  // and those of the chain's forwards to the successors' data ports.
  size_t data_tls_buffer_bytes = wire::TlsContext::kDefaultBufferBytes;
  // Checkpoints go here; empty disables them. The newest good one is loaded
  // at start (server/checkpoint.h). async: one is written every
  // checkpoint_interval and at shutdown. sync: one at every
  // shard.checkpoint_every_steps-th step, none on a timer or at shutdown.
  std::string checkpoint_dir;
  absl::Duration checkpoint_interval = absl::Seconds(60);
  // Start fresh when the checkpoints in checkpoint_dir do not fit this shard
  // or cannot be read, instead of refusing to start; they are left on disk.
  bool allow_fresh_start = false;
  // TLS, mutual TLS and the auth token (common/credentials.h); all off by
  // default.
  common::ServerSecurity security;
  // Replicated shards (shard.replicas > 1): etcd and how the other shards
  // reach this one; advertise_address empty: the listen host and the bound
  // port. `peer_security` is how this shard calls the others (forwarding,
  // state transfer).
  CoordinatorOptions replication;
  common::ClientSecurity peer_security;
  // A push applied at a chain's head that has not reached the tail after
  // this is answered UNAVAILABLE while its forward goes on (Replicator); a
  // member's forward on down the chain fails after it.
  absl::Duration forward_timeout = absl::Seconds(30);
  // Forwards that may wait at once, each on a thread of its own, for an
  // operation before theirs that has not arrived (Replicator).
  int max_waiting_forwards = 64;
  // How often silent workers and expired pulls are looked for.
  absl::Duration housekeeping_interval = absl::Milliseconds(100);
  // Tests of async convergence: the order pushes are applied in
  // (server/push_order.h); "arrival" in production. Only for unreplicated
  // async shards. Its num_workers is taken from shard.num_workers.
  PushOrderOptions push_order;
};

class PsServer {
 public:
  static absl::StatusOr<std::unique_ptr<PsServer>> Start(
      const PsServerOptions& options);
  ~PsServer();

  int port() const { return port_; }
  // The data port; 0 when none is open.
  int data_port() const { return data_port_ != nullptr ? data_port_->port() : 0; }
  // Connections open on the data port now.
  int data_connections() const {
    return data_port_ != nullptr ? data_port_->connections() : 0;
  }
  int metrics_port() const { return exposer_->port(); }
  Shard& shard() { return *shard_; }
  // The service whose handlers both transports run (data_port_fuzz drives
  // its data-path handlers through a DataConnection of its own).
  ParameterServerService& service() { return *service_; }
  // Null unless replicated.
  ChainTable* chain_table() { return chain_table_.get(); }

  // Stops accepting RPCs, ends parked pulls, joins the threads and writes
  // the final checkpoint (server/checkpoint.h: async only). An error means
  // the newest state could not be saved. Idempotent: later calls return the
  // first result.
  absl::Status Shutdown();

 private:
  PsServer() = default;
  void Housekeeping();
  absl::Status StartReplication(const PsServerOptions& options,
                                prometheus::Registry& registry);

  std::unique_ptr<common::MetricsExposer> exposer_;
  std::unique_ptr<common::RpcMetrics> rpc_metrics_;
  std::unique_ptr<ShardMetrics> shard_metrics_;
  std::unique_ptr<Shard> shard_;
  std::unique_ptr<Checkpointer> checkpointer_;
  absl::Duration checkpoint_interval_;
  std::unique_ptr<ReplicationMetrics> replication_metrics_;
  std::unique_ptr<ChainTable> chain_table_;
  std::unique_ptr<Forwarder> forwarder_;
  std::unique_ptr<Replicator> replicator_;
  std::unique_ptr<PushOrder> push_order_;
  // The service's PushPath (server/push_path.h); before the service, so it
  // goes after it.
  std::unique_ptr<PushPath> push_path_;
  std::unique_ptr<ParameterServerService> service_;
  // Before the service goes: its connections run the service's handlers.
  std::unique_ptr<DataPort> data_port_;
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  absl::Duration housekeeping_interval_;
  absl::Notification stop_;
  absl::Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
  absl::Status shutdown_status_ ABSL_GUARDED_BY(shutdown_mu_);
  // Set once Start succeeded: a shard that failed to start writes nothing.
  bool started_ = false;
  std::thread housekeeping_;
};

}  // namespace shardtrain::server

#endif  // SHARDTRAIN_SERVER_PS_SERVER_H_
