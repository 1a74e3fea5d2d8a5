// ReplicatedPushPath: the PushPath (server/push_path.h) of a replicated
// shard (--replicas > 1). Every write goes through the Replicator
// (server/replication/replicator.h): applied where this shard heads the
// write's replica group at the request's chain epoch, forwarded down the
// chain, and answered once the tail has it. A PushPull's push half is
// forwarded as it arrived (so it must be one field) and its pull is a
// committed read; a Pull is answered only by its group's tail.
//
// `replicator` is not owned and must outlive this. Thread-safe.
#ifndef SHARDTRAIN_SERVER_REPLICATION_REPLICATED_PUSH_PATH_H_
#define SHARDTRAIN_SERVER_REPLICATION_REPLICATED_PUSH_PATH_H_

#include "server/push_path.h"
#include "server/replication/replicator.h"

namespace shardtrain::server {

class ReplicatedPushPath final : public PushPath {
 public:
  explicit ReplicatedPushPath(Replicator* replicator) : replicator_(replicator) {}

  void Push(const grpc::ByteBuffer& request, const wire::PushView& view,
            PushDone done) override;
  absl::Status CheckPushPull(const wire::PushPullView& view) const override;
  void PushHalf(const grpc::ByteBuffer& request, const wire::ReceivedMessage& message,
                const wire::PushPullView& view, PushDone done) override;
  bool committed_reads() const override { return true; }
  absl::Status CheckHeadPull(const PullRequest& pull) const override;
  absl::Status CheckPull(const PullRequest& pull) const override;
  void Sparse(const SparseCall& call, const SparseApply& apply,
              std::function<void(absl::Status)> done) override;
  void Tick(absl::Time /*now*/) override {}
  void CancelAll() override {}

 private:
  Replicator* const replicator_;
};

}  // namespace shardtrain::server

#endif  // SHARDTRAIN_SERVER_REPLICATION_REPLICATED_PUSH_PATH_H_
