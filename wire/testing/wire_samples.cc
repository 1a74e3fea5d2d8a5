#include "wire/testing/wire_samples.h"

#include <algorithm>
#include <random>
#include <vector>

#include "common/payload.h"

namespace shardtrain::wire {
namespace {

std::string RandomBytes(std::mt19937& rng, size_t n) {
  std::string bytes(n, '\0');
  for (char& byte : bytes) byte = static_cast<char>(rng());
  return bytes;
}

struct PartSpec {
  const char* tensor;
  uint32_t partition;
  int64_t version;
  int elements;  // -1: no payload
};

// Names with multi-byte UTF-8, an empty name, versions of 1, 2 and 10
// bytes, payloads with lengths of 1 and 2 bytes and an empty one.
constexpr PartSpec kParts[] = {
    {"layer0/weights", 0, 12, 37},
    {"layer0/weights", 1, -1, 200},
    {"\xc3\xbcnic\xc3\xb6""de/\xe2\x82\xac/\xf0\x9f\x98\x80", 70000, 300, 0},
    {"bare", 2, 5, -1},
    {"", 0, 0, 1},
};

}  // namespace

Payload SamplePayload(DType dtype, Encoding encoding, int elements, uint32_t seed) {
  std::mt19937 rng(seed);
  const int size = common::DTypeSize(dtype);
  Payload payload;
  payload.set_dtype(dtype);
  payload.set_encoding(encoding);
  if (encoding == ENCODING_DENSE) {
    payload.set_data(RandomBytes(rng, static_cast<size_t>(elements) * size));
    return payload;
  }
  std::string indices;
  for (uint32_t index = 1; index < static_cast<uint32_t>(elements); index += 2) {
    for (int shift = 0; shift < 32; shift += 8) indices.push_back(static_cast<char>(index >> shift));
  }
  payload.set_data(RandomBytes(rng, indices.size() / 4 * size));
  payload.set_indices(std::move(indices));
  return payload;
}

PushRequest SamplePush(DType dtype, Encoding encoding, uint32_t seed, bool with_bare_part) {
  PushRequest push;
  push.set_worker(3 + seed % 5);
  push.set_clock(1234567);
  push.set_worker_incarnation(0xfedcba9876543210ull ^ seed);
  push.set_sequence(77 + seed);
  push.set_shard_incarnation(uint64_t{1} << 63);
  push.set_clock_parts(seed % 4);
  uint32_t part_seed = seed * 31;
  for (const PartSpec& spec : kParts) {
    if (spec.elements < 0 && !with_bare_part) continue;
    GradientPart* part = push.add_parts();
    part->mutable_key()->set_tensor(spec.tensor);
    part->mutable_key()->set_partition(spec.partition);
    part->set_version(spec.version);
    if (spec.elements >= 0) {
      *part->mutable_grad() = SamplePayload(dtype, encoding, spec.elements, ++part_seed);
    }
  }
  return push;
}

PullResponse SamplePullResponse(DType dtype, Encoding encoding, uint32_t seed,
                                bool with_bare_part) {
  PullResponse pull;
  pull.set_wait_seconds(0.125 + seed);
  pull.set_incarnation(0x0123456789abcdefull + seed);
  uint32_t part_seed = seed * 37;
  for (const PartSpec& spec : kParts) {
    if (spec.elements < 0 && !with_bare_part) continue;
    ParameterPart* part = pull.add_parts();
    part->mutable_key()->set_tensor(spec.tensor);
    part->mutable_key()->set_partition(spec.partition);
    part->set_version(spec.version);
    if (spec.elements >= 0) {
      *part->mutable_value() = SamplePayload(dtype, encoding, spec.elements, ++part_seed);
    }
  }
  return pull;
}

PullRequest SamplePullRequest(uint32_t seed) {
  PullRequest pull;
  pull.set_worker(3 + seed % 5);
  pull.set_clock(1234567);
  pull.set_min_version(-2);
  pull.set_dtype(DTYPE_BF16);
  pull.set_worker_incarnation(0xfedcba9876543210ull ^ seed);
  pull.set_shard_incarnation(42);
  for (const PartSpec& spec : kParts) {
    PartitionKey* key = pull.add_parts();
    key->set_tensor(spec.tensor);
    key->set_partition(spec.partition);
  }
  return pull;
}

PushResponse SamplePushResponse(uint32_t seed) {
  PushResponse push;
  push.set_max_staleness(4 + seed);
  push.set_incarnation(0x0123456789abcdefull + seed);
  push.set_duplicate(true);
  return push;
}

}  // namespace shardtrain::wire
