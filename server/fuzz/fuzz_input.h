// The input format of shard_fuzz, shared by the fuzz target and the seed
// generator so seeds are built exactly as the target reads them.
//
//   byte 0   shard flags: bit 0 sync, bits 1-3 optimizer (mod 6),
//            bit 4 staleness bound 0..1 (else none), bit 5 staleness-aware lr,
//            bit 6 staleness bound 1 (with bit 4)
//   byte 1   layout: bits 0-1 workers - 1, bits 2-3 partition size
//            (16384, 64, 7, 1 elements), bits 4-5 shards (1, 2, 3, 1) with
//            this shard the last of them, bits 6-7 replicas_to_aggregate
//            (0 = all, clamped to the workers)
//   then up to kMaxOps requests, each
//            [op: 1 byte][length: 2 bytes little-endian][length bytes]
//   where the bytes are the binary protobuf of that op's request (Tick: one
//   byte, seconds to advance the clock by). A truncated request ends the
//   input.
#ifndef SHARDTRAIN_SERVER_FUZZ_FUZZ_INPUT_H_
#define SHARDTRAIN_SERVER_FUZZ_FUZZ_INPUT_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "server/shard_options.h"

namespace shardtrain::server::fuzz {

enum class Op : uint8_t {
  kRegister = 0,
  kPush = 1,
  kPull = 2,
  kPushPull = 3,
  kHeartbeat = 4,
  kStatus = 5,
  kTick = 6,
  kRegisterTables = 7,
  kLookup = 8,
  kPushSparse = 9,
  // A SparseOp forwarded to a replica of the shard's tables.
  kApplySparseOp = 10,
};
inline constexpr int kNumOps = 11;
inline constexpr int kMaxOps = 32;
inline constexpr size_t kHeaderBytes = 2;

inline const char* const kOptimizers[] = {"sgd",  "momentum", "nesterov",
                                          "adam", "adamw",    "adagrad"};

// The limits the fuzzed shard runs under: small enough that a request over
// them would show up as a malloc or RSS limit in libFuzzer, and that the
// state the target digests twice per request (Checksum and FillStatus, both
// linear in elements and partitions) keeps an input well under a second even
// with one-element partitions.
inline ResourceLimits FuzzLimits() {
  ResourceLimits limits;
  limits.max_stored_elements = int64_t{1} << 14;
  limits.max_tensors = 64;
  limits.max_tensors_per_request = 16;
  limits.max_parts_per_request = 256;
  limits.max_partition_metrics = 16;
  limits.max_tables = 4;
  limits.max_table_dim = 16;
  limits.max_table_rows = 1024;
  limits.max_table_ids_per_request = 256;
  limits.max_table_filter_counters = 4096;
  return limits;
}

inline ShardOptions OptionsFromHeader(uint8_t flags, uint8_t layout) {
  ShardOptions options;
  options.mode = (flags & 1) ? ConsistencyMode::kSync : ConsistencyMode::kAsync;
  options.optimizer.name = kOptimizers[((flags >> 1) & 7) % 6];
  options.optimizer.learning_rate = 0.05f;
  options.max_staleness = (flags & 0x10) ? ((flags & 0x40) ? 1 : 0) : -1;
  options.staleness_aware_lr = (flags & 0x20) != 0;
  options.num_workers = 1 + (layout & 3);
  static constexpr int64_t kPartitionSizes[] = {16384, 64, 7, 1};
  options.partitioning.max_partition_elements = kPartitionSizes[(layout >> 2) & 3];
  static constexpr int kShards[] = {1, 2, 3, 1};
  options.partitioning.num_shards = kShards[(layout >> 4) & 3];
  options.shard_index = options.partitioning.num_shards - 1;
  options.replicas_to_aggregate = std::min((layout >> 6) & 3, options.num_workers);
  options.limits = FuzzLimits();
  return options;
}

// Appends one request record to `input`.
inline void AppendOp(Op op, const std::string& bytes, std::string* input) {
  const size_t length = std::min<size_t>(bytes.size(), 0xffff);
  input->push_back(static_cast<char>(op));
  input->push_back(static_cast<char>(length & 0xff));
  input->push_back(static_cast<char>(length >> 8));
  input->append(bytes, 0, length);
}

}  // namespace shardtrain::server::fuzz

#endif  // SHARDTRAIN_SERVER_FUZZ_FUZZ_INPUT_H_
