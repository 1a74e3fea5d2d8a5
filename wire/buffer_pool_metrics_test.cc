#include "wire/buffer_pool_metrics.h"

#include <map>
#include <string>

#include "gtest/gtest.h"
#include "wire/buffer_pool.h"

namespace shardtrain::wire {
namespace {

// "name" or "name{label=value}" -> the value of each metric collected.
std::map<std::string, double> Values(const BufferPoolMetrics& metrics) {
  std::map<std::string, double> values;
  for (const prometheus::MetricFamily& family : metrics.Collect()) {
    for (const prometheus::ClientMetric& metric : family.metric) {
      std::string key = family.name;
      for (const prometheus::ClientMetric::Label& label : metric.label) {
        key += "{" + label.name + "=" + label.value + "}";
      }
      values[key] = family.type == prometheus::MetricType::Counter ? metric.counter.value
                                                                     : metric.gauge.value;
    }
  }
  return values;
}

TEST(BufferPoolMetricsTest, EachScrapeReadsThePoolAsItIsThen) {
  constexpr size_t kMiB = size_t{1} << 20;
  BufferPool pool(2 * kMiB);
  const BufferPoolMetrics metrics(&pool);
  std::map<std::string, double> values = Values(metrics);
  EXPECT_EQ(values.size(), 5u);
  EXPECT_EQ(values["shardtrain_buffer_pool_kept_bytes"], 0);
  EXPECT_EQ(values["shardtrain_buffer_pool_max_kept_bytes"], 2 * kMiB);
  EXPECT_EQ(values["shardtrain_buffer_pool_allocations_total{served=fresh}"], 0);

  char* blocks[3];
  for (char*& block : blocks) block = pool.Allocate(kMiB);
  for (char* block : blocks) BufferPool::Release(block);  // the third is over the bound
  char* again = pool.Allocate(kMiB);
  values = Values(metrics);
  EXPECT_EQ(values["shardtrain_buffer_pool_kept_bytes"], kMiB);
  EXPECT_EQ(values["shardtrain_buffer_pool_allocations_total{served=fresh}"], 3);
  EXPECT_EQ(values["shardtrain_buffer_pool_allocations_total{served=reused}"], 1);
  EXPECT_EQ(values["shardtrain_buffer_pool_freed_total"], 1);

  pool.set_max_kept_bytes(0);
  BufferPool::Release(again);
  values = Values(metrics);
  EXPECT_EQ(values["shardtrain_buffer_pool_kept_bytes"], 0);
  EXPECT_EQ(values["shardtrain_buffer_pool_max_kept_bytes"], 0);
  EXPECT_EQ(values["shardtrain_buffer_pool_freed_total"], 3);
}

}  // namespace
}  // namespace shardtrain::wire
