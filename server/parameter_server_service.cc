#include "server/parameter_server_service.h"

#include <algorithm>
#include <utility>
#include <vector>

#include <glog/logging.h>
#include <grpcpp/support/proto_buffer_reader.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "server/local_push_path.h"
#include "server/replication/group_state_parts.h"
#include "wire/message_encoder.h"
#include "wire/message_views.h"

namespace shardtrain::server {

namespace {

// What a raw method answers for a body it cannot parse: exactly what the
// bad-body interceptor answers for the others. The parser's detail (which
// field, which byte) goes to the log.
absl::Status BadBody(const absl::Status& parsed, const char* type) {
  if (parsed.ok()) return parsed;
  VLOG(1) << parsed;
  return absl::InvalidArgumentError(absl::StrCat("request body is not a valid ", type));
}

// Parses a small stock message (a PullRequest, a LookupRequest) from a raw
// request.
absl::Status ParseStock(const grpc::ByteBuffer& buffer,
                        google::protobuf::Message* message) {
  message->Clear();
  if (!buffer.Valid()) return absl::OkStatus();  // an empty body
  grpc::ByteBuffer copy(buffer);  // references the same slices
  grpc::ProtoBufferReader reader(&copy);
  if (!message->ParseFromZeroCopyStream(&reader)) {
    return BadBody(absl::InvalidArgumentError("protobuf parse failed"),
                   message->GetTypeName().c_str());
  }
  return absl::OkStatus();
}

// A parse result of a push: a body that does not parse is BadBody; a push
// naming more parts than allowed (found before any is allocated) is refused
// as the shard refuses it, counted under the same limit.
absl::Status PushParsed(const absl::Status& parsed, const char* type,
                        ShardMetrics* metrics) {
  if (parsed.code() == absl::StatusCode::kResourceExhausted) {
    metrics->requests_refused("max_parts_per_request").Increment();
    return absl::ResourceExhaustedError(
        absl::StrCat(parsed.message(), " (--max_parts_per_request)"));
  }
  return BadBody(parsed, type);
}

// Views of the requests being handled on this thread, reused so that their
// part lists keep their capacity from call to call. Only used during a
// handler's synchronous part.
wire::PushView& ThreadPushView() {
  thread_local wire::PushView view;
  return view;
}

wire::PushPullView& ThreadPushPullView() {
  thread_local wire::PushPullView view;
  return view;
}

}  // namespace

// A pull (or a PushPull's pull half) that may have to wait: held by its
// call (ServerCall::Hold), so it lives as long as the call. The pulls_ lot
// only borrows it, and whoever takes it out of the lot finishes the call.
class ParameterServerService::PullWaiter : public ServerCall::Parked {
 public:
  PullWaiter(ParameterServerService* service, ServerCall* call, const char* method,
             absl::Time start, absl::Time deadline, size_t request_bytes, PullRequest request,
             bool push_pull, bool committed_read = false)
      : service_(service),
        call_(call),
        method_(method),
        start_(start),
        deadline_(deadline),
        request_bytes_(request_bytes),
        request_(std::move(request)),
        push_pull_(push_pull),
        committed_read_(committed_read) {}

  void OnCancel() override { service_->OnWaiterCancelled(this); }
  absl::Time deadline() const { return deadline_; }

  ParameterServerService* const service_;
  ServerCall* const call_;
  const char* const method_;
  const absl::Time start_;
  const absl::Time deadline_;
  const size_t request_bytes_;
  const PullRequest request_;
  // A PushPull: the response of its push half, sent with the pull; set
  // once the push path has applied it (replicated: once the chain's tail
  // has it).
  const bool push_pull_;
  PushResponse push_;
  // Answered by a replicated chain's head: sent only once the versions it
  // read (read_versions_) are committed. Sealed: the response is written
  // and waits for that.
  const bool committed_read_;
  bool sealed_ = false;
  std::vector<int64_t> read_versions_;
};

// FetchGroupState's answer: the parts of one copy of the group's state,
// written one after another. Owned by gRPC until OnDone.
class ParameterServerService::GroupStateWriter
    : public grpc::ServerWriteReactor<GroupStateResponse> {
 public:
  GroupStateWriter(ParameterServerService* service, absl::Time start, size_t request_bytes,
                   absl::Status status, std::vector<GroupStateResponse> parts)
      : service_(service),
        start_(start),
        request_bytes_(request_bytes),
        parts_(std::move(parts)) {
    if (!status.ok()) {
      VLOG(1) << "FetchGroupState rejected: " << status;
      Done(common::ToGrpcStatus(status));
      return;
    }
    WriteNext();
  }

  void OnWriteDone(bool ok) override {
    // Sent (or never will be): its memory goes now, not with the last part.
    parts_[next_ - 1] = GroupStateResponse();
    if (!ok) {
      Done(grpc::Status(grpc::StatusCode::CANCELLED, "the joining member went away"));
      return;
    }
    WriteNext();
  }
  void OnDone() override { delete this; }

 private:
  void WriteNext() {
    if (next_ == parts_.size()) {
      Done(grpc::Status::OK);
      return;
    }
    GroupStateResponse& part = parts_[next_++];
    sent_bytes_ += part.ByteSizeLong();
    StartWrite(&part);
  }
  void Done(const grpc::Status& status) {
    service_->Record("FetchGroupState", status, request_bytes_, status.ok() ? sent_bytes_ : 0,
                     start_);
    Finish(status);
  }

  ParameterServerService* const service_;
  const absl::Time start_;
  const size_t request_bytes_;
  std::vector<GroupStateResponse> parts_;
  size_t next_ = 0;
  size_t sent_bytes_ = 0;
};

// A training Lookup of a sync table that waits for the step its worker
// pushed (SparseTables::LookupWaits). Held by its call as PullWaiter is;
// whoever takes it out of the lookups_ lot finishes the call.
class ParameterServerService::LookupWaiter : public ServerCall::Parked {
 public:
  LookupWaiter(ParameterServerService* service, ServerCall* call, absl::Time start,
               absl::Time deadline, size_t request_bytes, LookupRequest request)
      : service_(service),
        call_(call),
        start_(start),
        deadline_(deadline),
        request_bytes_(request_bytes),
        request_(std::move(request)) {}

  void OnCancel() override { service_->OnLookupCancelled(this); }
  absl::Time deadline() const { return deadline_; }

  ParameterServerService* const service_;
  ServerCall* const call_;
  const absl::Time start_;
  const absl::Time deadline_;
  const size_t request_bytes_;
  const LookupRequest request_;
};

ParameterServerService::ParameterServerService(Shard* shard,
                                               common::RpcMetrics* rpc_metrics,
                                               ShardMetrics* shard_metrics,
                                               Checkpointer* checkpointer,
                                               absl::Duration max_pull_wait)
    : shard_(shard),
      rpc_metrics_(rpc_metrics),
      shard_metrics_(shard_metrics),
      checkpointer_(checkpointer),
      max_pull_wait_(max_pull_wait),
      local_path_(std::make_unique<LocalPushPath>(shard, /*order=*/nullptr)),
      push_path_(local_path_.get()),
      pulls_(&shard_metrics->waiting_pulls()) {
  SetMessageAllocatorFor_Register(&register_arena_);
}

ParameterServerService::~ParameterServerService() { CancelAllWaiters(); }

void ParameterServerService::Record(const char* method, const grpc::Status& status,
                                    size_t request_bytes, size_t response_bytes,
                                    absl::Time start) {
  rpc_metrics_->Record(method, status.error_code(), request_bytes,
                       status.ok() ? response_bytes : 0,
                       absl::ToDoubleSeconds(absl::Now() - start));
}

void ParameterServerService::Finish(grpc::ServerUnaryReactor* reactor,
                                    const char* method,
                                    const absl::Status& status,
                                    absl::Time start,
                                    const google::protobuf::Message& request,
                                    const google::protobuf::Message& response) {
  const grpc::Status grpc_status = common::ToGrpcStatus(status);
  Record(method, grpc_status, request.ByteSizeLong(),
         status.ok() ? response.ByteSizeLong() : 0, start);
  if (!status.ok()) VLOG(1) << method << " rejected: " << status;
  reactor->Finish(grpc_status);
}

grpc::ServerUnaryReactor* ParameterServerService::Register(
    grpc::CallbackServerContext* context, const RegisterRequest* request,
    RegisterResponse* response) {
  const absl::Time start = absl::Now();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Status status = shard_->Register(*request, response);
  response->set_data_port(static_cast<uint32_t>(data_port_.load()));
  Finish(reactor, "Register", status, start, *request, *response);
  return reactor;
}

grpc::ServerUnaryReactor* ParameterServerService::Push(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  auto* call = new GrpcServerCall(context, response);
  HandlePush(call, *request);
  return call;
}

void ParameterServerService::HandlePush(ServerCall* call, const grpc::ByteBuffer& request) {
  const absl::Time start = absl::Now();
  const size_t request_bytes = request.Length();
  wire::ReceivedMessage message;
  wire::PushView& push = ThreadPushView();
  const absl::Status status = ParsePushRequest(request, &message, &push);
  if (!status.ok()) {
    FinishCall(call, "Push", status, start, request_bytes);
    return;
  }
  // Answered once the push is applied (replicated: once the chain's tail
  // has it, maybe on another thread).
  push_path_->Push(request, push,
                   [this, call, start, request_bytes](absl::Status status,
                                                      const PushResponse& push_response) {
                     FinishMessage(call, "Push", status, start, request_bytes, push_response);
                   });
}

void ParameterServerService::FinishMessage(ServerCall* call, const char* method,
                                           absl::Status status, absl::Time start,
                                           size_t request_bytes,
                                           const google::protobuf::Message& message) {
  if (status.ok()) {
    bool own_buffer = false;
    const grpc::Status serialized =
        grpc::SerializationTraits<google::protobuf::Message>::Serialize(
            message, call->response(), &own_buffer);
    if (!serialized.ok()) status = common::FromGrpcStatus(serialized);
  }
  FinishCall(call, method, status, start, request_bytes);
}

void ParameterServerService::FinishCall(ServerCall* call, const char* method,
                                        const absl::Status& status, absl::Time start,
                                        size_t request_bytes) {
  const grpc::Status grpc_status = common::ToGrpcStatus(status);
  Record(method, grpc_status, request_bytes, status.ok() ? call->response()->Length() : 0,
         start);
  if (!status.ok()) VLOG(1) << method << " rejected: " << status;
  call->Finish(grpc_status);
}

absl::Status ParameterServerService::ParsePushRequest(const grpc::ByteBuffer& request,
                                                      wire::ReceivedMessage* message,
                                                      wire::PushView* push) {
  RETURN_IF_ERROR(message->Take(request));
  return PushParsed(wire::ParsePush(*message, push, MaxParts()), "shardtrain.PushRequest",
                    shard_metrics_);
}

grpc::ServerUnaryReactor* ParameterServerService::Replicate(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  auto* call = new GrpcServerCall(context, response);
  HandleReplicate(call, *request);
  return call;
}

void ParameterServerService::HandleReplicate(ServerCall* call,
                                             const grpc::ByteBuffer& request) {
  const absl::Time start = absl::Now();
  const size_t request_bytes = request.Length();
  if (replicator_ == nullptr) {
    FinishCall(call, "Replicate",
               absl::FailedPreconditionError(
                   "this shard is not replicated (--replicas 1): nothing to forward to it"),
               start, request_bytes);
    return;
  }
  wire::ReceivedMessage message;
  wire::PushView& push = ThreadPushView();
  const absl::Status status = ParsePushRequest(request, &message, &push);
  if (!status.ok()) {
    FinishCall(call, "Replicate", status, start, request_bytes);
    return;
  }
  // Answered once this member and the rest of the chain after it applied
  // the push (maybe on another thread); `request` lives as long as `call`.
  replicator_->Replicate(request, push,
                         [this, call, start, request_bytes](absl::Status status,
                                                            const PushResponse& push_response) {
                           FinishMessage(call, "Replicate", status, start, request_bytes,
                                         push_response);
                         });
}

grpc::ServerWriteReactor<GroupStateResponse>* ParameterServerService::FetchGroupState(
    grpc::CallbackServerContext* /*context*/, const GroupStateRequest* request) {
  const absl::Time start = absl::Now();
  absl::StatusOr<GroupStateResponse> state = absl::FailedPreconditionError(
      "this shard is not replicated (--replicas 1): it has no group state to hand over");
  if (replicator_ != nullptr) state = replicator_->GroupState(*request);
  std::vector<GroupStateResponse> parts;
  if (state.ok()) {
    parts = SplitGroupState(
        *std::move(state), GroupStatePartBytes(shard_->options().limits.max_response_bytes));
  }
  return new GroupStateWriter(this, start, request->ByteSizeLong(), state.status(),
                              std::move(parts));
}

grpc::ServerUnaryReactor* ParameterServerService::Heartbeat(
    grpc::CallbackServerContext* context, const HeartbeatRequest* request,
    HeartbeatResponse* response) {
  const absl::Time start = absl::Now();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Status status = shard_->Heartbeat(*request, response);
  response->set_data_port(static_cast<uint32_t>(data_port_.load()));
  Finish(reactor, "Heartbeat", status, start, *request, *response);
  return reactor;
}

grpc::ServerUnaryReactor* ParameterServerService::Status(
    grpc::CallbackServerContext* context, const StatusRequest* request,
    StatusResponse* response) {
  const absl::Time start = absl::Now();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  shard_->FillStatus(*request, response);
  shard_->tables().FillStatus(response);
  response->set_replicas(shard_->options().replicas);
  response->set_data_port(static_cast<uint32_t>(data_port_.load()));
  if (replicator_ != nullptr) {
    replicator_->table().Describe([this](int group) { return shard_->replica().Ops(group); },
                                  [this](int group) { return replicator_->Acked(group); },
                                  response->mutable_chains());
  }
  response->set_seconds_since_checkpoint(-1);
  if (checkpointer_ != nullptr) {
    response->set_checkpoint_dir(checkpointer_->dir());
    const absl::Time last = checkpointer_->last_success();
    if (last != absl::InfinitePast()) {
      response->set_seconds_since_checkpoint(absl::ToDoubleSeconds(absl::Now() - last));
    }
  }
  Finish(reactor, "Status", absl::OkStatus(), start, *request, *response);
  return reactor;
}

grpc::ServerUnaryReactor* ParameterServerService::RegisterTables(
    grpc::CallbackServerContext* context, const RegisterTablesRequest* request,
    RegisterTablesResponse* response) {
  const absl::Time start = absl::Now();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::Status status = shard_->tables().Register(*request);
  response->set_incarnation(shard_->incarnation());
  response->set_data_port(static_cast<uint32_t>(data_port_.load()));
  Finish(reactor, "RegisterTables", status, start, *request, *response);
  return reactor;
}

grpc::ServerUnaryReactor* ParameterServerService::Lookup(grpc::CallbackServerContext* context,
                                                         const grpc::ByteBuffer* request,
                                                         grpc::ByteBuffer* response) {
  auto* call = new GrpcServerCall(context, response);
  HandleLookup(call, *request);
  return call;
}

void ParameterServerService::HandleLookup(ServerCall* call, const grpc::ByteBuffer& request) {
  const absl::Time start = absl::Now();
  const size_t request_bytes = request.Length();
  LookupRequest lookup;
  const absl::Status status = ParseStock(request, &lookup);
  if (!status.ok()) {
    FinishCall(call, "Lookup", status, start, request_bytes);
    return;
  }
  if (LookupWaits(lookup)) {
    auto owned = std::make_unique<LookupWaiter>(this, call, start, PullDeadline(call, start),
                                                request_bytes, std::move(lookup));
    LookupWaiter* waiter = owned.get();
    call->Hold(std::move(owned));
    // Checked again as it is parked: the push that applies the step, or the
    // clock that moves the staleness bound, wakes the lot after it changed,
    // so the wake-up cannot be missed.
    if (!lookups_.Park(waiter, [&] { return LookupWaits(waiter->request_); })) {
      AnswerLookup(waiter);
    }
    return;
  }
  AnswerLookup(call, lookup, start, request_bytes);
}

void ParameterServerService::AnswerLookup(ServerCall* call, const LookupRequest& request,
                                          absl::Time start, size_t request_bytes) {
  wire::LookupResponseBuilder builder;
  if (!request.train()) {
    absl::Status status = shard_->tables().Lookup(request, &builder);
    if (status.ok()) builder.Finish(call->response());
    FinishCall(call, "Lookup", status, start, request_bytes);
    return;
  }
  SparseCall sparse;
  sparse.group = request.group();
  sparse.chain_epoch = request.chain_epoch();
  sparse.worker = request.worker();
  push_path_->Sparse(
      sparse,
      [this, &request, &builder, call](SparseOp* op, bool*) {
        RETURN_IF_ERROR(shard_->tables().Lookup(request, &builder, op));
        builder.Finish(call->response());
        return absl::OkStatus();
      },
      [this, call, start, request_bytes](absl::Status status) {
        FinishCall(call, "Lookup", status, start, request_bytes);
      });
}

void ParameterServerService::AnswerLookup(LookupWaiter* waiter) {
  AnswerLookup(waiter->call_, waiter->request_, waiter->start_, waiter->request_bytes_);
}

bool ParameterServerService::LookupWaits(const LookupRequest& request) const {
  // A training lookup obeys the staleness bound as a dense pull does (a
  // worker more than --max_staleness steps ahead of the slowest waits), and
  // a sync table's waits for the step's pushes.
  if (shard_->tables().LookupWaits(request)) return true;
  return request.train() &&
         request.worker() < static_cast<uint32_t>(shard_->options().num_workers) &&
         !shard_->pulls().WithinStaleness(request.worker(), request.clock());
}

void ParameterServerService::WakeLookups() {
  for (LookupWaiter* waiter : lookups_.Take([this](const LookupWaiter* waiter) {
         return !LookupWaits(waiter->request_);
       })) {
    AnswerLookup(waiter);
  }
}

void ParameterServerService::OnLookupCancelled(LookupWaiter* waiter) {
  if (!lookups_.Remove(waiter)) return;  // already answered
  FinishCall(waiter->call_, "Lookup", absl::CancelledError("the client went away"),
             waiter->start_, waiter->request_bytes_);
}

grpc::ServerUnaryReactor* ParameterServerService::PushSparse(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  auto* call = new GrpcServerCall(context, response);
  HandlePushSparse(call, *request);
  return call;
}

void ParameterServerService::HandlePushSparse(ServerCall* call,
                                              const grpc::ByteBuffer& request) {
  const absl::Time start = absl::Now();
  const size_t request_bytes = request.Length();
  PushSparseRequest push;
  const absl::Status parsed = ParseStock(request, &push);
  if (!parsed.ok()) {
    FinishCall(call, "PushSparse", parsed, start, request_bytes);
    return;
  }
  bool step_applied = false;
  SparseCall sparse;
  sparse.group = push.group();
  sparse.chain_epoch = push.chain_epoch();
  sparse.worker = push.worker();
  sparse.worker_incarnation = push.worker_incarnation();
  sparse.sequence = push.sequence();
  // The answer is written as the push is applied (before Sparse returns);
  // it is sent when the path says the push is done.
  push_path_->Sparse(
      sparse,
      [this, &push, call, &step_applied](SparseOp* op, bool* duplicate) {
        PushSparseResponse response;
        RETURN_IF_ERROR(shard_->tables().PushSparse(push, &response, &step_applied, op));
        *duplicate = response.duplicate();
        bool own_buffer = false;
        return common::FromGrpcStatus(
            grpc::SerializationTraits<PushSparseResponse>::Serialize(
                response, call->response(), &own_buffer));
      },
      [this, call, start, request_bytes](absl::Status status) {
        FinishCall(call, "PushSparse", status, start, request_bytes);
      });
  if (step_applied) WakeLookups();
}

grpc::ServerUnaryReactor* ParameterServerService::Checkpoint(
    grpc::CallbackServerContext* context, const CheckpointRequest* request,
    CheckpointResponse* response) {
  const absl::Time start = absl::Now();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::Status status;
  if (checkpointer_ == nullptr) {
    status = absl::FailedPreconditionError(
        "checkpoints are disabled on this shard: start it with --checkpoint_dir");
  } else {
    absl::StatusOr<CheckpointResponse> written = checkpointer_->Write();
    status = written.status();
    if (written.ok()) *response = *std::move(written);
  }
  Finish(reactor, "Checkpoint", status, start, *request, *response);
  return reactor;
}

grpc::ServerUnaryReactor* ParameterServerService::Pull(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  auto* call = new GrpcServerCall(context, response);
  HandlePull(call, *request);
  return call;
}

void ParameterServerService::HandlePull(ServerCall* call, const grpc::ByteBuffer& request) {
  const absl::Time start = absl::Now();
  const size_t request_bytes = request.Length();
  PullRequest pull;
  absl::Status status = ParseStock(request, &pull);
  if (status.ok()) status = push_path_->CheckPull(pull);
  if (!status.ok()) {
    FinishCall(call, "Pull", status, start, request_bytes);
    return;
  }
  auto owned = std::make_unique<PullWaiter>(this, call, "Pull", start, PullDeadline(call, start),
                                            request_bytes, std::move(pull),
                                            /*push_pull=*/false);
  PullWaiter* waiter = owned.get();
  call->Hold(std::move(owned));
  BeginPull(waiter);
}

grpc::ServerUnaryReactor* ParameterServerService::PushPull(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  auto* call = new GrpcServerCall(context, response);
  HandlePushPull(call, *request);
  return call;
}

void ParameterServerService::HandlePushPull(ServerCall* call, const grpc::ByteBuffer& request) {
  const absl::Time start = absl::Now();
  const size_t request_bytes = request.Length();
  wire::ReceivedMessage message;
  wire::PushPullView& view = ThreadPushPullView();
  absl::Status status = message.Take(request);
  if (status.ok()) {
    status = PushParsed(wire::ParsePushPull(message, &view, MaxParts()),
                        "shardtrain.PushPullRequest", shard_metrics_);
  }
  // The pull is checked before the push is applied so that a bad pull
  // rejects the whole request without changing the shard.
  if (status.ok() && view.pull.worker() != view.push.worker) {
    status = absl::InvalidArgumentError(
        absl::StrFormat("push is from worker %d but pull from worker %d",
                        view.push.worker, view.pull.worker()));
  }
  // The path's own checks (replicated: the chain's), then the pull's,
  // before the push is applied.
  if (status.ok()) status = push_path_->CheckPushPull(view);
  if (status.ok()) status = shard_->pulls().Validate(view.pull, view.push.clock);
  if (!status.ok()) {
    FinishCall(call, "PushPull", status, start, request_bytes);
    return;
  }
  auto owned = std::make_unique<PullWaiter>(
      this, call, "PushPull", start, PullDeadline(call, start), request_bytes,
      std::move(view.pull), /*push_pull=*/true, push_path_->committed_reads());
  PullWaiter* waiter = owned.get();
  call->Hold(std::move(owned));
  push_path_->PushHalf(request, message, view,
                       [this, waiter](absl::Status status, const PushResponse& push) {
                         if (!status.ok()) {
                           VLOG(1) << "PushPull rejected: " << status;
                           FinishWaiter(waiter, common::ToGrpcStatus(status));
                           return;
                         }
                         waiter->push_ = push;
                         BeginPull(waiter);
                       });
}

absl::Time ParameterServerService::PullDeadline(const ServerCall* call,
                                                absl::Time start) const {
  return std::min(start + max_pull_wait_, call->deadline());
}

void ParameterServerService::BeginPull(PullWaiter* waiter) {
  const PullRequest& pull = waiter->request_;
  const absl::Status valid = shard_->pulls().Validate(pull);
  if (!valid.ok()) {
    FinishWaiter(waiter, common::ToGrpcStatus(valid));
    return;
  }
  shard_->NotePull(pull);  // may complete steps and wake the lot: not in Park
  // Checked as it is parked, so a wake-up between the check and the parking
  // cannot be missed.
  if (pulls_.Park(waiter, [&] { return !shard_->pulls().Ready(pull); })) return;
  AnswerWaiter(waiter);
}

void ParameterServerService::AnswerWaiter(PullWaiter* waiter) {
  if (waiter->committed_read_) {
    // The chain may have moved on while the pull waited.
    const absl::Status head = push_path_->CheckHeadPull(waiter->request_);
    if (!head.ok()) {
      FinishWaiter(waiter, common::ToGrpcStatus(head));
      return;
    }
  }
  wire::PullResponseBuilder builder;
  shard_->pulls().Fill(waiter->request_, &builder,
                       waiter->committed_read_ ? &waiter->read_versions_ : nullptr);
  const double wait_seconds = absl::ToDoubleSeconds(absl::Now() - waiter->start_);
  grpc::ByteBuffer* response = waiter->call_->response();
  if (waiter->push_pull_) {
    builder.FinishPushPull(waiter->push_, wait_seconds, shard_->incarnation(), response);
  } else {
    builder.Finish(wait_seconds, shard_->incarnation(), response);
  }
  if (waiter->committed_read_) {
    // Sealed before it is parked (the lot's Take reads it); checked as it is
    // parked, as in BeginPull: MarkCommitted wakes the lot after raising the
    // versions this checks.
    waiter->sealed_ = true;
    if (pulls_.Park(waiter, [&] {
          return !shard_->pulls().Committed(waiter->request_, waiter->read_versions_);
        })) {
      return;
    }
  }
  FinishWaiter(waiter, grpc::Status::OK);
}

void ParameterServerService::FinishWaiter(PullWaiter* waiter, const grpc::Status& status) {
  ServerCall* call = waiter->call_;
  Record(waiter->method_, status, waiter->request_bytes_,
         status.ok() ? call->response()->Length() : 0, waiter->start_);
  call->Finish(status);  // may destroy the call, and `waiter` with it
}

void ParameterServerService::WakeWaiters() {
  // A sealed pull's response is written: it is sent. The others are read
  // now. Sorted before any is finished: gRPC may delete a finished one.
  std::vector<PullWaiter*> committed;
  std::vector<PullWaiter*> ready;
  for (PullWaiter* waiter : pulls_.Take([this](const PullWaiter* waiter) {
         return waiter->sealed_
                    ? shard_->pulls().Committed(waiter->request_, waiter->read_versions_)
                    : shard_->pulls().Ready(waiter->request_);
       })) {
    (waiter->sealed_ ? committed : ready).push_back(waiter);
  }
  for (PullWaiter* waiter : committed) FinishWaiter(waiter, grpc::Status::OK);
  for (PullWaiter* waiter : ready) AnswerWaiter(waiter);
  // What moved the pulls' staleness bound moves the lookups' too.
  WakeLookups();
}

void ParameterServerService::ExpireWaiters(absl::Time now) {
  push_path_->Tick(now);
  for (LookupWaiter* waiter : lookups_.TakeExpired(now)) {
    FinishCall(waiter->call_, "Lookup",
              absl::DeadlineExceededError(absl::StrFormat(
                  "training lookup of table \"%s\" by worker %d (clock %d) waited %s for "
                  "the other workers' pushes of the step (a sync table) or for the slowest "
                  "worker to come within --max_staleness",
                  waiter->request_.table(), waiter->request_.worker(),
                  waiter->request_.clock(), absl::FormatDuration(now - waiter->start_))),
              waiter->start_, waiter->request_bytes_);
  }
  for (PullWaiter* waiter : pulls_.TakeExpired(now)) {
    const std::string why =
        waiter->sealed_
            ? "the chain's tail acknowledging the versions it read"
            : "the step completing or the staleness bound allowing it";
    FinishWaiter(waiter,
                 grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                              absl::StrFormat(
                                  "pull from worker %d (clock %d, min_version "
                                  "%d) waited %s without %s",
                                  waiter->request_.worker(),
                                  waiter->request_.clock(),
                                  waiter->request_.min_version(),
                                  absl::FormatDuration(now - waiter->start_), why)));
  }
}

void ParameterServerService::OnWaiterCancelled(PullWaiter* waiter) {
  if (!pulls_.Remove(waiter)) return;  // already answered
  FinishWaiter(waiter, grpc::Status::CANCELLED);
}

void ParameterServerService::CancelAllWaiters() {
  push_path_->CancelAll();
  for (LookupWaiter* waiter : lookups_.TakeAll()) {
    FinishCall(waiter->call_, "Lookup", absl::UnavailableError("shard is shutting down"),
               waiter->start_, waiter->request_bytes_);
  }
  for (PullWaiter* waiter : pulls_.TakeAll()) {
    FinishWaiter(waiter, grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                      "shard is shutting down"));
  }
}

}  // namespace shardtrain::server
