#include "client/wire_requests.h"

#include <algorithm>
#include <utility>

#include <grpcpp/impl/codegen/proto_utils.h>

#include "absl/strings/str_format.h"
#include "common/payload.h"
#include "common/status_macros.h"
#include "wire/payload_pieces.h"

namespace shardtrain::client {
namespace {

absl::string_view BytesOf(absl::Span<const float> values) {
  return absl::string_view(reinterpret_cast<const char*>(values.data()),
                           values.size() * sizeof(float));
}

absl::Status Deserialize(grpc::ByteBuffer* buffer, google::protobuf::Message* message,
                         const char* what) {
  const grpc::Status status =
      grpc::GenericDeserialize<grpc::ProtoBufferReader, google::protobuf::Message>(
          buffer, message);
  if (!status.ok()) {
    return absl::InternalError(
        absl::StrFormat("the shard's %s does not parse: %s", what, status.error_message()));
  }
  return absl::OkStatus();
}

}  // namespace

WireRequests::WireRequests(const WireOptions& options, std::vector<PartitionSlice> slices,
                           const std::vector<std::string>* tensor_names)
    : options_(options), slices_(std::move(slices)), tensor_names_(tensor_names) {
  header_.worker = options.worker;
  header_.worker_incarnation = options.worker_incarnation;
  pull_.set_worker(options.worker);
  pull_.set_worker_incarnation(options.worker_incarnation);
  pull_.set_dtype(options.dtype);
  parts_.resize(slices_.size());
  destinations_.resize(slices_.size());
  if (options.topk != nullptr) {
    compressed_.resize(slices_.size());
  } else if (options.dtype != DTYPE_F32) {
    staged_.resize(slices_.size());
  }
  for (size_t i = 0; i < slices_.size(); ++i) {
    const PartitionSlice& slice = slices_[i];
    const std::string& name = (*tensor_names_)[slice.tensor];
    wire::GradientPartOut& part = parts_[i];
    part.tensor = name;
    part.partition = slice.partition;
    part.dtype = options.dtype;
    part.encoding = options.topk != nullptr ? ENCODING_SPARSE : ENCODING_DENSE;
    PartitionKey* key = pull_.add_parts();
    key->set_tensor(name);
    key->set_partition(slice.partition);
    dense_bytes_ += slice.size * common::DTypeSize(options.dtype);
  }
}

void WireRequests::SetPush(int64_t clock, uint64_t sequence,
                           absl::FunctionRef<absl::Span<const float>(int tensor)> grad_of,
                           const VersionTable& versions) {
  header_.clock = clock;
  header_.sequence = sequence;
  for (size_t i = 0; i < slices_.size(); ++i) {
    const PartitionSlice& slice = slices_[i];
    wire::GradientPartOut& part = parts_[i];
    part.version = versions[slice.version_index].load();
    const absl::Span<const float> grad = grad_of(slice.tensor).subspan(slice.offset, slice.size);
    if (options_.topk != nullptr) {
      Payload& payload = compressed_[i];
      options_.topk->Encode(slice.version_index, grad, options_.dtype, &payload);
      part.data = payload.data();
      part.indices = payload.indices();
    } else if (options_.dtype == DTYPE_F32) {
      part.data = BytesOf(grad);  // referenced where it lies
    } else {
      common::EncodeDense(grad, options_.dtype, &staged_[i]);
      part.data = staged_[i];
    }
  }
}

void WireRequests::SetPull(int64_t clock, int64_t min_version,
                           absl::FunctionRef<absl::Span<float>(int tensor)> params_of) {
  pull_.set_clock(clock);
  pull_.set_min_version(min_version);
  for (size_t i = 0; i < slices_.size(); ++i) {
    const PartitionSlice& slice = slices_[i];
    destinations_[i] = params_of(slice.tensor).subspan(slice.offset, slice.size);
  }
}

void WireRequests::set_chain_epoch(uint64_t epoch) {
  header_.chain_epoch = epoch;
  pull_.set_chain_epoch(epoch);
}

void WireRequests::PrepareAttempt(uint64_t shard_incarnation, const VersionTable* clamp) {
  header_.shard_incarnation = shard_incarnation;
  if (clamp == nullptr) return;
  // After a shard restart the gradient counts as computed from the older of
  // what it was computed from and what the shard has now.
  for (size_t i = 0; i < slices_.size(); ++i) {
    parts_[i].version =
        std::min(parts_[i].version, (*clamp)[slices_[i].version_index].load());
  }
}

void WireRequests::EncodePush(uint64_t shard_incarnation, const VersionTable* clamp,
                              grpc::ByteBuffer* out) {
  PrepareAttempt(shard_incarnation, clamp);
  wire::EncodePush(header_, parts_, &refs_, out);
}

void WireRequests::EncodePull(uint64_t shard_incarnation, grpc::ByteBuffer* out) {
  pull_.set_shard_incarnation(shard_incarnation);
  bool own_buffer = false;
  out->Clear();  // the writer starts from an empty buffer
  // A few keys and numbers: serialized as they are.
  (void)grpc::GenericSerialize<grpc::ProtoBufferWriter, PullRequest>(pull_, out, &own_buffer);
}

void WireRequests::EncodePushPull(uint64_t shard_incarnation, const VersionTable* clamp,
                                  grpc::ByteBuffer* out) {
  PrepareAttempt(shard_incarnation, clamp);
  pull_.set_shard_incarnation(shard_incarnation);
  wire::EncodePushPull(header_, parts_, pull_, &refs_, out);
}

absl::Status WireRequests::DecodePush(grpc::ByteBuffer* response, PushResult* result) const {
  PushResponse message;
  RETURN_IF_ERROR(Deserialize(response, &message, "push answer"));
  result->max_staleness = message.max_staleness();
  return absl::OkStatus();
}

absl::Status WireRequests::DecodeParameters(const wire::PullResponseView& view,
                                            VersionTable* versions,
                                            PullResult* result) const {
  if (view.parts.size() != slices_.size()) {
    return absl::InternalError(absl::StrFormat(
        "the shard answered %d partitions for %d asked", view.parts.size(), slices_.size()));
  }
  result->wait_seconds = view.wait_seconds;
  result->min_version = INT64_MAX;
  for (size_t i = 0; i < slices_.size(); ++i) {
    const PartitionSlice& slice = slices_[i];
    const wire::ParameterPartView& part = view.parts[i];
    const std::string& tensor = (*tensor_names_)[slice.tensor];
    if (part.key.partition != slice.partition || part.key.tensor != tensor) {
      return absl::InternalError(absl::StrFormat(
          "the shard answered partition %d of %s where partition %d of %s was asked",
          part.key.partition, part.key.tensor, slice.partition, tensor));
    }
    const absl::Status decoded = wire::DecodeInto(part.value, destinations_[i]);
    if (!decoded.ok()) {
      return absl::Status(decoded.code(),
                          absl::StrFormat("partition %d of %s: %s", slice.partition,
                                          tensor, decoded.message()));
    }
    (*versions)[slice.version_index].store(part.version);
    result->min_version = std::min(result->min_version, part.version);
  }
  return absl::OkStatus();
}

absl::Status WireRequests::DecodePull(grpc::ByteBuffer* response, VersionTable* versions,
                                      PullResult* result) const {
  wire::ReceivedMessage message;
  RETURN_IF_ERROR(message.Take(response));
  wire::PullResponseView view;
  RETURN_IF_ERROR(wire::ParsePullResponse(message, &view));
  return DecodeParameters(view, versions, result);
}

absl::Status WireRequests::DecodePushPull(grpc::ByteBuffer* response, VersionTable* versions,
                                          PushResult* push, PullResult* pull) const {
  wire::ReceivedMessage message;
  RETURN_IF_ERROR(message.Take(response));
  wire::PushPullResponseView view;
  RETURN_IF_ERROR(wire::ParsePushPullResponse(message, &view));
  push->max_staleness = view.push.max_staleness();
  return DecodeParameters(view.pull, versions, pull);
}

}  // namespace shardtrain::client
