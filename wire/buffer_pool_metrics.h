// BufferPoolMetrics: a BufferPool's figures for Prometheus, read from the
// pool at every scrape (nothing is counted on the pool's own path).
//
//   shardtrain_buffer_pool_kept_bytes          gauge    released bytes kept for reuse
//   shardtrain_buffer_pool_max_kept_bytes      gauge    the bound (--buffer_pool_mb)
//   shardtrain_buffer_pool_allocations_total   counter  {served="fresh"|"reused"}
//   shardtrain_buffer_pool_freed_total         counter  released blocks freed, not kept
//
// Many fresh allocations and frees against few reuses, with the kept bytes
// at the bound, say the bound is too low for the process's large messages.
//
//   exposer->AddCollectable(
//       std::make_shared<wire::BufferPoolMetrics>(&wire::BufferPool::Default()));
//
// Thread-safe.
#ifndef SHARDTRAIN_WIRE_BUFFER_POOL_METRICS_H_
#define SHARDTRAIN_WIRE_BUFFER_POOL_METRICS_H_

#include <vector>

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include "wire/buffer_pool.h"

namespace shardtrain::wire {

class BufferPoolMetrics : public prometheus::Collectable {
 public:
  // `pool` is not owned and must outlive this.
  explicit BufferPoolMetrics(const BufferPool* pool) : pool_(pool) {}

  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const BufferPool* const pool_;
};

}  // namespace shardtrain::wire

#endif  // SHARDTRAIN_WIRE_BUFFER_POOL_METRICS_H_
