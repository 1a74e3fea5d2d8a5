#include "wire/internal/wire_reader.h"

#include <algorithm>
#include <climits>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace shardtrain::wire::internal {

bool IsValidUtf8(absl::string_view bytes) {
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  const auto* end = p + bytes.size();
  while (p < end) {
    // Runs of ASCII, 8 bytes at a time.
    while (end - p >= 8) {
      uint64_t word;
      std::memcpy(&word, p, sizeof(word));
      if (word & 0x8080808080808080ull) break;
      p += 8;
    }
    if (p == end) break;
    const uint8_t lead = *p;
    if (lead < 0x80) {
      ++p;
      continue;
    }
    // The continuation bytes a lead byte takes, and the range its first
    // continuation byte must lie in (Unicode table 3-7).
    int continuations;
    uint8_t low = 0x80, high = 0xBF;
    if (lead >= 0xC2 && lead <= 0xDF) {
      continuations = 1;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      continuations = 2;
      if (lead == 0xE0) low = 0xA0;   // overlong
      if (lead == 0xED) high = 0x9F;  // surrogates
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      continuations = 3;
      if (lead == 0xF0) low = 0x90;   // overlong
      if (lead == 0xF4) high = 0x8F;  // above U+10FFFF
    } else {
      return false;
    }
    if (end - p <= continuations) return false;
    if (p[1] < low || p[1] > high) return false;
    for (int i = 2; i <= continuations; ++i) {
      if (p[i] < 0x80 || p[i] > 0xBF) return false;
    }
    p += continuations + 1;
  }
  return true;
}

WireReader::WireReader(absl::Span<const absl::string_view> pieces) : pieces_(pieces) {
  for (absl::string_view piece : pieces_) limit_ += piece.size();
  if (!pieces_.empty()) {
    piece_begin_ = p_ = pieces_[0].data();
    end_ = p_ + pieces_[0].size();
  }
}

void WireReader::NextPiece() {
  base_ += static_cast<size_t>(end_ - piece_begin_);
  ++index_;
  piece_begin_ = p_ = pieces_[index_].data();
  end_ = p_ + pieces_[index_].size();
}

bool WireReader::ReadVarintSlow(int max_bytes, uint64_t* value) {
  const size_t start = offset();
  uint64_t result = 0;
  for (int i = 0; i < max_bytes; ++i) {
    if (AtLimit()) return FailAt(start, "truncated varint");
    if (p_ == end_) NextPiece();
    const uint64_t byte = static_cast<uint8_t>(*p_++);
    result |= (byte & 0x7f) << (7 * i);
    if (byte < 0x80) {
      *value = result;
      return true;
    }
  }
  return FailAt(start, absl::StrCat("varint longer than ", max_bytes, " bytes"));
}

bool WireReader::ReadVarint(uint64_t* value) {
  if (end_ - p_ >= 10 && remaining() >= 10) {
    const auto* bytes = reinterpret_cast<const uint8_t*>(p_);
    uint64_t result = 0;
    for (int i = 0; i < 10; ++i) {
      const uint64_t byte = bytes[i];
      result |= (byte & 0x7f) << (7 * i);
      if (byte < 0x80) {
        p_ += i + 1;
        *value = result;
        return true;
      }
    }
    return Fail("varint longer than 10 bytes");
  }
  return ReadVarintSlow(10, value);
}

bool WireReader::ReadTag(uint32_t* tag) {
  if (p_ < end_ && remaining() > 0 && static_cast<uint8_t>(*p_) < 0x80) {
    *tag = static_cast<uint8_t>(*p_++);
    return true;
  }
  const size_t start = offset();
  uint64_t value;
  if (!ReadVarintSlow(5, &value)) return false;
  if (value > UINT32_MAX) return FailAt(start, "tag over 32 bits");
  *tag = static_cast<uint32_t>(value);
  return true;
}

bool WireReader::ReadFixed64(uint64_t* value) {
  if (remaining() < 8) return Fail("truncated fixed64");
  uint64_t result = 0;
  for (int i = 0; i < 8; ++i) {
    if (p_ == end_) NextPiece();
    result |= uint64_t{static_cast<uint8_t>(*p_++)} << (8 * i);
  }
  *value = result;
  return true;
}

bool WireReader::ReadLength(size_t* length) {
  const size_t start = offset();
  uint64_t value;
  if (p_ < end_ && remaining() > 0 && static_cast<uint8_t>(*p_) < 0x80) {
    value = static_cast<uint8_t>(*p_++);
  } else if (!ReadVarintSlow(5, &value)) {
    return false;
  }
  // Stock protobuf refuses lengths from 2 GiB - 16 up.
  if (value > static_cast<uint64_t>(INT_MAX - 16)) {
    return FailAt(start, absl::StrCat("length ", value, " over 2 GiB"));
  }
  if (value > remaining()) {
    return FailAt(start, absl::StrCat("length ", value,
                                      " runs past the end of the enclosing message (",
                                      remaining(), " bytes left)"));
  }
  *length = static_cast<size_t>(value);
  return true;
}

void WireReader::ReadBytes(size_t n, ReceivedBytes* out) {
  out->Clear();
  while (n > 0) {
    if (p_ == end_) NextPiece();
    const size_t take = std::min(n, static_cast<size_t>(end_ - p_));
    out->Append(absl::string_view(p_, take));
    p_ += take;
    n -= take;
  }
}

void WireReader::ReadString(size_t n, std::string* out) {
  if (p_ == end_ && n > 0) NextPiece();
  if (static_cast<size_t>(end_ - p_) >= n) {
    out->assign(p_, n);
    p_ += n;
    return;
  }
  out->resize(n);
  char* to = out->data();
  while (n > 0) {
    if (p_ == end_) NextPiece();
    const size_t take = std::min(n, static_cast<size_t>(end_ - p_));
    std::memcpy(to, p_, take);
    to += take;
    p_ += take;
    n -= take;
  }
}

bool WireReader::SkipField(uint32_t tag) {
  const uint32_t field = tag >> 3;
  if (field == 0) return Fail("field number 0");
  size_t skip = 0;
  switch (tag & 7) {
    case kVarint: {
      uint64_t ignored;
      return ReadVarint(&ignored);
    }
    case kFixed64:
      skip = 8;
      break;
    case kFixed32:
      skip = 4;
      break;
    case kLengthDelimited:
      if (!ReadLength(&skip)) return false;
      break;
    case kStartGroup:
      return Fail(absl::StrCat("group (wire type 3) in field ", field,
                               "; groups are not supported"));
    case kEndGroup:
      return Fail(absl::StrCat("end-group tag (wire type 4) in field ", field,
                               " outside a group"));
    default:
      return Fail(absl::StrCat("invalid wire type ", tag & 7, " in field ", field));
  }
  if (skip > remaining()) return Fail("truncated field");
  while (skip > 0) {
    if (p_ == end_) NextPiece();
    const size_t take = std::min(skip, static_cast<size_t>(end_ - p_));
    p_ += take;
    skip -= take;
  }
  return true;
}

size_t WireReader::PushLimit(size_t n) {
  const size_t old_limit = limit_;
  limit_ = offset() + n;
  return old_limit;
}

bool WireReader::Fail(absl::string_view reason) { return FailAt(offset(), reason); }

bool WireReader::FailAt(size_t at, absl::string_view reason) {
  reason_ = absl::StrCat(reason, " at byte ", at);
  return false;
}

bool WireReader::Within(absl::string_view field, int index) {
  std::string outer(field);
  if (index >= 0) absl::StrAppend(&outer, "[", index, "]");
  path_ = path_.empty() ? std::move(outer) : absl::StrCat(outer, ".", path_);
  return false;
}

std::string WireReader::error() const {
  return path_.empty() ? reason_ : absl::StrCat(path_, ": ", reason_);
}

}  // namespace shardtrain::wire::internal
