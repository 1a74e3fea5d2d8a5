#include "worker/ps_client.h"

#include <algorithm>
#include <functional>

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include "absl/strings/str_format.h"
#include "absl/synchronization/blocking_counter.h"
#include "common/grpc_status.h"
#include "common/payload.h"
#include "common/status_macros.h"

namespace shardtrain::worker {
namespace {

using IssueFn = std::function<void(int shard, grpc::ClientContext* context,
                                   std::function<void(grpc::Status)> done)>;

// Issues one RPC per shard at once and waits for all of them. Returns the
// first error, naming the shard.
absl::Status CallAllShards(const std::vector<std::string>& servers,
                           absl::Duration timeout, const char* method,
                           const IssueFn& issue) {
  const int n = static_cast<int>(servers.size());
  std::vector<grpc::ClientContext> contexts(n);
  std::vector<grpc::Status> statuses(n);
  absl::BlockingCounter pending(n);
  const auto deadline = absl::ToChronoTime(absl::Now() + timeout);
  for (int s = 0; s < n; ++s) {
    contexts[s].set_deadline(deadline);
    issue(s, &contexts[s], [&statuses, &pending, s](grpc::Status status) {
      statuses[s] = std::move(status);
      pending.DecrementCount();
    });
  }
  pending.Wait();
  for (int s = 0; s < n; ++s) {
    if (!statuses[s].ok()) {
      const absl::Status status = common::FromGrpcStatus(statuses[s]);
      return absl::Status(status.code(),
                          absl::StrFormat("%s to shard %d (%s): %s", method, s,
                                          servers[s], status.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

PsClient::PsClient(const PsClientOptions& options,
                   common::RpcMetrics* rpc_metrics)
    : options_(options), rpc_metrics_(rpc_metrics) {}

absl::StatusOr<std::unique_ptr<PsClient>> PsClient::Create(
    const PsClientOptions& options, common::RpcMetrics* rpc_metrics) {
  if (options.servers.empty()) {
    return absl::InvalidArgumentError("no parameter servers given");
  }
  if (common::DTypeSize(options.wire_dtype) == 0) {
    return absl::InvalidArgumentError("wire dtype must be f32, f16 or bf16");
  }
  if (!(options.topk_ratio >= 0 && options.topk_ratio <= 1)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the top-k ratio must be 0 (dense) or in (0, 1], got %g", options.topk_ratio));
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials,
                   common::MakeChannelCredentials(options.security, &args));
  std::unique_ptr<PsClient> client(new PsClient(options, rpc_metrics));
  for (const std::string& server : options.servers) {
    auto channel = grpc::CreateCustomChannel(server, credentials, args);
    client->stubs_.push_back(ParameterServer::NewStub(channel));
    client->channels_.push_back(std::move(channel));
  }
  return client;
}

void PsClient::RecordRpc(const char* method, const grpc::Status& status,
                         size_t request_bytes, size_t response_bytes,
                         absl::Time start) {
  if (rpc_metrics_ == nullptr) return;
  rpc_metrics_->Record(method, status.error_code(), response_bytes,
                       request_bytes, absl::ToDoubleSeconds(absl::Now() - start));
}

absl::Status PsClient::Register(const std::vector<TensorSpec>& tensors) {
  // Nothing may still write into versions_ or read topk_ while they are
  // rebuilt below.
  exchange_.reset();
  RegisterRequest request;
  for (const TensorSpec& spec : tensors) *request.add_tensors() = spec;
  std::vector<RegisterResponse> responses(stubs_.size());
  RETURN_IF_ERROR(CallAllShards(
      options_.servers, options_.rpc_timeout, "Register",
      [&](int s, grpc::ClientContext* context, auto done) {
        stubs_[s]->async()->Register(context, &request, &responses[s],
                                     std::move(done));
      }));

  tensors_ = tensors;
  tensor_sizes_.clear();
  versions_.clear();
  calls_.assign(stubs_.size(), ShardCalls());
  std::vector<std::vector<TensorExchange::Group>> groups(tensors.size());
  common::PartitionConfig config{options_.max_partition_elements, num_shards()};
  for (size_t t = 0; t < tensors.size(); ++t) {
    int64_t elements = 1;
    for (int64_t dim : tensors[t].shape()) elements *= dim;
    tensor_sizes_.push_back(elements);
    std::vector<int> group_of_shard(stubs_.size(), -1);
    for (const common::PlacedPartition& placed :
         common::PlaceTensor(tensors[t].name(), elements, config)) {
      const PartitionSlice slice{static_cast<int>(t),
                                 static_cast<uint32_t>(placed.partition),
                                 placed.range.offset, placed.range.size,
                                 versions_.size()};
      versions_.push_back(0);
      ShardCalls& calls = calls_[placed.shard];
      calls.slices.push_back(slice);
      PartitionKey key;
      key.set_tensor(tensors[t].name());
      key.set_partition(slice.partition);
      GradientPart* part = calls.request.mutable_push()->add_parts();
      *part->mutable_key() = key;
      part->mutable_grad()->set_dtype(options_.wire_dtype);
      part->mutable_grad()->set_encoding(ENCODING_DENSE);
      *calls.request.mutable_pull()->add_parts() = key;
      int& group = group_of_shard[placed.shard];
      if (group < 0) {
        group = static_cast<int>(groups[t].size());
        groups[t].push_back(TensorExchange::Group{placed.shard, {}});
      }
      groups[t][group].slices.push_back(slice);
    }
  }
  topk_.reset();
  if (options_.topk_ratio > 0) {
    std::vector<int64_t> partition_sizes(versions_.size());
    for (const ShardCalls& calls : calls_) {
      for (const PartitionSlice& slice : calls.slices) {
        partition_sizes[slice.version_index] = slice.size;
      }
    }
    ASSIGN_OR_RETURN(common::TopKCompressor topk,
                     common::TopKCompressor::Create(options_.topk_ratio, partition_sizes));
    topk_ = std::make_unique<common::TopKCompressor>(std::move(topk));
  }
  TensorExchange::Options exchange_options;
  exchange_options.worker_index = options_.worker_index;
  exchange_options.wire_dtype = options_.wire_dtype;
  exchange_options.topk = topk_.get();
  exchange_options.push_timeout = options_.rpc_timeout;
  exchange_options.pull_timeout = options_.pull_timeout;
  std::vector<ParameterServer::Stub*> stubs;
  for (const auto& stub : stubs_) stubs.push_back(stub.get());
  exchange_ = std::make_unique<TensorExchange>(
      exchange_options, std::move(stubs), tensors_, std::move(groups), &versions_,
      [this](const char* method, const grpc::Status& status, size_t sent,
             size_t received, absl::Time start) {
        RecordRpc(method, status, sent, received, start);
      });
  // Cross-check: each shard must report exactly the partitions we expect.
  for (size_t s = 0; s < calls_.size(); ++s) {
    if (responses[s].partitions_size() != static_cast<int>(calls_[s].slices.size())) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "shard %d holds %d partitions of these tensors but this worker "
          "expects %d: do --max_partition_elements and the shard count match?",
          s, responses[s].partitions_size(), calls_[s].slices.size()));
    }
  }
  for (ShardCalls& calls : calls_) {
    calls.request.mutable_push()->set_worker(options_.worker_index);
    calls.request.mutable_pull()->set_worker(options_.worker_index);
    calls.request.mutable_pull()->set_dtype(options_.wire_dtype);
  }
  return absl::OkStatus();
}

absl::Status PsClient::EncodePush(
    int64_t clock, absl::Span<const absl::Span<const float>> grads) {
  if (grads.size() != tensors_.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "push of %d tensors; %d are registered", grads.size(), tensors_.size()));
  }
  for (size_t t = 0; t < grads.size(); ++t) {
    if (static_cast<int64_t>(grads[t].size()) != tensor_sizes_[t]) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "gradient of %s has %d elements, not %d", tensors_[t].name(),
          grads[t].size(), tensor_sizes_[t]));
    }
  }
  for (ShardCalls& calls : calls_) {
    PushRequest& push = *calls.request.mutable_push();
    push.set_clock(clock);
    for (size_t i = 0; i < calls.slices.size(); ++i) {
      const PartitionSlice& slice = calls.slices[i];
      GradientPart* part = push.mutable_parts(static_cast<int>(i));
      part->set_version(versions_[slice.version_index]);
      const absl::Span<const float> grad = grads[slice.tensor].subspan(slice.offset, slice.size);
      if (topk_ != nullptr) {
        topk_->Encode(slice.version_index, grad, options_.wire_dtype, part->mutable_grad());
      } else {
        common::EncodeDense(grad, options_.wire_dtype, part->mutable_grad()->mutable_data());
      }
    }
  }
  return absl::OkStatus();
}

absl::Status PsClient::PreparePull(int64_t clock, int64_t min_version,
                                   absl::Span<const absl::Span<float>> params) {
  if (params.size() != tensors_.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "pull into %d tensors; %d are registered", params.size(), tensors_.size()));
  }
  for (ShardCalls& calls : calls_) {
    PullRequest& pull = *calls.request.mutable_pull();
    pull.set_clock(clock);
    pull.set_min_version(min_version);
  }
  return absl::OkStatus();
}

void PsClient::CollectPush(PushStats* stats) const {
  stats->max_staleness = 0;
  for (const ShardCalls& calls : calls_) {
    stats->max_staleness =
        std::max(stats->max_staleness, calls.response.push().max_staleness());
  }
}

absl::Status PsClient::CollectPull(absl::Span<const absl::Span<float>> params,
                                   PullStats* stats) {
  stats->server_wait_seconds = 0;
  stats->min_version = INT64_MAX;
  for (size_t s = 0; s < calls_.size(); ++s) {
    ShardCalls& calls = calls_[s];
    const PullResponse& response = calls.response.pull();
    if (response.parts_size() != static_cast<int>(calls.slices.size())) {
      return absl::InternalError(absl::StrFormat(
          "shard %d answered %d partitions for %d asked", s,
          response.parts_size(), calls.slices.size()));
    }
    stats->server_wait_seconds =
        std::max(stats->server_wait_seconds, response.wait_seconds());
    for (size_t i = 0; i < calls.slices.size(); ++i) {
      const PartitionSlice& slice = calls.slices[i];
      const ParameterPart& part = response.parts(static_cast<int>(i));
      RETURN_IF_ERROR(common::DecodeDense(
          part.value().dtype(), part.value().data(),
          params[slice.tensor].subspan(slice.offset, slice.size)));
      versions_[slice.version_index] = part.version();
      stats->min_version = std::min(stats->min_version, part.version());
    }
  }
  return absl::OkStatus();
}

absl::Status PsClient::Push(int64_t clock,
                            absl::Span<const absl::Span<const float>> grads,
                            PushStats* stats) {
  RETURN_IF_ERROR(EncodePush(clock, grads));
  const absl::Time start = absl::Now();
  RETURN_IF_ERROR(CallAllShards(
      options_.servers, options_.rpc_timeout, "Push",
      [&](int s, grpc::ClientContext* context, auto done) {
        ShardCalls& calls = calls_[s];
        stubs_[s]->async()->Push(
            context, &calls.request.push(), calls.response.mutable_push(),
            [this, &calls, start, done = std::move(done)](grpc::Status status) {
              RecordRpc("Push", status, calls.request.push().ByteSizeLong(),
                        calls.response.push().ByteSizeLong(), start);
              done(std::move(status));
            });
      }));
  CollectPush(stats);
  return absl::OkStatus();
}

absl::Status PsClient::Pull(int64_t clock, int64_t min_version,
                            absl::Span<const absl::Span<float>> params,
                            PullStats* stats) {
  RETURN_IF_ERROR(PreparePull(clock, min_version, params));
  const absl::Time start = absl::Now();
  RETURN_IF_ERROR(CallAllShards(
      options_.servers, options_.pull_timeout, "Pull",
      [&](int s, grpc::ClientContext* context, auto done) {
        ShardCalls& calls = calls_[s];
        stubs_[s]->async()->Pull(
            context, &calls.request.pull(), calls.response.mutable_pull(),
            [this, &calls, start, done = std::move(done)](grpc::Status status) {
              RecordRpc("Pull", status, calls.request.pull().ByteSizeLong(),
                        calls.response.pull().ByteSizeLong(), start);
              done(std::move(status));
            });
      }));
  return CollectPull(params, stats);
}

absl::Status PsClient::PushPull(int64_t clock, int64_t min_version,
                                absl::Span<const absl::Span<const float>> grads,
                                absl::Span<const absl::Span<float>> params,
                                PushStats* push_stats, PullStats* pull_stats) {
  RETURN_IF_ERROR(EncodePush(clock, grads));
  RETURN_IF_ERROR(PreparePull(clock, min_version, params));
  const absl::Time start = absl::Now();
  RETURN_IF_ERROR(CallAllShards(
      options_.servers, options_.pull_timeout, "PushPull",
      [&](int s, grpc::ClientContext* context, auto done) {
        ShardCalls& calls = calls_[s];
        stubs_[s]->async()->PushPull(
            context, &calls.request, &calls.response,
            [this, &calls, start, done = std::move(done)](grpc::Status status) {
              RecordRpc("PushPull", status, calls.request.ByteSizeLong(),
                        calls.response.ByteSizeLong(), start);
              done(std::move(status));
            });
      }));
  CollectPush(push_stats);
  return CollectPull(params, pull_stats);
}

void PsClient::StartExchange(int tensor, int64_t clock, int64_t min_version,
                             absl::Span<const float> grad,
                             std::unique_ptr<Fence> grad_ready,
                             absl::Span<float> params) {
  exchange_->Start(tensor, clock, min_version, grad, std::move(grad_ready),
                   params);
}

absl::Status PsClient::FinishExchanges(PushStats* push_stats,
                                       PullStats* pull_stats) {
  return exchange_->Finish(&push_stats->max_staleness,
                           &pull_stats->server_wait_seconds,
                           &pull_stats->min_version);
}

absl::StatusOr<HeartbeatResponse> PsClient::Heartbeat(int64_t clock, bool done) {
  HeartbeatRequest request;
  request.set_worker(options_.worker_index);
  request.set_clock(clock);
  request.set_done(done);
  std::vector<HeartbeatResponse> responses(stubs_.size());
  RETURN_IF_ERROR(CallAllShards(
      options_.servers, options_.rpc_timeout, "Heartbeat",
      [&](int s, grpc::ClientContext* context, auto done_fn) {
        stubs_[s]->async()->Heartbeat(context, &request, &responses[s],
                                      std::move(done_fn));
      }));
  return responses[0];
}

absl::StatusOr<std::vector<StatusResponse>> PsClient::ClusterStatus() {
  StatusRequest request;
  std::vector<StatusResponse> responses(stubs_.size());
  RETURN_IF_ERROR(CallAllShards(
      options_.servers, options_.rpc_timeout, "Status",
      [&](int s, grpc::ClientContext* context, auto done) {
        stubs_[s]->async()->Status(context, &request, &responses[s],
                                   std::move(done));
      }));
  return responses;
}

}  // namespace shardtrain::worker
