// The 64-bit mixing hashes of sparse tables: where an id's row sits in a
// shard's index, which slot (and so which shard) owns an id, and the
// counters that make a row's initial value and an admission draw pure
// functions of their inputs. All are stable across processes, builds and
// machines: they decide placement and are part of the wire contract.
#ifndef SHARDTRAIN_SPARSE_ID_HASH_H_
#define SHARDTRAIN_SPARSE_ID_HASH_H_

#include <cstdint>

#include "absl/strings/string_view.h"

namespace shardtrain::sparse {

// SplitMix64's finaliser (Steele, Lea, Flood 2014): a bijection of the
// 64-bit integers whose every output bit depends on every input bit.
inline uint64_t Mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// A table's salt: FNV-1a of its name, mixed. Keeps tables' rows apart in
// hashes that take (table, id).
inline uint64_t TableSalt(absl::string_view name) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : name) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return Mix64(h);
}

// The slot of `id` among num_slots (> 0). Slots, not ids, are placed on
// replica groups, so every shard's share of a Zipf stream's hot ids is even.
inline uint32_t SlotOf(uint64_t id, uint32_t num_slots) {
  // Lemire's multiply-shift range reduction of the mixed id's top half.
  return static_cast<uint32_t>(((Mix64(id) >> 32) * num_slots) >> 32);
}

// Slots of every table: fixed for a job, so an id's slot never changes.
inline constexpr uint32_t kTableSlots = 4096;

// The shard (replica group) holding id's row among num_shards (> 0): its
// slot's, slot mod num_shards, as a dense partition's group is its primary.
inline int ShardOfId(uint64_t id, int num_shards) {
  return static_cast<int>(SlotOf(id, kTableSlots) % static_cast<uint32_t>(num_shards));
}

// A uniform draw in [0, 1) with 24 bits, from a 64-bit hash value.
inline float UnitFloat(uint64_t bits) {
  return static_cast<float>(bits >> 40) * (1.0f / 16777216.0f);
}

}  // namespace shardtrain::sparse

#endif  // SHARDTRAIN_SPARSE_ID_HASH_H_
