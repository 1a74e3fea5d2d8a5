#include "server/replication/group_state_parts.h"

#include <algorithm>
#include <utility>

namespace shardtrain::server {

int64_t GroupStatePartBytes(int64_t max_message_bytes) {
  return std::max<int64_t>(1, std::min<int64_t>(int64_t{4} << 20, max_message_bytes / 2));
}

int64_t GroupStateRecordBytes(int64_t max_message_bytes) {
  return std::max<int64_t>(1, std::min<int64_t>(int64_t{32} << 20, max_message_bytes / 4));
}

std::vector<GroupStateResponse> SplitGroupState(GroupStateResponse state, int64_t part_bytes) {
  std::vector<GroupStateResponse> parts(1);
  int64_t bytes = 0;
  for (CheckpointRecord& record : *state.mutable_records()) {
    // A record's bytes in its part: its own, a tag and a length.
    const int64_t size = static_cast<int64_t>(record.ByteSizeLong()) + 1 + 10;
    if (bytes > 0 && bytes + size > part_bytes) {
      parts.emplace_back();
      bytes = 0;
    }
    *parts.back().add_records() = std::move(record);
    bytes += size;
  }
  GroupStateResponse& last = parts.back();
  last.mutable_push_logs()->Swap(state.mutable_push_logs());
  last.mutable_table_push_logs()->Swap(state.mutable_table_push_logs());
  return parts;
}

void AppendGroupStatePart(GroupStateResponse part, GroupStateResponse* state) {
  for (CheckpointRecord& record : *part.mutable_records()) {
    *state->add_records() = std::move(record);
  }
  for (PushLogState& log : *part.mutable_push_logs()) {
    *state->add_push_logs() = std::move(log);
  }
  for (PushLogState& log : *part.mutable_table_push_logs()) {
    *state->add_table_push_logs() = std::move(log);
  }
}

}  // namespace shardtrain::server
