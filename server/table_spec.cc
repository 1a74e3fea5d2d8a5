#include "server/table_spec.h"

#include "absl/strings/str_cat.h"

namespace shardtrain::server {

sparse::TableLimits TableLimitsOf(const ResourceLimits& limits) {
  sparse::TableLimits out;
  out.max_dim = limits.max_table_dim;
  out.max_rows = limits.max_table_rows;
  out.max_filter_counters = limits.max_table_filter_counters;
  return out;
}

absl::StatusOr<sparse::TableConfig> TableConfigFromSpec(const TableSpec& spec,
                                                        const ResourceLimits& limits) {
  auto invalid = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("table \"", spec.name(), "\": ", what));
  };
  sparse::TableConfig c;
  c.name = spec.name();
  c.dim = spec.dim();
  switch (spec.dtype()) {
    case DTYPE_UNSPECIFIED:
    case DTYPE_F32:
      c.storage = sparse::RowStorage::kF32;
      break;
    case DTYPE_BF16:
      c.storage = sparse::RowStorage::kBf16;
      break;
    default:
      return invalid("rows are stored as f32 (DTYPE_F32) or bf16 (DTYPE_BF16)");
  }
  switch (spec.init()) {
    case TableSpec::INIT_UNIFORM:
      c.init.kind = sparse::RowInit::Kind::kUniform;
      break;
    case TableSpec::INIT_NORMAL:
      c.init.kind = sparse::RowInit::Kind::kNormal;
      break;
    case TableSpec::INIT_ZEROS:
      c.init.kind = sparse::RowInit::Kind::kZeros;
      break;
    default:
      return invalid(absl::StrCat("unknown init ", spec.init()));
  }
  c.init.scale = spec.init_scale();
  c.init.seed = spec.seed();
  const std::string optimizer = spec.optimizer().empty() ? "sgd" : spec.optimizer();
  if (!sparse::ParseSparseOptimizerName(optimizer, &c.optimizer.kind)) {
    return invalid(absl::StrCat("unknown optimizer \"", optimizer,
                                "\" (sgd, adagrad, rowwise_adagrad, adam, ftrl)"));
  }
  sparse::SparseOptimizerOptions& o = c.optimizer;
  o.learning_rate = spec.learning_rate();
  // Zero means the method's usual value.
  o.eps = spec.eps() != 0 ? spec.eps()
                          : (o.kind == sparse::SparseOptimizerKind::kAdam ? 1e-8f : 1e-10f);
  o.initial_accumulator = spec.initial_accumulator();
  o.beta1 = spec.beta1() != 0 ? spec.beta1() : 0.9f;
  o.beta2 = spec.beta2() != 0 ? spec.beta2() : 0.999f;
  o.ftrl_beta = spec.ftrl_beta() != 0 ? spec.ftrl_beta() : 1.0f;
  o.l1 = spec.l1();
  o.l2 = spec.l2();
  if (spec.admission().empty() || spec.admission() == "none") {
    c.admission.kind = sparse::Admission::Kind::kNone;
  } else if (spec.admission() == "probability") {
    c.admission.kind = sparse::Admission::Kind::kProbability;
    c.admission.probability = spec.admission_probability();
  } else if (spec.admission() == "count") {
    c.admission.kind = sparse::Admission::Kind::kCount;
    c.admission.count = spec.admission_count();
    if (spec.admission_filter_counters() != 0) {
      c.admission.filter_counters = spec.admission_filter_counters();
    }
  } else {
    return invalid(absl::StrCat("unknown admission \"", spec.admission(),
                                "\" (none, probability, count)"));
  }
  c.eviction.ttl = spec.ttl();
  c.eviction.ttl_in_seconds = spec.ttl_in_seconds();
  c.eviction.capacity = spec.capacity();
  if (spec.eviction().empty() || spec.eviction() == "lru") {
    c.eviction.policy = sparse::Eviction::Policy::kLru;
  } else if (spec.eviction() == "lfu") {
    c.eviction.policy = sparse::Eviction::Policy::kLfu;
  } else {
    return invalid(absl::StrCat("unknown eviction \"", spec.eviction(), "\" (lru, lfu)"));
  }
  if (absl::Status s = sparse::ValidateTableConfig(c, TableLimitsOf(limits)); !s.ok()) return s;
  return c;
}

}  // namespace shardtrain::server
