// Zero-copy encoding of the data-path messages into a grpc::ByteBuffer.
//
// The output is byte for byte a valid protobuf encoding of the message in
// proto/shardtrain.proto (stock ParseFromString accepts it), but tensor
// bytes are not copied into it:
//  - EncodePush / EncodePushPull: each payload goes out as a gRPC slice that
//    references the caller's memory (the gradient tensor itself for dense
//    f32, or the buffer it was converted or compressed into). Only the
//    headers (keys, versions, lengths) are written into fresh memory.
//  - PullResponseBuilder: the server writes each partition's parameters
//    once, straight into the memory that is sent, taken from a recycled
//    pool so a steady stream of large pulls does not fault in new pages.
//    LookupResponseBuilder does the same for a sparse table's rows.
//
// Referenced memory. gRPC keeps the slices of a sent message until the
// transport has written them, which may be after the call's callback ran.
// Every slice that references caller memory is counted in a SendRefs; the
// caller may write to or free that memory only once SendRefs::WaitReleased
// returned true (or Outstanding() is 0).
//
//   SendRefs refs;
//   grpc::ByteBuffer request;
//   EncodePush(header, parts, &refs, &request);
//   stub.UnaryCall(&context, "/shardtrain.ParameterServer/Push", options,
//                  &request, &response, done);
//   ... wait for done ...
//   request.Clear();
//   if (!refs.WaitReleased(absl::Now() + absl::Seconds(10))) ...
//   // now the gradient may be overwritten
#ifndef SHARDTRAIN_WIRE_MESSAGE_ENCODER_H_
#define SHARDTRAIN_WIRE_MESSAGE_ENCODER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include <grpcpp/support/byte_buffer.h>

#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "proto/shardtrain.pb.h"
#include "wire/buffer_pool.h"

namespace shardtrain::wire {

// Counts the slices that reference caller memory and are still held by
// gRPC. Payloads lying back to back in memory (the partitions of one
// tensor) share one referenced slice, so the count is of memory runs, not
// of parts. Thread-safe. Must outlive every slice it counts: destroy it
// only after WaitReleased returned true (the destructor checks).
class SendRefs {
 public:
  SendRefs() = default;
  SendRefs(const SendRefs&) = delete;
  SendRefs& operator=(const SendRefs&) = delete;
  ~SendRefs();

  // Slices referencing memory through this tracker not yet released.
  int Outstanding() const;
  // Blocks until Outstanding() is 0 or `deadline`; false on timeout.
  bool WaitReleased(absl::Time deadline) const;

  // The slice destroy callback's side (used by the encoder).
  void Acquire();
  void Release();

 private:
  mutable absl::Mutex mu_;
  int outstanding_ ABSL_GUARDED_BY(mu_) = 0;
};

// Payloads smaller than this are copied into the message's header memory.
inline constexpr size_t kCopyBelowBytes = 128;

// The scalar fields of a PushRequest.
struct PushHeader {
  uint32_t worker = 0;
  int64_t clock = 0;
  uint64_t worker_incarnation = 0;
  uint64_t sequence = 0;
  uint64_t shard_incarnation = 0;
  uint64_t chain_epoch = 0;  // replicated shards; 0 is not sent
  uint32_t clock_parts = 0;  // a push split over several calls; 0 is not sent
};

// One GradientPart with its payload. `data` and `indices` are referenced,
// not copied (but for those under kCopyBelowBytes, which a slice would cost
// more than copying); they must stay unchanged until the SendRefs says
// they are released.
struct GradientPartOut {
  absl::string_view tensor;
  uint32_t partition = 0;
  int64_t version = 0;
  DType dtype = DTYPE_F32;
  Encoding encoding = ENCODING_DENSE;
  absl::string_view data;
  absl::string_view indices;  // ENCODING_SPARSE only
};

// A PushRequest into `*out` (replacing its contents).
void EncodePush(const PushHeader& header, absl::Span<const GradientPartOut> parts,
                SendRefs* refs, grpc::ByteBuffer* out);
// A PushPullRequest: the push as EncodePush, then `pull`.
void EncodePushPull(const PushHeader& header,
                    absl::Span<const GradientPartOut> parts,
                    const PullRequest& pull, SendRefs* refs,
                    grpc::ByteBuffer* out);

// Builds a PullResponse, or a PushPullResponse around one.
// Thread-compatible; one builder per response.
class PullResponseBuilder {
 public:
  // Payload memory from BufferPool::Default().
  PullResponseBuilder();
  // Payload memory from `pool`, which must outlive the sent message.
  explicit PullResponseBuilder(BufferPool* pool);
  // Gives back the memory of parts not finished.
  ~PullResponseBuilder();
  PullResponseBuilder(const PullResponseBuilder&) = delete;
  PullResponseBuilder& operator=(const PullResponseBuilder&) = delete;

  // Adds a ParameterPart with a dense payload of `bytes` bytes of `dtype`
  // and returns where to write them (64-byte aligned when `bytes` is 128 or
  // more); the pointer stays valid until Finish. An empty payload is still
  // sent (the part has a value).
  char* AddPart(absl::string_view tensor, uint32_t partition, int64_t version,
                DType dtype, size_t bytes);

  // The PullResponse into `*out`. Call Finish or FinishPushPull once; the
  // payload memory then belongs to the message (back to the pool when gRPC
  // drops it).
  void Finish(double wait_seconds, uint64_t incarnation, grpc::ByteBuffer* out);
  // A PushPullResponse{push, pull = the parts added} into `*out`.
  void FinishPushPull(const PushResponse& push, double wait_seconds,
                      uint64_t incarnation, grpc::ByteBuffer* out);

 private:
  struct Part;
  // Finish, inside a PushPullResponse with `push` unless it is null.
  void FinishMessage(const PushResponse* push, double wait_seconds, uint64_t incarnation,
                     grpc::ByteBuffer* out);

  BufferPool* const pool_;
  std::vector<std::unique_ptr<Part>> parts_;
};

// A LookupResponse whose rows the server writes once, straight into pool
// memory that is sent (no zero-filled string, no serialisation copy).
//
//   LookupResponseBuilder builder;
//   float* rows = reinterpret_cast<float*>(builder.Rows(n * dim * 4));
//   ... write the rows ...
//   builder.set_incarnation(incarnation);
//   builder.Finish(&response);
class LookupResponseBuilder {
 public:
  // Row memory from BufferPool::Default().
  LookupResponseBuilder();
  // Row memory from `pool`, which must outlive the sent message.
  explicit LookupResponseBuilder(BufferPool* pool);
  // Gives back the row memory if Finish was not called.
  ~LookupResponseBuilder();
  LookupResponseBuilder(const LookupResponseBuilder&) = delete;
  LookupResponseBuilder& operator=(const LookupResponseBuilder&) = delete;

  // Where to write the rows field's `bytes` bytes (64-byte aligned; null for
  // 0). Call at most once.
  char* Rows(size_t bytes);
  void set_incarnation(uint64_t incarnation) { incarnation_ = incarnation; }

  // The LookupResponse into `*out`; the row memory then belongs to the
  // message (back to the pool when gRPC drops it). Call once.
  void Finish(grpc::ByteBuffer* out);

 private:
  BufferPool* const pool_;
  char* block_ = nullptr;
  size_t bytes_ = 0;
  uint64_t incarnation_ = 0;
};

}  // namespace shardtrain::wire

#endif  // SHARDTRAIN_WIRE_MESSAGE_ENCODER_H_
