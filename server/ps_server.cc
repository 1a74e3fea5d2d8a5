#include "server/ps_server.h"

#include <algorithm>

#include <glog/logging.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>
#include <prometheus/counter.h>

#include "absl/strings/str_cat.h"
#include "common/float_env.h"
#include "common/reconnect.h"
#include "common/status_macros.h"
#include "server/bad_body_interceptor.h"
#include "server/local_push_path.h"
#include "server/replication/peer_tls_check.h"
#include "server/replication/replicated_push_path.h"
#include "wire/buffer_pool_metrics.h"
#include "wire/tls_context.h"

namespace shardtrain::server {
namespace {

std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
MakeServerInterceptors() {
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
      interceptors;
  interceptors.push_back(std::make_unique<BadBodyInterceptorFactory>());
  return interceptors;
}

}  // namespace

absl::StatusOr<std::unique_ptr<PsServer>> PsServer::Start(
    const PsServerOptions& options) {
  std::unique_ptr<PsServer> server(new PsServer());
  server->housekeeping_interval_ = options.housekeeping_interval;
  ASSIGN_OR_RETURN(server->exposer_,
                   common::MetricsExposer::Create(options.metrics_address));
  prometheus::Registry& registry = server->exposer_->registry();
  server->rpc_metrics_ = std::make_unique<common::RpcMetrics>(registry, "server");
  server->shard_metrics_ = std::make_unique<ShardMetrics>(registry);
  server->exposer_->AddCollectable(
      std::make_shared<wire::BufferPoolMetrics>(&wire::BufferPool::Default()));
  ShardOptions shard_options = options.shard;
  // A pull must fit in one response message.
  shard_options.limits.max_response_bytes = std::min<int64_t>(
      shard_options.limits.max_response_bytes, options.max_message_bytes);
  // Step copies are only taken for a checkpoint directory.
  if (options.checkpoint_dir.empty()) shard_options.checkpoint_every_steps = 0;
  ASSIGN_OR_RETURN(server->shard_,
                   Shard::Create(shard_options, server->shard_metrics_.get()));
  if (!options.checkpoint_dir.empty()) {
    server->checkpoint_interval_ = options.checkpoint_interval;
    Checkpointer::Options checkpoints;
    checkpoints.dir = options.checkpoint_dir;
    checkpoints.allow_fresh_start = options.allow_fresh_start;
    server->checkpointer_ = std::make_unique<Checkpointer>(
        checkpoints, server->shard_.get(), server->shard_metrics_.get());
    ASSIGN_OR_RETURN(std::string restored, server->checkpointer_->RestoreLatest());
    if (restored.empty()) {
      LOG(INFO) << "no usable checkpoint in " << options.checkpoint_dir
                << "; starting fresh";
    }
    prometheus::BuildCounter()
        .Name("shardtrain_checkpoint_restores_total")
        .Help("Shard starts with a checkpoint directory: result=ok restored a "
              "checkpoint, result=fresh started with fresh parameters")
        .Register(registry)
        .Add({{"result", restored.empty() ? "fresh" : "ok"}})
        .Increment();
  }
  server->service_ = std::make_unique<ParameterServerService>(
      server->shard_.get(), server->rpc_metrics_.get(),
      server->shard_metrics_.get(), server->checkpointer_.get(),
      options.shard.max_pull_wait);
  ParameterServerService* service = server->service_.get();
  PushOrderOptions push_order = options.push_order;
  push_order.num_workers = options.shard.num_workers;
  ASSIGN_OR_RETURN(server->push_order_, PushOrder::Create(push_order));
  if (server->push_order_->ordered()) {
    if (options.shard.mode != ConsistencyMode::kAsync || options.shard.replicas > 1) {
      return absl::InvalidArgumentError(
          "--push_order orders the pushes of an unreplicated async shard (tests of "
          "convergence under staleness); use --mode=async and --replicas=1");
    }
    LOG(WARNING) << "pushes are applied in " << options.push_order.kind
                 << " order of the workers (--push_order, for tests)";
  }
  // How writes are applied, chosen once: through the chain, or here (in
  // the push order's turns when it orders them).
  if (options.shard.replicas > 1) {
    RETURN_IF_ERROR(server->StartReplication(options, registry));
    server->push_path_ = std::make_unique<ReplicatedPushPath>(server->replicator_.get());
  } else {
    server->push_path_ = std::make_unique<LocalPushPath>(
        server->shard_.get(),
        server->push_order_->ordered() ? server->push_order_.get() : nullptr);
  }
  service->set_push_path(server->push_path_.get());
  server->shard_->SetProgressCallback([service] { service->WakeWaiters(); });

  prometheus::Counter& auth_failures =
      prometheus::BuildCounter()
          .Name("shardtrain_rpc_unauthenticated_total")
          .Help("Calls refused before any handler for a missing or wrong auth token")
          .Register(registry)
          .Add({});
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                   common::MakeServerCredentials(options.security, &auth_failures));

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen_address, credentials, &server->port_);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  // A second server on a used port must fail, not share it.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Workers ping idle connections (keepalive); accept that instead of
  // closing them with "too many pings".
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  builder.experimental().SetInterceptorCreators(MakeServerInterceptors());
  builder.RegisterService(service);
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.listen_address,
                     " (is another process using the port?)"));
  }
  if (options.shard.replicas > 1) {
    CoordinatorOptions coordination = options.replication;
    coordination.num_shards = options.shard.partitioning.num_shards;
    coordination.replicas = options.shard.replicas;
    if (coordination.advertise_address.empty()) {
      const std::string host =
          options.listen_address.substr(0, options.listen_address.rfind(':'));
      if (host == "0.0.0.0" || host == "[::]" || host.empty()) {
        return absl::InvalidArgumentError(
            "--replicas > 1 with --listen on every interface needs "
            "--advertise_address (host:port the other shards reach this one at)");
      }
      coordination.advertise_address = absl::StrCat(host, ":", server->port_);
    }
    if (options.peer_security.tls()) {
      const std::string host =
          options.listen_address.substr(0, options.listen_address.rfind(':'));
      const bool wildcard = host == "0.0.0.0" || host == "[::]" || host.empty();
      RETURN_IF_ERROR(CheckPeerTls(
          options.peer_security, absl::StrCat(wildcard ? "127.0.0.1" : host, ":", server->port_),
          coordination.advertise_address, absl::Seconds(10)));
    }
    ASSIGN_OR_RETURN(server->coordinator_,
                     Coordinator::Start(coordination, server->shard_.get(),
                                        server->chain_table_.get(), server->forwarder_.get(),
                                        server->replication_metrics_.get()));
  }
  if (!options.data_listen.empty()) {
    DataPortOptions data;
    // With TLS, the data port is served in TLS too, with the same files.
    ASSIGN_OR_RETURN(data.tls,
                     wire::TlsContext::ForServer(options.security, options.data_tls_buffer_bytes));
    data.auth_failures = &auth_failures;
    data.listen_address = options.data_listen;
    data.max_connections = options.max_data_connections;
    data.limits = options.data_limits;
    data.limits.max_message_bytes = static_cast<uint64_t>(options.max_message_bytes);
    ASSIGN_OR_RETURN(server->data_port_, DataPort::Start(data, service, registry));
    service->set_data_port(server->data_port_->port());
  }
  server->server_->GetHealthCheckService()->SetServingStatus(true);
  server->housekeeping_ = std::thread([s = server.get()] { s->Housekeeping(); });
  server->started_ = true;
  LOG(INFO) << "shard " << options.shard.shard_index << "/"
            << options.shard.partitioning.num_shards << " serving on port "
            << server->port_ << ", metrics on port " << server->metrics_port()
            << (server->data_port_ != nullptr
                    ? absl::StrCat(", data port ", server->data_port_->port())
                    : std::string());
  return server;
}

absl::Status PsServer::StartReplication(const PsServerOptions& options,
                                        prometheus::Registry& registry) {
  replication_metrics_ = std::make_unique<ReplicationMetrics>(registry, options.shard.replicas);
  chain_table_ = std::make_unique<ChainTable>(
      options.shard.shard_index, shard_->incarnation(), shard_->replica().groups(),
      options.replication.lease_ttl, replication_metrics_.get());
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  // A successor that restarts on the same address is back within a second
  // or two.
  common::SetQuickReconnect(args);
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials,
                   common::MakeChannelCredentials(options.peer_security, &args));
  // Pushes go down the chain as frames to the successors' data ports, in
  // TLS when the shards serve it.
  ASSIGN_OR_RETURN(std::shared_ptr<const wire::TlsContext> peer_tls,
                   wire::TlsContext::ForClient(options.peer_security,
                                               options.data_tls_buffer_bytes));
  forwarder_ = std::make_unique<Forwarder>(chain_table_.get(), std::move(credentials),
                                           std::move(args), replication_metrics_.get(),
                                           /*data_ports=*/true, std::move(peer_tls));
  replicator_ = std::make_unique<Replicator>(shard_.get(), chain_table_.get(),
                                             forwarder_.get(), replication_metrics_.get(),
                                             options.forward_timeout,
                                             options.max_waiting_forwards);
  service_->set_replicator(replicator_.get());
  return absl::OkStatus();
}

PsServer::~PsServer() { (void)Shutdown(); }

void PsServer::Housekeeping() {
  common::EnableFlushToZero();
  absl::Time last_checkpoint = absl::Now();
  while (!stop_.WaitForNotificationWithTimeout(housekeeping_interval_)) {
    const absl::Time now = absl::Now();
    shard_->Tick(now);
    service_->ExpireWaiters(now);
    if (checkpointer_ == nullptr) continue;
    // Failures are logged and counted by the checkpointer.
    if (shard_->options().mode == ConsistencyMode::kSync) {
      (void)checkpointer_->WriteCompletedStep();
    } else if (now - last_checkpoint >= checkpoint_interval_) {
      (void)checkpointer_->Write();
      last_checkpoint = now;
    }
  }
}

absl::Status PsServer::Shutdown() {
  absl::MutexLock lock(&shutdown_mu_);
  if (shut_down_) return shutdown_status_;
  shut_down_ = true;
  stop_.Notify();
  if (housekeeping_.joinable()) housekeeping_.join();
  // Leave the chains first (the lease is revoked), so the other members
  // reconfigure without waiting for it to expire.
  coordinator_.reset();
  if (forwarder_ != nullptr) forwarder_->Stop();
  if (replicator_ != nullptr) replicator_->Stop();
  if (server_ != nullptr) {
    server_->GetHealthCheckService()->SetServingStatus(false);
    service_->set_data_port(0);
    if (data_port_ != nullptr) data_port_->Shutdown();
    service_->CancelAllWaiters();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
    server_->Wait();
  }
  // Nothing changes the shard any more: the last checkpoint is complete. A
  // shard that did not start (its checkpoint may have failed to load)
  // writes nothing, so it cannot replace a good checkpoint.
  if (checkpointer_ != nullptr && started_) {
    shutdown_status_ = checkpointer_->WriteFinal();
    if (!shutdown_status_.ok()) {
      LOG(ERROR) << "final checkpoint failed: " << shutdown_status_;
    }
  }
  return shutdown_status_;
}

}  // namespace shardtrain::server
