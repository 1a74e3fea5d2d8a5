#include "server/local_push_path.h"

#include <utility>

namespace shardtrain::server {

bool LocalPushPath::Ordered(uint32_t worker) const {
  return order_ != nullptr && order_->ordered() &&
         worker < static_cast<uint32_t>(shard_->options().num_workers);
}

void LocalPushPath::Push(const grpc::ByteBuffer& request, const wire::PushView& view,
                         PushDone done) {
  if (Ordered(view.worker)) {
    EnterOrdered(view.worker, request, /*push_pull=*/false, std::move(done));
    return;
  }
  PushResponse response;
  const absl::Status status = shard_->Push(view, &response);
  done(status, response);
}

absl::Status LocalPushPath::CheckPushPull(const wire::PushPullView& /*view*/) const {
  return absl::OkStatus();
}

void LocalPushPath::PushHalf(const grpc::ByteBuffer& request,
                             const wire::ReceivedMessage& /*message*/,
                             const wire::PushPullView& view, PushDone done) {
  if (Ordered(view.push.worker)) {
    EnterOrdered(view.push.worker, request, /*push_pull=*/true, std::move(done));
    return;
  }
  PushResponse response;
  const absl::Status status = shard_->Push(view.push, &response);
  done(status, response);
}

void LocalPushPath::EnterOrdered(uint32_t worker, const grpc::ByteBuffer& request,
                                 bool push_pull, PushDone done) {
  // gRPC keeps `request` alive until the call is answered; the view is the
  // caller's thread's, so the parked push is parsed again when admitted.
  order_->Enter(worker, [this, &request, push_pull, done = std::move(done)](bool admitted) {
    if (!admitted) {
      done(absl::UnavailableError("shard is shutting down"), PushResponse());
    } else {
      ApplyAdmitted(request, push_pull, done);
    }
    order_->Leave();
  });
}

void LocalPushPath::ApplyAdmitted(const grpc::ByteBuffer& request, bool push_pull,
                                  const PushDone& done) {
  const size_t max_parts =
      static_cast<size_t>(shard_->options().limits.max_parts_per_request);
  wire::ReceivedMessage message;
  PushResponse response;
  absl::Status status = message.Take(request);
  if (push_pull) {
    wire::PushPullView view;
    if (status.ok()) status = wire::ParsePushPull(message, &view, max_parts);
    if (status.ok()) status = shard_->Push(view.push, &response);
  } else {
    wire::PushView view;
    if (status.ok()) status = wire::ParsePush(message, &view, max_parts);
    if (status.ok()) status = shard_->Push(view, &response);
  }
  done(status, response);
}

absl::Status LocalPushPath::CheckHeadPull(const PullRequest& /*pull*/) const {
  return absl::OkStatus();
}

absl::Status LocalPushPath::CheckPull(const PullRequest& /*pull*/) const {
  return absl::OkStatus();
}

void LocalPushPath::Sparse(const SparseCall& /*call*/, const SparseApply& apply,
                           std::function<void(absl::Status)> done) {
  bool duplicate = false;
  done(apply(nullptr, &duplicate));
}

void LocalPushPath::Tick(absl::Time now) {
  if (order_ != nullptr) order_->Tick(now);
}

void LocalPushPath::CancelAll() {
  if (order_ != nullptr) order_->CancelAll();
}

}  // namespace shardtrain::server
