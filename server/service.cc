#include "server/service.h"

#include <algorithm>

#include <glog/logging.h>

#include "absl/strings/str_format.h"
#include "common/grpc_status.h"

namespace shardtrain::server {

// A pull that may have to wait. Owned by gRPC from the handler's return
// until OnDone; the waiters_ list only borrows it, and whoever removes it
// from that list is the one who calls Finish.
class ParameterServerService::WaitingReactor : public grpc::ServerUnaryReactor {
 public:
  WaitingReactor(ParameterServerService* service, const char* method,
                 absl::Time start, absl::Time deadline, size_t request_bytes,
                 const PullRequest* request, PullResponse* pull_response,
                 const google::protobuf::Message* response)
      : service_(service),
        method_(method),
        start_(start),
        deadline_(deadline),
        request_bytes_(request_bytes),
        request_(request),
        pull_response_(pull_response),
        response_(response) {}

  void OnCancel() override { service_->OnWaiterCancelled(this); }
  void OnDone() override { delete this; }

  ParameterServerService* const service_;
  const char* const method_;
  const absl::Time start_;
  const absl::Time deadline_;
  const size_t request_bytes_;
  const PullRequest* const request_;
  PullResponse* const pull_response_;
  const google::protobuf::Message* const response_;
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
      max_pull_wait_(max_pull_wait) {
  SetMessageAllocatorFor_Push(&push_pool_);
  SetMessageAllocatorFor_Pull(&pull_pool_);
  SetMessageAllocatorFor_PushPull(&push_pull_pool_);
  SetMessageAllocatorFor_Register(&register_arena_);
}

ParameterServerService::~ParameterServerService() { CancelAllWaiters(); }

void ParameterServerService::Record(const char* method,
                                    const grpc::Status& status,
                                    absl::Time start, size_t request_bytes,
                                    size_t response_bytes) {
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
  Record(method, grpc_status, start, request.ByteSizeLong(),
         status.ok() ? response.ByteSizeLong() : 0);
  if (!status.ok()) VLOG(1) << method << " rejected: " << status;
  reactor->Finish(grpc_status);
}

grpc::ServerUnaryReactor* ParameterServerService::Register(
    grpc::CallbackServerContext* context, const RegisterRequest* request,
    RegisterResponse* response) {
  const absl::Time start = absl::Now();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  Finish(reactor, "Register", shard_->Register(*request, response), start,
         *request, *response);
  return reactor;
}

grpc::ServerUnaryReactor* ParameterServerService::Push(
    grpc::CallbackServerContext* context, const PushRequest* request,
    PushResponse* response) {
  const absl::Time start = absl::Now();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  Finish(reactor, "Push", shard_->Push(*request, response), start, *request,
         *response);
  return reactor;
}

grpc::ServerUnaryReactor* ParameterServerService::Heartbeat(
    grpc::CallbackServerContext* context, const HeartbeatRequest* request,
    HeartbeatResponse* response) {
  const absl::Time start = absl::Now();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  Finish(reactor, "Heartbeat", shard_->Heartbeat(*request, response), start,
         *request, *response);
  return reactor;
}

grpc::ServerUnaryReactor* ParameterServerService::Status(
    grpc::CallbackServerContext* context, const StatusRequest* request,
    StatusResponse* response) {
  const absl::Time start = absl::Now();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  shard_->FillStatus(*request, response);
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
    grpc::CallbackServerContext* context, const PullRequest* request,
    PullResponse* response) {
  const absl::Time start = absl::Now();
  return StartPull(context, "Pull", start, request->ByteSizeLong(), *request,
                   response, response);
}

grpc::ServerUnaryReactor* ParameterServerService::PushPull(
    grpc::CallbackServerContext* context, const PushPullRequest* request,
    PushPullResponse* response) {
  const absl::Time start = absl::Now();
  // The pull is checked before the push is applied so that a bad pull
  // rejects the whole request without changing the shard.
  absl::Status status;
  if (request->pull().worker() != request->push().worker()) {
    status = absl::InvalidArgumentError(absl::StrFormat(
        "push is from worker %d but pull from worker %d",
        request->push().worker(), request->pull().worker()));
  }
  if (status.ok()) status = shard_->ValidatePull(request->pull());
  if (status.ok()) status = shard_->Push(request->push(), response->mutable_push());
  if (!status.ok()) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    Finish(reactor, "PushPull", status, start, *request, *response);
    return reactor;
  }
  return StartPull(context, "PushPull", start, request->ByteSizeLong(),
                   request->pull(), response->mutable_pull(), response);
}

grpc::ServerUnaryReactor* ParameterServerService::StartPull(
    grpc::CallbackServerContext* context, const char* method, absl::Time start,
    size_t request_bytes, const PullRequest& request,
    PullResponse* pull_response, const google::protobuf::Message* response) {
  const absl::Time deadline =
      std::min(start + max_pull_wait_, absl::FromChrono(context->deadline()));
  auto* reactor = new WaitingReactor(this, method, start, deadline, request_bytes,
                                     &request, pull_response, response);
  const absl::Status valid = shard_->ValidatePull(request);
  if (!valid.ok()) {
    FinishWaiter(reactor, common::ToGrpcStatus(valid));
    return reactor;
  }
  shard_->NotePull(request);  // may complete steps and wake waiters: before mu_
  {
    absl::MutexLock lock(&mu_);
    // Checked under mu_ so a wake-up between the check and the insertion
    // cannot be missed: WakeWaiters takes mu_ too.
    if (!shard_->PullReady(request)) {
      waiters_.push_back(reactor);
      shard_metrics_->waiting_pulls().Set(static_cast<double>(waiters_.size()));
      return reactor;
    }
  }
  shard_->FillPull(request, pull_response);
  FinishWaiter(reactor, grpc::Status::OK);
  return reactor;
}

void ParameterServerService::FinishWaiter(WaitingReactor* waiter,
                                          const grpc::Status& status) {
  if (status.ok()) {
    waiter->pull_response_->set_wait_seconds(
        absl::ToDoubleSeconds(absl::Now() - waiter->start_));
  }
  Record(waiter->method_, status, waiter->start_, waiter->request_bytes_,
         status.ok() ? waiter->response_->ByteSizeLong() : 0);
  waiter->Finish(status);
}

void ParameterServerService::WakeWaiters() {
  std::vector<WaitingReactor*> ready;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if (shard_->PullReady(*(*it)->request_)) {
        ready.push_back(*it);
        it = waiters_.erase(it);
      } else {
        ++it;
      }
    }
    if (!ready.empty()) {
      shard_metrics_->waiting_pulls().Set(static_cast<double>(waiters_.size()));
    }
  }
  for (WaitingReactor* waiter : ready) {
    shard_->FillPull(*waiter->request_, waiter->pull_response_);
    FinishWaiter(waiter, grpc::Status::OK);
  }
}

void ParameterServerService::ExpireWaiters(absl::Time now) {
  std::vector<WaitingReactor*> expired;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if ((*it)->deadline_ <= now) {
        expired.push_back(*it);
        it = waiters_.erase(it);
      } else {
        ++it;
      }
    }
    if (!expired.empty()) {
      shard_metrics_->waiting_pulls().Set(static_cast<double>(waiters_.size()));
    }
  }
  for (WaitingReactor* waiter : expired) {
    FinishWaiter(waiter,
                 grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                              absl::StrFormat(
                                  "pull from worker %d (clock %d, min_version "
                                  "%d) waited %s without the step completing "
                                  "or the staleness bound allowing it",
                                  waiter->request_->worker(),
                                  waiter->request_->clock(),
                                  waiter->request_->min_version(),
                                  absl::FormatDuration(now - waiter->start_))));
  }
}

void ParameterServerService::OnWaiterCancelled(WaitingReactor* waiter) {
  {
    absl::MutexLock lock(&mu_);
    auto it = std::find(waiters_.begin(), waiters_.end(), waiter);
    if (it == waiters_.end()) return;  // already answered
    waiters_.erase(it);
    shard_metrics_->waiting_pulls().Set(static_cast<double>(waiters_.size()));
  }
  FinishWaiter(waiter, grpc::Status::CANCELLED);
}

void ParameterServerService::CancelAllWaiters() {
  std::list<WaitingReactor*> all;
  {
    absl::MutexLock lock(&mu_);
    all.swap(waiters_);
    shard_metrics_->waiting_pulls().Set(0);
  }
  for (WaitingReactor* waiter : all) {
    FinishWaiter(waiter, grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                      "shard is shutting down"));
  }
}

}  // namespace shardtrain::server
