// PushLog: the pushes of one worker that a shard applied to one replica
// group, by sequence, so that a push the worker retries (its answer was
// lost) is answered again instead of applied twice.
//
// The log keeps a window of kWindow sequences below the highest applied:
// an older sequence cannot be told apart and is refused. A new worker
// incarnation (a restarted worker) starts a new log once its first push is
// applied. Replicas follow the head's log (Record) and a shard that copies
// a group's state copies its logs (Export, Import; server/push_logs.h holds
// a shard's logs).
//
//   absl::MutexLock lock(&log.mu());  // held from the check to the record
//   ASSIGN_OR_RETURN(std::optional<int64_t> staleness, log.Find(incarnation, seq));
//   if (staleness.has_value()) return Duplicate(*staleness);
//   ... apply ...
//   log.Record(incarnation, seq, max_staleness);
//
// Thread-safe as annotated: the caller holds mu() around each call, and
// around a check, the push it guards and its record.
#ifndef SHARDTRAIN_SERVER_PUSH_LOG_H_
#define SHARDTRAIN_SERVER_PUSH_LOG_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/shardtrain.pb.h"

namespace shardtrain::server {

class PushLog {
 public:
  // Sequences at most this far below the highest applied one are known.
  static constexpr int64_t kWindow = 4096;

  absl::Mutex& mu() const ABSL_LOCK_RETURNED(mu_) { return mu_; }

  // The max_staleness answered when push `sequence` of `worker_incarnation`
  // was applied; nullopt if it was not (a push of a new incarnation never
  // was). FAILED_PRECONDITION when the sequence is older than the window.
  absl::StatusOr<std::optional<int64_t>> Find(uint64_t worker_incarnation,
                                              uint64_t sequence) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Notes push `sequence` of `worker_incarnation` as applied, answered with
  // `staleness`; a new incarnation replaces the log.
  void Record(uint64_t worker_incarnation, uint64_t sequence, int64_t staleness)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The log as a group's state carries it (all but `worker`); false, and
  // `*out` untouched, when nothing was applied yet.
  bool Export(PushLogState* out) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Replaces the log with `in` (Export's). INVALID_ARGUMENT, the log
  // unchanged, when its sequences and staleness do not pair up.
  absl::Status Import(const PushLogState& in) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

 private:
  // Starts an empty log for `worker_incarnation`.
  void Reset(uint64_t worker_incarnation) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  uint64_t incarnation_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t highest_ ABSL_GUARDED_BY(mu_) = 0;
  // Indexed by sequence % kWindow: the push's max_staleness, or -1 if that
  // sequence was not applied. Allocated on first use.
  std::vector<int64_t> applied_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardtrain::server

#endif  // SHARDTRAIN_SERVER_PUSH_LOG_H_
