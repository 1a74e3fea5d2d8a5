#include "client/batch_call.h"

#include <utility>

#include <grpcpp/client_context.h>

#include "absl/strings/str_format.h"

namespace shardtrain::client {

void KeepFirstError(absl::Status* first, const absl::Status& status) {
  if (status.ok()) return;
  if (first->ok() || (first->code() == absl::StatusCode::kFailedPrecondition &&
                      status.code() != absl::StatusCode::kFailedPrecondition)) {
    *first = status;
  }
}

BatchCall::BatchCall(const BatchContext* context, ShardChannel* channel, int connection,
                     std::unique_ptr<WireRequests> requests)
    : context_(context),
      channel_(channel),
      connection_(connection),
      requests_(std::move(requests)),
      answered_by_(channel) {}

void BatchCall::StartPush(std::function<void(absl::Status)> done) {
  Start(Kind::kPush, std::move(done));
}

void BatchCall::StartPull(std::function<void(absl::Status)> done) {
  Start(Kind::kPull, std::move(done));
}

void BatchCall::StartPushPull(std::function<void(absl::Status)> done) {
  Start(Kind::kPushPull, std::move(done));
}

void BatchCall::Start(Kind kind, std::function<void(absl::Status)> done) {
  static constexpr const char* kNames[] = {"Push", "Pull", "PushPull"};
  static constexpr const char* kMethods[] = {kPushMethod, kPullMethod, kPushPullMethod};
  static constexpr wire::DataMethod kFrameMethods[] = {
      wire::DataMethod::kPush, wire::DataMethod::kPull, wire::DataMethod::kPushPull};
  const int k = static_cast<int>(kind);
  ShardRpc rpc;
  rpc.method = kNames[k];
  // Replicated shards: a push enters its group's chain at the head, a pull
  // is answered by the tail; a PushPull goes to the head, which answers its
  // pull half with what the tail holds.
  rpc.role = kind == Kind::kPull ? ChainRole::kTail : ChainRole::kHead;
  rpc.attempt_timeout = kind == Kind::kPush ? context_->push_timeout : context_->pull_timeout;
  rpc.reconnect_timeout = context_->retry_for;
  rpc.start = [this, kind, k](const ShardAttempt& attempt,
                              std::function<void(grpc::Status)> attempt_done) {
    // Re-encoded for every attempt: the shard incarnation or chain epoch,
    // and in async mode the versions, may have changed since the last one.
    const VersionTable* clamp = context_->sync ? nullptr : context_->versions;
    requests_->set_chain_epoch(attempt.chain_epoch);
    switch (kind) {
      case Kind::kPush:
        requests_->EncodePush(attempt.shard_incarnation, clamp, &request_);
        break;
      case Kind::kPull:
        requests_->EncodePull(attempt.shard_incarnation, &request_);
        break;
      case Kind::kPushPull:
        requests_->EncodePushPull(attempt.shard_incarnation, clamp, &request_);
        break;
    }
    response_.Clear();
    answered_by_ = attempt.target;
    ShardChannel* target = attempt.target;
    const int connection = connection_ % target->num_connections();
    grpc::ClientContext* grpc_context = attempt.context;
    // Over gRPC: the attempt as is; or after a frames call that did not
    // reach the shard.
    auto send_grpc = [this, k, target, connection, grpc_context](
                         std::function<void(grpc::Status)> attempt_done) {
      const absl::Time start = absl::Now();
      target->generic(connection)
          ->UnaryCall(grpc_context, kMethods[k], grpc::StubOptions(), &request_, &response_,
                      [this, k, start, attempt_done = std::move(attempt_done)](
                          grpc::Status status) {
                        if (context_->recorder) {
                          context_->recorder(kNames[k], status, request_.Length(),
                                             response_.Length(), start);
                        }
                        attempt_done(std::move(status));
                      });
    };
    wire::FrameChannel* frames = target->frames(connection);
    if (frames == nullptr) {
      send_grpc(std::move(attempt_done));
      return;
    }
    const absl::Time start = absl::Now();
    frames->Call(kFrameMethods[k], request_, &response_,
                 absl::FromChrono(grpc_context->deadline()),
                 [this, k, start, target, send_grpc, attempt_done = std::move(attempt_done)](
                     grpc::Status status, bool reached) mutable {
                   if (!reached) {
                     target->FramesUnreachable();
                     send_grpc(std::move(attempt_done));
                     return;
                   }
                   if (context_->recorder) {
                     context_->recorder(kNames[k], status, request_.Length(),
                                        response_.Length(), start);
                   }
                   attempt_done(std::move(status));
                 },
                 attempt.cancel.get());
  };
  channel_->Call(std::move(rpc), [this, kind, done = std::move(done)](absl::Status status) {
    if (status.ok()) status = Decode(kind);
    done(std::move(status));
  });
}

absl::Status BatchCall::Decode(Kind kind) {
  absl::Status status;
  switch (kind) {
    case Kind::kPush:
      status = requests_->DecodePush(&response_, &push_result_);
      if (status.ok() && context_->replay != nullptr) {
        context_->replay->Acked(shard(), this, requests_->push_header(),
                                requests_->push_parts());
      }
      break;
    case Kind::kPull:
      status = requests_->DecodePull(&response_, context_->versions, &pull_result_);
      if (status.ok() && context_->replay != nullptr) context_->replay->Pulled(shard(), this);
      break;
    case Kind::kPushPull:
      status = requests_->DecodePushPull(&response_, context_->versions, &push_result_,
                                         &pull_result_);
      break;
  }
  response_.Clear();
  if (status.ok()) return status;
  const char* name = kind == Kind::kPull ? "Pull" : kind == Kind::kPush ? "Push" : "PushPull";
  if (channel_->routed()) {
    return absl::Status(status.code(),
                        absl::StrFormat("%s answer of shard %d (%s) for group %d: %s", name,
                                        answered_by_->index(), answered_by_->address(),
                                        shard(), status.message()));
  }
  return absl::Status(status.code(),
                      absl::StrFormat("%s answer of shard %d (%s): %s", name, shard(),
                                      channel_->address(), status.message()));
}

absl::Status BatchCall::Release(absl::Time deadline) {
  request_.Clear();
  if (requests_->refs().WaitReleased(deadline)) return absl::OkStatus();
  return absl::DeadlineExceededError(absl::StrFormat(
      "gRPC still holds %d slices of a gradient sent to shard %d (%s)",
      requests_->refs().Outstanding(), shard(), channel_->address()));
}

}  // namespace shardtrain::client
