// PushPath: how a shard's service applies the writes workers send (a Push,
// a PushPull's push half, a sparse table's training Lookup and PushSparse),
// chosen once when the server starts:
//  - LocalPushPath (server/local_push_path.h), unreplicated shards: applied
//    to the Shard here, at once or (--push_order, tests) in its worker's
//    turn;
//  - ReplicatedPushPath (server/replication/replicated_push_path.h),
//    --replicas > 1: through the Replicator, applied at the chain's head,
//    forwarded, and answered once the tail has it; the pulls that follow
//    a push there are committed reads.
// The service (server/parameter_server_service.h) parses, checks and answers; it does not
// ask which path it has.
#ifndef SHARDTRAIN_SERVER_PUSH_PATH_H_
#define SHARDTRAIN_SERVER_PUSH_PATH_H_

#include <cstdint>
#include <functional>

#include <grpcpp/support/byte_buffer.h>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "proto/shardtrain.pb.h"
#include "wire/message_views.h"

namespace shardtrain::server {

// Who a sparse table's training lookup or push is, for the chain.
struct SparseCall {
  int group = 0;
  uint64_t chain_epoch = 0;
  uint32_t worker = 0;
  uint64_t worker_incarnation = 0;  // 0 for a lookup
  uint64_t sequence = 0;            // 0 for a lookup
};

class PushPath {
 public:
  using PushDone = std::function<void(absl::Status, const PushResponse&)>;
  // Runs a sparse operation here, describing what it changed in *op (null
  // when nothing needs it) or setting *duplicate (a push applied before).
  using SparseApply = std::function<absl::Status(SparseOp* op, bool* duplicate)>;

  virtual ~PushPath() = default;

  // The Push `view`, parsed from `request` (gRPC's, alive until `done` has
  // run; `view` is only read during the call). `done` may run before this
  // returns.
  virtual void Push(const grpc::ByteBuffer& request, const wire::PushView& view,
                    PushDone done) = 0;

  // OK when this shard may take the PushPull `view`, checked before its
  // pull half and before anything changes.
  virtual absl::Status CheckPushPull(const wire::PushPullView& view) const = 0;
  // The push half of the PushPull `view`, parsed from `message` (which
  // holds `request`, gRPC's, alive until `done` has run). `done` may run
  // before this returns.
  virtual void PushHalf(const grpc::ByteBuffer& request, const wire::ReceivedMessage& message,
                        const wire::PushPullView& view, PushDone done) = 0;
  // Whether a PushPull's pull, once read, waits until the versions it read
  // are committed (the chain's tail has them).
  virtual bool committed_reads() const = 0;
  // Committed reads: OK while this shard may still answer `pull` (the
  // chain may have moved on while it waited).
  virtual absl::Status CheckHeadPull(const PullRequest& pull) const = 0;
  // OK when this shard may answer the Pull `pull`.
  virtual absl::Status CheckPull(const PullRequest& pull) const = 0;

  // A sparse table's training lookup or push `call`: `apply` runs it here
  // before this returns; `done` gets its status (maybe later).
  virtual void Sparse(const SparseCall& call, const SparseApply& apply,
                      std::function<void(absl::Status)> done) = 0;

  // Housekeeping at `now`: a push order's turn held too long passes on.
  virtual void Tick(absl::Time now) = 0;
  // Shutdown: pushes parked for their turn end with UNAVAILABLE.
  virtual void CancelAll() = 0;
};

}  // namespace shardtrain::server

#endif  // SHARDTRAIN_SERVER_PUSH_PATH_H_
