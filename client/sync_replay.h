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
// A noted push references its payloads where they were sent from (the
// caller's gradient, a batch's staging buffer) until Detach() copies them
// into memory of its own; the client detaches before it lets the caller
// reuse a gradient (when Push or FinishExchanges returns).
//
//   SyncReplay replay(num_shards);
//   replay.Acked(shard, batch, header, parts);   // push acknowledged
//   replay.Detach();                             // before Push returns
//   replay.Pulled(shard, batch);                 // its step's pull is done
//   replay.SendAgain(channel, rpc_timeout, record, done);  // after a resync
//
// Thread-safe.
#ifndef SHARDTRAIN_CLIENT_SYNC_REPLAY_H_
#define SHARDTRAIN_CLIENT_SYNC_REPLAY_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/shard_channel.h"
#include "proto/shardtrain.pb.h"
#include "wire/message_encoder.h"

namespace shardtrain::client {

class SyncReplay {
 public:
  explicit SyncReplay(int num_shards) : pending_(num_shards) {}

  // Shard `shard` acknowledged the push `key` (the batch call that sent it) made
  // of `header` and `parts`, whose payloads stay referenced until Detach.
  // Pushes of earlier steps (a smaller clock), on any shard, are forgotten: a
  // step this worker moved past (it rejoined later, say) is never sent
  // again. Acknowledging a noted push again (a retry's answer) changes
  // nothing.
  void Acked(int shard, const void* key, const wire::PushHeader& header,
             absl::Span<const wire::GradientPartOut> parts);
  // The pull that follows push `key` completed on shard `shard`.
  void Pulled(int shard, const void* key);
  // Copies the payloads of every noted push into memory of the replay's
  // own: afterwards nothing noted refers to the memory it was sent from.
  void Detach();
  // The pushes still noted for `shard`, as messages ready to send to its
  // new incarnation (shard_incarnation 0).
  std::vector<PushRequest> Pending(int shard) const;
  // Sends Pending(channel's shard) to its new incarnation, each through
  // `channel` (retried as it retries) with `attempt_timeout` per attempt
  // and recorded by `record` (may be empty), and calls `done` once all are
  // in: a push the shard already has (ALREADY_EXISTS) or whose step
  // completed without it (FAILED_PRECONDITION) counts as in; otherwise the
  // first error. The caller has re-registered on the shard first.
  void SendAgain(ShardChannel* channel, absl::Duration attempt_timeout,
                 const RpcRecorder& record, std::function<void(absl::Status)> done) const;
  // Pushes noted for `shard` whose payloads are still referenced (tests).
  int Referenced(int shard) const;

 private:
  struct Part {
    std::string tensor;
    uint32_t partition = 0;
    int64_t version = 0;
    DType dtype = DTYPE_F32;
    Encoding encoding = ENCODING_DENSE;
    // Referenced until detached; then `owned_*` hold the bytes.
    absl::string_view data;
    absl::string_view indices;
    std::string owned_data;
    std::string owned_indices;
  };
  struct Noted {
    const void* key = nullptr;
    wire::PushHeader header;
    std::vector<Part> parts;
    bool detached = false;
  };
  mutable absl::Mutex mu_;
  std::vector<std::vector<Noted>> pending_ ABSL_GUARDED_BY(mu_);
  int64_t highest_clock_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace shardtrain::client

#endif  // SHARDTRAIN_CLIENT_SYNC_REPLAY_H_
