#include "sparse/table_config.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace shardtrain::sparse {
namespace {

absl::Status Invalid(absl::string_view table, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("table \"", table, "\": ", what));
}

bool Finite(float x) { return std::isfinite(x); }

}  // namespace

int32_t OptimizerStateWords(SparseOptimizerKind kind, int32_t dim) {
  switch (kind) {
    case SparseOptimizerKind::kSgd:
      return 0;
    case SparseOptimizerKind::kAdagrad:
      return dim;
    case SparseOptimizerKind::kRowWiseAdagrad:
      return 1;
    case SparseOptimizerKind::kAdam:
      return 2 * dim + 1;  // m, v, the row's step count
    case SparseOptimizerKind::kFtrl:
      return 2 * dim;  // z, n
  }
  return 0;
}

int32_t ValueWords(RowStorage storage, int32_t dim) {
  return storage == RowStorage::kBf16 ? (dim + 1) / 2 : dim;
}

absl::string_view SparseOptimizerName(SparseOptimizerKind kind) {
  switch (kind) {
    case SparseOptimizerKind::kSgd:
      return "sgd";
    case SparseOptimizerKind::kAdagrad:
      return "adagrad";
    case SparseOptimizerKind::kRowWiseAdagrad:
      return "rowwise_adagrad";
    case SparseOptimizerKind::kAdam:
      return "adam";
    case SparseOptimizerKind::kFtrl:
      return "ftrl";
  }
  return "?";
}

bool ParseSparseOptimizerName(absl::string_view name, SparseOptimizerKind* kind) {
  for (SparseOptimizerKind k :
       {SparseOptimizerKind::kSgd, SparseOptimizerKind::kAdagrad,
        SparseOptimizerKind::kRowWiseAdagrad, SparseOptimizerKind::kAdam,
        SparseOptimizerKind::kFtrl}) {
    if (name == SparseOptimizerName(k)) {
      *kind = k;
      return true;
    }
  }
  return false;
}

absl::Status ValidateTableConfig(const TableConfig& config, const TableLimits& limits) {
  const std::string& t = config.name;
  if (t.empty() || t.size() > 128) return Invalid(t, "name must be 1 to 128 bytes");
  if (config.dim < 1 || config.dim > limits.max_dim) {
    return Invalid(t, absl::StrCat("dim ", config.dim, " outside [1, ", limits.max_dim,
                                   "] (--max_table_dim)"));
  }
  if (!Finite(config.init.scale) || config.init.scale < 0) {
    return Invalid(t, "init scale must be finite and >= 0");
  }
  const SparseOptimizerOptions& o = config.optimizer;
  if (!Finite(o.learning_rate) || o.learning_rate <= 0) {
    return Invalid(t, "learning_rate must be finite and > 0");
  }
  if (!Finite(o.eps) || o.eps < 0) return Invalid(t, "eps must be finite and >= 0");
  if (!Finite(o.initial_accumulator) || o.initial_accumulator < 0) {
    return Invalid(t, "initial_accumulator must be finite and >= 0");
  }
  if (!(o.beta1 >= 0 && o.beta1 < 1) || !(o.beta2 >= 0 && o.beta2 < 1)) {
    return Invalid(t, "Adam's beta1 and beta2 must lie in [0, 1)");
  }
  if (!Finite(o.ftrl_beta) || o.ftrl_beta < 0 || !Finite(o.l1) || o.l1 < 0 ||
      !Finite(o.l2) || o.l2 < 0) {
    return Invalid(t, "FTRL's beta, l1 and l2 must be finite and >= 0");
  }
  const Admission& a = config.admission;
  if (a.kind == Admission::Kind::kProbability && !(a.probability > 0 && a.probability <= 1)) {
    return Invalid(t, "admission probability must lie in (0, 1]");
  }
  if (a.kind == Admission::Kind::kCount) {
    if (a.count < 1 || a.count > 15) return Invalid(t, "admission count must lie in [1, 15]");
    if (a.filter_counters < 64 || a.filter_counters > limits.max_filter_counters) {
      return Invalid(t, absl::StrCat("admission filter_counters outside [64, ",
                                     limits.max_filter_counters,
                                     "] (--max_table_filter_counters)"));
    }
  }
  const Eviction& e = config.eviction;
  if (e.ttl < 0 || e.ttl > UINT32_MAX / 2) {
    return Invalid(t, "eviction ttl must lie in [0, 2^31)");
  }
  if (e.capacity < 0 || e.capacity > limits.max_rows) {
    return Invalid(t, absl::StrCat("eviction capacity outside [0, ", limits.max_rows,
                                   "] (--max_table_rows)"));
  }
  if (e.capacity > 0 && e.capacity < 64) return Invalid(t, "eviction capacity must be >= 64");
  return absl::OkStatus();
}

}  // namespace shardtrain::sparse
