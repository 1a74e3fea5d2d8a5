#include "server/decoded_push.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "common/payload.h"
#include "common/status_macros.h"
#include "server/membership.h"
#include "wire/payload_pieces.h"

namespace shardtrain::server {
namespace {

std::vector<std::vector<float>>& GradScratch() {
  thread_local std::vector<std::vector<float>> scratch;
  return scratch;
}

}  // namespace

absl::StatusOr<std::vector<DecodedPart>> DecodePush(const wire::PushView& request,
                                                    const TensorStore& store,
                                                    int max_parts, ShardMetrics* metrics) {
  if (request.parts.empty()) {
    return absl::InvalidArgumentError("push carries no gradients");
  }
  const size_t num_parts = request.parts.size();
  if (num_parts > static_cast<size_t>(max_parts)) {
    metrics->requests_refused("max_parts_per_request").Increment();
    return absl::ResourceExhaustedError(absl::StrFormat(
        "push has %d parts; the limit is %d per request (--max_parts_per_request)",
        num_parts, max_parts));
  }
  // Every key is looked up and checked for repeats before anything is
  // decoded, so a request naming one partition many times costs nothing.
  std::vector<DecodedPart> decoded;
  decoded.reserve(num_parts);
  int sparse_parts = 0;
  for (size_t i = 0; i < num_parts; ++i) {
    const wire::GradientPartView& part = request.parts[i];
    ASSIGN_OR_RETURN(Partition * partition,
                     store.Find(part.key.tensor, part.key.partition));
    // Versions count updates, like clocks count steps: bounded, so that no
    // version (a sync fast-forward included) can overflow.
    if (part.version < 0 || part.version > kMaxClock) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s/%d: version %d is not in [0, %d]", partition->tensor,
          partition->index, part.version, kMaxClock));
    }
    DecodedPart& d = decoded.emplace_back();
    d.request_index = i;
    d.partition = partition;
    d.payload = &part.grad;
    d.version = part.version;
    if (part.grad.encoding == ENCODING_SPARSE) ++sparse_parts;
  }
  std::sort(decoded.begin(), decoded.end(),
            [](const DecodedPart& a, const DecodedPart& b) {
              return a.partition->id < b.partition->id;
            });
  for (size_t i = 1; i < decoded.size(); ++i) {
    if (decoded[i].partition == decoded[i - 1].partition) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s/%d appears twice in one push", decoded[i].partition->tensor,
          decoded[i].partition->index));
    }
  }
  // Dense payloads (any dtype) are checked here and applied later straight
  // from the received bytes: one read for the NaN/Inf check, one pass for
  // the update. Sparse ones are decoded into scratch.
  std::vector<std::vector<float>>& scratch = GradScratch();
  if (scratch.size() < static_cast<size_t>(sparse_parts)) scratch.resize(sparse_parts);
  int next_scratch = 0;
  for (DecodedPart& d : decoded) {
    const Partition& partition = *d.partition;
    const wire::PayloadView& payload = *d.payload;
    const size_t size = static_cast<size_t>(partition.range.size);
    absl::Status status;
    if (payload.encoding != ENCODING_SPARSE) {
      d.dense = true;
      status = wire::CheckDense(payload, partition.range.size);
      if (status.ok()) status = wire::CheckFinite(payload);
    } else if (payload.indices.size() / sizeof(uint32_t) > size) {
      // Refused before scratch is sized for it.
      status = absl::InvalidArgumentError(absl::StrFormat(
          "sparse payload names %d elements of a %d-element partition",
          payload.indices.size() / sizeof(uint32_t), size));
    } else {
      std::vector<float>& buffer = scratch[next_scratch++];
      buffer.resize(size);
      status = wire::DecodeInto(payload, absl::MakeSpan(buffer));
      // Checked after decoding: repeated indices add up, and may overflow.
      if (status.ok()) status = common::CheckFinite(buffer);
      d.decoded = buffer;
    }
    if (!status.ok()) {
      return absl::Status(status.code(),
                          absl::StrFormat("%s/%d: %s", partition.tensor,
                                          partition.index, status.message()));
    }
  }
  return decoded;
}

void TrimDecodeScratch() {
  // Large scratch is not kept past a request that needed it.
  std::vector<std::vector<float>>& scratch = GradScratch();
  size_t scratch_elements = 0;
  for (const std::vector<float>& buffer : scratch) scratch_elements += buffer.capacity();
  if (scratch_elements > (size_t{1} << 24)) scratch = {};
}

}  // namespace shardtrain::server
