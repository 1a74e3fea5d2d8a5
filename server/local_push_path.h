// LocalPushPath: the PushPath (server/push_path.h) of an unreplicated
// shard: every write is applied to the Shard here, before the call that
// carried it is answered. With a PushOrder that orders pushes
// (--push_order, tests of convergence under staleness), an async worker's
// Push or PushPull waits, holding no thread, for that worker's turn, and
// is parsed again from the request gRPC keeps when admitted.
//
// `shard` and `order` (which may be null: no order) are not owned and must
// outlive this. Thread-safe.
#ifndef SHARDTRAIN_SERVER_LOCAL_PUSH_PATH_H_
#define SHARDTRAIN_SERVER_LOCAL_PUSH_PATH_H_

#include "server/push_order.h"
#include "server/push_path.h"
#include "server/shard.h"

namespace shardtrain::server {

class LocalPushPath final : public PushPath {
 public:
  LocalPushPath(Shard* shard, PushOrder* order) : shard_(shard), order_(order) {}

  void Push(const grpc::ByteBuffer& request, const wire::PushView& view,
            PushDone done) override;
  absl::Status CheckPushPull(const wire::PushPullView& view) const override;
  void PushHalf(const grpc::ByteBuffer& request, const wire::ReceivedMessage& message,
                const wire::PushPullView& view, PushDone done) override;
  bool committed_reads() const override { return false; }
  absl::Status CheckHeadPull(const PullRequest& pull) const override;
  absl::Status CheckPull(const PullRequest& pull) const override;
  void Sparse(const SparseCall& call, const SparseApply& apply,
              std::function<void(absl::Status)> done) override;
  void Tick(absl::Time now) override;
  void CancelAll() override;

 private:
  // Whether `worker`'s push waits for its turn in order_ (a worker id out
  // of range is refused by the shard, unordered).
  bool Ordered(uint32_t worker) const;
  // Parks the push of `request` (a PushRequest, or a PushPullRequest when
  // `push_pull`) until `worker`'s turn, then applies it.
  void EnterOrdered(uint32_t worker, const grpc::ByteBuffer& request, bool push_pull,
                    PushDone done);
  // Parses that push again, on the admitting thread, and applies it.
  void ApplyAdmitted(const grpc::ByteBuffer& request, bool push_pull, const PushDone& done);

  Shard* const shard_;
  PushOrder* const order_;
};

}  // namespace shardtrain::server

#endif  // SHARDTRAIN_SERVER_LOCAL_PUSH_PATH_H_
