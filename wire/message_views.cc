// The parsers of wire/message_views.h, over internal::WireReader.
#include "wire/message_views.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "wire/internal/wire_reader.h"

namespace shardtrain::wire {
namespace {

using internal::kFixed64;
using internal::kLengthDelimited;
using internal::kVarint;
using internal::MakeTag;
using internal::WireReader;

// The non-empty pieces of a received message.
using Pieces = absl::InlinedVector<absl::string_view, 16>;

Pieces PiecesOf(const ReceivedMessage& message) {
  Pieces pieces;
  pieces.reserve(message.slices().size());
  for (const grpc::Slice& slice : message.slices()) {
    if (slice.size() == 0) continue;
    pieces.emplace_back(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return pieces;
}

absl::Status Invalid(absl::string_view body, absl::string_view type, const WireReader& reader) {
  return absl::InvalidArgumentError(
      absl::StrCat(body, " body is not a valid shardtrain.", type, ": ", reader.error()));
}

// Reads a length prefix and parses the submessage it frames with `parse`
// (merging into what earlier occurrences left, as protobuf does).
template <typename Parse>
bool ReadMessage(WireReader& reader, absl::string_view field, int index, Parse parse) {
  size_t length;
  if (!reader.ReadLength(&length)) return reader.Within(field, index);
  const size_t outer = reader.PushLimit(length);
  if (!parse()) return reader.Within(field, index);
  reader.PopLimit(outer);
  return true;
}

template <typename T>
bool ReadVarintField(WireReader& reader, absl::string_view field, T* out) {
  uint64_t value;
  if (!reader.ReadVarint(&value)) return reader.Within(field);
  if constexpr (sizeof(T) == 4) {
    *out = static_cast<T>(static_cast<uint32_t>(value));  // the low 32 bits
  } else {
    *out = static_cast<T>(value);
  }
  return true;
}

bool ReadBytesField(WireReader& reader, absl::string_view field, ReceivedBytes* out) {
  size_t length;
  if (!reader.ReadLength(&length)) return reader.Within(field);
  reader.ReadBytes(length, out);
  return true;
}

// The number of fields with `tag` from here to the limit, to size a vector
// by what the bytes hold (stops early on bytes the real pass refuses).
size_t CountFields(WireReader reader, uint32_t tag) {
  size_t count = 0;
  while (!reader.AtLimit()) {
    uint32_t next;
    if (!reader.ReadTag(&next) || !reader.SkipField(next)) break;
    if (next == tag) ++count;
  }
  return count;
}

bool ParseKey(WireReader& reader, KeyView* key) {
  while (!reader.AtLimit()) {
    uint32_t tag;
    if (!reader.ReadTag(&tag)) return false;
    switch (tag) {
      case MakeTag(1, kLengthDelimited): {
        const size_t start = reader.offset();
        size_t length;
        if (!reader.ReadLength(&length)) return reader.Within("tensor");
        reader.ReadString(length, &key->tensor);
        if (!internal::IsValidUtf8(key->tensor)) {
          reader.FailAt(start, "invalid UTF-8 in a string field");
          return reader.Within("tensor");
        }
        break;
      }
      case MakeTag(2, kVarint):
        if (!ReadVarintField(reader, "partition", &key->partition)) return false;
        break;
      default:
        if (!reader.SkipField(tag)) return false;
    }
  }
  return true;
}

bool ParsePayload(WireReader& reader, PayloadView* payload) {
  while (!reader.AtLimit()) {
    uint32_t tag;
    if (!reader.ReadTag(&tag)) return false;
    switch (tag) {
      case MakeTag(1, kVarint):
        if (!ReadVarintField(reader, "dtype", &payload->dtype)) return false;
        break;
      case MakeTag(2, kVarint):
        if (!ReadVarintField(reader, "encoding", &payload->encoding)) return false;
        break;
      case MakeTag(3, kLengthDelimited):
        if (!ReadBytesField(reader, "data", &payload->data)) return false;
        break;
      case MakeTag(4, kLengthDelimited):
        if (!ReadBytesField(reader, "indices", &payload->indices)) return false;
        break;
      default:
        if (!reader.SkipField(tag)) return false;
    }
  }
  return true;
}

// GradientPart and ParameterPart: key, version, an optional payload.
template <typename PartView>
bool ParsePart(WireReader& reader, const char* payload_name, PartView* part,
               bool* has_payload, PayloadView* payload) {
  while (!reader.AtLimit()) {
    uint32_t tag;
    if (!reader.ReadTag(&tag)) return false;
    switch (tag) {
      case MakeTag(1, kLengthDelimited):
        if (!ReadMessage(reader, "key", -1, [&] { return ParseKey(reader, &part->key); })) {
          return false;
        }
        break;
      case MakeTag(2, kVarint):
        if (!ReadVarintField(reader, "version", &part->version)) return false;
        break;
      case MakeTag(3, kLengthDelimited):
        *has_payload = true;
        if (!ReadMessage(reader, payload_name, -1,
                         [&] { return ParsePayload(reader, payload); })) {
          return false;
        }
        break;
      default:
        if (!reader.SkipField(tag)) return false;
    }
  }
  return true;
}

// A small stock message in a length-delimited field: gathered and merged
// into `*message` (a second occurrence merges, as protobuf does).
bool MergeStockField(WireReader& reader, absl::string_view field,
                     google::protobuf::MessageLite* message) {
  const size_t start = reader.offset();
  size_t length;
  if (!reader.ReadLength(&length)) return reader.Within(field);
  std::string bytes;
  reader.ReadString(length, &bytes);
  if (!message->MergeFromString(bytes)) {
    reader.FailAt(start, absl::StrCat("not a valid ", message->GetTypeName()));
    return reader.Within(field);
  }
  return true;
}

// `*too_many`: set to the number of parts when over `max_parts` (nothing
// is allocated for them then).
bool ParsePushFields(WireReader& reader, size_t max_parts, size_t* too_many, PushView* view) {
  const size_t parts =
      view->parts.size() + CountFields(reader, MakeTag(3, kLengthDelimited));
  if (parts > max_parts) {
    *too_many = parts;
    return false;
  }
  view->parts.reserve(parts);
  while (!reader.AtLimit()) {
    uint32_t tag;
    if (!reader.ReadTag(&tag)) return false;
    switch (tag) {
      case MakeTag(1, kVarint):
        if (!ReadVarintField(reader, "worker", &view->worker)) return false;
        break;
      case MakeTag(2, kVarint):
        if (!ReadVarintField(reader, "clock", &view->clock)) return false;
        break;
      case MakeTag(3, kLengthDelimited): {
        const int index = static_cast<int>(view->parts.size());
        GradientPartView& part = view->parts.emplace_back();
        if (!ReadMessage(reader, "parts", index, [&] {
              return ParsePart(reader, "grad", &part, &part.has_grad, &part.grad);
            })) {
          return false;
        }
        break;
      }
      case MakeTag(4, kVarint):
        if (!ReadVarintField(reader, "worker_incarnation", &view->worker_incarnation)) {
          return false;
        }
        break;
      case MakeTag(5, kVarint):
        if (!ReadVarintField(reader, "sequence", &view->sequence)) return false;
        break;
      case MakeTag(6, kVarint):
        if (!ReadVarintField(reader, "shard_incarnation", &view->shard_incarnation)) {
          return false;
        }
        break;
      case MakeTag(7, kVarint):
        if (!ReadVarintField(reader, "chain_epoch", &view->chain_epoch)) return false;
        break;
      case MakeTag(8, kLengthDelimited):
        // One per part at most (and as many closes): bounded like parts.
        if (view->replicated.size() >= 2 * max_parts + 1) {
          *too_many = view->replicated.size();
          return false;
        }
        if (!MergeStockField(reader, "replicated", &view->replicated.emplace_back())) {
          return false;
        }
        break;
      case MakeTag(9, kVarint):
        if (!ReadVarintField(reader, "clock_parts", &view->clock_parts)) return false;
        break;
      default:
        if (!reader.SkipField(tag)) return false;
    }
  }
  return true;
}

bool ParsePullResponseFields(WireReader& reader, PullResponseView* view) {
  view->parts.reserve(view->parts.size() +
                      CountFields(reader, MakeTag(1, kLengthDelimited)));
  while (!reader.AtLimit()) {
    uint32_t tag;
    if (!reader.ReadTag(&tag)) return false;
    switch (tag) {
      case MakeTag(1, kLengthDelimited): {
        const int index = static_cast<int>(view->parts.size());
        ParameterPartView& part = view->parts.emplace_back();
        if (!ReadMessage(reader, "parts", index, [&] {
              return ParsePart(reader, "value", &part, &part.has_value, &part.value);
            })) {
          return false;
        }
        break;
      }
      case MakeTag(2, kFixed64): {
        uint64_t bits;
        if (!reader.ReadFixed64(&bits)) return reader.Within("wait_seconds");
        std::memcpy(&view->wait_seconds, &bits, sizeof(bits));
        break;
      }
      case MakeTag(3, kVarint):
        if (!ReadVarintField(reader, "incarnation", &view->incarnation)) return false;
        break;
      default:
        if (!reader.SkipField(tag)) return false;
    }
  }
  return true;
}

absl::Status TooManyParts(size_t parts, size_t max_parts) {
  return absl::ResourceExhaustedError(absl::StrCat(
      "push has ", parts, " parts; the limit is ", max_parts, " per request"));
}

void Reset(PushView* view) {
  view->worker = 0;
  view->clock = 0;
  view->worker_incarnation = 0;
  view->sequence = 0;
  view->shard_incarnation = 0;
  view->chain_epoch = 0;
  view->clock_parts = 0;
  view->parts.clear();
  view->replicated.clear();
}

void Reset(PullResponseView* view) {
  view->parts.clear();
  view->wait_seconds = 0;
  view->incarnation = 0;
}

}  // namespace

absl::Status ReceivedMessage::Take(const grpc::ByteBuffer& buffer) {
  slices_.clear();
  size_ = 0;
  if (!buffer.Valid()) return absl::OkStatus();  // nothing received: empty
  const grpc::Status status = buffer.Dump(&slices_);
  if (!status.ok()) {
    slices_.clear();
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read the received message: ", status.error_message()));
  }
  for (const grpc::Slice& slice : slices_) size_ += slice.size();
  return absl::OkStatus();
}

absl::Status ReceivedMessage::Take(grpc::ByteBuffer* buffer) {
  const absl::Status status = Take(*buffer);
  if (status.ok()) buffer->Clear();
  return status;
}

grpc::ByteBuffer ReceivedMessage::Range(size_t offset, size_t n) const {
  std::vector<grpc::Slice> out;
  size_t begin = 0;  // of the current slice in the message
  for (const grpc::Slice& slice : slices_) {
    const size_t end = begin + slice.size();
    const size_t from = std::max(begin, offset);
    const size_t to = std::min(end, offset + n);
    if (from < to) out.push_back(slice.sub(from - begin, to - begin));
    begin = end;
    if (begin >= offset + n) break;
  }
  if (out.empty()) return grpc::ByteBuffer();
  return grpc::ByteBuffer(out.data(), out.size());
}

ReceivedMessage ReceivedMessage::FromPieces(absl::string_view bytes,
                                            const std::vector<size_t>& cuts) {
  ReceivedMessage message;
  size_t begin = 0;
  for (size_t cut : cuts) {
    if (cut < begin || cut > bytes.size()) continue;
    message.slices_.emplace_back(bytes.data() + begin, cut - begin);
    begin = cut;
  }
  message.slices_.emplace_back(bytes.data() + begin, bytes.size() - begin);
  message.size_ = bytes.size();
  return message;
}

absl::Status ParsePush(const ReceivedMessage& message, PushView* view, size_t max_parts) {
  Reset(view);
  const Pieces pieces = PiecesOf(message);
  WireReader reader(pieces);
  size_t too_many = 0;
  if (!ParsePushFields(reader, max_parts, &too_many, view)) {
    if (too_many > 0) return TooManyParts(too_many, max_parts);
    return Invalid("request", "PushRequest", reader);
  }
  return absl::OkStatus();
}

absl::Status ParsePushPull(const ReceivedMessage& message, PushPullView* view,
                           size_t max_parts) {
  Reset(&view->push);
  view->pull.Clear();
  view->push_offset = 0;
  view->push_size = 0;
  view->push_fields = 0;
  const Pieces pieces = PiecesOf(message);
  WireReader reader(pieces);
  size_t too_many = 0;
  while (!reader.AtLimit()) {
    uint32_t tag;
    bool ok = reader.ReadTag(&tag);
    if (ok) {
      switch (tag) {
        case MakeTag(1, kLengthDelimited): {
          size_t length;
          ok = reader.ReadLength(&length);
          if (!ok) {
            reader.Within("push");
            break;
          }
          view->push_offset = reader.offset();
          view->push_size = length;
          ++view->push_fields;
          const size_t outer = reader.PushLimit(length);
          ok = ParsePushFields(reader, max_parts, &too_many, &view->push);
          if (too_many > 0) return TooManyParts(too_many, max_parts);
          if (!ok) {
            reader.Within("push");
            break;
          }
          reader.PopLimit(outer);
          break;
        }
        case MakeTag(2, kLengthDelimited):
          ok = MergeStockField(reader, "pull", &view->pull);
          break;
        default:
          ok = reader.SkipField(tag);
      }
    }
    if (!ok) return Invalid("request", "PushPullRequest", reader);
  }
  return absl::OkStatus();
}

absl::Status ParsePullResponse(const ReceivedMessage& message, PullResponseView* view) {
  Reset(view);
  const Pieces pieces = PiecesOf(message);
  WireReader reader(pieces);
  if (!ParsePullResponseFields(reader, view)) {
    return Invalid("response", "PullResponse", reader);
  }
  return absl::OkStatus();
}

absl::Status ParsePushPullResponse(const ReceivedMessage& message,
                                   PushPullResponseView* view) {
  view->push.Clear();
  Reset(&view->pull);
  const Pieces pieces = PiecesOf(message);
  WireReader reader(pieces);
  while (!reader.AtLimit()) {
    uint32_t tag;
    bool ok = reader.ReadTag(&tag);
    if (ok) {
      switch (tag) {
        case MakeTag(1, kLengthDelimited):
          ok = MergeStockField(reader, "push", &view->push);
          break;
        case MakeTag(2, kLengthDelimited):
          ok = ReadMessage(reader, "pull", -1,
                           [&] { return ParsePullResponseFields(reader, &view->pull); });
          break;
        default:
          ok = reader.SkipField(tag);
      }
    }
    if (!ok) return Invalid("response", "PushPullResponse", reader);
  }
  return absl::OkStatus();
}

}  // namespace shardtrain::wire
