// RowOptimizer: the update rule of a sparse table, applied to one row at a
// time where that row's gradient arrives (lazily: rows without a gradient
// keep their state untouched, as torch's sparse optimizers do).
//
// A row's optimizer state is state_words() 32-bit words stored beside its
// value in the same record (sparse/row_store.h), so value and state are
// always read, written, replicated and checkpointed together:
//   sgd              none
//   adagrad          h[dim]           h += g^2;        w -= lr g / (sqrt(h) + eps)
//   rowwise_adagrad  h                h += mean(g^2);  w -= lr g / (sqrt(h) + eps)
//   adam             m[dim] v[dim] t  t += 1; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
//                                     w -= lr sqrt(1-b2^t)/(1-b1^t) m / (sqrt(v) + eps)
//                                     (torch.optim.SparseAdam's form, with the row's
//                                     own step count t instead of the tensor's)
//   ftrl             z[dim] n[dim]    FTRL-Proximal: s = (sqrt(n + g^2) - sqrt(n)) / lr;
//                                     z += g - s w; n += g^2;
//                                     w = |z| <= l1 ? 0 : -(z - sign(z) l1) /
//                                                        ((beta + sqrt(n)) / lr + l2)
// Thread-compatible (const after construction).
#ifndef SHARDTRAIN_SPARSE_ROW_OPTIMIZER_H_
#define SHARDTRAIN_SPARSE_ROW_OPTIMIZER_H_

#include <cstdint>

#include "sparse/table_config.h"

namespace shardtrain::sparse {

class RowOptimizer {
 public:
  // REQUIRES: options and dim passed ValidateTableConfig.
  RowOptimizer(const SparseOptimizerOptions& options, int32_t dim);

  int32_t state_words() const { return state_words_; }

  // Writes a new row's state.
  void InitState(uint32_t* state) const;

  // Applies the gradient g (dim floats, finite) to row w and its state,
  // with learning rate lr_scale * learning_rate.
  void Apply(float* w, uint32_t* state, const float* g, float lr_scale) const;

 private:
  SparseOptimizerOptions options_;
  int32_t dim_;
  int32_t state_words_;
};

}  // namespace shardtrain::sparse

#endif  // SHARDTRAIN_SPARSE_ROW_OPTIMIZER_H_
