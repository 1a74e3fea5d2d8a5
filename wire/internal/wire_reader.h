// WireReader: reads the protobuf wire format from a chain of pieces (the
// slices of a received message), with the same limits stock protobuf
// applies, for the hand-written parsers in wire/message_views.cc.
//
//   WireReader reader(pieces);
//   while (!reader.AtLimit()) {
//     uint32_t tag;
//     if (!reader.ReadTag(&tag)) return false;
//     ...
//   }
//
// Every read checks it stays within the current limit (the end of the
// message, or of the submessage being read after PushLimit), so a length
// the bytes do not back is refused before anything is allocated for it.
// A failed read returns false and error() says what and where; the reader
// is then unspecified. Thread-compatible.
#ifndef SHARDTRAIN_WIRE_INTERNAL_WIRE_READER_H_
#define SHARDTRAIN_WIRE_INTERNAL_WIRE_READER_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "wire/received_bytes.h"

namespace shardtrain::wire::internal {

enum WireType : uint32_t {
  kVarint = 0,
  kFixed64 = 1,
  kLengthDelimited = 2,
  kStartGroup = 3,
  kEndGroup = 4,
  kFixed32 = 5,
};

constexpr uint32_t MakeTag(uint32_t field, WireType type) {
  return (field << 3) | type;
}

// True when `bytes` is well-formed UTF-8 as protobuf checks proto3 strings:
// no overlong forms, no surrogates, nothing above U+10FFFF.
bool IsValidUtf8(absl::string_view bytes);

class WireReader {
 public:
  // `pieces` (non-empty pieces, in order) must outlive the reader.
  explicit WireReader(absl::Span<const absl::string_view> pieces);

  // Bytes read so far, from the start of the message.
  size_t offset() const { return base_ + static_cast<size_t>(p_ - piece_begin_); }
  // Bytes left before the current limit.
  size_t remaining() const { return limit_ - offset(); }
  bool AtLimit() const { return offset() == limit_; }

  // A tag: at most 5 bytes and 32 bits. Its field number may be 0 and its
  // wire type anything; SkipField checks them.
  bool ReadTag(uint32_t* tag);
  // A varint of at most 10 bytes (bits past 64 are dropped, as protobuf
  // does).
  bool ReadVarint(uint64_t* value);
  bool ReadFixed64(uint64_t* value);
  // The length prefix of a length-delimited field: at most 5 bytes, under
  // 2 GiB, and no longer than the bytes left before the limit.
  bool ReadLength(size_t* length);
  // The next `n` bytes as pieces of the chain (not copied), or copied into
  // `out`. REQUIRES: n <= remaining().
  void ReadBytes(size_t n, ReceivedBytes* out);
  void ReadString(size_t n, std::string* out);
  // Skips the value of a field whose tag was just read. Refuses field
  // number 0, groups (wire types 3 and 4) and wire types 6 and 7.
  bool SkipField(uint32_t tag);

  // Narrows the limit to the next `n` bytes and returns the old limit for
  // PopLimit. REQUIRES: n <= remaining().
  size_t PushLimit(size_t n);
  // REQUIRES: AtLimit().
  void PopLimit(size_t old_limit) { limit_ = old_limit; }

  // Records `reason` (with the current offset) as the error; returns false.
  bool Fail(absl::string_view reason);
  // Records `reason` at byte `at`; returns false.
  bool FailAt(size_t at, absl::string_view reason);
  // Prefixes the recorded error with the field it happened in (called by
  // each enclosing message on the way out); returns false.
  bool Within(absl::string_view field, int index = -1);
  // "parts[2].grad.data: length 4096 runs past ... at byte 88".
  std::string error() const;

 private:
  bool ReadVarintSlow(int max_bytes, uint64_t* value);
  // Moves to the next piece. REQUIRES: p_ == end_ and bytes remain.
  void NextPiece();

  absl::Span<const absl::string_view> pieces_;
  size_t index_ = 0;                  // pieces_[index_] holds p_
  const char* piece_begin_ = nullptr;
  const char* p_ = nullptr;
  const char* end_ = nullptr;
  size_t base_ = 0;                   // offset of piece_begin_
  size_t limit_ = 0;
  std::string path_;                  // built on failure only
  std::string reason_;
};

}  // namespace shardtrain::wire::internal

#endif  // SHARDTRAIN_WIRE_INTERNAL_WIRE_READER_H_
