// PushLogs: a shard's push logs (server/push_log.h), one per (replica group
// it holds, worker), as a replica group's state carries them.
//
//   PushLogs logs(/*groups=*/{2, 0, 1}, /*num_workers=*/4);
//   PushLog& log = logs.Of(group, worker);   // lock log.mu() to use it
//   logs.Export(group, state.mutable_push_logs());  // for a joining member
//   RETURN_IF_ERROR(other.Import(group, state.push_logs(), "push log"));
//
// The set of logs is fixed at construction; each log is thread-safe as
// PushLog says, so PushLogs is thread-safe.
#ifndef SHARDTRAIN_SERVER_PUSH_LOGS_H_
#define SHARDTRAIN_SERVER_PUSH_LOGS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "proto/shardtrain.pb.h"
#include "server/push_log.h"

namespace shardtrain::server {

class PushLogs {
 public:
  // Logs for each of `groups` (distinct, >= 0) and each worker in
  // [0, num_workers).
  PushLogs(const std::vector<int>& groups, int num_workers);

  // `group`'s index among the groups held, or -1 when it is not held.
  int SlotOf(int group) const {
    return group >= 0 && group < static_cast<int>(slot_of_.size()) ? slot_of_[group] : -1;
  }
  bool Holds(int group) const { return SlotOf(group) >= 0; }

  // REQUIRES: Holds(group), worker < num_workers.
  PushLog& Of(int group, uint32_t worker) const {
    return *logs_[static_cast<size_t>(SlotOf(group)) * static_cast<size_t>(num_workers_) +
                  worker];
  }

  // Appends `group`'s logs that hold something, each exported under its
  // lock, to `out`. REQUIRES: Holds(group).
  void Export(int group, google::protobuf::RepeatedPtrField<PushLogState>* out) const;
  // Replaces `group`'s logs of the workers named in `in` (Export's), each
  // under its lock. INVALID_ARGUMENT for a group not held, a worker outside
  // [0, num_workers) or a log PushLog::Import refuses (logs before it are
  // imported); `what` names the logs in the message.
  absl::Status Import(int group, const google::protobuf::RepeatedPtrField<PushLogState>& in,
                      absl::string_view what);

 private:
  const int num_workers_;
  std::vector<int> slot_of_;  // by group
  std::vector<std::unique_ptr<PushLog>> logs_;
};

}  // namespace shardtrain::server

#endif  // SHARDTRAIN_SERVER_PUSH_LOGS_H_
