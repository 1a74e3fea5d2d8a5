// ReceivedBytes: the bytes of one protobuf `bytes` field as they lie in the
// slices gRPC received, without copying them out.
//
// gRPC hands a received message over as a chain of slices (pieces of the
// transport's read buffers); a field may start, end and be split anywhere in
// that chain. A ReceivedBytes is the list of pieces that make up one field,
// in order. It borrows the memory of the ReceivedMessage it was parsed from
// (wire/message_views.h), or of the std::string it was made from.
//
//   ReceivedBytes data = part.grad.data;
//   for (absl::string_view piece : data.pieces()) Consume(piece);
//
// Thread-compatible; cheap to copy (copies the piece list, not the bytes).
#ifndef SHARDTRAIN_WIRE_RECEIVED_BYTES_H_
#define SHARDTRAIN_WIRE_RECEIVED_BYTES_H_

#include <cstddef>
#include <string>

#include "absl/container/inlined_vector.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace shardtrain::wire {

class ReceivedBytes {
 public:
  ReceivedBytes() = default;
  // One contiguous piece (e.g. a stock protobuf message's std::string).
  explicit ReceivedBytes(absl::string_view contiguous);

  // Appends a piece; empty pieces are dropped.
  void Append(absl::string_view piece);
  // Empties the list (keeps its capacity).
  void Clear() {
    pieces_.clear();
    size_ = 0;
  }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  // Non-empty pieces, in order; their sizes add up to size().
  absl::Span<const absl::string_view> pieces() const { return pieces_; }

  // Copies bytes [offset, offset + n) to `out`.
  // REQUIRES: offset + n <= size().
  void CopyTo(size_t offset, size_t n, char* out) const;
  // All bytes in one string (tests, small fields).
  std::string ToString() const;

 private:
  absl::InlinedVector<absl::string_view, 2> pieces_;
  size_t size_ = 0;
};

}  // namespace shardtrain::wire

#endif  // SHARDTRAIN_WIRE_RECEIVED_BYTES_H_
