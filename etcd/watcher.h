// Watcher: delivers the puts and deletes under one etcd key prefix, in
// revision order, from a thread of its own. Made by EtcdClient::Watch:
//
//   std::unique_ptr<Watcher> watcher = etcd->Watch(
//       "/chain/", read.revision + 1, [&](const WatchEvent& e) {
//         if (e.type == WatchEvent::Type::kPut) Reconfigure(e.key, e.value);
//       });
//   ...
//   watcher.reset();  // stops; no callback runs after the destructor returns
//
// When the stream breaks (etcd restarted, connection lost) the watcher
// reconnects with a backoff and resumes from the revision after the last
// one it delivered, so no event is lost or delivered twice. A stream on an
// etcd member that loses its leader, or that another call on the connection
// found dead or cut off, resumes on the next member (one that just stops
// answering is noticed by gRPC's keep-alive pings within 15 s). It ends for
// good only when etcd refuses the watch (e.g. the revision to resume from
// was compacted), or when etcd's revision went back past the one to resume
// from (DATA_LOSS: etcd lost its data, or was restored from an older
// backup; resuming would wait for revisions that already happened once):
// on_error is then called once, and the owner starts again from a fresh
// read.
//
// Callbacks run on the watcher's thread, one at a time; they must not
// destroy the watcher. Thread-safe; the destructor cancels the stream and
// joins the thread.
#ifndef SHARDTRAIN_ETCD_WATCHER_H_
#define SHARDTRAIN_ETCD_WATCHER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace grpc {
class ClientContext;
}  // namespace grpc

namespace shardtrain::etcd {

namespace internal {
class Connection;
struct Member;
}  // namespace internal

struct WatchEvent {
  enum class Type { kPut, kDelete };
  Type type = Type::kPut;
  std::string key;
  // Empty for kDelete.
  std::string value;
  // The revision of the change (of the deletion for kDelete).
  int64_t mod_revision = 0;
};

class Watcher {
 public:
  using EventCallback = std::function<void(const WatchEvent&)>;
  using ErrorCallback = std::function<void(absl::Status)>;

  // Made by EtcdClient::Watch.
  ~Watcher();
  Watcher(const Watcher&) = delete;
  Watcher& operator=(const Watcher&) = delete;

  // The revision the watch resumes from after a reconnect (0 before the
  // first stream was created when watching from "now").
  int64_t next_revision() const;
  // Number of streams created so far (1 + reconnects).
  int64_t streams() const;

 private:
  friend class EtcdClient;
  // Starts the thread.
  Watcher(std::shared_ptr<internal::Connection> connection, std::string prefix,
          int64_t start_revision, EventCallback on_event, ErrorCallback on_error);

  void Run();
  // One stream to `member` from next_revision_ until it breaks or the watcher stops.
  // FAILED_PRECONDITION or OUT_OF_RANGE end the watch for good; other
  // errors are retried. *created: etcd accepted the watch.
  absl::Status RunStream(const internal::Member& member, bool* created);
  bool Stopping() const;

  const std::shared_ptr<internal::Connection> connection_;
  const std::string prefix_;
  const EventCallback on_event_;
  const ErrorCallback on_error_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t next_revision_ ABSL_GUARDED_BY(mu_);
  int64_t streams_ ABSL_GUARDED_BY(mu_) = 0;
  // The open stream's context (owned by RunStream's stack), so that the
  // destructor can cancel a blocked Read.
  grpc::ClientContext* in_flight_ ABSL_GUARDED_BY(mu_) = nullptr;
  // The member that stream is open on.
  const internal::Member* in_flight_member_ ABSL_GUARDED_BY(mu_) = nullptr;

  // Connection::AddListener's id, removed by the destructor.
  const int listener_;
  std::thread thread_;  // Last: starts after everything above is set.
};

}  // namespace shardtrain::etcd

#endif  // SHARDTRAIN_ETCD_WATCHER_H_
