// ShardChannel: the one place where a worker's RPCs to a shard are retried.
//
// Every RPC the worker sends (the data path's BatchCalls, client/batch_call.h,
// for the blocking calls and the overlapped exchange alike, and the control
// RPCs) goes through ShardChannel::Call, which runs it on the gRPC callback
// API and, while the shard cannot be reached, tries again:
//  - UNAVAILABLE (no connection, connection reset), a per-attempt
//    DEADLINE_EXCEEDED and a transport reset are retried with exponential
//    backoff and full jitter, each retry waiting for the channel to connect
//    (wait_for_ready) within its attempt deadline, until `reconnect_timeout`
//    has passed since the call's first failure; then the call fails with an
//    error naming the shard, its address and how long it was retried;
//  - ABORTED (the shard restarted since this worker learned its versions)
//    first resynchronises the shard (the ResyncFn re-registers the tensors
//    and takes the shard's partition versions; one resync at a time per
//    shard, shared by every call that needs it), then retries.
// Any other error ends the call at once.
//
// A shard may have several connections (PsClientOptions::channels_per_shard):
// the control RPCs use the first through stub(), the data path any of them
// through generic(connection); retries and resyncs are the shard's, shared.
//
// Replicated shards (--replicas > 1, set_chain). The channel of shard index
// g then also stands for replica group g: a call with a ChainRole goes to
// the shard that plays that role in g's chain now (pushes to the head,
// pulls to the tail, ChainRoutes), over that shard's own connections, and
// carries the chain's epoch. A retryable failure, including a shard's
// refusal of a stale epoch ("stale chain epoch", "not serving group", both
// UNAVAILABLE), re-reads the chain before the retry, which may go to
// another shard; when the chain read has a newer epoch than the failed
// attempt's, the retry goes at once, without a backoff, and a refusal that
// lasts milliseconds (the shard has not read the newest epoch yet, or a
// head hands its place over) is retried after 5 ms, doubling. A call
// waiting out a backoff looks every 20 ms whether its chain moved on (the
// router's watch saw a dead head replaced) and then retries at once. An
// attempt in flight to a member that the chain has since dropped
// (AbandonDeparted: the router saw a newer epoch without it) is cancelled
// and retried at once on the new chain: a member that hangs or is cut off
// sends no reset, and the call would otherwise wait out its deadline
// (pushes are idempotent, so the new head applies a retried push once).
// No resync: the chain keeps the state across shard
// failures, so a routed call sends shard_incarnation 0. Calls without a
// role (the control RPCs) always go to the channel's own shard.
//
//   ShardRpc rpc;
//   rpc.method = "Heartbeat";
//   rpc.attempt_timeout = absl::Seconds(30);
//   rpc.start = [&](const ShardAttempt& attempt, auto done) {
//     attempt.target->stub()->async()->Heartbeat(attempt.context, &request, &response,
//                                                 std::move(done));
//   };
//   channel.Call(std::move(rpc), [](absl::Status status) { ... });
//
// Thread-safe.
#ifndef SHARDTRAIN_CLIENT_SHARD_CHANNEL_H_
#define SHARDTRAIN_CLIENT_SHARD_CHANNEL_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/support/status.h>

#include "absl/container/flat_hash_set.h"
#include "absl/random/bit_gen_ref.h"
#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "wire/attempt_cancel.h"
#include "wire/frame_channel.h"
#include "wire/tls_context.h"
#include "client/ps_client_metrics.h"
#include "proto/shardtrain.grpc.pb.h"

namespace shardtrain::client {

struct RetryPolicy {
  // Backoff before retry r (0-based) is uniform in
  // [0, min(max_backoff, initial_backoff * 2^r)] ("full jitter").
  absl::Duration initial_backoff = absl::Milliseconds(50);
  absl::Duration max_backoff = absl::Seconds(2);
  // The same ceiling for a call routed by replica chains (ChainRoutes):
  // such an attempt fails at once when its member is dead (no
  // wait_for_ready), and the retry goes where the chain says by then, so
  // a short ceiling lets it reach the new head soon after the chain
  // changes instead of sleeping out a long backoff.
  absl::Duration routed_max_backoff = absl::Milliseconds(250);
  // A call gives up this long after its first failure.
  absl::Duration reconnect_timeout = absl::Seconds(120);
};

// The upper bound of the backoff before retry `retry` (0-based).
absl::Duration BackoffCeiling(const RetryPolicy& policy, int retry);
// A backoff drawn uniformly in [0, BackoffCeiling(policy, retry)].
absl::Duration Backoff(const RetryPolicy& policy, int retry, absl::BitGenRef gen);
// Deadline of an attempt started at `now`: `attempt_timeout` from now, but
// for a retry (first_failure not InfinitePast) no later than first_failure +
// reconnect_timeout.
absl::Time AttemptDeadline(absl::Time now, absl::Duration attempt_timeout,
                           absl::Time first_failure, absl::Duration reconnect_timeout);
// UNAVAILABLE, DEADLINE_EXCEEDED or a transport reset reported as another
// code ("Stream removed", "Socket closed", "Connection reset").
bool IsRetryable(const grpc::Status& status);

// A shard's refusal of a call routed by an outdated chain configuration:
// UNAVAILABLE whose message starts with "stale chain epoch" or "not serving
// group". The shard is alive; the client re-reads the chain and retries.
bool IsChainRefusal(const grpc::Status& status);

class ShardChannel;

// Records one finished RPC for metrics: method, status, the request's and
// the response's bytes (the order of every byte count in the project's
// metrics calls), start time.
using RpcRecorder = std::function<void(const char* method, const grpc::Status& status,
                                       size_t request_bytes, size_t response_bytes,
                                       absl::Time start)>;

// The member of a replica group's chain a call goes to.
enum class ChainRole {
  kNone,  // not routed: the channel's own shard (control RPCs; replicas 1)
  kHead,  // Push, PushPull: the chain's first member
  kTail,  // Pull: the chain's last member
};

// Where a routed call goes for one attempt.
struct ChainRoute {
  int shard = -1;      // shard index
  uint64_t epoch = 0;  // the chain configuration's epoch, sent on the request
};

// The chains of a replicated job as the client knows them (ChainRouter,
// client/chain_router.h). Implementations are thread-safe.
class ChainRoutes {
 public:
  virtual ~ChainRoutes() = default;
  // The shard playing `role` (kHead or kTail) in `group`'s chain now.
  // UNAVAILABLE while the group has no configuration.
  virtual absl::StatusOr<ChainRoute> Route(int group, ChainRole role) const = 0;
  // Re-reads `group`'s chain (rate-limited; a failed read keeps the last
  // one), then calls `then` once, on any thread.
  virtual void Refresh(int group, std::function<void()> then) = 0;
};

// One attempt of a ShardRpc, as ShardRpc::start receives it.
struct ShardAttempt {
  // Fresh for every attempt; its deadline and wait_for_ready are set.
  grpc::ClientContext* context = nullptr;
  // For the request's shard_incarnation: the shard's incarnation as last
  // learned (0 when unknown, and always for a routed call).
  uint64_t shard_incarnation = 0;
  // For the request's chain_epoch: the routed chain's epoch; 0 unrouted.
  uint64_t chain_epoch = 0;
  // The shard to send to, whose connections to use: the called channel
  // itself unless the call was routed. Use connection
  // `c % target->num_connections()`.
  ShardChannel* target = nullptr;
  // A routed attempt sent on the target's data port (target->frames())
  // says here how to cancel it: AbandonDeparted cancels `context` and
  // this. Null for an unrouted call (pass it on as is).
  std::shared_ptr<wire::AttemptCancel> cancel;
};

// One RPC as ShardChannel::Call runs it.
struct ShardRpc {
  const char* method = "";
  // kHead/kTail: routed to that member of the channel's replica group when
  // the channel has chain routes (set_chain); otherwise ignored.
  ChainRole role = ChainRole::kNone;
  absl::Duration attempt_timeout = absl::Seconds(30);
  // The call gives up this long after its first failure; capped by the
  // channel's RetryPolicy::reconnect_timeout.
  absl::Duration reconnect_timeout = absl::InfiniteDuration();
  // Starts one attempt (see ShardAttempt: stamp its incarnation and epoch
  // on the request, send on its target over attempt.context) and calls
  // `done` when the RPC ends. Called again, with a fresh attempt, for
  // every retry.
  std::function<void(const ShardAttempt& attempt, std::function<void(grpc::Status)> done)>
      start;
};

class ShardChannel {
 public:
  // Resynchronises the shard after it restarted: re-registers this
  // worker's tensors there, learns the shard's versions and incarnation
  // (set_incarnation) and calls `done`. Runs one at a time per channel.
  using ResyncFn =
      std::function<void(ShardChannel* channel, std::function<void(absl::Status)> done)>;

  // `connections` are this shard's gRPC channels (at least one; see
  // PsClientOptions::channels_per_shard): the control RPCs (stub()) use the
  // first, the data path spreads its calls over all (generic()).
  // `metrics` may be null; if not, it must outlive the channel.
  ShardChannel(int index, std::string address,
               std::vector<std::shared_ptr<grpc::Channel>> connections,
               const RetryPolicy& policy, PsClientMetrics* metrics);
  ShardChannel(const ShardChannel&) = delete;
  ShardChannel& operator=(const ShardChannel&) = delete;

  // Runs `rpc` with retries (see the file comment) and calls `done` once,
  // with OK or an error that names the method, the shard and its address.
  void Call(ShardRpc rpc, std::function<void(absl::Status)> done);

  // Runs `resync` on ABORTED. Set before the first call.
  void set_resync(ResyncFn resync) { resync_ = std::move(resync); }
  // Replicated shards: routes the calls with a ChainRole through `routes`
  // as calls of replica group index(); `peers[s]` is shard s's channel.
  // Not owned; they must outlive this. Set before the first call.
  void set_chain(ChainRoutes* routes, std::vector<ShardChannel*> peers) {
    routes_ = routes;
    peers_ = std::move(peers);
  }
  bool routed() const { return routes_ != nullptr; }
  // Replicated shards: this channel's replica group has a chain at `epoch`
  // whose members are `members` (shard indices). Routed attempts sent
  // under an older epoch to a shard not among them are cancelled and
  // retried at once (see the file comment). Called by the chain router's
  // change listener; returns how many were cancelled.
  int AbandonDeparted(uint64_t epoch, const std::vector<int>& members);

  // The shard's incarnation as last learned (0: unknown).
  uint64_t incarnation() const { return incarnation_.load(); }
  void set_incarnation(uint64_t incarnation) { incarnation_.store(incarnation); }
  // The next push sequence number for this shard: 1, 2, ...
  uint64_t NextSequence() { return next_sequence_.fetch_add(1) + 1; }
  // The next PushSparse sequence number (a sequence space of its own on the
  // shard), shared by every TableClient of this worker: 1, 2, ...
  uint64_t NextSparseSequence() { return next_sparse_sequence_.fetch_add(1) + 1; }

  int index() const { return index_; }
  const std::string& address() const { return address_; }
  // Typed stub on the first connection (Register, Heartbeat, Status).
  ParameterServer::Stub* stub() { return stub_.get(); }
  // Raw-bytes stub on connection `connection` (Push, Pull, PushPull).
  grpc::GenericStub* generic(int connection) { return generic_[connection].get(); }

  // The data port (server/data_port.h). Once enabled, the data path's
  // calls go to the port the shard names in its Register and Heartbeat
  // answers (set_data_port), as frames, one FrameChannel per connection;
  // with no port named, or for kFramesPause after a frames call did not
  // reach the shard (FramesUnreachable), they use gRPC. Routed calls
  // (replicated shards) take the data port of the member they go to; an
  // attempt sent there registers its cancellation (ShardAttempt::cancel),
  // so AbandonDeparted reaches it as it reaches a gRPC attempt. Enable
  // before the first call. `tls` (a client context; null: plaintext)
  // secures those connections.
  void EnableFrames(uint64_t max_message_bytes,
                    std::shared_ptr<const wire::TlsContext> tls = nullptr);
  void set_data_port(int port);
  // Connection `connection`'s frames channel, or null: use gRPC.
  wire::FrameChannel* frames(int connection);
  void FramesUnreachable();
  static constexpr absl::Duration kFramesPause = absl::Seconds(5);
  int num_connections() const { return static_cast<int>(connections_.size()); }
  // Whether the shard moves a worker's clock once every call of a split
  // push is in (its Register answer's counts_clock_parts).
  bool counts_clock_parts() const { return counts_clock_parts_.load(); }
  void set_counts_clock_parts(bool counts) { counts_clock_parts_.store(counts); }
  const RetryPolicy& policy() const { return policy_; }

 private:
  struct PendingCall;

  void StartAttempt(PendingCall* call);
  void OnAttemptDone(PendingCall* call, grpc::Status status);
  // Before a retry: re-reads the chain of a routed call, then ScheduleRetry.
  void Retry(PendingCall* call);
  // The next attempt after the call's backoff (and one more retry counted),
  // or after `wait`.
  void ScheduleRetry(PendingCall* call);
  void ScheduleRetryAfter(PendingCall* call, absl::Duration wait);
  // Waits until call->retry_at (a routed call: or its chain's epoch moves
  // past the attempt's), then starts the next attempt.
  void ArmRetry(PendingCall* call);
  static void Finish(PendingCall* call, absl::Status status);
  // "Push to shard 2 (host:port)" or, routed, "Push of group 1 to shard 2
  // (host:port)": the shard the last attempt went to.
  std::string Describe(const PendingCall& call) const;
  // Runs `then` once the shard has been resynchronised since an attempt
  // sent with `sent_incarnation` was refused.
  void RequestResync(uint64_t sent_incarnation, std::function<void(absl::Status)> then);
  void NoteFailure(const char* method, const grpc::Status& status, absl::Duration budget);
  void NoteAnswer();
  // Connections still in gRPC's reconnect backoff (the shard was down)
  // connect again now. True when there was one.
  bool Reconnect();
  // The backoff before retry `retry`; a routed call's is capped by
  // RetryPolicy::routed_max_backoff.
  absl::Duration Jitter(int retry, bool routed);

  const int index_;
  const std::string address_;
  const std::vector<std::shared_ptr<grpc::Channel>> connections_;
  const std::unique_ptr<ParameterServer::Stub> stub_;
  std::vector<std::unique_ptr<grpc::GenericStub>> generic_;
  const RetryPolicy policy_;
  PsClientMetrics* const metrics_;
  ResyncFn resync_;
  ChainRoutes* routes_ = nullptr;
  std::vector<ShardChannel*> peers_;  // by shard index; with routes_
  std::atomic<uint64_t> incarnation_{0};
  // Frames (EnableFrames): one channel per connection, made at once.
  std::vector<std::unique_ptr<wire::FrameChannel>> frames_;
  std::atomic<int> data_port_{0};
  std::atomic<bool> counts_clock_parts_{false};
  std::atomic<int64_t> frames_paused_until_ns_{0};
  std::atomic<uint64_t> next_sequence_{0};
  std::atomic<uint64_t> next_sparse_sequence_{0};

  absl::Mutex mu_;
  // An outage: calls failing since outage_start_; logged once per outage.
  bool in_outage_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time outage_start_ ABSL_GUARDED_BY(mu_);
  absl::Time last_warning_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool resyncing_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::function<void(absl::Status)>> resync_waiters_ ABSL_GUARDED_BY(mu_);
  absl::BitGen gen_ ABSL_GUARDED_BY(mu_);
  // Routed attempts in flight (AbandonDeparted).
  absl::flat_hash_set<PendingCall*> in_flight_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardtrain::client

#endif  // SHARDTRAIN_CLIENT_SHARD_CHANNEL_H_
