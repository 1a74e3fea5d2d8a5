#include "wire/frame_header.h"

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace shardtrain::wire {
namespace {

constexpr uint8_t kResponseFlag = 1;

template <typename T>
void Put(T value, char*& out) {
  for (size_t i = 0; i < sizeof(T); ++i) *out++ = static_cast<char>(value >> (8 * i));
}

template <typename T>
T Get(const char*& in) {
  T value = 0;
  for (size_t i = 0; i < sizeof(T); ++i) {
    value = static_cast<T>(value | (T{static_cast<unsigned char>(*in++)} << (8 * i)));
  }
  return value;
}

}  // namespace

void FrameHeader::Encode(char* out) const {
  Put<uint32_t>(kMagic, out);
  Put<uint8_t>(response ? kResponseFlag : 0, out);
  Put<uint8_t>(method, out);
  Put<uint16_t>(status, out);
  Put<uint32_t>(timeout_ms, out);
  Put<uint64_t>(call_id, out);
  Put<uint32_t>(message_bytes, out);
  Put<uint64_t>(body_bytes, out);
}

absl::StatusOr<FrameHeader> FrameHeader::Decode(const char* in, uint64_t max_body_bytes,
                                                uint32_t max_message_bytes) {
  const uint32_t magic = Get<uint32_t>(in);
  if (magic != kMagic) {
    return absl::InvalidArgumentError(
        absl::StrFormat("not a shardtrain frame (magic 0x%08x, want 0x%08x)", magic, kMagic));
  }
  const uint8_t flags = Get<uint8_t>(in);
  if ((flags & ~kResponseFlag) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat("unknown frame flags 0x%02x", flags));
  }
  FrameHeader header;
  header.response = (flags & kResponseFlag) != 0;
  header.method = Get<uint8_t>(in);
  header.status = Get<uint16_t>(in);
  header.timeout_ms = Get<uint32_t>(in);
  header.call_id = Get<uint64_t>(in);
  header.message_bytes = Get<uint32_t>(in);
  header.body_bytes = Get<uint64_t>(in);
  if (header.method == 0) return absl::InvalidArgumentError("frame names method 0");
  if (!header.response && (header.status != 0 || header.message_bytes != 0)) {
    return absl::InvalidArgumentError("a request frame carries a status");
  }
  if (header.body_bytes > max_body_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("frame body of %d bytes is over the limit of %d", header.body_bytes,
                        max_body_bytes));
  }
  if (header.message_bytes > max_message_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("frame status message of %d bytes is over the limit of %d",
                        header.message_bytes, max_message_bytes));
  }
  return header;
}

}  // namespace shardtrain::wire
