// wire_fuzz: libFuzzer target over the zero-copy parsers of wire
// (message_views.h), differential against stock protobuf.
//
// Each input names one of the four data-path messages and cuts its bytes
// into slices (format in server/fuzz/wire_fuzz_input.h). Besides the
// sanitizers it checks:
//  - the parse does not depend on where the slices are cut: the same bytes
//    in one slice give the same outcome and view;
//  - what our parser accepts, stock protobuf accepts, and the view equals
//    the stock message's view (ViewOf);
//  - a refusal is INVALID_ARGUMENT naming the message type;
//  - an accepted message re-encoded by the zero-copy encoder (when the
//    encoder can express it) parses with stock protobuf to the same view;
//  - the input's first 32 bytes read as a data-path frame header are
//    refused with INVALID_ARGUMENT or RESOURCE_EXHAUSTED, or encode back to
//    the same bytes.
// A broken promise aborts, which libFuzzer reports as a crash.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

#include <google/protobuf/stubs/logging.h>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "proto/shardtrain.pb.h"
#include "server/fuzz/wire_fuzz_input.h"
#include "wire/frame_header.h"
#include "wire/message_encoder.h"
#include "wire/message_views.h"
#include "wire/testing/view_diff.h"

namespace shardtrain::server::fuzz {
namespace {

using wire::ReceivedMessage;

[[noreturn]] void Fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "wire_fuzz: %s: %s\n", what, detail.c_str());
  std::abort();
}

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) Fail("cannot read an encoded buffer", "");
  std::string bytes;
  for (const grpc::Slice& slice : slices) {
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return bytes;
}

// Re-encodes an accepted push with EncodePush; every part needs a payload
// (the encoder always writes one).
void CheckPushReencodes(const wire::PushView& view) {
  std::vector<std::string> storage;
  storage.reserve(2 * view.parts.size());
  std::vector<wire::GradientPartOut> parts;
  for (const wire::GradientPartView& part : view.parts) {
    if (!part.has_grad) return;
    wire::GradientPartOut& out = parts.emplace_back();
    out.tensor = part.key.tensor;
    out.partition = part.key.partition;
    out.version = part.version;
    out.dtype = static_cast<DType>(part.grad.dtype);
    out.encoding = static_cast<Encoding>(part.grad.encoding);
    out.data = storage.emplace_back(part.grad.data.ToString());
    out.indices = storage.emplace_back(part.grad.indices.ToString());
  }
  wire::PushHeader header{view.worker, view.clock, view.worker_incarnation, view.sequence,
                          view.shard_incarnation};
  header.clock_parts = view.clock_parts;
  wire::SendRefs refs;
  std::string bytes;
  {
    grpc::ByteBuffer buffer;
    wire::EncodePush(header, parts, &refs, &buffer);
    bytes = Flatten(buffer);
  }
  if (refs.Outstanding() != 0) Fail("encoded push slices not released", "");
  PushRequest stock;
  if (!stock.ParseFromString(bytes)) Fail("stock protobuf refuses our encoding", "push");
  const std::string diff = wire::DiffViews(wire::ViewOf(stock), view);
  if (!diff.empty()) Fail("re-encoded push differs", diff);
}

// Re-encodes an accepted pull response with PullResponseBuilder when every
// part is a dense payload.
void CheckPullReencodes(const wire::PullResponseView& view) {
  wire::BufferPool pool(1 << 20);
  std::string bytes;
  {
    wire::PullResponseBuilder builder(&pool);
    for (const wire::ParameterPartView& part : view.parts) {
      if (!part.has_value || part.value.encoding != ENCODING_DENSE ||
          !part.value.indices.empty()) {
        return;
      }
      char* out = builder.AddPart(part.key.tensor, part.key.partition, part.version,
                                  static_cast<DType>(part.value.dtype),
                                  part.value.data.size());
      part.value.data.CopyTo(0, part.value.data.size(), out);
    }
    grpc::ByteBuffer buffer;
    builder.Finish(view.wait_seconds, view.incarnation, &buffer);
    bytes = Flatten(buffer);
  }
  PullResponse stock;
  if (!stock.ParseFromString(bytes)) Fail("stock protobuf refuses our encoding", "pull");
  const std::string diff = wire::DiffViews(wire::ViewOf(stock), view);
  if (!diff.empty()) Fail("re-encoded pull response differs", diff);
}

// `parse(message, &view)` is one of the parsers of wire/message_views.h.
template <typename Stock, typename View, typename Parse>
void Check(const WireInput& input, Parse parse, const char* error_prefix) {
  // The views borrow the messages.
  const ReceivedMessage cut = ReceivedMessage::FromPieces(input.bytes, input.cuts);
  const ReceivedMessage whole = ReceivedMessage::FromPieces(input.bytes, {});
  View cut_view, whole_view;
  const absl::Status cut_status = parse(cut, &cut_view);
  const absl::Status whole_status = parse(whole, &whole_view);
  if (cut_status.ok() != whole_status.ok()) {
    Fail("the outcome depends on the cuts", cut_status.ToString() + " / " + whole_status.ToString());
  }
  if (!cut_status.ok()) {
    if (cut_status.code() != absl::StatusCode::kInvalidArgument ||
        !absl::StartsWith(cut_status.message(), error_prefix)) {
      Fail("a refusal is not INVALID_ARGUMENT naming the message", cut_status.ToString());
    }
    return;
  }
  std::string diff = wire::DiffViews(cut_view, whole_view);
  if (!diff.empty()) Fail("the view depends on the cuts", diff);
  Stock stock;
  if (!stock.ParseFromString(input.bytes)) Fail("we accept what stock protobuf refuses", "");
  diff = wire::DiffViews(cut_view, wire::ViewOf(stock));
  if (!diff.empty()) Fail("our view differs from stock protobuf's", diff);
  if constexpr (std::is_same_v<View, wire::PushView>) CheckPushReencodes(cut_view);
  if constexpr (std::is_same_v<View, wire::PushPullView>) CheckPushReencodes(cut_view.push);
  if constexpr (std::is_same_v<View, wire::PullResponseView>) CheckPullReencodes(cut_view);
  if constexpr (std::is_same_v<View, wire::PushPullResponseView>) {
    CheckPullReencodes(cut_view.pull);
  }
}

// Reads the input's first bytes as a data-path frame header
// (wire/frame_header.h): a refusal is INVALID_ARGUMENT or
// RESOURCE_EXHAUSTED, and an accepted header encodes back to the same bytes.
void CheckFrameHeader(const uint8_t* data, size_t size) {
  if (size < wire::FrameHeader::kBytes) return;
  const char* bytes = reinterpret_cast<const char*>(data);
  const absl::StatusOr<wire::FrameHeader> header =
      wire::FrameHeader::Decode(bytes, uint64_t{1} << 30, 1 << 12);
  if (!header.ok()) {
    if (header.status().code() != absl::StatusCode::kInvalidArgument &&
        header.status().code() != absl::StatusCode::kResourceExhausted) {
      Fail("frame header refused with another code", header.status().ToString());
    }
    return;
  }
  char encoded[wire::FrameHeader::kBytes];
  header->Encode(encoded);
  if (std::string(encoded, sizeof(encoded)) != std::string(bytes, sizeof(encoded))) {
    Fail("frame header does not encode back to its bytes", "");
  }
}

}  // namespace
}  // namespace shardtrain::server::fuzz

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  // Stock protobuf logs every invalid UTF-8 string it refuses.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardtrain;
  using namespace shardtrain::server::fuzz;
  CheckFrameHeader(data, size);
  WireInput input;
  if (!ReadWireInput(data, size, &input)) return 0;
  switch (input.message) {
    case WireMessage::kPushRequest:
      Check<PushRequest, wire::PushView>(
          input, [](const ReceivedMessage& m, wire::PushView* v) { return wire::ParsePush(m, v); },
          "request body is not a valid shardtrain.PushRequest: ");
      break;
    case WireMessage::kPushPullRequest:
      Check<PushPullRequest, wire::PushPullView>(
          input,
          [](const ReceivedMessage& m, wire::PushPullView* v) { return wire::ParsePushPull(m, v); },
          "request body is not a valid shardtrain.PushPullRequest: ");
      break;
    case WireMessage::kPullResponse:
      Check<PullResponse, wire::PullResponseView>(
          input, &wire::ParsePullResponse,
          "response body is not a valid shardtrain.PullResponse: ");
      break;
    case WireMessage::kPushPullResponse:
      Check<PushPullResponse, wire::PushPullResponseView>(
          input, &wire::ParsePushPullResponse,
          "response body is not a valid shardtrain.PushPullResponse: ");
      break;
  }
  return 0;
}
