// Forwarder: sends pushes down a replica chain, fetches a group's state and
// asks how a member sees it, shard to shard.
//
// Forward sends a push (the worker's request bytes as received plus the
// replicated ops the head appended; no copy of the tensors) to this shard's
// successor in the group's newest chain as a Replicate RPC, and calls `done`
// once the successor answered OK, which it does only after the tail has
// applied it. When the chain changes under a forward (the successor died,
// a new tail joined) the forward is sent again to whoever is the successor
// now (at once when this shard sees the new chain, even mid-backoff); a
// member that already applied it skips it (per-partition operation
// counts), so nothing is applied twice. A shard that became the tail
// completes its forwards at once; one that left the chain fails them; one
// fenced while its lease is confirmed (ChainTable::Fence) holds them until
// it serves again or the chain drops it.
// Forwards are pipelined: any number may be in flight. A forward in
// flight to a successor that hangs or is cut off (no reset comes back) is
// cancelled and sent again as soon as the chain drops that successor
// (AbandonDeparted), not after its attempt's deadline.
//
// With `data_ports`, a forward goes to the successor's data port as a
// Replicate frame (wire/frame_channel.h: plain TCP, no HTTP/2) once the
// forwarder has learned that port: it asks each successor (each
// incarnation) for it with a Status call in the background, and sends by
// gRPC meanwhile, to a successor without a data port (--data_listen
// empty), and for a while after its port did not take a call. With
// `data_tls` (the shard's peer TLS, a client context) those connections are
// TLS, verified and with the token as the gRPC forwards are.
//
//   forwarder.Forward(group, std::move(request), absl::Seconds(30),
//                     [reactor](absl::Status status) { ... });
//
// Thread-safe.
#ifndef SHARDTRAIN_SERVER_REPLICATION_FORWARDER_H_
#define SHARDTRAIN_SERVER_REPLICATION_FORWARDER_H_

#include <functional>
#include <map>
#include <memory>
#include <string>

#include <grpcpp/channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/channel_arguments.h>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "wire/attempt_cancel.h"
#include "wire/frame_channel.h"
#include "wire/tls_context.h"
#include "proto/shardtrain.grpc.pb.h"
#include "server/replication/chain_table.h"
#include "server/replication/replication_metrics.h"

namespace shardtrain::server {

class Forwarder {
 public:
  // `table` and `metrics` must outlive the forwarder. `data_ports` and
  // `data_tls`: see the file comment.
  Forwarder(const ChainTable* table, std::shared_ptr<grpc::ChannelCredentials> credentials,
            grpc::ChannelArguments args, ReplicationMetrics* metrics, bool data_ports = false,
            std::shared_ptr<const wire::TlsContext> data_tls = nullptr);
  // Waits (up to 5 s) for the forwards (and data port questions) in flight
  // to end.
  ~Forwarder();

  // See the file comment. `request` is a PushRequest with its replicated
  // ops; each attempt appends the chain epoch it is sent under. `done`
  // gets UNAVAILABLE once `timeout` has passed without the successor's OK;
  // with absl::InfiniteDuration() the forward goes on until the tail has
  // it, this shard leaves the chain, a successor refuses it for good or
  // Stop (a head's own operations: see Replicator).
  void Forward(int group, grpc::ByteBuffer request, absl::Duration timeout,
               std::function<void(absl::Status)> done);

  // Asks `address` (this shard's predecessor in `group`'s chain at `epoch`)
  // for the group's state: its parts, put together. The copy of a large
  // group takes as long as its bytes need, so `part_timeout` bounds the wait
  // for each part (the first one included: a predecessor that hangs fails
  // it soon) and `timeout` the whole. DEADLINE_EXCEEDED when either runs out.
  absl::StatusOr<GroupStateResponse> FetchGroupState(const std::string& address, int group,
                                                     int64_t epoch, absl::Duration part_timeout,
                                                     absl::Duration timeout);

  // How the shard at `address` sees `group` (its Status RPC's chain entry):
  // its epoch, position, operations applied and whether it still copies
  // the group's state. NOT_FOUND when it does not hold the group.
  absl::StatusOr<ChainState> MemberState(const std::string& address, int group,
                                         absl::Duration timeout);

  // `group`'s chain changed (the coordinator adopted a newer one): forwards
  // in flight to an address that is no longer this shard's successor in it
  // are cancelled and sent again under the new chain. Returns how many.
  int AbandonDeparted(int group);

  // Ends retries: forwards still waiting fail with UNAVAILABLE.
  void Stop();

 private:
  struct Call;
  // A successor's data port, learned for one incarnation of it.
  struct DataPeer {
    std::unique_ptr<wire::FrameChannel> frames;  // null: no usable host
    uint64_t incarnation = 0;
    bool known = false;   // frames has the port of that incarnation
    bool asking = false;  // a Status call for it is in flight
    absl::Time ask_after = absl::InfinitePast();
  };

  void Attempt(Call* call);
  // Sends the attempt over gRPC / as a frame on `frames`.
  void SendGrpc(Call* call);
  void SendFrame(Call* call, wire::FrameChannel* frames);
  // An attempt ended with `status`: done, retried or failed.
  void Attempted(Call* call, const grpc::Status& status);
  // The data port channel to `member`, or null (then gRPC: the port is not
  // known yet, or there is none). *ask: the caller is to ask for the port
  // (AskDataPort, after releasing mu_).
  wire::FrameChannel* FramesToLocked(const chain::ChainConfig::Member& member, bool* ask)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Asks `address` for its data port (a Status call), for `incarnation`.
  void AskDataPort(const std::string& address, uint64_t incarnation) ABSL_LOCKS_EXCLUDED(mu_);
  // `address`'s data port did not take a call: gRPC for a while, then ask again.
  void FramesUnreachable(const std::string& address) ABSL_LOCKS_EXCLUDED(mu_);
  void Retry(Call* call, absl::Status why);
  // Waits until call->retry_at, or until the group's chain epoch moves past
  // the attempt's, then attempts again.
  void ArmRetry(Call* call);
  void End(Call* call, absl::Status status);
  std::shared_ptr<grpc::Channel> ChannelTo(const std::string& address);

  const ChainTable* const table_;
  const std::shared_ptr<grpc::ChannelCredentials> credentials_;
  const grpc::ChannelArguments args_;
  ReplicationMetrics* const metrics_;
  const bool data_ports_;
  const std::shared_ptr<const wire::TlsContext> data_tls_;

  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<grpc::Channel>> channels_ ABSL_GUARDED_BY(mu_);
  // By address; kept for the forwarder's life (a channel follows its
  // shard to a new port with set_port).
  std::map<std::string, DataPeer> data_peers_ ABSL_GUARDED_BY(mu_);
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  // Attempts in flight (AbandonDeparted).
  absl::flat_hash_set<Call*> attempts_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace shardtrain::server

#endif  // SHARDTRAIN_SERVER_REPLICATION_FORWARDER_H_
