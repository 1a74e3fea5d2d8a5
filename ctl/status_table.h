// Human-readable tables of a cluster's state for psctl.
#ifndef SHARDTRAIN_CTL_STATUS_TABLE_H_
#define SHARDTRAIN_CTL_STATUS_TABLE_H_

#include <string>
#include <vector>

#include "proto/shardtrain.pb.h"

namespace shardtrain::ctl {

// One table of shards (partitions, parameters, version range, updates,
// drops, staleness, checkpoint age, uptime) and one of workers (clock per
// shard, state, time since heartbeat), with a summary line. `addresses[i]`
// is where statuses[i] came from.
std::string FormatClusterStatus(const std::vector<std::string>& addresses,
                                const std::vector<StatusResponse>& statuses);

// "950ms", "12.3s", "4m05s", "2h03m".
std::string FormatAge(double seconds);

}  // namespace shardtrain::ctl

#endif  // SHARDTRAIN_CTL_STATUS_TABLE_H_
