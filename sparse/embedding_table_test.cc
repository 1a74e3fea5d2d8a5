#include "sparse/embedding_table.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sparse/row_initializer.h"

namespace shardtrain::sparse {
namespace {

using ::testing::HasSubstr;

TableConfig Config(int dim = 4) {
  TableConfig c;
  c.name = "items";
  c.dim = dim;
  c.init.kind = RowInit::Kind::kUniform;
  c.init.scale = 0.1f;
  c.init.seed = 5;
  c.optimizer.kind = SparseOptimizerKind::kSgd;
  c.optimizer.learning_rate = 1.0f;
  return c;
}

std::unique_ptr<EmbeddingTable> Make(const TableConfig& c, TableLimits limits = {}) {
  auto table = EmbeddingTable::Create(c, limits);
  EXPECT_TRUE(table.ok()) << table.status();
  return std::move(*table);
}

std::vector<float> Initial(const TableConfig& c, uint64_t id) {
  std::vector<float> row(c.dim);
  RowInitializer(c.init, c.name, c.dim).Fill(id, row.data());
  return row;
}

std::vector<float> Train(EmbeddingTable& t, std::vector<uint64_t> ids, uint32_t now = 1) {
  std::vector<float> out(ids.size() * t.dim());
  t.LookupForTraining(ids, now, out.data());
  return out;
}

std::vector<float> Read(const EmbeddingTable& t, std::vector<uint64_t> ids) {
  std::vector<float> out(ids.size() * t.dim());
  t.LookupReadOnly(ids, out.data());
  return out;
}

TEST(EmbeddingTableTest, RefusesABadConfig) {
  TableConfig c = Config();
  c.dim = 0;
  EXPECT_EQ(EmbeddingTable::Create(c, {}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(EmbeddingTableTest, TrainingLookupCreatesRowsAtTheirInitialValue) {
  TableConfig c = Config();
  auto t = Make(c);
  std::vector<float> out = Train(*t, {7, 9, 7});
  EXPECT_EQ(t->rows(), 2);
  EXPECT_EQ(t->counters().created, 2);
  EXPECT_EQ(std::vector<float>(out.begin(), out.begin() + 4), Initial(c, 7));
  EXPECT_EQ(std::vector<float>(out.begin() + 4, out.begin() + 8), Initial(c, 9));
  EXPECT_EQ(std::vector<float>(out.begin() + 8, out.end()), Initial(c, 7));
}

TEST(EmbeddingTableTest, ReadOnlyLookupStoresNothing) {
  TableConfig c = Config();
  auto t = Make(c);
  EXPECT_EQ(Read(*t, {3}), Initial(c, 3));
  EXPECT_EQ(t->rows(), 0);
}

TEST(EmbeddingTableTest, ApplyUpdatesStoredRowsAndDropsOthers) {
  TableConfig c = Config();
  auto t = Make(c);
  Train(*t, {1, 2});
  const std::vector<float> grads = {1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3};
  EXPECT_EQ(t->Apply({1, 2, 99}, grads.data(), 2, 1.0f), 2);
  EXPECT_EQ(t->counters().dropped, 1);
  std::vector<float> want1 = Initial(c, 1), want2 = Initial(c, 2);
  for (float& x : want1) x -= 1;
  for (float& x : want2) x -= 2;
  std::vector<float> got = Read(*t, {1, 2, 99});
  EXPECT_EQ(std::vector<float>(got.begin(), got.begin() + 4), want1);
  EXPECT_EQ(std::vector<float>(got.begin() + 4, got.begin() + 8), want2);
  EXPECT_EQ(t->rows(), 2);  // 99 was not created by the push
}

TEST(EmbeddingTableTest, CountAdmissionKeepsRareIdsOut) {
  TableConfig c = Config();
  c.admission.kind = Admission::Kind::kCount;
  c.admission.count = 3;
  c.admission.filter_counters = 1 << 16;
  auto t = Make(c);
  // Ids 0..99 are seen twice, 100..199 three times.
  for (int round = 0; round < 3; ++round) {
    std::vector<uint64_t> ids;
    for (uint64_t id = round < 2 ? 0 : 100; id < 200; ++id) ids.push_back(id);
    std::vector<float> out = Train(*t, ids);
    // Not admitted or not: every id reads as its initial value.
    for (size_t i = 0; i < ids.size(); ++i) {
      ASSERT_EQ(std::vector<float>(out.begin() + i * 4, out.begin() + i * 4 + 4),
                Initial(c, ids[i]));
    }
  }
  for (uint64_t id = 0; id < 100; ++id) ASSERT_FALSE(t->ReadRecord(id).has_value()) << id;
  for (uint64_t id = 100; id < 200; ++id) ASSERT_TRUE(t->ReadRecord(id).has_value()) << id;
  EXPECT_EQ(t->rows(), 100);
  EXPECT_EQ(t->counters().rejected, 400);  // the first two lookups of each id
}

// The counts go with the rows: a table loaded from another's records and
// filter admits an id on the lookup that would have admitted it there.
TEST(EmbeddingTableTest, ExportedFilterKeepsTheCounts) {
  TableConfig c = Config();
  c.admission.kind = Admission::Kind::kCount;
  c.admission.count = 3;
  c.admission.filter_counters = 1 << 12;
  auto before = Make(c);
  std::vector<uint64_t> ids;
  for (uint64_t id = 0; id < 50; ++id) ids.push_back(id);
  Train(*before, ids);
  Train(*before, ids);  // counted twice, not admitted
  std::string records, filter;
  before->ExportRecords(&records);
  before->ExportFilter(&filter);
  EXPECT_EQ(static_cast<int64_t>(filter.size()), int64_t{1} << 11);

  auto after = Make(c);
  ASSERT_TRUE(after->ImportRecords(records).ok());
  ASSERT_TRUE(after->ImportFilter(filter).ok());
  Train(*after, ids);
  EXPECT_EQ(after->rows(), 50);
  // Without the counters the third lookup is only the first.
  auto fresh = Make(c);
  Train(*fresh, ids);
  EXPECT_EQ(fresh->rows(), 0);

  // Counters of another size, or for a table without a filter, are refused
  // and change nothing.
  EXPECT_EQ(after->ImportFilter(filter.substr(8)).code(), absl::StatusCode::kInvalidArgument);
  const int64_t total = static_cast<int64_t>(filter.size());
  EXPECT_FALSE(after->FilterPieceFits(total - 8, 0, total - 8));
  EXPECT_TRUE(after->FilterPieceFits(total - 8, 8, total));
  EXPECT_FALSE(after->FilterPieceFits(16, total - 8, total));  // past the end
  std::string again;
  after->ExportFilter(&again);
  EXPECT_NE(again, filter);  // the third lookup counted
  auto plain = Make(Config());
  EXPECT_EQ(plain->ImportFilter(filter).code(), absl::StatusCode::kInvalidArgument);
  std::string none;
  plain->ExportFilter(&none);
  EXPECT_TRUE(none.empty());
}

TEST(EmbeddingTableTest, ProbabilityAdmissionAdmitsAboutThatShare) {
  TableConfig c = Config();
  c.admission.kind = Admission::Kind::kProbability;
  c.admission.probability = 0.25f;
  auto t = Make(c);
  std::vector<uint64_t> ids(20000);
  std::iota(ids.begin(), ids.end(), 0);
  Train(*t, ids);
  EXPECT_NEAR(t->rows() / 20000.0, 0.25, 0.02);
}

TEST(EmbeddingTableTest, LruCapacityEvictsTheLeastRecentlyUsedRows) {
  TableConfig c = Config();
  c.eviction.capacity = 640;  // evicts 10 at a time
  auto t = Make(c);
  // Row id is used last at step id + 1.
  for (uint64_t id = 0; id < 640; ++id) Train(*t, {id}, static_cast<uint32_t>(id + 1));
  // Touch 0..4 again, late: they become the most recent.
  Train(*t, {0, 1, 2, 3, 4}, 1000);
  EXPECT_EQ(t->rows(), 640);
  Train(*t, {5000}, 1001);
  EXPECT_LE(t->rows(), 640);
  EXPECT_EQ(t->counters().evicted_capacity, 10);
  // The 10 least recent: 5..14.
  for (uint64_t id = 0; id < 640; ++id) {
    EXPECT_EQ(t->ReadRecord(id).has_value(), id < 5 || id >= 15) << id;
  }
  ASSERT_TRUE(t->ReadRecord(5000).has_value());
}

TEST(EmbeddingTableTest, LfuCapacityEvictsTheLeastFrequentlyUsedRows) {
  TableConfig c = Config();
  c.eviction.capacity = 64;
  c.eviction.policy = Eviction::Policy::kLfu;
  auto t = Make(c);
  for (uint64_t id = 0; id < 64; ++id) {
    for (uint64_t k = 0; k <= id; ++k) Train(*t, {id}, 1);  // id used id + 1 times
  }
  Train(*t, {1000, 1001}, 2);
  EXPECT_EQ(t->counters().evicted_capacity, 2);
  EXPECT_FALSE(t->ReadRecord(0).has_value());
  EXPECT_FALSE(t->ReadRecord(1).has_value());
  EXPECT_TRUE(t->ReadRecord(2).has_value());
}

TEST(EmbeddingTableTest, EvictedIdComesBackAsAFreshRow) {
  TableConfig c = Config();
  c.eviction.ttl = 10;
  auto t = Make(c);
  Train(*t, {1}, 1);
  const std::vector<float> g = {1, 1, 1, 1};
  t->Apply({1}, g.data(), 2, 1.0f);
  EXPECT_NE(Read(*t, {1}), Initial(c, 1));
  EXPECT_EQ(t->EvictExpired(12), 0);  // 10 steps since the last use
  EXPECT_EQ(t->EvictExpired(13), 1);
  EXPECT_EQ(t->rows(), 0);
  EXPECT_EQ(t->counters().evicted_ttl, 1);
  EXPECT_EQ(Train(*t, {1}, 14), Initial(c, 1));
}

TEST(EmbeddingTableTest, TtlKeepsRowsInUse) {
  TableConfig c = Config();
  c.eviction.ttl = 5;
  auto t = Make(c);
  Train(*t, {1, 2, 3}, 1);
  Train(*t, {2}, 8);
  const std::vector<float> g = {1, 1, 1, 1};
  t->Apply({3}, g.data(), 9, 1.0f);
  EXPECT_EQ(t->EvictExpired(10), 1);
  EXPECT_FALSE(t->ReadRecord(1).has_value());
  EXPECT_TRUE(t->ReadRecord(2).has_value());
  EXPECT_TRUE(t->ReadRecord(3).has_value());
}

TEST(EmbeddingTableTest, MemoryStaysUnderTheCapacity) {
  TableConfig c = Config(16);
  c.eviction.capacity = 4096;
  c.optimizer.kind = SparseOptimizerKind::kRowWiseAdagrad;
  auto t = Make(c);
  const int64_t bytes_at_start = t->bytes();
  for (uint32_t step = 1; step <= 50; ++step) {
    std::vector<uint64_t> ids(1000);
    std::iota(ids.begin(), ids.end(), uint64_t{step} * 1000);
    Train(*t, ids, step);
    ASSERT_LE(t->rows(), 4096);
  }
  // Index sized for the capacity up front; records for at most the
  // capacity's rows, the free list and the bitmap of rows in use.
  EXPECT_LE(t->bytes(), bytes_at_start + int64_t{t->record_bytes()} * 4096 + 65536);
}

TEST(EmbeddingTableTest, RecordsRoundTripWholeRows) {
  TableConfig c = Config(3);
  c.optimizer.kind = SparseOptimizerKind::kAdam;
  c.optimizer.learning_rate = 0.01f;
  c.optimizer.eps = 1e-8f;
  auto t = Make(c);
  Train(*t, {10, 20, 30}, 1);
  const std::vector<float> g = {1, 2, 3, -1, -2, -3};
  t->Apply({10, 20}, g.data(), 2, 1.0f);
  t->Apply({10}, g.data(), 3, 1.0f);
  std::string records;
  t->ExportRecords(&records);
  EXPECT_EQ(records.size(), 3u * t->record_bytes());
  auto copy = Make(c);
  ASSERT_TRUE(copy->ImportRecords(records).ok());
  EXPECT_EQ(copy->rows(), 3);
  for (uint64_t id : {10, 20, 30}) EXPECT_EQ(copy->ReadRecord(id), t->ReadRecord(id)) << id;
  // The restored Adam state goes on where it was: the same next update.
  t->Apply({10}, g.data(), 4, 1.0f);
  copy->Apply({10}, g.data(), 4, 1.0f);
  EXPECT_EQ(copy->ReadRecord(10), t->ReadRecord(10));
}

TEST(EmbeddingTableTest, BadRecordsChangeNothing) {
  TableConfig c = Config();
  auto t = Make(c);
  Train(*t, {1, 2}, 1);
  std::string records;
  t->ExportRecords(&records);
  const std::string before = records;
  auto target = Make(c);
  Train(*target, {2}, 1);
  const auto target_row2 = target->ReadRecord(2);
  absl::Status s = target->ImportRecords(records.substr(1));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("multiple"));
  // A NaN in the second record's value: the first must not land either.
  const float nan = std::nanf("");
  std::memcpy(&records[t->record_bytes() + 8], &nan, 4);
  s = target->ImportRecords(records);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("non-finite"));
  EXPECT_EQ(target->rows(), 1);
  EXPECT_EQ(target->ReadRecord(2), target_row2);
  EXPECT_FALSE(target->ReadRecord(1).has_value());
}

TEST(EmbeddingTableTest, ImportBeyondCapacityIsRefused) {
  TableConfig c = Config();
  auto t = Make(c);
  std::vector<uint64_t> ids(100);
  std::iota(ids.begin(), ids.end(), 0);
  Train(*t, ids);
  std::string records;
  t->ExportRecords(&records);
  TableConfig small = c;
  small.eviction.capacity = 64;
  auto target = Make(small);
  EXPECT_EQ(target->ImportRecords(records).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(target->rows(), 0);
}

TEST(EmbeddingTableTest, SameOperationsGiveBitIdenticalTables) {
  // What keeps replicas identical: admission draws, eviction order and
  // initial values depend only on the operations and their order.
  TableConfig c = Config(8);
  c.optimizer.kind = SparseOptimizerKind::kRowWiseAdagrad;
  c.admission.kind = Admission::Kind::kProbability;
  c.admission.probability = 0.5f;
  c.eviction.capacity = 256;
  auto a = Make(c);
  auto b = Make(c);
  for (uint32_t step = 1; step <= 40; ++step) {
    std::vector<uint64_t> ids;
    for (uint64_t i = 0; i < 50; ++i) ids.push_back((i * i + step * 37) % 700);
    Train(*a, ids, step);
    Train(*b, ids, step);
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    std::vector<float> g(ids.size() * 8, 0.01f * step);
    a->Apply(ids, g.data(), step, 1.0f);
    b->Apply(ids, g.data(), step, 1.0f);
  }
  std::string ra, rb;
  a->ExportRecords(&ra);
  b->ExportRecords(&rb);
  EXPECT_GT(a->counters().evicted_capacity, 0);
  EXPECT_EQ(ra, rb);
}

// Training lookups as the shard runs them for --replicas 1: the stored
// rows under a shared lock, then the ids without one (if any) under the
// exclusive one. Counts the lookups that needed the second half.
std::vector<float> TrainInHalves(EmbeddingTable& t, std::vector<uint64_t> ids, uint32_t now,
                                 int64_t* stored, int64_t* halves) {
  std::vector<float> out(ids.size() * t.dim());
  std::vector<uint32_t> rows, misses;
  t.LookupStoredForTraining(ids, now, out.data(), &rows, &misses);
  if (misses.empty()) {
    ++*stored;
  } else {
    ++*halves;
    t.LookupMissesForTraining(ids, misses, now, out.data());
  }
  return out;
}

TEST(EmbeddingTableTest, LookupsOfStoredRowsEqualTrainingLookups) {
  for (const Eviction::Policy policy : {Eviction::Policy::kLru, Eviction::Policy::kLfu}) {
    TableConfig c = Config(8);
    c.optimizer.kind = SparseOptimizerKind::kRowWiseAdagrad;
    c.eviction.capacity = 256;
    c.eviction.policy = policy;
    auto a = Make(c);
    auto b = Make(c);
    int64_t stored = 0, halves = 0;
    for (uint32_t step = 1; step <= 40; ++step) {
      // Ids 0..49 every third step (stored from the second time on), other
      // ids up to 700 between (rows created and evicted).
      std::vector<uint64_t> ids;
      for (uint64_t i = 0; i < 50; ++i) ids.push_back(step % 3 == 0 ? i : (i * i + step * 37) % 700);
      ASSERT_EQ(Train(*a, ids, step), TrainInHalves(*b, ids, step, &stored, &halves))
          << "step " << step;
      std::sort(ids.begin(), ids.end());
      ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
      std::vector<float> g(ids.size() * 8, 0.01f * step);
      a->Apply(ids, g.data(), step, 1.0f);
      b->Apply(ids, g.data(), step, 1.0f);
    }
    EXPECT_GE(stored, 10) << "lookups of stored rows";
    EXPECT_GE(halves, 20) << "lookups with ids to create";
    EXPECT_GT(a->counters().evicted_capacity, 0);
    std::string ra, rb;
    a->ExportRecords(&ra);
    b->ExportRecords(&rb);
    EXPECT_EQ(ra, rb) << "the last uses (and LFU counts) must match too";
    EXPECT_EQ(a->counters().lookups, b->counters().lookups);
  }
}

// The first half reads and marks the stored rows and creates nothing; the
// second creates the rest, or reads the rows created meanwhile.
TEST(EmbeddingTableTest, ALookupOfStoredRowsListsTheIdsWithoutOne) {
  TableConfig c = Config();
  c.eviction.policy = Eviction::Policy::kLfu;
  auto t = Make(c);
  Train(*t, {1, 2}, 1);
  std::string before;
  t->ExportRecords(&before);
  const std::vector<uint64_t> ids = {1, 3, 2, 4};
  std::vector<float> out(ids.size() * 4, -1.0f);
  std::vector<uint32_t> rows, misses;
  t->LookupStoredForTraining(ids, 2, out.data(), &rows, &misses);
  EXPECT_EQ(misses, (std::vector<uint32_t>{1, 3}));
  EXPECT_EQ(t->rows(), 2);
  EXPECT_EQ(t->counters().lookups, 4);
  EXPECT_EQ(std::vector<float>(out.begin(), out.begin() + 4), Read(*t, {1}));
  EXPECT_EQ(std::vector<float>(out.begin() + 8, out.begin() + 12), Read(*t, {2}));
  EXPECT_EQ(out[4], -1.0f) << "nothing written for id 3 yet";
  std::string after;
  t->ExportRecords(&after);
  EXPECT_NE(before, after) << "rows 1 and 2 were marked used at 2";
  // Another lookup creates id 4 in between.
  Train(*t, {4}, 2);
  t->LookupMissesForTraining(ids, misses, 2, out.data());
  EXPECT_EQ(t->rows(), 4);
  EXPECT_EQ(t->counters().lookups, 4 + 1 + 2);
  EXPECT_EQ(std::vector<float>(out.begin() + 4, out.begin() + 8), Read(*t, {3}));
  EXPECT_EQ(std::vector<float>(out.begin() + 12, out.end()), Read(*t, {4}));
  // All stored: nothing missing.
  t->LookupStoredForTraining({4, 3}, 3, out.data(), &rows, &misses);
  EXPECT_TRUE(misses.empty());
}

TEST(EmbeddingTableTest, LookupsOfStoredRowsRunBesideEachOther) {
  TableConfig c = Config();
  c.eviction.policy = Eviction::Policy::kLfu;
  auto t = Make(c);
  constexpr uint64_t kRows = 64;
  std::vector<uint64_t> all(kRows);
  std::iota(all.begin(), all.end(), 0);
  Train(*t, all, 1);  // every row used once
  constexpr int kThreads = 4;
  constexpr int kCalls = 2000;
  std::vector<std::thread> threads;
  for (int k = 0; k < kThreads; ++k) {
    threads.emplace_back([&t, &all, k] {
      std::vector<float> out(kRows * 4);
      std::vector<uint32_t> rows, misses;
      for (int call = 0; call < kCalls; ++call) {
        t->LookupStoredForTraining(all, static_cast<uint32_t>(2 + k), out.data(), &rows,
                                   &misses);
        ASSERT_TRUE(misses.empty());
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(t->counters().lookups, static_cast<int64_t>(kRows) * (1 + kThreads * kCalls));
  // Every use counted: each record's LFU count (its last word) is 1 + the
  // lookups, and its last use one of the threads' clocks.
  for (uint64_t id = 0; id < kRows; ++id) {
    const std::optional<std::string> record = t->ReadRecord(id);
    ASSERT_TRUE(record.has_value());
    uint32_t meta[2];
    std::memcpy(meta, record->data() + record->size() - 8, 8);
    EXPECT_GE(meta[0], 2u);
    EXPECT_LT(meta[0], 2u + kThreads);
    EXPECT_EQ(meta[1], 1u + kThreads * kCalls) << id;
  }
}

// The spacing of bf16 values around x (8 significant bits).
float Bf16Ulp(float x) { return std::ldexp(1.0f, std::ilogb(x) - 7); }

TableConfig Bf16Config(int dim = 4) {
  TableConfig c = Config(dim);
  c.storage = RowStorage::kBf16;
  return c;
}

TEST(EmbeddingTableBf16Test, RecordsHoldTwoValuesPerWord) {
  TableConfig c = Bf16Config(16);
  c.optimizer.kind = SparseOptimizerKind::kRowWiseAdagrad;
  EXPECT_EQ(Make(c)->record_bytes(), 48);  // id 8 + values 32 + state 4 + last use 4
  c.storage = RowStorage::kF32;
  EXPECT_EQ(Make(c)->record_bytes(), 80);
  EXPECT_EQ(Make(Bf16Config(3))->record_bytes(), 8 + 8 + 4);  // 3 values in 2 words
}

TEST(EmbeddingTableBf16Test, RowsReadAsTheirInitialValueInBf16) {
  for (int dim : {4, 5}) {
    TableConfig c = Bf16Config(dim);
    auto t = Make(c);
    const std::vector<float> first = Train(*t, {7, 9});
    const std::vector<float> again = Read(*t, {7, 9});
    EXPECT_EQ(first, again);
    const std::vector<float> init = Initial(c, 9);
    for (int j = 0; j < dim; ++j) {
      const float got = first[dim + j];
      EXPECT_NEAR(got, init[j], Bf16Ulp(init[j])) << j;
      // A bf16 value: its low 16 bits are zero.
      uint32_t bits;
      std::memcpy(&bits, &got, sizeof(bits));
      EXPECT_EQ(bits & 0xffff, 0u) << j;
    }
  }
}

// Steps far below bf16's resolution: 2000 SGD steps of 1e-4 move a row at
// 0.25 (where bf16 values are 2^-9 ~ 0.002 apart) to about 0.05, as f32
// does; rounding to nearest would leave it at 0.25. Each stochastic
// rounding adds noise of variance up to spacing x step, about 0.018 of
// standard deviation per element over the 2000 steps, 0.0022 for the mean
// of 64.
TEST(EmbeddingTableBf16Test, StochasticRoundingKeepsTinyStepsOnAverage) {
  constexpr int kDim = 64;
  TableConfig c = Bf16Config(kDim);
  c.init.kind = RowInit::Kind::kZeros;
  auto t = Make(c);
  Train(*t, {1});
  std::vector<float> grad(kDim, -0.25f);
  ASSERT_EQ(t->Apply(std::vector<uint64_t>{1}, grad.data(), 1, 1.0f), 1);
  ASSERT_EQ(Read(*t, {1}), std::vector<float>(kDim, 0.25f));  // exact in bf16
  std::fill(grad.begin(), grad.end(), 1e-4f);
  for (uint32_t step = 2; step < 2002; ++step) {
    t->Apply(std::vector<uint64_t>{1}, grad.data(), step, 1.0f);
  }
  const std::vector<float> row = Read(*t, {1});
  double mean = 0;
  for (float v : row) {
    EXPECT_NEAR(v, 0.05, 0.07);
    mean += v / kDim;
  }
  EXPECT_NEAR(mean, 0.05, 0.008);
}

// Adam at lr 0.001 for 100 steps (rows move by up to about 0.1, where bf16
// values are at most 2^-11 apart): each row stays within the rounding noise
// of the same table in f32.
TEST(EmbeddingTableBf16Test, UpdatesStayCloseToF32) {
  TableConfig c = Bf16Config(16);
  c.optimizer.kind = SparseOptimizerKind::kAdam;
  c.optimizer.learning_rate = 0.001f;
  TableConfig f = c;
  f.storage = RowStorage::kF32;
  auto half = Make(c);
  auto full = Make(f);
  std::vector<uint64_t> ids(32);
  std::iota(ids.begin(), ids.end(), 100);
  Train(*half, ids);
  Train(*full, ids);
  std::vector<float> grads(ids.size() * 16);
  for (uint32_t step = 1; step <= 100; ++step) {
    for (size_t i = 0; i < grads.size(); ++i) {
      grads[i] = std::sin(0.37f * static_cast<float>(i) + 0.11f * static_cast<float>(step));
    }
    half->Apply(ids, grads.data(), step, 1.0f);
    full->Apply(ids, grads.data(), step, 1.0f);
  }
  const std::vector<float> a = Read(*half, ids);
  const std::vector<float> b = Read(*full, ids);
  double worst = 0, total = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::abs(double{a[i]} - b[i]));
    total += std::abs(double{a[i]} - b[i]);
  }
  EXPECT_LT(worst, 0.01);
  EXPECT_LT(total / a.size(), 0.002);
}

TEST(EmbeddingTableBf16Test, SameOperationsGiveBitIdenticalTablesAndRecordsRoundTrip) {
  TableConfig c = Bf16Config(6);
  c.optimizer.kind = SparseOptimizerKind::kRowWiseAdagrad;
  auto a = Make(c);
  auto b = Make(c);
  std::vector<uint64_t> ids = {3, 8, 13, 21};
  std::vector<float> grads(ids.size() * 6);
  for (uint32_t step = 1; step <= 20; ++step) {
    for (auto* t : {a.get(), b.get()}) {
      Train(*t, ids, step);
      for (size_t i = 0; i < grads.size(); ++i) grads[i] = 0.01f * static_cast<float>(i % 7) - 0.02f;
      t->Apply(ids, grads.data(), step, 1.0f);
    }
  }
  std::string ra, rb;
  a->ExportRecords(&ra);
  b->ExportRecords(&rb);
  EXPECT_EQ(ra, rb);
  // A copy from the records goes on exactly as the original.
  auto copy = Make(c);
  ASSERT_TRUE(copy->ImportRecords(ra).ok());
  a->Apply(ids, grads.data(), 21, 1.0f);
  copy->Apply(ids, grads.data(), 21, 1.0f);
  EXPECT_EQ(Read(*a, ids), Read(*copy, ids));
  // A record with a bf16 Inf is refused.
  std::string bad = ra.substr(0, static_cast<size_t>(a->record_bytes()));
  bad[8] = 0x80;
  bad[9] = 0x7f;  // element 0: 0x7f80, +Inf
  EXPECT_EQ(copy->ImportRecords(bad).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardtrain::sparse
