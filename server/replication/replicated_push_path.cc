#include "server/replication/replicated_push_path.h"

#include <utility>

#include "absl/strings/str_format.h"

namespace shardtrain::server {

void ReplicatedPushPath::Push(const grpc::ByteBuffer& request, const wire::PushView& view,
                              PushDone done) {
  replicator_->Push(request, view, std::move(done));
}

absl::Status ReplicatedPushPath::CheckPushPull(const wire::PushPullView& view) const {
  // The push half is forwarded down the chain as it arrived.
  if (view.push_fields != 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a replicated PushPull needs its push half in one field, not %d", view.push_fields));
  }
  // The chain first: a shard that is not (yet) the group's head at the
  // request's epoch (one restarted at a dead one's address, still waiting
  // for its place or copying the group's state) answers with a refusal the
  // worker retries elsewhere, not "unknown tensor".
  return replicator_->CheckPushPull(view.push, view.pull);
}

void ReplicatedPushPath::PushHalf(const grpc::ByteBuffer& /*request*/,
                                  const wire::ReceivedMessage& message,
                                  const wire::PushPullView& view, PushDone done) {
  replicator_->Push(message.Range(view.push_offset, view.push_size), view.push, std::move(done));
}

absl::Status ReplicatedPushPath::CheckHeadPull(const PullRequest& pull) const {
  return replicator_->CheckHeadPull(pull);
}

absl::Status ReplicatedPushPath::CheckPull(const PullRequest& pull) const {
  return replicator_->CheckPull(pull);
}

void ReplicatedPushPath::Sparse(const SparseCall& call, const SparseApply& apply,
                                std::function<void(absl::Status)> done) {
  replicator_->Sparse(call.group, call.chain_epoch, call.worker, call.worker_incarnation,
                      call.sequence, apply, std::move(done));
}

}  // namespace shardtrain::server
