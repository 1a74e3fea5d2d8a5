#include "server/pull_reader.h"

#include <algorithm>
#include <limits>
#include <optional>

#include <glog/logging.h>
#include <grpcpp/support/proto_buffer_reader.h>

#include "absl/strings/str_format.h"
#include "common/payload.h"
#include "common/status_macros.h"
#include "server/request_checks.h"
#include "wire/payload_pieces.h"

namespace shardtrain::server {

PullReader::PullReader(const ShardOptions& options, uint64_t incarnation,
                       const TensorStore* store, const Membership* membership,
                       ShardMetrics* metrics)
    : options_(options),
      incarnation_(incarnation),
      store_(store),
      membership_(membership),
      metrics_(metrics) {}

absl::Status PullReader::Validate(const PullRequest& request, int64_t push_clock) const {
  RETURN_IF_ERROR(CheckWorker(options_, request.worker()));
  RETURN_IF_ERROR(CheckIncarnation(options_, incarnation_, request.shard_incarnation()));
  if (request.parts().empty()) {
    return absl::InvalidArgumentError("pull names no partitions");
  }
  if (request.parts_size() > options_.limits.max_parts_per_request) {
    return Refuse(metrics_, "max_parts_per_request",
                  absl::ResourceExhaustedError(absl::StrFormat(
                      "pull names %d parts; the limit is %d per request "
                      "(--max_parts_per_request)",
                      request.parts_size(), options_.limits.max_parts_per_request)));
  }
  if (request.dtype() != DTYPE_UNSPECIFIED &&
      common::DTypeSize(request.dtype()) == 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "pull asks for dtype %d; use f32, f16 or bf16", request.dtype()));
  }
  if (request.clock() < 0 || request.clock() > kMaxClock ||
      request.min_version() < 0 || request.min_version() > kMaxClock) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "pull clock and min_version must be in [0, %d]", kMaxClock));
  }
  const int64_t width = common::DTypeSize(common::PayloadDType(request.dtype()));
  std::vector<const Partition*> found;
  found.reserve(request.parts_size());
  int64_t response_bytes = 0;
  for (const PartitionKey& key : request.parts()) {
    ASSIGN_OR_RETURN(Partition * part, store_->Find(key));
    found.push_back(part);
    // Payload plus a generous allowance for the key and framing.
    response_bytes += part->range.size * width +
                      static_cast<int64_t>(key.tensor().size()) + 64;
    const int64_t version = part->version.load(std::memory_order_acquire);
    const int64_t reachable = options_.mode == ConsistencyMode::kSync
                                  ? std::max(version + 1, push_clock)
                                  : version + 1;
    if (request.min_version() > reachable) {
      return absl::OutOfRangeError(absl::StrFormat(
          "%s/%d: min_version %d is more than one step ahead of version %d",
          part->tensor, part->index, request.min_version(), version));
    }
  }
  std::sort(found.begin(), found.end(),
            [](const Partition* a, const Partition* b) { return a->id < b->id; });
  for (size_t i = 1; i < found.size(); ++i) {
    if (found[i] == found[i - 1]) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s/%d appears twice in one pull", found[i]->tensor, found[i]->index));
    }
  }
  if (response_bytes > options_.limits.max_response_bytes) {
    return Refuse(metrics_, "max_response_bytes",
                  absl::ResourceExhaustedError(absl::StrFormat(
                      "pull asks for about %d bytes of parameters; a response "
                      "may have at most %d (--max_message_mb): pull fewer "
                      "partitions at a time",
                      response_bytes, options_.limits.max_response_bytes)));
  }
  return absl::OkStatus();
}

bool PullReader::Ready(const PullRequest& request) const {
  if (request.min_version() > 0) {
    for (const PartitionKey& key : request.parts()) {
      absl::StatusOr<Partition*> part = store_->Find(key);
      if (!part.ok()) return true;  // answered with the error by Validate
      if ((*part)->version.load(std::memory_order_acquire) < request.min_version()) {
        return false;
      }
    }
  }
  return WithinStaleness(request.worker(), request.clock());
}

bool PullReader::WithinStaleness(uint32_t worker, int64_t clock) const {
  if (options_.mode != ConsistencyMode::kAsync || options_.max_staleness < 0) return true;
  const std::optional<int64_t> slowest = membership_->SlowestActiveClock();
  // Both on the bound's scale: a worker back after being dropped counts
  // from where the others were (see Membership). slowest <= 2 * kMaxClock;
  // the sum saturates instead of overflowing.
  return !(slowest && options_.max_staleness <= std::numeric_limits<int64_t>::max() - *slowest &&
           membership_->StalenessClock(static_cast<int>(worker), clock) >
               *slowest + options_.max_staleness);
}

void PullReader::Fill(const PullRequest& request, wire::PullResponseBuilder* builder,
                     std::vector<int64_t>* versions) const {
  if (versions != nullptr) versions->assign(request.parts_size(), 0);
  int index = 0;
  const DType dtype = common::PayloadDType(request.dtype());
  const size_t width = static_cast<size_t>(common::DTypeSize(dtype));
  for (const PartitionKey& key : request.parts()) {
    absl::StatusOr<Partition*> found = store_->Find(key);
    if (!found.ok()) continue;  // unreachable after Validate
    const Partition& part = **found;
    absl::ReaderMutexLock lock(&part.mu);
    const int64_t version = part.version.load(std::memory_order_relaxed);
    if (versions != nullptr) (*versions)[index] = version;
    ++index;
    char* out = builder->AddPart(key.tensor(), key.partition(), version, dtype,
                                 part.params.size() * width);
    wire::EncodeElements(part.params, dtype, out);
  }
}

bool PullReader::Committed(const PullRequest& request,
                          absl::Span<const int64_t> versions) const {
  for (int i = 0; i < request.parts_size(); ++i) {
    absl::StatusOr<Partition*> found = store_->Find(request.parts(i));
    if (!found.ok()) continue;  // unreachable after Validate
    const int64_t wrote = static_cast<size_t>(i) < versions.size() ? versions[i] : 0;
    if ((*found)->committed.load(std::memory_order_acquire) < wrote) return false;
  }
  return true;
}

void PullReader::Fill(const PullRequest& request, PullResponse* response) const {
  wire::PullResponseBuilder builder;
  Fill(request, &builder);
  grpc::ByteBuffer buffer;
  builder.Finish(/*wait_seconds=*/0, incarnation_, &buffer);
  grpc::ProtoBufferReader reader(&buffer);
  // The encoder writes valid protobuf; a failure here is a broken invariant.
  CHECK(response->ParseFromZeroCopyStream(&reader)) << "pull response does not parse";
}

}  // namespace shardtrain::server
