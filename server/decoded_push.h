// DecodePush: a received push checked in full and turned into the parts a
// shard applies, before any partition changes.
//
// Every key is looked up (TensorStore) and checked for repeats before any
// payload is read, so a request naming one partition many times costs
// nothing; parts come back sorted by partition id, the order in which they
// are locked. A dense payload (any dtype) is checked (size, NaN/Inf) and
// later applied straight from the received bytes; a sparse one is decoded
// into thread-local scratch, reused across requests on each gRPC thread so
// the hot path allocates nothing once warm. Thread-safe (the scratch is per
// thread).
#ifndef SHARDTRAIN_SERVER_DECODED_PUSH_H_
#define SHARDTRAIN_SERVER_DECODED_PUSH_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "server/shard_metrics.h"
#include "server/tensor_store.h"
#include "wire/message_views.h"

namespace shardtrain::server {

// One part of a push, ready to apply.
struct DecodedPart {
  Partition* partition = nullptr;
  const wire::PayloadView* payload = nullptr;  // in the request
  int64_t version = 0;
  // A dense payload (checked) is applied straight from its received bytes;
  // a sparse one from `decoded`, this thread's scratch.
  bool dense = false;
  absl::Span<const float> decoded;
  // sync: the push is for a later step than a resuming partition's.
  bool ahead = false;
  // The part's index in the request.
  size_t request_index = 0;
};

// The parts of `request`, sorted by partition id; INVALID_ARGUMENT (bad
// key, version, payload, a partition named twice), NOT_FOUND (a key not
// here) or RESOURCE_EXHAUSTED (more than `max_parts` parts, counted in
// `metrics` under max_parts_per_request). The parts view `request` and
// this thread's scratch: they are valid until the next DecodePush on this
// thread. `metrics` is not owned.
absl::StatusOr<std::vector<DecodedPart>> DecodePush(const wire::PushView& request,
                                                    const TensorStore& store,
                                                    int max_parts, ShardMetrics* metrics);

// Gives back this thread's scratch if a large push grew it; call once the
// parts of the last DecodePush are no longer used.
void TrimDecodeScratch();

}  // namespace shardtrain::server

#endif  // SHARDTRAIN_SERVER_DECODED_PUSH_H_
