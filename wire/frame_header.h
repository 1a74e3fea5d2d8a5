// FrameHeader: the fixed 32-byte header of a frame on a framed TCP
// connection (wire/frame_socket.h), the way calls travel without HTTP/2: a
// request names its method, its call id and how long its caller waits; a
// response repeats the call id and carries a gRPC status code. After the
// header come `message_bytes` bytes of status message (responses that
// failed), then `body_bytes` bytes of body: the same serialised message
// that the gRPC method carries.
//
//   little-endian:  magic u32 "STF1" | flags u8 (bit 0: response) |
//                   method u8 | status u16 | timeout_ms u32 | call_id u64 |
//                   message_bytes u32 | body_bytes u64
//
//   char bytes[FrameHeader::kBytes];
//   header.Encode(bytes);
//   ASSIGN_OR_RETURN(FrameHeader read,
//                    FrameHeader::Decode(bytes, max_body_bytes, max_message_bytes));
#ifndef SHARDTRAIN_WIRE_FRAME_HEADER_H_
#define SHARDTRAIN_WIRE_FRAME_HEADER_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"

namespace shardtrain::wire {

// The calls a shard's data port serves (server/data_port.h), as
// FrameHeader::method; each carries the same message as the gRPC method of
// that name.
enum class DataMethod : uint8_t {
  kPush = 1,
  kPull = 2,
  kPushPull = 3,
  kLookup = 4,
  kPushSparse = 5,
  // Shard to shard: a push forwarded down a replica chain
  // (server/replication/forwarder.h).
  kReplicate = 6,
  // A TLS connection's first frame when its client has the shared token:
  // the body is the token; never answered (server/data_connection.h).
  kHello = 7,
};

struct FrameHeader {
  static constexpr size_t kBytes = 32;
  static constexpr uint32_t kMagic = 0x31465453;  // "STF1" in little-endian order

  bool response = false;
  uint8_t method = 0;         // the caller's method number, 1..255
  uint16_t status = 0;        // response: a grpc::StatusCode (0: OK)
  uint32_t timeout_ms = 0;    // request: how long its caller waits (0: no limit)
  uint64_t call_id = 0;       // chosen by the caller, repeated by the response
  uint32_t message_bytes = 0; // response: the status message's length
  uint64_t body_bytes = 0;

  // Writes the header's kBytes bytes to `out`.
  void Encode(char* out) const;

  // Reads kBytes bytes from `in`. INVALID_ARGUMENT for what no peer of this
  // protocol sends (another magic, unknown flags, method 0, a request with
  // a status or a message); RESOURCE_EXHAUSTED for a body over
  // `max_body_bytes` or a message over `max_message_bytes`, before anything
  // of them is read.
  static absl::StatusOr<FrameHeader> Decode(const char* in, uint64_t max_body_bytes,
                                            uint32_t max_message_bytes);
};

}  // namespace shardtrain::wire

#endif  // SHARDTRAIN_WIRE_FRAME_HEADER_H_
