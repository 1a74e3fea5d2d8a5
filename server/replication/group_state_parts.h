// A replica group's state (GroupStateResponse, GroupReplica::Export) cut into
// the parts FetchGroupState streams to a joining member, and put back
// together there, so a group of any size crosses within --max_message_mb.
//
//   for (GroupStateResponse& part : SplitGroupState(std::move(state), bytes))
//     send(part);
//   ...
//   GroupStateResponse state;
//   while (receive(&part)) AppendGroupStatePart(std::move(part), &state);
//
// Pure functions of their arguments; thread-compatible.
#ifndef SHARDTRAIN_SERVER_REPLICATION_GROUP_STATE_PARTS_H_
#define SHARDTRAIN_SERVER_REPLICATION_GROUP_STATE_PARTS_H_

#include <cstdint>
#include <vector>

#include "proto/shardtrain.pb.h"

namespace shardtrain::server {

// The most bytes of one part when a message may have `max_message_bytes`:
// 4 MiB, or half the limit where that is less.
int64_t GroupStatePartBytes(int64_t max_message_bytes);
// The most bytes of a table's rows (and as many of its admission filter's)
// in one record of a group's state: a quarter of the limit, no more than
// 32 MiB, so that a record with both fits in a message.
int64_t GroupStateRecordBytes(int64_t max_message_bytes);

// `state`'s records, in order, in parts of at most `part_bytes` serialized
// bytes each (a record larger than that alone in its part), and its push
// logs in the last part. At least one part, even for an empty state.
std::vector<GroupStateResponse> SplitGroupState(GroupStateResponse state, int64_t part_bytes);

// Appends `part` (the next of SplitGroupState's parts) to `state`.
void AppendGroupStatePart(GroupStateResponse part, GroupStateResponse* state);

}  // namespace shardtrain::server

#endif  // SHARDTRAIN_SERVER_REPLICATION_GROUP_STATE_PARTS_H_
