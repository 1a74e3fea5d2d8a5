#include "server/table_metrics.h"

#include "common/rpc_metrics.h"

namespace shardtrain::server {

TableMetrics::TableMetrics(prometheus::Registry& registry)
    : rows_(prometheus::BuildGauge()
                .Name("shardtrain_table_rows")
                .Help("Rows of a sparse table stored on this shard")
                .Register(registry)),
      capacity_(prometheus::BuildGauge()
                    .Name("shardtrain_table_capacity_rows")
                    .Help("Rows a sparse table may store on this shard before evicting "
                          "(or, without a capacity, refusing new rows)")
                    .Register(registry)),
      bytes_per_row_(prometheus::BuildGauge()
                         .Name("shardtrain_table_bytes_per_row")
                         .Help("Bytes a sparse table holds (index, records, admission "
                               "filter) per stored row")
                         .Register(registry)),
      lookups_(prometheus::BuildCounter()
                   .Name("shardtrain_table_lookups_total")
                   .Help("Ids looked up in a sparse table for training")
                   .Register(registry)),
      created_(prometheus::BuildCounter()
                   .Name("shardtrain_table_rows_created_total")
                   .Help("Rows created in a sparse table (ids admitted)")
                   .Register(registry)),
      rejected_(prometheus::BuildCounter()
                    .Name("shardtrain_table_admission_rejected_total")
                    .Help("Training lookups of unseen ids given no row, by reason: "
                          "admission, or full (nothing could be evicted)")
                    .Register(registry)),
      evicted_(prometheus::BuildCounter()
                   .Name("shardtrain_table_evictions_total")
                   .Help("Rows evicted from a sparse table, by reason: ttl or capacity")
                   .Register(registry)),
      gradients_(prometheus::BuildCounter()
                     .Name("shardtrain_table_gradients_total")
                     .Help("Row gradients received by a sparse table, by result: applied, "
                           "or dropped (the id has no row)")
                     .Register(registry)),
      unique_ids_(prometheus::BuildHistogram()
                      .Name("shardtrain_table_push_ids")
                      .Help("Unique ids per PushSparse request")
                      .Register(registry)),
      lookup_ids_(prometheus::BuildHistogram()
                      .Name("shardtrain_table_lookup_ids")
                      .Help("Ids per training Lookup request (the client sends each id of "
                            "a batch once)")
                      .Register(registry)),
      op_seconds_(prometheus::BuildHistogram()
                      .Name("shardtrain_table_op_seconds")
                      .Help("The shard's time in one Lookup or PushSparse of a sparse table "
                            "(its lock and the work on the rows), by op")
                      .Register(registry)),
      staleness_(prometheus::BuildHistogram()
                     .Name("shardtrain_table_push_staleness_steps")
                     .Help("Steps a PushSparse request's clock is behind the newest clock "
                           "the table has seen from any worker (lookups and pushes): how "
                           "far the others went on while its rows were in flight")
                     .Register(registry)),
      sync_steps_(prometheus::BuildGauge()
                      .Name("shardtrain_table_sync_steps")
                      .Help("Steps a sync table has applied on this shard (each the mean "
                            "of every worker's push)")
                      .Register(registry)),
      step_arrivals_(prometheus::BuildGauge()
                         .Name("shardtrain_table_step_arrivals")
                         .Help("Workers whose push of a sync table's open step this shard "
                               "has; the step is applied when all have pushed")
                         .Register(registry)) {}

TableMetrics::Series TableMetrics::ForTable(const std::string& table) {
  Series s;
  s.rows = &rows_.Add({{"table", table}});
  s.capacity = &capacity_.Add({{"table", table}});
  s.bytes_per_row = &bytes_per_row_.Add({{"table", table}});
  s.lookups = &lookups_.Add({{"table", table}});
  s.created = &created_.Add({{"table", table}});
  s.rejected = &rejected_.Add({{"table", table}, {"reason", "admission"}});
  s.full = &rejected_.Add({{"table", table}, {"reason", "full"}});
  s.evicted_ttl = &evicted_.Add({{"table", table}, {"reason", "ttl"}});
  s.evicted_capacity = &evicted_.Add({{"table", table}, {"reason", "capacity"}});
  s.applied = &gradients_.Add({{"table", table}, {"result", "applied"}});
  s.dropped = &gradients_.Add({{"table", table}, {"result", "dropped"}});
  const prometheus::Histogram::BucketBoundaries ids{64,    256,    1024,   4096,
                                                    16384, 65536, 262144, 1048576};
  s.unique_ids = &unique_ids_.Add({{"table", table}}, ids);
  s.lookup_ids = &lookup_ids_.Add({{"table", table}}, ids);
  s.lookup_seconds =
      &op_seconds_.Add({{"table", table}, {"op", "lookup"}}, common::LatencyBuckets());
  s.push_seconds = &op_seconds_.Add({{"table", table}, {"op", "push"}}, common::LatencyBuckets());
  s.staleness = &staleness_.Add(
      {{"table", table}}, prometheus::Histogram::BucketBoundaries{0, 1, 2, 4, 8, 16, 32, 64, 128});
  s.sync_steps = &sync_steps_.Add({{"table", table}});
  s.step_arrivals = &step_arrivals_.Add({{"table", table}});
  return s;
}

}  // namespace shardtrain::server
