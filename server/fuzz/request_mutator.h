// A structure-aware mutation for shard_fuzz inputs.
//
// libFuzzer's byte mutations rarely turn a protobuf field into a value the
// shard must refuse (a clock of 2^63 - 1, a shape of 2^30 elements): the
// varint grows and the lengths around it no longer match. This mutation
// parses one request of the input (server/fuzz/fuzz_input.h), changes one
// field through protobuf reflection -- an edge value for a number, a known
// tensor name, an element of a repeated field added or removed, a
// submessage created -- or repeats or drops a whole request, and writes the
// input back.
#ifndef SHARDTRAIN_SERVER_FUZZ_REQUEST_MUTATOR_H_
#define SHARDTRAIN_SERVER_FUZZ_REQUEST_MUTATOR_H_

#include <cstddef>
#include <cstdint>
#include <random>

namespace shardtrain::server::fuzz {

// Mutates the input in data[0, size) in place and returns its new size
// (<= max_size), or 0 if it could not (no parseable request; the result
// would not fit): the caller then mutates the bytes another way.
size_t MutateRequests(uint8_t* data, size_t size, size_t max_size, std::minstd_rand& rng);

}  // namespace shardtrain::server::fuzz

#endif  // SHARDTRAIN_SERVER_FUZZ_REQUEST_MUTATOR_H_
