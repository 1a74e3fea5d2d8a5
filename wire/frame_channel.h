// FrameChannel: one framed TCP connection to a shard's data port
// (server/data_port.h), carrying the data path's calls as frames
// (wire/frame_header.h) instead of HTTP/2 streams: a worker's Push, Pull,
// PushPull, Lookup and PushSparse, and a chain member's Replicate to its
// successor (server/replication/forwarder.h). A call's request is written by
// the calling thread with one sendmsg straight from its slices; the
// connection's reader thread reads each answer into one slice
// (wire/frame_socket.h) and runs the call's `done`. Calls overlap on the
// connection, matched by call id.
//
// The connection opens on the first call and again on the first call after
// it failed. With a TlsContext (wire/tls_context.h) it is a TLS
// connection, verified as the gRPC channel to the same shard is, whose
// first frame carries the shared token (DataMethod::kHello) when there is
// one. The connect and the handshake hold no lock: a host that does not answer holds
// up only the calls that need the connection, each no longer than its
// deadline or the connect timeout, and not past its cancel (a call
// cancelled while it connects, or waits for another call's connect, ends
// at once), set_port or the channel's end (either cuts the connect short).
// A call's deadline travels with it (the shard's parked pulls give up at
// it) and is kept here too: a call not answered by then ends with
// DEADLINE_EXCEEDED, and a late answer is dropped. When the connection
// fails, its calls end with UNAVAILABLE.
//
//   FrameChannel channel("10.0.0.7", data_port, max_message_bytes);
//   channel.Call(DataMethod::kPush, request, &response, deadline,
//                [](grpc::Status status, bool reached) { ... }, &attempt_cancel);
//
// `reached` is false when the call surely did not reach the shard's
// handlers (the port did not accept a connection, or closed it without
// answering anything on it, as a shard at --max_data_connections does): the
// caller may send it another way (gRPC) at once. Retries are the caller's
// (client/shard_channel.h); Cancel ends a call at once (a routed call whose
// shard left the chain). `done` never runs while the call's request is
// still being written: after it, nothing here reads the request's bytes,
// so a retry may re-encode them. Thread-safe.
#ifndef SHARDTRAIN_WIRE_FRAME_CHANNEL_H_
#define SHARDTRAIN_WIRE_FRAME_CHANNEL_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/status.h>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "wire/attempt_cancel.h"
#include "wire/frame_header.h"
#include "wire/frame_socket.h"
#include "wire/interrupter.h"
#include "wire/tls_context.h"

namespace shardtrain::wire {

class FrameChannel {
 public:
  using Done = std::function<void(grpc::Status status, bool reached)>;

  // Calls go to `host`:`port` (set_port may change it); answers over
  // `max_message_bytes` end the connection with RESOURCE_EXHAUSTED. `tls`
  // (a client context; null: plaintext) secures each connection.
  FrameChannel(std::string host, int port, uint64_t max_message_bytes,
               absl::Duration connect_timeout = absl::Seconds(5),
               std::shared_ptr<const TlsContext> tls = nullptr);
  // Ends the calls in flight with CANCELLED (their `done` runs) and joins
  // the reader.
  ~FrameChannel();
  FrameChannel(const FrameChannel&) = delete;
  FrameChannel& operator=(const FrameChannel&) = delete;

  // Sends `request` as `method`; the answer's body goes to *response (alive
  // until `done`), and `done` runs once, on the reader thread or on this
  // one (a call that failed before it was sent, or ended while it was
  // written). With `cancel`, the call registers there how to end it:
  // while it waits for its connection (it ends with CANCELLED, reached: it
  // must not be sent another way, it was cancelled), then, before its
  // request is written, its Cancel (a write blocked on a shard that stopped
  // reading is cut short too). Returns the call's id for Cancel; 0 when it
  // ended unsent.
  uint64_t Call(DataMethod method, const grpc::ByteBuffer& request,
                grpc::ByteBuffer* response, absl::Time deadline, Done done,
                AttemptCancel* cancel = nullptr);
  // Ends call `call_id` with CANCELLED (reached) if it has not ended; its
  // answer, if one comes, is dropped. A call still being written ends when
  // its write does: its connection is shut down to cut the write short
  // (the connection's other calls end with UNAVAILABLE).
  void Cancel(uint64_t call_id) ABSL_LOCKS_EXCLUDED(mu_);

  const std::string& host() const { return host_; }
  int port() const ABSL_LOCKS_EXCLUDED(mu_);
  // The shard restarted on another data port: later calls go there, and
  // the open connection (to the old one) is closed, or the connect to the
  // old one cut short (its calls end unsent).
  void set_port(int port) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // One opened connection and its reader; a failed one is replaced.
  struct Connection {
    std::unique_ptr<FrameSocket> socket;
    absl::Mutex write_mu;  // one frame written at a time
    std::thread reader;
    std::atomic<bool> reader_done{false};
    bool failed = false;        // guarded by FrameChannel::mu_
    bool answered_any = false;  // guarded by FrameChannel::mu_
  };
  struct Pending {
    grpc::ByteBuffer* response;
    absl::Time deadline;
    Done done;
    std::weak_ptr<Connection> connection;  // the one it is sent on
    // Call() is still writing the request: an end that comes meanwhile is
    // recorded (ended, status, reached) and Call() runs `done` after the
    // write.
    bool writing = true;
    bool ended = false;
    grpc::Status status;
    bool reached = true;
  };

  // A call that waits for a connection: its own connect, or another's.
  struct OpenWait {
    bool cancelled = false;   // guarded by FrameChannel::mu_
    bool connecting = false;  // this call connects; guarded by FrameChannel::mu_
  };

  // Reads `connection`'s answers until it fails.
  void Read(Connection* connection);
  // The open connection, opened now if there is none. A `cancel` of the
  // call while it waits ends that wait with CANCELLED and sets *cancelled.
  absl::StatusOr<std::shared_ptr<Connection>> Open(absl::Time deadline, AttemptCancel* cancel,
                                                   bool* cancelled) ABSL_LOCKS_EXCLUDED(mu_);
  // AttemptCancel's callback for a call in Open: ends its wait, and cuts
  // the connect short if the call is the one connecting.
  void CancelOpen(OpenWait* wait) ABSL_LOCKS_EXCLUDED(mu_);
  // No call is connecting, or the channel is closing.
  bool ConnectSettled() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends `connection`'s calls with `status` (`reached` unless nothing was
  // ever answered on it) and marks it failed.
  void Fail(Connection* connection, const grpc::Status& status);
  // Ends the calls whose deadline has passed.
  void Expire(absl::Time now);
  // Ends the call at `it` with `status`: moves it to *ended to have its
  // `done` run (outside mu_), or, while Call() still writes it, records
  // the end for Call() to deliver.
  void EndLocked(absl::flat_hash_map<uint64_t, Pending>::iterator it, grpc::Status status,
                 bool reached, std::vector<Pending>* ended) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string host_;
  const uint64_t max_message_bytes_;
  const absl::Duration connect_timeout_;
  const std::shared_ptr<const TlsContext> tls_;

  mutable absl::Mutex mu_;
  int port_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<Connection> connection_ ABSL_GUARDED_BY(mu_);
  // Failed connections whose reader may still be running.
  std::vector<std::shared_ptr<Connection>> retired_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, Pending> pending_ ABSL_GUARDED_BY(mu_);
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  // A call is connecting (outside mu_); the others wait for it.
  bool connecting_ ABSL_GUARDED_BY(mu_) = false;
  // Cuts that connect short (set_port, the destructor, its call's cancel).
  std::shared_ptr<Interrupter> connect_interrupter_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardtrain::wire

#endif  // SHARDTRAIN_WIRE_FRAME_CHANNEL_H_
