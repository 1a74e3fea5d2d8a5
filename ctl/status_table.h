// Human-readable tables of a cluster's state for psctl.
#ifndef SHARDTRAIN_CTL_STATUS_TABLE_H_
#define SHARDTRAIN_CTL_STATUS_TABLE_H_

#include <string>
#include <vector>

#include "proto/shardtrain.pb.h"

namespace shardtrain::ctl {

// Renders what psctl status shows. `addresses[i]` is where statuses[i] came
// from; a shard that did not answer has mode "DOWN".
//  - one line per shard: tensors, partitions, stored parameters, version
//    range, updates, duplicate pushes, drops, staleness, checkpoint age,
//    uptime and incarnation (from the summary fields, so they cover every
//    partition even when the listing is cut short);
//  - one line per expected worker (also those never seen): state across the
//    shards (live, done, gone = forgotten on some shard, never joined),
//    time since it was last heard of, rejoins and its clock on each shard;
//  - a summary: expected vs live workers, and which workers are missing:
//    in sync mode for which step (the slowest partition's version) and for
//    how long; the staleness spread;
//  - with replicas > 1, the chains each shard serves (FormatChainStates);
//  - the sparse tables and each shard's share of their rows
//    (FormatTableStates);
//  - the first `max_partitions_shown` listed partitions of each shard.
std::string FormatClusterStatus(const std::vector<std::string>& addresses,
                                const std::vector<StatusResponse>& statuses,
                                int max_partitions_shown = 0);

// The chains section of psctl status, empty when no answering shard runs
// with replicas > 1: one line per shard and group it serves (epoch, members
// head..tail, its position, pushes applied, at the head the lag = applied
// minus acknowledged by the tail, and whether it is catching up), then a
// line for each group with fewer members than replicas (DEGRADED) and each
// group whose shards disagree on the epoch (a change not seen everywhere yet).
std::string FormatChainStates(const std::vector<std::string>& addresses,
                              const std::vector<StatusResponse>& statuses);

// The sparse tables section of psctl status, empty when no answering shard
// holds a table: per table its dim and optimizer, then each shard's rows,
// capacity (and how full), and bytes per row; and the total rows.
std::string FormatTableStates(const std::vector<std::string>& addresses,
                              const std::vector<StatusResponse>& statuses);

// "950ms", "12.3s", "4m05s", "2h03m".
std::string FormatAge(double seconds);

}  // namespace shardtrain::ctl

#endif  // SHARDTRAIN_CTL_STATUS_TABLE_H_
