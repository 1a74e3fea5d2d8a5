// Zero-copy parsing of the data-path messages (PushRequest, PushPullRequest,
// PullResponse, PushPullResponse) straight from the slices gRPC received.
//
// The bytes on the wire are the protobuf encoding of the messages in
// proto/shardtrain.proto, so any gRPC client speaking the stock protobuf
// messages is understood, and anything parsed here parses with stock
// protobuf. The difference is where tensor bytes end up: stock parsing
// copies every `bytes` field into a std::string; these views leave them in
// the received slices (wire::ReceivedBytes), so the server applies a
// gradient, and the client copies pulled parameters into the model, in one
// pass over the bytes as they arrived.
//
// Parsing follows protobuf's rules: fields in any order, unknown fields
// skipped, the last value of a repeated scalar wins, a repeated singular
// submessage is merged. A malformed message (truncated, bad varint, a
// group, a length past the end, nesting the schema does not have) is
// INVALID_ARGUMENT "request body is not a valid shardtrain.PushRequest: ..."
// (the message type named), and the view is unspecified.
//
//   ReceivedMessage message;
//   RETURN_IF_ERROR(message.Take(request_buffer));
//   PushView push;
//   RETURN_IF_ERROR(ParsePush(message, &push));
//   for (const GradientPartView& part : push.parts) ... part.grad.data ...
//
// A view borrows the ReceivedMessage (or stock message) it was made from,
// which must outlive it. Thread-compatible.
#ifndef SHARDTRAIN_WIRE_MESSAGE_VIEWS_H_
#define SHARDTRAIN_WIRE_MESSAGE_VIEWS_H_

#include <cstdint>
#include <string>
#include <vector>

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include "absl/status/status.h"
#include "proto/shardtrain.pb.h"
#include "wire/received_bytes.h"

namespace shardtrain::wire {

// The slices of one received message, referenced, not copied. An invalid
// (never filled) buffer is taken as an empty message.
//
// Views point into the slices, and gRPC keeps a short slice's bytes inside
// the grpc::Slice itself: a ReceivedMessage may be moved while views of it
// live (the slices stay where they are), but not taken into again.
class ReceivedMessage {
 public:
  ReceivedMessage() = default;
  // Takes references to `buffer`'s slices and clears it. INVALID_ARGUMENT
  // if gRPC cannot hand them over (a compressed buffer).
  absl::Status Take(grpc::ByteBuffer* buffer);
  // The same for a buffer the caller may not clear (the request of a raw
  // callback method); `buffer` keeps its own references.
  absl::Status Take(const grpc::ByteBuffer& buffer);
  // Tests: a message made of `bytes` cut into pieces at `cuts` (offsets in
  // increasing order), each piece its own slice.
  static ReceivedMessage FromPieces(absl::string_view bytes,
                                    const std::vector<size_t>& cuts);

  size_t size() const { return size_; }
  const std::vector<grpc::Slice>& slices() const { return slices_; }
  // Bytes [offset, offset + n) as a buffer referencing the same slices (no
  // copy). REQUIRES: offset + n <= size().
  grpc::ByteBuffer Range(size_t offset, size_t n) const;

 private:
  std::vector<grpc::Slice> slices_;
  size_t size_ = 0;
};

// shardtrain.Payload.
struct PayloadView {
  int dtype = 0;     // a DType value as sent; may be one this build lacks
  int encoding = 0;  // an Encoding value as sent
  ReceivedBytes data;
  ReceivedBytes indices;  // ENCODING_SPARSE only
};

// shardtrain.PartitionKey. The name is copied (short).
struct KeyView {
  std::string tensor;
  uint32_t partition = 0;
};

// shardtrain.GradientPart.
struct GradientPartView {
  KeyView key;
  int64_t version = 0;
  bool has_grad = false;
  PayloadView grad;
};

// shardtrain.PushRequest.
struct PushView {
  uint32_t worker = 0;
  int64_t clock = 0;
  uint64_t worker_incarnation = 0;
  uint64_t sequence = 0;
  uint64_t shard_incarnation = 0;
  uint64_t chain_epoch = 0;
  uint32_t clock_parts = 0;
  std::vector<GradientPartView> parts;
  // Set on a push forwarded down a replica chain (PushRequest.replicated).
  std::vector<ReplicatedOp> replicated;
};

// shardtrain.PushPullRequest. Its pull half carries no tensor bytes and is
// parsed with stock protobuf.
struct PushPullView {
  PushView push;
  PullRequest pull;
  // Where the push half's bytes lie in the message (after its length
  // prefix), and how many `push` fields there were: a replicated head
  // forwards those bytes as they are when there was exactly one.
  size_t push_offset = 0;
  size_t push_size = 0;
  int push_fields = 0;
};

// shardtrain.ParameterPart.
struct ParameterPartView {
  KeyView key;
  int64_t version = 0;
  bool has_value = false;
  PayloadView value;
};

// shardtrain.PullResponse.
struct PullResponseView {
  std::vector<ParameterPartView> parts;
  double wait_seconds = 0;
  uint64_t incarnation = 0;
};

// shardtrain.PushPullResponse. Its push half is small and parsed with stock
// protobuf.
struct PushPullResponseView {
  PushResponse push;
  PullResponseView pull;
};

// `max_parts`: a push with more parts than this is RESOURCE_EXHAUSTED
// "push has N parts; the limit is M per request", found by a scan of the
// tags before anything is allocated for the parts (a part's view takes
// about 160 bytes; an empty part on the wire 2).
inline constexpr size_t kNoPartLimit = ~size_t{0};
absl::Status ParsePush(const ReceivedMessage& message, PushView* view,
                       size_t max_parts = kNoPartLimit);
absl::Status ParsePushPull(const ReceivedMessage& message, PushPullView* view,
                           size_t max_parts = kNoPartLimit);
absl::Status ParsePullResponse(const ReceivedMessage& message,
                               PullResponseView* view);
absl::Status ParsePushPullResponse(const ReceivedMessage& message,
                                   PushPullResponseView* view);

// Views of stock messages, for in-process callers and tests; they borrow
// `message`'s strings.
PushView ViewOf(const PushRequest& message);
PullResponseView ViewOf(const PullResponse& message);

}  // namespace shardtrain::wire

#endif  // SHARDTRAIN_WIRE_MESSAGE_VIEWS_H_
