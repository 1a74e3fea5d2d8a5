// Options of one parameter-server shard. Flags live in server/main.cc and are
// copied into this struct; tests fill it directly.
#ifndef SHARDTRAIN_SERVER_SHARD_OPTIONS_H_
#define SHARDTRAIN_SERVER_SHARD_OPTIONS_H_

#include <cstdint>

#include "absl/time/time.h"
#include "common/partition.h"
#include "server/optimizer.h"
#include "server/resource_limits.h"

namespace shardtrain::server {

enum class ConsistencyMode { kSync, kAsync };

struct ShardOptions {
  // This shard's index and how tensors are cut and placed in the cluster.
  int shard_index = 0;
  common::PartitionConfig partitioning;

  ConsistencyMode mode = ConsistencyMode::kAsync;
  // Workers in the job; worker ids are 0 .. num_workers-1.
  int num_workers = 1;
  // sync: gradients averaged per step; 0 means every live worker.
  int replicas_to_aggregate = 0;
  // async: a worker more than this many clocks ahead of the slowest live
  // worker waits on its pull (SSP); negative disables the bound.
  int64_t max_staleness = -1;
  // async: scale each update by 1 / max(1, staleness).
  bool staleness_aware_lr = false;

  OptimizerOptions optimizer;

  // A worker silent for this long is forgotten: it no longer holds back
  // sync steps or the staleness bound.
  absl::Duration heartbeat_timeout = absl::Seconds(10);
  // The longest a pull may wait for a step or the staleness bound.
  absl::Duration max_pull_wait = absl::Seconds(120);
  // A worker never seen this long after the shard started no longer holds
  // back sync steps or the staleness bound; it joins whenever it arrives.
  absl::Duration join_timeout = absl::Seconds(60);

  // sync: each partition's state is copied as its version reaches a
  // multiple of this, and the shard's copies of one step form a
  // checkpoint; every shard uses the same steps, so their checkpoints
  // agree (server/step_snapshot.h). 0: no step checkpoints.
  int64_t checkpoint_every_steps = 0;

  // Replicated shards: each replica group's partitions live on a chain of
  // this many shards (server/replication/); 1 holds only this shard's own
  // group, as without replication.
  int replicas = 1;

  // What one shard holds and one request may ask for; checked before any
  // allocation (server/resource_limits.h).
  ResourceLimits limits;
};

}  // namespace shardtrain::server

#endif  // SHARDTRAIN_SERVER_SHARD_OPTIONS_H_
