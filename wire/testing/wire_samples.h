// Sample data-path messages for the wire tests and benchmarks: every field
// set to a value that exercises the encoding (multi-byte and 10-byte
// varints, non-ASCII tensor names, a part without a payload, an empty
// payload, lengths over 127 bytes), with random tensor bytes.
//
//   PushRequest push = SamplePush(DTYPE_F16, ENCODING_SPARSE, /*seed=*/1);
#ifndef SHARDTRAIN_WIRE_TESTING_WIRE_SAMPLES_H_
#define SHARDTRAIN_WIRE_TESTING_WIRE_SAMPLES_H_

#include <cstdint>
#include <string>

#include "proto/shardtrain.pb.h"

namespace shardtrain::wire {

// A payload of `elements` elements (dense), or of every other one of them
// (sparse), with random bytes.
Payload SamplePayload(DType dtype, Encoding encoding, int elements, uint32_t seed);

// `with_bare_part`: also a part without a payload (the encoder writes every
// part with one, so its tests leave it out).
PushRequest SamplePush(DType dtype, Encoding encoding, uint32_t seed,
                       bool with_bare_part = true);
PullResponse SamplePullResponse(DType dtype, Encoding encoding, uint32_t seed,
                                bool with_bare_part = true);
PullRequest SamplePullRequest(uint32_t seed);
PushResponse SamplePushResponse(uint32_t seed);

}  // namespace shardtrain::wire

#endif  // SHARDTRAIN_WIRE_TESTING_WIRE_SAMPLES_H_
