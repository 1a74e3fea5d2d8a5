// ParameterServerService: the gRPC face of a Shard (callback API), and the
// handlers of the data path whichever transport carries it: the gRPC
// methods Push, Pull, PushPull, Lookup and PushSparse, and the same five
// as frames on the shard's data port (server/data_port.h), both run
// Handle* on a ServerCall (server/server_call.h).
//
// Every handler validates, calls the Shard and finishes on the calling
// thread; writes (Push, a PushPull's push half, a training Lookup,
// PushSparse) go through the PushPath chosen at start (server/push_path.h:
// here, or through the replica chain, which may answer on another thread). Push, Pull and PushPull are raw methods: their request arrives as
// gRPC's received slices and is parsed in place (wire/
// message_views.h), so a gradient is applied straight from the bytes
// received; their response is encoded with wire::PullResponseBuilder, which
// writes each partition's parameters once, into the memory that is sent.
// On the wire both are the protobuf messages of proto/shardtrain.proto, so
// stock protobuf clients are served unchanged; a body that does not parse
// is INVALID_ARGUMENT "request body is not a valid shardtrain.PushRequest:
// ..." (the other methods get the same from server/bad_body_interceptor.h). A Pull (or the pull half of a PushPull) that cannot be answered
// yet is parked (server/parked_lot.h), holding no thread; the shard's progress
// callback re-checks parked pulls and answers those now ready. A parked pull
// ends with DEADLINE_EXCEEDED at the client's deadline or the server's
// max_pull_wait, with CANCELLED if the client goes away, or with UNAVAILABLE
// at shutdown. A training Lookup that must wait is parked the same way: one
// of a sync table until its step's pushes are in (SparseTables::LookupWaits,
// answered by the PushSparse that applies the step), and any of a worker
// too far ahead of the slowest in async mode with --max_staleness (the same
// SSP bound as its pulls, answered as the slowest worker's clock moves).
// Thread-safe.
#ifndef SHARDTRAIN_SERVER_PARAMETER_SERVER_SERVICE_H_
#define SHARDTRAIN_SERVER_PARAMETER_SERVER_SERVICE_H_

#include <atomic>
#include <memory>

#include "absl/time/time.h"
#include "common/rpc_metrics.h"
#include "proto/shardtrain.grpc.pb.h"
#include "server/checkpoint.h"
#include "server/internal/arena_messages.h"
#include "server/parked_lot.h"
#include "server/push_path.h"
#include "server/replication/replicator.h"
#include "server/server_call.h"
#include "server/shard.h"
#include "server/shard_metrics.h"
#include "wire/message_views.h"

namespace shardtrain::server {

// Callback methods, raw (grpc::ByteBuffer) for the data path's five: the
// three that carry tensors, Lookup (its rows are written into the memory
// that is sent) and PushSparse; the data port (server/data_port.h) carries
// the same five as frames.
using ParameterServerBase = ParameterServer::WithCallbackMethod_Register<
    ParameterServer::WithRawCallbackMethod_Push<
        ParameterServer::WithRawCallbackMethod_Pull<
            ParameterServer::WithRawCallbackMethod_PushPull<
                ParameterServer::WithCallbackMethod_Heartbeat<
                    ParameterServer::WithCallbackMethod_Status<
                        ParameterServer::WithCallbackMethod_Checkpoint<
                            ParameterServer::WithRawCallbackMethod_Replicate<
                                ParameterServer::WithCallbackMethod_FetchGroupState<
                                    ParameterServer::WithCallbackMethod_RegisterTables<
                                        ParameterServer::WithRawCallbackMethod_Lookup<
                                            ParameterServer::WithRawCallbackMethod_PushSparse<
                                                ParameterServer::Service>>>>>>>>>>>>;

class ParameterServerService final : public ParameterServerBase {
 public:
  // `shard`, `rpc_metrics`, `shard_metrics` and `checkpointer` are not owned
  // and must outlive the service; `checkpointer` is null when checkpoints
  // are disabled.
  ParameterServerService(Shard* shard, common::RpcMetrics* rpc_metrics,
                         ShardMetrics* shard_metrics, Checkpointer* checkpointer,
                         absl::Duration max_pull_wait);
  ~ParameterServerService() override;

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* context,
                                     const RegisterRequest* request,
                                     RegisterResponse* response) override;
  // `request` holds a PushRequest; `response` gets a PushResponse.
  grpc::ServerUnaryReactor* Push(grpc::CallbackServerContext* context,
                                 const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override;
  // PullRequest -> PullResponse.
  grpc::ServerUnaryReactor* Pull(grpc::CallbackServerContext* context,
                                 const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override;
  // PushPullRequest -> PushPullResponse.
  grpc::ServerUnaryReactor* PushPull(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const HeartbeatRequest* request,
                                      HeartbeatResponse* response) override;
  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* context,
                                   const StatusRequest* request,
                                   StatusResponse* response) override;
  grpc::ServerUnaryReactor* Checkpoint(grpc::CallbackServerContext* context,
                                       const CheckpointRequest* request,
                                       CheckpointResponse* response) override;
  // Replicated shards: a push forwarded by the predecessor in its chain.
  grpc::ServerUnaryReactor* Replicate(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* RegisterTables(grpc::CallbackServerContext* context,
                                           const RegisterTablesRequest* request,
                                           RegisterTablesResponse* response) override;
  // LookupRequest -> LookupResponse.
  grpc::ServerUnaryReactor* Lookup(grpc::CallbackServerContext* context,
                                   const grpc::ByteBuffer* request,
                                   grpc::ByteBuffer* response) override;
  // PushSparseRequest -> PushSparseResponse.
  grpc::ServerUnaryReactor* PushSparse(grpc::CallbackServerContext* context,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;
  // A replica group's state for a joining member, taken at once and sent
  // in parts (server/replication/group_state_parts.h).
  grpc::ServerWriteReactor<GroupStateResponse>* FetchGroupState(
      grpc::CallbackServerContext* context, const GroupStateRequest* request) override;

  // The data path's methods, whichever transport carries them (the gRPC
  // methods above, the data port's frames): `request` is the call's body,
  // alive until `call` is finished; the answer goes to call->response().
  void HandlePush(ServerCall* call, const grpc::ByteBuffer& request);
  void HandlePull(ServerCall* call, const grpc::ByteBuffer& request);
  void HandlePushPull(ServerCall* call, const grpc::ByteBuffer& request);
  void HandleLookup(ServerCall* call, const grpc::ByteBuffer& request);
  void HandlePushSparse(ServerCall* call, const grpc::ByteBuffer& request);
  // A push forwarded by the predecessor in its chain (Replicate).
  void HandleReplicate(ServerCall* call, const grpc::ByteBuffer& request);

  // How writes are applied (server/push_path.h): a LocalPushPath of the
  // shard, without a push order, unless set. Not owned; set before serving.
  void set_push_path(PushPath* path) { push_path_ = path; }
  // Replicated shards (--replicas > 1): forwards from a predecessor, group
  // state for a joining member and the chains in Status go to `replicator`
  // (server/replication/replicator.h). Not owned; set before serving.
  void set_replicator(Replicator* replicator) { replicator_ = replicator; }

  // The data port named in Register's and Heartbeat's answers (0: none).
  void set_data_port(int port) { data_port_.store(port); }

  // Answers every parked pull that has become ready.
  void WakeWaiters();
  // Ends parked pulls whose deadline is before `now`; passes on a push
  // order's turn held too long.
  void ExpireWaiters(absl::Time now);
  // Ends every parked pull (and parked push) with UNAVAILABLE; call before
  // server shutdown.
  void CancelAllWaiters();

 private:
  class PullWaiter;
  friend class PullWaiter;
  class LookupWaiter;
  friend class LookupWaiter;
  class GroupStateWriter;
  friend class GroupStateWriter;

  // Answers `lookup` on `call`: at once, or (a replicated training lookup)
  // once the group's tail has its changes.
  void AnswerLookup(ServerCall* call, const LookupRequest& lookup, absl::Time start,
                    size_t request_bytes);
  // Answers a parked (or about to be parked) lookup and finishes it.
  void AnswerLookup(LookupWaiter* waiter);
  // Whether a lookup must be parked: a sync table's step is not in yet, or
  // the worker is too far ahead of the slowest (SSP, as for pulls).
  bool LookupWaits(const LookupRequest& request) const;
  // Answers the parked lookups whose step has been applied.
  void WakeLookups();
  void OnLookupCancelled(LookupWaiter* waiter);

  // When a parked call that started at `start` gives up: the client's
  // deadline or --max_pull_wait, whichever comes first.
  absl::Time PullDeadline(const ServerCall* call, absl::Time start) const;
  // Answers `waiter` now if its pull is ready, else parks it.
  void BeginPull(PullWaiter* waiter);
  // Encodes the answer to `waiter`'s pull into its response and finishes it
  // (a committed read: parks it, sealed, until what it read is committed).
  void AnswerWaiter(PullWaiter* waiter);
  void FinishWaiter(PullWaiter* waiter, const grpc::Status& status);
  void OnWaiterCancelled(PullWaiter* waiter);
  // One finished call for the RPC metrics (byte counts in RpcRecorder's
  // order: request, response).
  void Record(const char* method, const grpc::Status& status, size_t request_bytes,
              size_t response_bytes, absl::Time start);
  // The most parts a push may name (checked while parsing, before the
  // parts' views are allocated).
  size_t MaxParts() const {
    return static_cast<size_t>(shard_->options().limits.max_parts_per_request);
  }
  // Finishes `reactor` with `status`, recording the RPC.
  void Finish(grpc::ServerUnaryReactor* reactor, const char* method,
              const absl::Status& status, absl::Time start,
              const google::protobuf::Message& request,
              const google::protobuf::Message& response);
  // Parses a raw PushRequest (Push, Replicate) into `push`, which views
  // `message`'s slices.
  absl::Status ParsePushRequest(const grpc::ByteBuffer& request,
                                wire::ReceivedMessage* message, wire::PushView* push);
  // Serializes `message` (if `status` is OK) into `call`'s response and
  // finishes it.
  void FinishMessage(ServerCall* call, const char* method, absl::Status status,
                     absl::Time start, size_t request_bytes,
                     const google::protobuf::Message& message);
  // Finishes `call` (its response written, if OK), recording the RPC.
  void FinishCall(ServerCall* call, const char* method, const absl::Status& status,
                  absl::Time start, size_t request_bytes);

  Shard* const shard_;
  common::RpcMetrics* const rpc_metrics_;
  ShardMetrics* const shard_metrics_;
  Checkpointer* const checkpointer_;
  const absl::Duration max_pull_wait_;
  // The path unless set_push_path chose another; before push_path_.
  const std::unique_ptr<PushPath> local_path_;
  PushPath* push_path_;
  Replicator* replicator_ = nullptr;
  std::atomic<int> data_port_{0};

  // A Register may carry a million tiny specs: its memory is given back.
  internal::ArenaMessages<RegisterRequest, RegisterResponse> register_arena_;

  // Parked pulls (shardtrain_waiting_pulls counts them) and parked
  // training lookups.
  ParkedLot<PullWaiter> pulls_;
  ParkedLot<LookupWaiter> lookups_;
};

}  // namespace shardtrain::server

#endif  // SHARDTRAIN_SERVER_PARAMETER_SERVER_SERVICE_H_
