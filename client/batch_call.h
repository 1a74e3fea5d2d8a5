// BatchCall: the data-path RPCs (Push, Pull, PushPull) of one batch of
// partitions: those that live on one shard (with replicated shards: in one
// replica group, whose pushes go to its chain's head and pulls to its tail)
// and that one of its connections carries. The blocking PsClient calls and
// the overlapped exchange both start their RPCs here: the requests come from
// the batch's WireRequests
// (client/wire_requests.h), each goes through the shard's ShardChannel
// (client/shard_channel.h) as a frame to the shard's data port
// (wire/frame_channel.h) or, without one, as raw bytes on
// grpc::GenericStub, and the answer is decoded straight into the
// destinations given to SetPull.
//
//   BatchCall call(&context, channel, /*connection=*/0, std::move(requests));
//   call.requests().SetPush(clock, channel->NextSequence(), grad_of, versions);
//   call.StartPush([&](absl::Status status) { ... call.push_result() ... });
//   ... once every started call has ended:
//   RETURN_IF_ERROR(call.Release(deadline));  // the gradient may change now
//
// Thread-compatible: one call of a batch at a time; `done` runs on a gRPC
// thread or a frames channel's reader.
#ifndef SHARDTRAIN_CLIENT_BATCH_CALL_H_
#define SHARDTRAIN_CLIENT_BATCH_CALL_H_

#include <functional>
#include <memory>

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "client/shard_channel.h"
#include "client/sync_replay.h"
#include "client/wire_requests.h"

namespace shardtrain::client {

// What the batches of one client share. Not owned by the batches; must
// outlive them.
struct BatchContext {
  VersionTable* versions = nullptr;
  // Sync mode: a push re-sent after a shard restart keeps its versions (its
  // step), and acknowledged pushes are noted in `replay` until their pull.
  // Async: each version becomes min(version sent, the shard's now).
  bool sync = false;
  SyncReplay* replay = nullptr;  // sync mode only
  absl::Duration push_timeout = absl::Seconds(30);
  absl::Duration pull_timeout = absl::Seconds(300);
  // Gives up on a call this long after its first failure (capped by the
  // channel's reconnect timeout).
  absl::Duration retry_for = absl::InfiniteDuration();
  RpcRecorder recorder;  // may be empty
};

// Keeps in `*first` the first error of several calls, but lets any other
// error replace a FAILED_PRECONDITION (a late sync gradient, which the
// trainer recovers from).
void KeepFirstError(absl::Status* first, const absl::Status& status);

class BatchCall {
 public:
  BatchCall(const BatchContext* context, ShardChannel* channel, int connection,
            std::unique_ptr<WireRequests> requests);
  BatchCall(const BatchCall&) = delete;
  BatchCall& operator=(const BatchCall&) = delete;

  WireRequests& requests() { return *requests_; }
  const WireRequests& requests() const { return *requests_; }
  // The shard index of the batch's channel; with replicated shards, the
  // replica group (the shard each attempt went to may differ).
  int shard() const { return channel_->index(); }
  // Whether that shard counts a split push's calls (ShardChannel::
  // counts_clock_parts).
  bool ShardCountsClockParts() const { return channel_->counts_clock_parts(); }
  int connection() const { return connection_; }
  // The next push sequence number of this batch's shard (replica group:
  // numbered per group, so that a new head recognises a retried push).
  uint64_t NextSequence() { return channel_->NextSequence(); }

  // Each sends what requests() was last set to, with retries, and calls
  // `done` once with the outcome. A push needs SetPush first, a pull
  // SetPull, a push-pull both.
  void StartPush(std::function<void(absl::Status)> done);
  void StartPull(std::function<void(absl::Status)> done);
  void StartPushPull(std::function<void(absl::Status)> done);

  // The last answer's figures; valid after an OK `done`.
  const PushResult& push_result() const { return push_result_; }
  const PullResult& pull_result() const { return pull_result_; }

  // After `done`: drops the request and waits, until `deadline`, for gRPC
  // to release every slice that references the gradient or the batch's
  // staging memory. DEADLINE_EXCEEDED if it has not by then: the gradient
  // must not change yet.
  absl::Status Release(absl::Time deadline);

 private:
  enum class Kind { kPush, kPull, kPushPull };
  void Start(Kind kind, std::function<void(absl::Status)> done);
  absl::Status Decode(Kind kind);

  const BatchContext* const context_;
  ShardChannel* const channel_;
  const int connection_;
  const std::unique_ptr<WireRequests> requests_;
  // The shard the last attempt went to, for error messages.
  ShardChannel* answered_by_;
  grpc::ByteBuffer request_;
  grpc::ByteBuffer response_;
  PushResult push_result_;
  PullResult pull_result_;
};

}  // namespace shardtrain::client

#endif  // SHARDTRAIN_CLIENT_BATCH_CALL_H_
