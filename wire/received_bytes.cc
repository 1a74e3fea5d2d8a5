#include "wire/received_bytes.h"

#include <algorithm>
#include <cstring>

namespace shardtrain::wire {

ReceivedBytes::ReceivedBytes(absl::string_view contiguous) { Append(contiguous); }

void ReceivedBytes::Append(absl::string_view piece) {
  if (piece.empty()) return;
  pieces_.push_back(piece);
  size_ += piece.size();
}

void ReceivedBytes::CopyTo(size_t offset, size_t n, char* out) const {
  for (absl::string_view piece : pieces_) {
    if (n == 0) return;
    if (offset >= piece.size()) {
      offset -= piece.size();
      continue;
    }
    const size_t take = std::min(n, piece.size() - offset);
    std::memcpy(out, piece.data() + offset, take);
    out += take;
    n -= take;
    offset = 0;
  }
}

std::string ReceivedBytes::ToString() const {
  std::string out(size_, '\0');
  CopyTo(0, size_, out.data());
  return out;
}

}  // namespace shardtrain::wire
