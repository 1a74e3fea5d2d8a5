// What data_port_fuzz and its seed writer share: the shard the fuzzer
// serves (one tensor "w" of kElements f32 in one partition) and how a call
// is written as the bytes a client sends (wire/frame_header.h).
#ifndef SHARDTRAIN_SERVER_FUZZ_DATA_PORT_FRAMES_H_
#define SHARDTRAIN_SERVER_FUZZ_DATA_PORT_FRAMES_H_

#include <cstdint>
#include <string>

#include "wire/frame_header.h"

namespace shardtrain::server::fuzz {

inline constexpr int kDataPortElements = 256;

// One request frame: header and body.
inline std::string RequestFrame(wire::DataMethod method, uint64_t call_id,
                                uint32_t timeout_ms, const std::string& body) {
  wire::FrameHeader header;
  header.method = static_cast<uint8_t>(method);
  header.call_id = call_id;
  header.timeout_ms = timeout_ms;
  header.body_bytes = body.size();
  char bytes[wire::FrameHeader::kBytes];
  header.Encode(bytes);
  return std::string(bytes, sizeof(bytes)) + body;
}

}  // namespace shardtrain::server::fuzz

#endif  // SHARDTRAIN_SERVER_FUZZ_DATA_PORT_FRAMES_H_
