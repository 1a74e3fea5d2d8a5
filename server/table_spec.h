// The TableSpec a worker registers a sparse table with, as the table config
// a shard builds the table from (sparse/table_config.h), and the limits of
// this shard's flags that every config is checked against.
#ifndef SHARDTRAIN_SERVER_TABLE_SPEC_H_
#define SHARDTRAIN_SERVER_TABLE_SPEC_H_

#include "absl/status/statusor.h"
#include "proto/shardtrain.pb.h"
#include "server/resource_limits.h"
#include "sparse/table_config.h"

namespace shardtrain::server {

// INVALID_ARGUMENT naming the field (and the flag of a limit) for a spec
// out of range or naming an unknown optimizer, admission or eviction.
absl::StatusOr<sparse::TableConfig> TableConfigFromSpec(const TableSpec& spec,
                                                        const ResourceLimits& limits);

sparse::TableLimits TableLimitsOf(const ResourceLimits& limits);

}  // namespace shardtrain::server

#endif  // SHARDTRAIN_SERVER_TABLE_SPEC_H_
