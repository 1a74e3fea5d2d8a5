// ResourceLimits: what one shard may hold and one request may ask for.
//
// Every limit is checked before anything is allocated or changed, and a
// request over one is refused with RESOURCE_EXHAUSTED (or INVALID_ARGUMENT
// for a malformed count) and a message naming the limit and its flag.
#ifndef SHARDTRAIN_SERVER_RESOURCE_LIMITS_H_
#define SHARDTRAIN_SERVER_RESOURCE_LIMITS_H_

#include <cstdint>

namespace shardtrain::server {

struct ResourceLimits {
  // Parameter elements over all tensors on this shard (optimizer slots come
  // on top: 2x more for Adam). --max_stored_elements.
  int64_t max_stored_elements = int64_t{1} << 30;
  // Tensors registered on this shard. --max_tensors.
  int64_t max_tensors = 100000;
  // Tensors in one Register request. --max_tensors_per_request.
  int max_tensors_per_request = 10000;
  // Parts (partitions) in one Push or Pull request. --max_parts_per_request.
  int max_parts_per_request = 65536;
  // Partitions that get their own version gauge in /metrics; the rest are
  // summarised. --max_partition_metrics.
  int max_partition_metrics = 256;
  // Bytes of parameters one Pull may ask for: a larger answer would not fit
  // in a gRPC message. ps-server sets it from --max_message_mb.
  int64_t max_response_bytes = int64_t{256} << 20;

  // Sparse tables registered on this shard. --max_tables.
  int max_tables = 64;
  // A table's embedding dim. --max_table_dim.
  int max_table_dim = 1024;
  // Rows of one table on this shard (a table's capacity is at most this;
  // one without a capacity stops creating rows here). --max_table_rows.
  int64_t max_table_rows = int64_t{1} << 28;
  // Ids in one Lookup or PushSparse request. --max_table_ids_per_request.
  int64_t max_table_ids_per_request = int64_t{1} << 20;
  // Counters of a table's admission filter. --max_table_filter_counters.
  int64_t max_table_filter_counters = int64_t{1} << 30;
};

}  // namespace shardtrain::server

#endif  // SHARDTRAIN_SERVER_RESOURCE_LIMITS_H_
