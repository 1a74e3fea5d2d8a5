#include "sparse/row_index.h"

#include <random>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "gtest/gtest.h"
#include "sparse/id_hash.h"

namespace shardtrain::sparse {
namespace {

// Ids live in a vector indexed by row, as a table's records hold them.
struct Rows {
  std::vector<uint64_t> ids;
  uint64_t operator()(uint32_t row) const { return ids[row]; }
};

TEST(RowIndexTest, AgreesWithAMapUnderInsertsAndErases) {
  RowIndex index;
  Rows rows;
  absl::flat_hash_map<uint64_t, uint32_t> model;
  std::mt19937_64 rng(11);
  for (int op = 0; op < 200000; ++op) {
    const uint64_t id = rng() % 5000;  // small key space: many erases and refinds
    const uint64_t hash = Mix64(id ^ 0x1234);
    auto it = model.find(id);
    if (it == model.end()) {
      ASSERT_EQ(index.Find(id, hash, rows), RowIndex::kNone);
      const uint32_t row = static_cast<uint32_t>(rows.ids.size());
      rows.ids.push_back(id);
      index.Insert(hash, row);
      model[id] = row;
    } else if (rng() % 2 == 0) {
      ASSERT_EQ(index.Find(id, hash, rows), it->second);
    } else {
      ASSERT_TRUE(index.Erase(id, hash, rows));
      model.erase(it);
      ASSERT_EQ(index.Find(id, hash, rows), RowIndex::kNone);
    }
    ASSERT_EQ(index.size(), model.size());
  }
  for (const auto& [id, row] : model) EXPECT_EQ(index.Find(id, Mix64(id ^ 0x1234), rows), row);
}

TEST(RowIndexTest, SizedForExpectedEntriesNeverGrows) {
  RowIndex index(70000);
  const size_t slots = index.slot_count();
  EXPECT_LE(slots, 80001u);  // 8/7 of the entries
  Rows rows;
  for (uint64_t id = 0; id < 70000; ++id) {
    rows.ids.push_back(id);
    index.Insert(Mix64(id), static_cast<uint32_t>(id));
  }
  EXPECT_EQ(index.slot_count(), slots);
  for (uint64_t id = 0; id < 70000; ++id) ASSERT_EQ(index.Find(id, Mix64(id), rows), id);
}

TEST(RowIndexTest, FingerprintCollisionsAreResolvedById) {
  // Ids whose hashes share their top 32 bits: every probe matches the
  // fingerprint, and only id_of tells them apart.
  RowIndex index;
  Rows rows;
  for (uint64_t i = 0; i < 50; ++i) {
    rows.ids.push_back(1000 + i);
    index.Insert(0xabcdef0100000000ULL | i, static_cast<uint32_t>(i));
  }
  for (uint64_t i = 0; i < 50; ++i) {
    EXPECT_EQ(index.Find(1000 + i, 0xabcdef0100000000ULL | i, rows), i);
  }
  EXPECT_TRUE(index.Erase(1010, 0xabcdef0100000000ULL, rows));
  EXPECT_EQ(index.Find(1010, 0xabcdef0100000000ULL, rows), RowIndex::kNone);
  EXPECT_EQ(index.Find(1011, 0xabcdef0100000000ULL, rows), 11u);
}

}  // namespace
}  // namespace shardtrain::sparse
