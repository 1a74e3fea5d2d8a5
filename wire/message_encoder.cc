// The encoders of wire/message_encoder.h.
//
// Each message is laid out as the protobuf encoding stock protobuf writes
// (fields in number order, proto3 defaults left out), so its bytes equal
// SerializeAsString of the same message. Everything but the payloads is
// written into one header allocation; the message is the sequence of
// header runs and payload slices.
#include "wire/message_encoder.h"

#include <cstring>
#include <string>
#include <utility>

#include <glog/logging.h>
#include <grpc/slice.h>
#include <grpcpp/support/slice.h>

namespace shardtrain::wire {
namespace {

enum WireType : uint8_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2 };

size_t VarintSize(uint64_t value) {
  size_t size = 1;
  while (value >= 0x80) {
    value >>= 7;
    ++size;
  }
  return size;
}

// Sizes of whole fields (every field number here is under 16: a 1-byte tag).
size_t VarintFieldSize(uint64_t value) { return value == 0 ? 0 : 1 + VarintSize(value); }
uint64_t EnumValue(int value) { return static_cast<uint64_t>(static_cast<int64_t>(value)); }
size_t MessageFieldSize(size_t length) { return 1 + VarintSize(length) + length; }
size_t BytesFieldSize(size_t length) { return length == 0 ? 0 : MessageFieldSize(length); }
size_t ReferencedBytes(size_t length) { return length >= kCopyBelowBytes ? length : 0; }

size_t KeySize(absl::string_view tensor, uint32_t partition) {
  return BytesFieldSize(tensor.size()) + VarintFieldSize(partition);
}

size_t PayloadSize(int dtype, int encoding, size_t data, size_t indices) {
  return VarintFieldSize(EnumValue(dtype)) + VarintFieldSize(EnumValue(encoding)) +
         BytesFieldSize(data) + BytesFieldSize(indices);
}

// GradientPart and ParameterPart.
size_t PartSize(absl::string_view tensor, uint32_t partition, int64_t version,
                size_t payload_size) {
  return MessageFieldSize(KeySize(tensor, partition)) +
         VarintFieldSize(static_cast<uint64_t>(version)) + MessageFieldSize(payload_size);
}

size_t GradientPartSize(const GradientPartOut& part) {
  return PartSize(part.tensor, part.partition, part.version,
                  PayloadSize(part.dtype, part.encoding, part.data.size(), part.indices.size()));
}

size_t PushSize(const PushHeader& header, absl::Span<const GradientPartOut> parts) {
  size_t size = VarintFieldSize(header.worker) +
                VarintFieldSize(static_cast<uint64_t>(header.clock)) +
                VarintFieldSize(header.worker_incarnation) + VarintFieldSize(header.sequence) +
                VarintFieldSize(header.shard_incarnation) +
                VarintFieldSize(header.chain_epoch) + VarintFieldSize(header.clock_parts);
  for (const GradientPartOut& part : parts) size += MessageFieldSize(GradientPartSize(part));
  return size;
}

size_t PushReferencedBytes(absl::Span<const GradientPartOut> parts) {
  size_t bytes = 0;
  for (const GradientPartOut& part : parts) {
    bytes += ReferencedBytes(part.data.size()) + ReferencedBytes(part.indices.size());
  }
  return bytes;
}

void ReleaseSendRef(void* refs) { static_cast<SendRefs*>(refs)->Release(); }
void ReleaseBlock(void* block) { BufferPool::Release(static_cast<char*>(block)); }

// Writes one message: header bytes into a single fresh slice, payloads as
// slices of their own.
class MessageWriter {
 public:
  // `header_bytes`: exactly what the Write calls will put in the header.
  explicit MessageWriter(size_t header_bytes)
      : header_(grpc_slice_malloc(header_bytes)),
        begin_(reinterpret_cast<char*>(GRPC_SLICE_START_PTR(header_))),
        p_(begin_),
        end_(begin_ + header_bytes),
        run_start_(begin_) {}
  ~MessageWriter() { grpc_slice_unref(header_); }
  MessageWriter(const MessageWriter&) = delete;
  MessageWriter& operator=(const MessageWriter&) = delete;

  void Varint(uint64_t value) {
    DCHECK_LE(VarintSize(value), static_cast<size_t>(end_ - p_));
    while (value >= 0x80) {
      *p_++ = static_cast<char>(value | 0x80);
      value >>= 7;
    }
    *p_++ = static_cast<char>(value);
  }
  void Tag(uint32_t field, WireType type) { Varint(field << 3 | type); }
  void VarintField(uint32_t field, uint64_t value) {
    if (value == 0) return;
    Tag(field, kVarint);
    Varint(value);
  }
  void Fixed64Field(uint32_t field, uint64_t value) {
    if (value == 0) return;
    Tag(field, kFixed64);
    for (int i = 0; i < 8; ++i) *p_++ = static_cast<char>(value >> (8 * i));
  }
  void MessageField(uint32_t field, size_t length) {
    Tag(field, kLengthDelimited);
    Varint(length);
  }
  void Copy(absl::string_view bytes) {
    DCHECK_LE(bytes.size(), static_cast<size_t>(end_ - p_));
    if (!bytes.empty()) std::memcpy(p_, bytes.data(), bytes.size());
    p_ += bytes.size();
  }
  // A stock message, serialized into the header.
  void StockMessageField(uint32_t field, const google::protobuf::MessageLite& message,
                         size_t size) {
    MessageField(field, size);
    CHECK(message.SerializeToArray(p_, static_cast<int>(size)));
    p_ += size;
  }
  // A bytes field whose value is copied when small, else sent from where it
  // lies (counted in `refs`).
  void BytesField(uint32_t field, absl::string_view bytes, SendRefs* refs) {
    if (bytes.empty()) return;
    MessageField(field, bytes.size());
    if (bytes.size() < kCopyBelowBytes) {
      Copy(bytes);
    } else {
      AddSegment(Segment{bytes.data(), bytes.size(), refs, nullptr});
    }
  }
  // A bytes field whose value is a block from a BufferPool, which the
  // message takes over.
  void PoolBlockField(uint32_t field, char* block, size_t bytes) {
    MessageField(field, bytes);
    AddSegment(Segment{block, bytes, nullptr, block});
  }

  // The message into `*out`.
  void Finish(grpc::ByteBuffer* out);

 private:
  // A run of header bytes (refs and block null), bytes referenced through
  // `refs`, or a pool block.
  struct Segment {
    const char* data;
    size_t size;
    SendRefs* refs;
    char* block;
  };

  void AddSegment(Segment segment) {
    CloseHeaderRun();
    segments_.push_back(segment);
  }
  void CloseHeaderRun() {
    if (p_ > run_start_) {
      segments_.push_back(Segment{run_start_, static_cast<size_t>(p_ - run_start_), nullptr,
                                  nullptr});
    }
    run_start_ = p_;
  }

  grpc_slice header_;
  char* const begin_;
  char* p_;
  char* const end_;
  char* run_start_;
  std::vector<Segment> segments_;
};

void MessageWriter::Finish(grpc::ByteBuffer* out) {
  CloseHeaderRun();
  CHECK_EQ(p_, end_) << "message size computed wrong";
  // Referenced segments that continue where the previous referenced one
  // (through the same SendRefs) ended share one slice: one refcount and one
  // Acquire for the whole run, sub-slices of it for its segments.
  struct Run {
    const char* begin;
    const char* end;
    SendRefs* refs;
    int segments;
    grpc_slice slice;
  };
  std::vector<Run> runs;
  std::vector<int> run_of(segments_.size(), -1);
  for (size_t i = 0; i < segments_.size(); ++i) {
    const Segment& segment = segments_[i];
    if (segment.refs == nullptr) continue;
    if (runs.empty() || runs.back().refs != segment.refs || runs.back().end != segment.data) {
      runs.push_back(Run{segment.data, segment.data, segment.refs, 0, grpc_empty_slice()});
    }
    runs.back().end = segment.data + segment.size;
    ++runs.back().segments;
    run_of[i] = static_cast<int>(runs.size()) - 1;
  }
  for (Run& run : runs) {
    run.refs->Acquire();
    run.slice = grpc_slice_new_with_user_data(const_cast<char*>(run.begin),
                                              static_cast<size_t>(run.end - run.begin),
                                              &ReleaseSendRef, run.refs);
  }

  std::vector<grpc::Slice> slices;
  slices.reserve(segments_.size());
  for (size_t i = 0; i < segments_.size(); ++i) {
    const Segment& segment = segments_[i];
    grpc_slice slice;
    if (segment.refs != nullptr) {
      Run& run = runs[run_of[i]];
      if (run.segments == 1) {
        slice = run.slice;  // the run's only segment takes its reference
        run.slice = grpc_empty_slice();
      } else {
        const size_t offset = static_cast<size_t>(segment.data - run.begin);
        slice = grpc_slice_sub(run.slice, offset, offset + segment.size);
      }
    } else if (segment.block != nullptr) {
      slice = grpc_slice_new_with_user_data(segment.block, segment.size, &ReleaseBlock,
                                            segment.block);
    } else {
      const size_t offset = static_cast<size_t>(segment.data - begin_);
      slice = grpc_slice_sub(header_, offset, offset + segment.size);
    }
    slices.emplace_back(slice, grpc::Slice::STEAL_REF);
  }
  for (Run& run : runs) grpc_slice_unref(run.slice);  // the sub-slices hold it
  // The buffer takes its own references; `slices` drops ours.
  *out = grpc::ByteBuffer(slices.data(), slices.size());
}

// The PushRequest fields of `header` and `parts`, in field-number order.
void WritePush(const PushHeader& header, absl::Span<const GradientPartOut> parts,
               SendRefs* refs, MessageWriter& writer) {
  writer.VarintField(1, header.worker);
  writer.VarintField(2, static_cast<uint64_t>(header.clock));
  for (const GradientPartOut& part : parts) {
    writer.MessageField(3, GradientPartSize(part));
    writer.MessageField(1, KeySize(part.tensor, part.partition));
    if (!part.tensor.empty()) {
      writer.MessageField(1, part.tensor.size());
      writer.Copy(part.tensor);
    }
    writer.VarintField(2, part.partition);
    writer.VarintField(2, static_cast<uint64_t>(part.version));
    writer.MessageField(
        3, PayloadSize(part.dtype, part.encoding, part.data.size(), part.indices.size()));
    writer.VarintField(1, EnumValue(part.dtype));
    writer.VarintField(2, EnumValue(part.encoding));
    writer.BytesField(3, part.data, refs);
    writer.BytesField(4, part.indices, refs);
  }
  writer.VarintField(4, header.worker_incarnation);
  writer.VarintField(5, header.sequence);
  writer.VarintField(6, header.shard_incarnation);
  writer.VarintField(7, header.chain_epoch);
  writer.VarintField(9, header.clock_parts);
}

}  // namespace

SendRefs::~SendRefs() {
  absl::MutexLock lock(&mu_);
  CHECK_EQ(outstanding_, 0)
      << "SendRefs destroyed while gRPC still holds slices referencing its memory";
}

int SendRefs::Outstanding() const {
  absl::MutexLock lock(&mu_);
  return outstanding_;
}

bool SendRefs::WaitReleased(absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  const int* outstanding = &outstanding_;
  return mu_.AwaitWithDeadline(
      absl::Condition(+[](const int* count) { return *count == 0; }, outstanding), deadline);
}

void SendRefs::Acquire() {
  absl::MutexLock lock(&mu_);
  ++outstanding_;
}

void SendRefs::Release() {
  absl::MutexLock lock(&mu_);
  --outstanding_;
}

void EncodePush(const PushHeader& header, absl::Span<const GradientPartOut> parts,
                SendRefs* refs, grpc::ByteBuffer* out) {
  MessageWriter writer(PushSize(header, parts) - PushReferencedBytes(parts));
  WritePush(header, parts, refs, writer);
  writer.Finish(out);
}

void EncodePushPull(const PushHeader& header, absl::Span<const GradientPartOut> parts,
                    const PullRequest& pull, SendRefs* refs, grpc::ByteBuffer* out) {
  const size_t push_size = PushSize(header, parts);
  const size_t pull_size = pull.ByteSizeLong();
  MessageWriter writer(MessageFieldSize(push_size) - PushReferencedBytes(parts) +
                       MessageFieldSize(pull_size));
  writer.MessageField(1, push_size);
  WritePush(header, parts, refs, writer);
  writer.StockMessageField(2, pull, pull_size);
  writer.Finish(out);
}

struct PullResponseBuilder::Part {
  std::string tensor;
  uint32_t partition;
  int64_t version;
  DType dtype;
  size_t bytes;
  char* block;  // from pool_, or null when `bytes` is small: `small` holds it
  char small[kCopyBelowBytes];

  size_t PayloadBytes() const { return PayloadSize(dtype, ENCODING_DENSE, bytes, 0); }
  size_t Size() const { return PartSize(tensor, partition, version, PayloadBytes()); }
};

PullResponseBuilder::PullResponseBuilder() : PullResponseBuilder(&BufferPool::Default()) {}

PullResponseBuilder::PullResponseBuilder(BufferPool* pool) : pool_(pool) {}

PullResponseBuilder::~PullResponseBuilder() {
  for (const std::unique_ptr<Part>& part : parts_) {
    if (part->block != nullptr) BufferPool::Release(part->block);
  }
}

char* PullResponseBuilder::AddPart(absl::string_view tensor, uint32_t partition,
                                   int64_t version, DType dtype, size_t bytes) {
  auto part = std::make_unique<Part>();
  part->tensor = std::string(tensor);
  part->partition = partition;
  part->version = version;
  part->dtype = dtype;
  part->bytes = bytes;
  part->block = bytes < kCopyBelowBytes ? nullptr : pool_->Allocate(bytes);
  char* data = part->block != nullptr ? part->block : part->small;
  parts_.push_back(std::move(part));
  return data;
}

void PullResponseBuilder::FinishMessage(const PushResponse* push, double wait_seconds,
                                        uint64_t incarnation, grpc::ByteBuffer* out) {
  uint64_t wait_bits;
  std::memcpy(&wait_bits, &wait_seconds, sizeof(wait_bits));
  size_t pull_size = (wait_bits != 0 ? 9 : 0) + VarintFieldSize(incarnation);
  size_t pooled_bytes = 0;
  for (const std::unique_ptr<Part>& part : parts_) {
    pull_size += MessageFieldSize(part->Size());
    if (part->block != nullptr) pooled_bytes += part->bytes;
  }
  size_t push_size = 0;
  size_t header_bytes = pull_size - pooled_bytes;
  if (push != nullptr) {
    push_size = push->ByteSizeLong();
    // Field 1 (push) whole, field 2's tag and length (its value is the pull).
    header_bytes += MessageFieldSize(push_size) + 1 + VarintSize(pull_size);
  }
  MessageWriter writer(header_bytes);
  if (push != nullptr) {
    writer.StockMessageField(1, *push, push_size);
    writer.MessageField(2, pull_size);
  }
  for (std::unique_ptr<Part>& part : parts_) {
    writer.MessageField(1, part->Size());
    writer.MessageField(1, KeySize(part->tensor, part->partition));
    if (!part->tensor.empty()) {
      writer.MessageField(1, part->tensor.size());
      writer.Copy(part->tensor);
    }
    writer.VarintField(2, part->partition);
    writer.VarintField(2, static_cast<uint64_t>(part->version));
    writer.MessageField(3, part->PayloadBytes());
    writer.VarintField(1, EnumValue(part->dtype));
    if (part->block != nullptr) {
      writer.PoolBlockField(3, part->block, part->bytes);
      part->block = nullptr;  // the message owns it now
    } else if (part->bytes > 0) {
      writer.MessageField(3, part->bytes);
      writer.Copy(absl::string_view(part->small, part->bytes));
    }
  }
  writer.Fixed64Field(2, wait_bits);
  writer.VarintField(3, incarnation);
  parts_.clear();
  writer.Finish(out);
}

void PullResponseBuilder::Finish(double wait_seconds, uint64_t incarnation,
                                 grpc::ByteBuffer* out) {
  FinishMessage(nullptr, wait_seconds, incarnation, out);
}

void PullResponseBuilder::FinishPushPull(const PushResponse& push, double wait_seconds,
                                         uint64_t incarnation, grpc::ByteBuffer* out) {
  FinishMessage(&push, wait_seconds, incarnation, out);
}

LookupResponseBuilder::LookupResponseBuilder()
    : LookupResponseBuilder(&BufferPool::Default()) {}

LookupResponseBuilder::LookupResponseBuilder(BufferPool* pool) : pool_(pool) {}

LookupResponseBuilder::~LookupResponseBuilder() {
  if (block_ != nullptr) BufferPool::Release(block_);
}

char* LookupResponseBuilder::Rows(size_t bytes) {
  CHECK(block_ == nullptr && bytes_ == 0) << "Rows called twice";
  bytes_ = bytes;
  if (bytes > 0) block_ = pool_->Allocate(bytes);
  return block_;
}

void LookupResponseBuilder::Finish(grpc::ByteBuffer* out) {
  const size_t header_bytes =
      (bytes_ > 0 ? 1 + VarintSize(bytes_) : 0) + VarintFieldSize(incarnation_);
  MessageWriter writer(header_bytes);
  if (block_ != nullptr) {
    writer.PoolBlockField(1, block_, bytes_);
    block_ = nullptr;  // the message owns it now
  }
  writer.VarintField(2, incarnation_);
  writer.Finish(out);
}

}  // namespace shardtrain::wire
