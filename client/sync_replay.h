// SyncReplay: the sync-mode pushes a shard has acknowledged whose step this
// worker has not yet pulled from it.
//
// A sync shard sums a step's gradients in an accumulator that no checkpoint
// holds. If it dies after acknowledging this worker's push for step t but
// before t completes, the restarted shard never gets that gradient again
// (the push succeeded) and step t cannot complete: every worker would wait
// for it. So PsClient notes each acknowledged push here, forgets it when the
// pull of its step from that shard completes, and after re-registering on a
// restarted shard sends it the pushes still noted for it. Pushes not yet
// acknowledged need nothing: their own retries reach the new shard.
//
// The PushRequest pointers are borrowed: the client's reusable messages,
// which are not re-encoded while their step's pull is in flight.
// Thread-safe.
#ifndef SHARDTRAIN_CLIENT_SYNC_REPLAY_H_
#define SHARDTRAIN_CLIENT_SYNC_REPLAY_H_

#include <cstdint>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "proto/shardtrain.pb.h"

namespace shardtrain::client {

class SyncReplay {
 public:
  explicit SyncReplay(int num_shards) : pending_(num_shards) {}

  // Shard `shard` acknowledged `push`. Pushes of earlier steps (a smaller
  // clock), on any shard, are forgotten: a step this worker moved past (it
  // rejoined later, say) is never sent again.
  void Acked(int shard, const PushRequest* push);
  // The pull that follows `push` completed on shard `shard`.
  void Pulled(int shard, const PushRequest* push);
  // Copies of the pushes still noted for `shard`, ready to send to its new
  // incarnation (shard_incarnation cleared).
  std::vector<PushRequest> Pending(int shard) const;

 private:
  struct Noted {
    const PushRequest* push;
    int64_t clock;  // push->clock() when acknowledged
  };
  mutable absl::Mutex mu_;
  std::vector<std::vector<Noted>> pending_ ABSL_GUARDED_BY(mu_);
  int64_t highest_clock_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace shardtrain::client

#endif  // SHARDTRAIN_CLIENT_SYNC_REPLAY_H_
