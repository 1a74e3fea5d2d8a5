// TableMetrics: the Prometheus families of a shard's sparse tables, each
// labelled by table, and each table's own series.
#ifndef SHARDTRAIN_SERVER_TABLE_METRICS_H_
#define SHARDTRAIN_SERVER_TABLE_METRICS_H_

#include <string>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

namespace shardtrain::server {

class TableMetrics {
 public:
  // One table's series.
  struct Series {
    prometheus::Gauge* rows;
    prometheus::Gauge* capacity;
    prometheus::Gauge* bytes_per_row;
    prometheus::Counter* lookups;
    prometheus::Counter* created;
    prometheus::Counter* rejected;      // admission said no
    prometheus::Counter* full;          // no row could be freed
    prometheus::Counter* evicted_ttl;
    prometheus::Counter* evicted_capacity;
    prometheus::Counter* applied;
    prometheus::Counter* dropped;       // gradients of rows not stored
    prometheus::Histogram* unique_ids;  // ids per PushSparse request
    prometheus::Histogram* lookup_ids;  // ids per training Lookup request
    // The shard's time in one Lookup or PushSparse of the table (waiting for
    // its lock and the work on its rows; not the RPC's transfer or a sync
    // lookup's wait for the step, which shardtrain_rpc_duration_seconds has).
    prometheus::Histogram* lookup_seconds;
    prometheus::Histogram* push_seconds;
    // Per PushSparse request: the newest clock the table has seen from any
    // worker minus the request's clock.
    prometheus::Histogram* staleness;
    // Sync tables: steps applied, and workers whose push of the open step
    // is in (a step stuck at N-1 waits for the last worker).
    prometheus::Gauge* sync_steps;
    prometheus::Gauge* step_arrivals;
  };

  // Registers the families in `registry`, which must outlive this.
  explicit TableMetrics(prometheus::Registry& registry);

  Series ForTable(const std::string& table);

 private:
  prometheus::Family<prometheus::Gauge>& rows_;
  prometheus::Family<prometheus::Gauge>& capacity_;
  prometheus::Family<prometheus::Gauge>& bytes_per_row_;
  prometheus::Family<prometheus::Counter>& lookups_;
  prometheus::Family<prometheus::Counter>& created_;
  prometheus::Family<prometheus::Counter>& rejected_;
  prometheus::Family<prometheus::Counter>& evicted_;
  prometheus::Family<prometheus::Counter>& gradients_;
  prometheus::Family<prometheus::Histogram>& unique_ids_;
  prometheus::Family<prometheus::Histogram>& lookup_ids_;
  prometheus::Family<prometheus::Histogram>& op_seconds_;
  prometheus::Family<prometheus::Histogram>& staleness_;
  prometheus::Family<prometheus::Gauge>& sync_steps_;
  prometheus::Family<prometheus::Gauge>& step_arrivals_;
};

}  // namespace shardtrain::server

#endif  // SHARDTRAIN_SERVER_TABLE_METRICS_H_
