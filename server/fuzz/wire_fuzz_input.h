// The input format of wire_fuzz (the zero-copy parsers of wire),
// shared by the target and its seed generator.
//
//   byte 0        bits 0-1: the message (WireMessage), bits 2-5: cuts n
//   bytes 1..2n   n cut positions, uint16 little-endian, each taken modulo
//                 (message size + 1) and sorted: where the message is cut
//                 into slices
//   the rest      the message bytes
#ifndef SHARDTRAIN_SERVER_FUZZ_WIRE_FUZZ_INPUT_H_
#define SHARDTRAIN_SERVER_FUZZ_WIRE_FUZZ_INPUT_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace shardtrain::server::fuzz {

enum class WireMessage : uint8_t {
  kPushRequest = 0,
  kPushPullRequest = 1,
  kPullResponse = 2,
  kPushPullResponse = 3,
};

struct WireInput {
  WireMessage message = WireMessage::kPushRequest;
  std::vector<size_t> cuts;
  std::string bytes;
};

// Empty input: nothing to parse (returns false).
inline bool ReadWireInput(const uint8_t* data, size_t size, WireInput* input) {
  if (size == 0) return false;
  input->message = static_cast<WireMessage>(data[0] & 3);
  size_t cuts = (data[0] >> 2) & 15;
  cuts = std::min(cuts, (size - 1) / 2);
  const size_t header = 1 + 2 * cuts;
  input->bytes.assign(reinterpret_cast<const char*>(data) + header, size - header);
  input->cuts.clear();
  for (size_t i = 0; i < cuts; ++i) {
    const size_t cut = data[1 + 2 * i] | (size_t{data[2 + 2 * i]} << 8);
    input->cuts.push_back(cut % (input->bytes.size() + 1));
  }
  std::sort(input->cuts.begin(), input->cuts.end());
  return true;
}

inline std::string WriteWireInput(const WireInput& input) {
  const size_t cuts = std::min<size_t>(input.cuts.size(), 15);
  std::string out(1, static_cast<char>(static_cast<uint8_t>(input.message) | (cuts << 2)));
  for (size_t i = 0; i < cuts; ++i) {
    out.push_back(static_cast<char>(input.cuts[i] & 0xff));
    out.push_back(static_cast<char>((input.cuts[i] >> 8) & 0xff));
  }
  return out + input.bytes;
}

}  // namespace shardtrain::server::fuzz

#endif  // SHARDTRAIN_SERVER_FUZZ_WIRE_FUZZ_INPUT_H_
