// TableConfig: everything a sparse embedding table is registered with: its
// name and row width, how an unseen id's row starts, the optimizer that
// updates rows, which ids may take a row (admission) and which rows leave
// (eviction). A table is registered once per job; every shard and replica
// holds the same config, so any of them builds the same rows.
//
//   TableConfig config;
//   config.name = "user_id";
//   config.dim = 16;
//   config.optimizer.kind = SparseOptimizerKind::kRowWiseAdagrad;
//   config.eviction.capacity = 50'000'000;
//   RETURN_IF_ERROR(ValidateTableConfig(config, limits));
#ifndef SHARDTRAIN_SPARSE_TABLE_CONFIG_H_
#define SHARDTRAIN_SPARSE_TABLE_CONFIG_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace shardtrain::sparse {

// How an unseen id's row starts. Element j of id's row is a pure function of
// (seed, table name, id, j) (sparse/row_initializer.h).
struct RowInit {
  enum class Kind { kZeros, kUniform, kNormal };
  Kind kind = Kind::kUniform;
  // Bound of U(-scale, scale) or stddev of N(0, scale^2).
  float scale = 0.01f;
  uint64_t seed = 0;
};

enum class SparseOptimizerKind {
  kSgd,             // w -= lr * g
  kAdagrad,         // per element: h += g^2; w -= lr * g / (sqrt(h) + eps)
  kRowWiseAdagrad,  // per row: h += mean(g^2); w -= lr * g / (sqrt(h) + eps)
  kAdam,            // lazy Adam, bias correction by the row's own step count
  kFtrl,            // FTRL-Proximal (McMahan et al. 2013), per element
};

struct SparseOptimizerOptions {
  SparseOptimizerKind kind = SparseOptimizerKind::kSgd;
  float learning_rate = 0.01f;  // FTRL: alpha
  // Adagrad, row-wise Adagrad: added to sqrt(h) (torch's default 1e-10).
  // Adam: added to sqrt(v) (torch's default 1e-8).
  float eps = 1e-10f;
  // Adagrad, row-wise Adagrad: h's starting value (>= 0).
  float initial_accumulator = 0.0f;
  float beta1 = 0.9f;    // Adam
  float beta2 = 0.999f;  // Adam
  float ftrl_beta = 1.0f;  // FTRL: beta of the per-coordinate rate
  float l1 = 0.0f;         // FTRL
  float l2 = 0.0f;         // FTRL
};

// Which unseen ids a training lookup gives a row. An id not admitted reads
// as its initial value, is not stored, and its gradients are dropped.
struct Admission {
  enum class Kind { kNone, kProbability, kCount };
  Kind kind = Kind::kNone;
  // kProbability: the chance each training lookup of an unseen id admits it.
  float probability = 1.0f;
  // kCount: an id takes a row at its count-th training lookup. Counts are
  // kept in a counting filter of 4-bit counters (so 1..15).
  int32_t count = 1;
  // kCount: counters in the filter (rounded up to a power of two); ids that
  // share all their counters are counted together, so size it to a few times
  // the number of distinct rare ids expected between evictions.
  int64_t filter_counters = int64_t{1} << 24;
};

// Which rows leave. Both limits may be set.
struct Eviction {
  enum class Policy { kLru, kLfu };
  // Rows not updated nor looked up for training within ttl units of the
  // table's clock are removed by a sweep (EmbeddingTable::EvictExpired);
  // 0 turns it off. The clock is training steps, or seconds when
  // ttl_in_seconds.
  int64_t ttl = 0;
  bool ttl_in_seconds = false;
  // The most rows this shard stores of the table; 0: no bound besides the
  // shard's --max_table_rows. When full, the least recently (kLru) or least
  // frequently (kLfu) used rows make room, a 1/64 of the capacity at a time.
  int64_t capacity = 0;
  Policy policy = Policy::kLru;
};

// How a row's values are stored; its optimizer state is f32 either way.
// kBf16 halves the values' bytes: a lookup reads them widened to f32, and
// an update is computed in f32 and rounded back stochastically (element j
// up with the probability of its remainder, drawn by a counter-based hash
// of the table, the id, the table's update count and j, so replicas
// applying the same updates round alike), so steps far below bf16's
// resolution (2^-8 of the value) still move a row by the right amount on
// average where rounding to nearest would drop them.
enum class RowStorage { kF32, kBf16 };

struct TableConfig {
  std::string name;
  int32_t dim = 0;
  RowStorage storage = RowStorage::kF32;
  RowInit init;
  SparseOptimizerOptions optimizer;
  Admission admission;
  Eviction eviction;
};

// The bounds a process accepts configs within (each one a flag of the
// process that holds tables).
struct TableLimits {
  int32_t max_dim = 1024;
  int64_t max_rows = int64_t{1} << 31;  // per table per shard
  int64_t max_filter_counters = int64_t{1} << 30;
};

// INVALID_ARGUMENT naming the field for a config that is out of range.
absl::Status ValidateTableConfig(const TableConfig& config, const TableLimits& limits);

// 32-bit words of optimizer state per row for `kind` at `dim`.
int32_t OptimizerStateWords(SparseOptimizerKind kind, int32_t dim);
// 32-bit words of a row's values: dim f32, or dim bf16 rounded up to words.
int32_t ValueWords(RowStorage storage, int32_t dim);

absl::string_view SparseOptimizerName(SparseOptimizerKind kind);
// "sgd" | "adagrad" | "rowwise_adagrad" | "adam" | "ftrl".
bool ParseSparseOptimizerName(absl::string_view name, SparseOptimizerKind* kind);

}  // namespace shardtrain::sparse

#endif  // SHARDTRAIN_SPARSE_TABLE_CONFIG_H_
