#include "sparse/table_config.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardtrain::sparse {
namespace {

using ::testing::HasSubstr;

TableConfig Good() {
  TableConfig c;
  c.name = "user";
  c.dim = 16;
  return c;
}

void ExpectInvalid(const TableConfig& c, const std::string& what, TableLimits limits = {}) {
  absl::Status s = ValidateTableConfig(c, limits);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << what;
  EXPECT_THAT(std::string(s.message()), HasSubstr(what));
}

TEST(TableConfigTest, AcceptsDefaults) { EXPECT_TRUE(ValidateTableConfig(Good(), {}).ok()); }

TEST(TableConfigTest, RefusesEachFieldOutOfRange) {
  TableConfig c = Good();
  c.name = "";
  ExpectInvalid(c, "name");
  c = Good();
  c.dim = 0;
  ExpectInvalid(c, "--max_table_dim");
  c.dim = 17;
  TableLimits limits;
  limits.max_dim = 16;
  ExpectInvalid(c, "dim 17", limits);
  c = Good();
  c.optimizer.learning_rate = std::nanf("");
  ExpectInvalid(c, "learning_rate");
  c = Good();
  c.optimizer.beta2 = 1.0f;
  ExpectInvalid(c, "beta2");
  c = Good();
  c.admission.kind = Admission::Kind::kProbability;
  c.admission.probability = 0.0f;
  ExpectInvalid(c, "probability");
  c = Good();
  c.admission.kind = Admission::Kind::kCount;
  c.admission.count = 16;
  ExpectInvalid(c, "count");
  c.admission.count = 3;
  c.admission.filter_counters = int64_t{1} << 40;
  ExpectInvalid(c, "--max_table_filter_counters");
  c = Good();
  c.eviction.capacity = limits.max_rows + 1;
  ExpectInvalid(c, "--max_table_rows");
  c.eviction.capacity = 10;
  ExpectInvalid(c, ">= 64");
  c = Good();
  c.eviction.ttl = -1;
  ExpectInvalid(c, "ttl");
}

TEST(TableConfigTest, StateWordsPerOptimizer) {
  EXPECT_EQ(OptimizerStateWords(SparseOptimizerKind::kSgd, 16), 0);
  EXPECT_EQ(OptimizerStateWords(SparseOptimizerKind::kAdagrad, 16), 16);
  EXPECT_EQ(OptimizerStateWords(SparseOptimizerKind::kRowWiseAdagrad, 16), 1);
  EXPECT_EQ(OptimizerStateWords(SparseOptimizerKind::kAdam, 16), 33);
  EXPECT_EQ(OptimizerStateWords(SparseOptimizerKind::kFtrl, 16), 32);
}

TEST(TableConfigTest, OptimizerNamesRoundTrip) {
  for (auto k : {SparseOptimizerKind::kSgd, SparseOptimizerKind::kAdagrad,
                 SparseOptimizerKind::kRowWiseAdagrad, SparseOptimizerKind::kAdam,
                 SparseOptimizerKind::kFtrl}) {
    SparseOptimizerKind parsed;
    ASSERT_TRUE(ParseSparseOptimizerName(SparseOptimizerName(k), &parsed));
    EXPECT_EQ(parsed, k);
  }
  SparseOptimizerKind parsed;
  EXPECT_FALSE(ParseSparseOptimizerName("lamb", &parsed));
}

}  // namespace
}  // namespace shardtrain::sparse
