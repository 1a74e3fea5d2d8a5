// WireRequests: the one place where a client builds, encodes and decodes the
// data-path messages (Push, Pull, PushPull) for a batch of partitions that
// live on one shard, for every path: dense f32, f16/bf16, sparse top-k.
//
// Both ways of talking to the shards use it: the blocking Push/Pull/
// PushPull (one batch per shard connection, all registered tensors) and the
// overlapped exchange (one batch per tensor, shard and connection); see
// client/batch_call.h for the RPCs around it.
//
// Tensor bytes are not copied into protobuf `bytes` fields:
//  - a push references its payloads (wire/message_encoder.h): a
//    dense f32 gradient is sent from the caller's memory itself; f16/bf16
//    are converted once into this batch's recycled staging buffer, top-k
//    is compressed into this batch's payloads, and those are referenced;
//  - a pull's answer is parsed in place in the received slices and each
//    partition copied (and converted) straight into its destination, one
//    pass over the bytes (wire/payload_pieces.h).
// The bytes on the wire are the protobuf encoding of proto/shardtrain.proto,
// so any shard speaking the stock messages understands them.
//
// Referenced memory. Until refs().WaitReleased() returns true after a push's
// call ended (and the request buffer was cleared), gRPC may still read the
// gradient passed to SetPush and this batch's staging buffers.
//
//   WireRequests batch(options, slices, &names);
//   batch.SetPush(clock, sequence, [&](int t) { return grads[t]; }, versions);
//   grpc::ByteBuffer request, response;
//   batch.EncodePush(shard_incarnation, /*clamp=*/nullptr, &request);
//   ... generic_stub.UnaryCall(ctx, kPushMethod, {}, &request, &response, done) ...
//   PushResult pushed;
//   RETURN_IF_ERROR(batch.DecodePush(&response, &pushed));
//   request.Clear();
//   batch.refs().WaitReleased(deadline);  // now the gradient may change
//
// Thread-compatible: one call of the batch at a time.
#ifndef SHARDTRAIN_CLIENT_WIRE_REQUESTS_H_
#define SHARDTRAIN_CLIENT_WIRE_REQUESTS_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include <grpcpp/support/byte_buffer.h>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/topk_compressor.h"
#include "proto/shardtrain.pb.h"
#include "wire/message_encoder.h"
#include "wire/message_views.h"

namespace shardtrain::client {

// The full names of the data-path methods, for grpc::GenericStub.
inline constexpr char kPushMethod[] = "/shardtrain.ParameterServer/Push";
inline constexpr char kPullMethod[] = "/shardtrain.ParameterServer/Pull";
inline constexpr char kPushPullMethod[] = "/shardtrain.ParameterServer/PushPull";

// Elements [offset, offset + size) of tensor `tensor`, one partition.
struct PartitionSlice {
  int tensor = 0;
  uint32_t partition = 0;
  int64_t offset = 0;
  int64_t size = 0;
  size_t version_index = 0;  // into the client's VersionTable
};

// The version of each partition as last learned (pulled, or taken from a
// restarted shard), indexed by PartitionSlice::version_index. A deque, so
// the atomics never move.
using VersionTable = std::deque<std::atomic<int64_t>>;

// What every request of one client carries.
struct WireOptions {
  uint32_t worker = 0;
  uint64_t worker_incarnation = 0;
  // Dtype of gradients and parameters on the wire.
  DType dtype = DTYPE_F32;
  // Not owned; null sends gradients dense. Must outlive the requests.
  common::TopKCompressor* topk = nullptr;
};

// What a shard answered to a push.
struct PushResult {
  int64_t max_staleness = 0;
};

// What a shard answered to a pull, besides the parameters.
struct PullResult {
  double wait_seconds = 0;
  int64_t min_version = INT64_MAX;  // smallest partition version received
};

class WireRequests {
 public:
  // `tensor_names[t]` names tensor t; not owned, must outlive this.
  // REQUIRES: `slices` is not empty.
  WireRequests(const WireOptions& options, std::vector<PartitionSlice> slices,
               const std::vector<std::string>* tensor_names);
  WireRequests(const WireRequests&) = delete;
  WireRequests& operator=(const WireRequests&) = delete;

  const std::vector<PartitionSlice>& slices() const { return slices_; }
  // Payload bytes this batch's push carries (dense in the wire dtype).
  int64_t dense_bytes() const { return dense_bytes_; }

  // Prepares the next push: gradient of partition i is
  // grad_of(slice.tensor).subspan(slice.offset, slice.size), computed from
  // the versions now in `versions`. Converts or compresses the payloads
  // that are not sent as they are. REQUIRES: every grad_of(t) asked for is
  // large enough; it stays unchanged until the push's references are
  // released (see the file comment).
  void SetPush(int64_t clock, uint64_t sequence,
               absl::FunctionRef<absl::Span<const float>(int tensor)> grad_of,
               const VersionTable& versions);
  // Prepares the next pull: partition i is written to
  // params_of(slice.tensor).subspan(slice.offset, slice.size).
  void SetPull(int64_t clock, int64_t min_version,
               absl::FunctionRef<absl::Span<float>(int tensor)> params_of);

  // Replicated shards: the chain epoch the next encoded requests carry
  // (PushRequest/PullRequest.chain_epoch); 0, the default, is not sent.
  void set_chain_epoch(uint64_t epoch);
  // An async push split over several calls: how many (PushRequest.clock_parts);
  // 0, the default, is not sent.
  void set_clock_parts(uint32_t parts) { header_.clock_parts = parts; }

  // One attempt's request. `clamp` (async mode) lowers each part's version
  // to the version now in it, if smaller (a shard that restarted and lost
  // updates). Replaces `*out`.
  void EncodePush(uint64_t shard_incarnation, const VersionTable* clamp,
                  grpc::ByteBuffer* out);
  void EncodePull(uint64_t shard_incarnation, grpc::ByteBuffer* out);
  void EncodePushPull(uint64_t shard_incarnation, const VersionTable* clamp,
                      grpc::ByteBuffer* out);

  // Decode an answer, consuming `response`. A pull's partitions are copied
  // into the destinations of SetPull and their versions stored in
  // `versions`. INTERNAL/INVALID_ARGUMENT when the answer does not match
  // the request.
  absl::Status DecodePush(grpc::ByteBuffer* response, PushResult* result) const;
  absl::Status DecodePull(grpc::ByteBuffer* response, VersionTable* versions,
                          PullResult* result) const;
  absl::Status DecodePushPull(grpc::ByteBuffer* response, VersionTable* versions,
                              PushResult* push, PullResult* pull) const;

  // The push as last encoded (payloads referenced), for SyncReplay.
  const wire::PushHeader& push_header() const { return header_; }
  absl::Span<const wire::GradientPartOut> push_parts() const { return parts_; }

  // Slices of sent requests that still reference the gradient or this
  // batch's staging buffers.
  wire::SendRefs& refs() { return refs_; }
  const wire::SendRefs& refs() const { return refs_; }

 private:
  // Applies `clamp` to parts_ and sets the header's shard incarnation.
  void PrepareAttempt(uint64_t shard_incarnation, const VersionTable* clamp);
  absl::Status DecodeParameters(const wire::PullResponseView& view,
                                VersionTable* versions, PullResult* result) const;

  const WireOptions options_;
  const std::vector<PartitionSlice> slices_;
  const std::vector<std::string>* const tensor_names_;
  int64_t dense_bytes_ = 0;
  wire::PushHeader header_;
  std::vector<wire::GradientPartOut> parts_;
  // f16/bf16: each partition's gradient converted, recycled from push to
  // push. Top-k: each partition's compressed payload.
  std::vector<std::string> staged_;
  std::vector<Payload> compressed_;
  PullRequest pull_;
  std::vector<absl::Span<float>> destinations_;  // by slice, from SetPull
  wire::SendRefs refs_;
};

}  // namespace shardtrain::client

#endif  // SHARDTRAIN_CLIENT_WIRE_REQUESTS_H_
