// RowInitializer: the starting value of an id's row, a pure function of
// (seed, table, id) computed with a counter-based hash, so a shard, its
// replicas, a restarted shard and an evaluation lookup of an id never stored
// all produce the same row without shipping it. Thread-compatible (const).
#ifndef SHARDTRAIN_SPARSE_ROW_INITIALIZER_H_
#define SHARDTRAIN_SPARSE_ROW_INITIALIZER_H_

#include <cstdint>

#include "absl/strings/string_view.h"
#include "sparse/table_config.h"

namespace shardtrain::sparse {

class RowInitializer {
 public:
  RowInitializer(const RowInit& init, absl::string_view table, int32_t dim);

  // Writes id's starting row: dim floats.
  void Fill(uint64_t id, float* row) const;

 private:
  RowInit::Kind kind_;
  float scale_;
  uint64_t key_;
  int32_t dim_;
};

}  // namespace shardtrain::sparse

#endif  // SHARDTRAIN_SPARSE_ROW_INITIALIZER_H_
