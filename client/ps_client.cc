#include "client/ps_client.h"

#include <algorithm>
#include <functional>

#include <glog/logging.h>
#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/blocking_counter.h"
#include "client/chain_control.h"
#include "client/direct_control.h"
#include "client/shard_calls.h"
#include "common/grpc_status.h"
#include "common/initializer.h"
#include "common/partition.h"
#include "common/payload.h"
#include "common/status_macros.h"
#include "wire/tls_context.h"

namespace shardtrain::client {
namespace {

// 512 KiB of f32 (bench/results/channels_split_cpu.txt).
constexpr int64_t kMinElementsPerConnection = 128 * 1024;

// INVALID_ARGUMENT unless `spans` has one span per registered tensor, of
// its size; the messages name the `call` ("push of") and the `noun` and
// `verb` of a span ("gradient", "has").
template <typename T>
absl::Status CheckSpans(absl::Span<const absl::Span<T>> spans, const char* call,
                        const char* noun, const char* verb,
                        const std::vector<TensorSpec>& tensors,
                        const std::vector<int64_t>& sizes) {
  if (spans.size() != tensors.size()) {
    return absl::InvalidArgumentError(absl::StrCat(call, " ", spans.size(), " tensors; ",
                                                   tensors.size(), " are registered"));
  }
  for (size_t t = 0; t < spans.size(); ++t) {
    if (static_cast<int64_t>(spans[t].size()) != sizes[t]) {
      return absl::InvalidArgumentError(absl::StrCat(noun, " of ", tensors[t].name(), " ",
                                                     verb, " ", spans[t].size(),
                                                     " elements, not ", sizes[t]));
    }
  }
  return absl::OkStatus();
}

uint64_t NewIncarnation() {
  absl::BitGen gen;
  uint64_t incarnation = 0;
  while (incarnation == 0) incarnation = absl::Uniform<uint64_t>(gen);
  return incarnation;
}

}  // namespace

PsClient::PsClient(const PsClientOptions& options,
                   common::RpcMetrics* rpc_metrics, PsClientMetrics* fault_metrics)
    : options_(options),
      rpc_metrics_(rpc_metrics),
      fault_metrics_(fault_metrics),
      worker_incarnation_(NewIncarnation()),
      replay_(static_cast<int>(options.servers.size())) {}

PsClient::~PsClient() { exchange_.reset(); }

absl::StatusOr<std::unique_ptr<PsClient>> PsClient::Create(
    const PsClientOptions& options, common::RpcMetrics* rpc_metrics,
    PsClientMetrics* fault_metrics) {
  RETURN_IF_ERROR(ValidatePsClientOptions(options));
  ChannelOptions channel_options;
  channel_options.max_message_bytes = options.max_message_bytes;
  channel_options.keepalive_time = options.keepalive_time;
  channel_options.keepalive_timeout = options.keepalive_timeout;
  channel_options.security = options.security;
  channel_options.transport = options.transport;
  ASSIGN_OR_RETURN(const ChannelFactory factory, ChannelFactory::Create(channel_options));
  // The data path's frames go to the shard's data port when it names one
  // (replicated: a routed call, to its member's), in the gRPC channels'
  // TLS if any; tests that connect or intercept gRPC themselves keep it on
  // gRPC.
  const bool frames = options.use_data_port && !options.connect && !options.interceptors;
  std::shared_ptr<const wire::TlsContext> data_tls;
  if (frames) {
    ASSIGN_OR_RETURN(data_tls, wire::TlsContext::ForClient(options.security));
  }
  std::unique_ptr<PsClient> client(new PsClient(options, rpc_metrics, fault_metrics));
  RetryPolicy policy;
  policy.initial_backoff = options.initial_backoff;
  policy.max_backoff = options.max_backoff;
  policy.reconnect_timeout = options.reconnect_timeout;
  for (size_t s = 0; s < options.servers.size(); ++s) {
    const std::string& server = options.servers[s];
    std::vector<std::shared_ptr<grpc::Channel>> connections;
    for (int c = 0; c < options.channels_per_shard; ++c) {
      connections.push_back(
          options.connect
              ? options.connect(static_cast<int>(s), c)
              : factory.Make(server, c,
                             options.interceptors
                                 ? options.interceptors(static_cast<int>(s))
                                 : std::vector<std::unique_ptr<
                                       grpc::experimental::ClientInterceptorFactoryInterface>>()));
    }
    auto shard = std::make_unique<ShardChannel>(static_cast<int>(s), server,
                                                std::move(connections), policy,
                                                fault_metrics);
    if (frames) {
      shard->EnableFrames(static_cast<uint64_t>(options.max_message_bytes), data_tls);
    }
    PsClient* self = client.get();
    // Replicated shards keep no per-shard state to resynchronise.
    if (options.replicas == 1) {
      shard->set_resync([self](ShardChannel* channel, std::function<void(absl::Status)> done) {
        self->Resync(channel, std::move(done));
      });
    }
    client->channels_.push_back(std::move(shard));
  }
  PsClient* self = client.get();
  std::vector<ShardChannel*> channels;
  for (const std::unique_ptr<ShardChannel>& channel : client->channels_) {
    channels.push_back(channel.get());
  }
  client->calls_ = std::make_unique<ShardCalls>(
      std::move(channels), options.rpc_timeout,
      [self](const char* method, const grpc::Status& status, size_t request_bytes,
             size_t response_bytes, absl::Time start) {
        self->RecordRpc(method, status, request_bytes, response_bytes, start);
      });
  if (options.replicas > 1) {
    ASSIGN_OR_RETURN(std::unique_ptr<ChainControl> chains,
                     ChainControl::Create(options, client->calls_.get(), fault_metrics));
    client->router_ = chains->router();
    client->control_ = std::move(chains);
  } else {
    client->control_ = std::make_unique<DirectControl>(client->calls_.get());
  }
  BatchContext& context = client->batch_context_;
  context.versions = &client->versions_;
  context.push_timeout = options.rpc_timeout;
  context.pull_timeout = options.pull_timeout;
  context.recorder = [self](const char* method, const grpc::Status& status,
                            size_t request_bytes, size_t response_bytes, absl::Time start) {
    self->RecordRpc(method, status, request_bytes, response_bytes, start);
  };
  return client;
}

void PsClient::RecordRpc(const char* method, const grpc::Status& status,
                         size_t request_bytes, size_t response_bytes,
                         absl::Time start) {
  if (rpc_metrics_ == nullptr) return;
  rpc_metrics_->Record(method, status.error_code(), request_bytes, response_bytes,
                       absl::ToDoubleSeconds(absl::Now() - start));
}

absl::Status PsClient::Register(const std::vector<TensorSpec>& tensors) {
  RegisterRequest request;
  for (const TensorSpec& spec : tensors) *request.add_tensors() = spec;
  request.set_worker(options_.worker_index);
  request.set_num_workers(options_.num_workers);
  request.set_worker_incarnation(worker_incarnation_);
  std::vector<RegisterResponse> responses(channels_.size());
  // By group (= shard index): the shard whose answer gives its versions.
  std::vector<int> source(channels_.size());
  RETURN_IF_ERROR(control_->Register(request, &responses, &source));
  PartitionLayout layout = PlanLayout(
      tensors, common::PartitionConfig{options_.max_partition_elements, num_shards()});
  // Every shard must hold exactly the partitions this worker places there,
  // checked before anything of the client changes.
  std::vector<std::vector<std::pair<size_t, int64_t>>> taken(channels_.size());
  for (size_t g = 0; g < channels_.size(); ++g) {
    ASSIGN_OR_RETURN(taken[g], MatchShard(static_cast<int>(g), source[g],
                                          layout.partition_index[g], responses[source[g]]));
  }
  std::unique_ptr<common::TopKCompressor> topk;
  if (options_.topk_ratio > 0) {
    ASSIGN_OR_RETURN(common::TopKCompressor made,
                     common::TopKCompressor::Create(options_.topk_ratio,
                                                    layout.partition_sizes));
    topk = std::make_unique<common::TopKCompressor>(std::move(made));
  }

  // Nothing may still write into versions_ or read topk_ while they are
  // replaced.
  exchange_.reset();
  shard_batches_.clear();
  tensor_batches_.clear();
  register_request_ = std::move(request);
  // KIND_VALUES initial values stay in register_request_ only (a resync
  // sends them again); the layout needs the shapes.
  tensors_.clear();
  for (const TensorSpec& spec : tensors) tensors_.push_back(common::WithoutValues(spec));
  tensor_names_.clear();
  for (const TensorSpec& spec : tensors) tensor_names_.push_back(spec.name());
  layout_ = std::move(layout);
  versions_.clear();
  for (size_t i = 0; i < layout_.partition_sizes.size(); ++i) versions_.emplace_back(0);
  topk_ = std::move(topk);
  // The shards' versions and this worker's clock say where the job is.
  registered_worker_clock_ = 0;
  for (size_t s = 0; s < channels_.size(); ++s) {
    if (options_.replicas == 1) {
      RETURN_IF_ERROR(TakeShardState(static_cast<int>(s), responses[s], /*restarted=*/false));
    } else {
      for (const auto& [i, version] : taken[s]) versions_[i].store(version);
    }
    registered_worker_clock_ =
        std::max(registered_worker_clock_, responses[s].worker_clock());
  }
  BuildCalls(layout_);
  return absl::OkStatus();
}

void PsClient::AddBatches(int shard, const std::vector<PartitionSlice>& slices, int first,
                          std::vector<std::unique_ptr<BatchCall>>* out) {
  // A shard holding none of the partitions gets no call (an empty push is
  // refused).
  if (slices.empty()) return;
  ShardChannel* channel = channels_[shard].get();
  const int connections = channel->num_connections();
  std::vector<std::vector<PartitionSlice>> runs =
      SplitOverConnections(slices, connections, kMinElementsPerConnection);
  WireOptions wire;
  wire.worker = options_.worker_index;
  wire.worker_incarnation = worker_incarnation_;
  wire.dtype = options_.wire_dtype;
  wire.topk = topk_.get();
  for (int r = 0; r < static_cast<int>(runs.size()); ++r) {
    if (runs[r].empty()) continue;
    out->push_back(std::make_unique<BatchCall>(
        &batch_context_, channel, (first + r) % connections,
        std::make_unique<WireRequests>(wire, std::move(runs[r]), &tensor_names_)));
  }
}

void PsClient::BuildCalls(const PartitionLayout& layout) {
  batch_context_.sync = sync_;
  // Replicated shards need no replay: the chain keeps what a member acked.
  batch_context_.replay = sync_ && options_.replicas == 1 ? &replay_ : nullptr;
  batches_per_shard_.assign(channels_.size(), 0);
  for (int s = 0; s < num_shards(); ++s) {
    const size_t before = shard_batches_.size();
    AddBatches(s, layout.shard_slices[s], 0, &shard_batches_);
    batches_per_shard_[s] = static_cast<int>(shard_batches_.size() - before);
  }
  std::vector<std::vector<BatchCall*>> by_tensor(layout.tensor_slices.size());
  for (size_t t = 0; t < layout.tensor_slices.size(); ++t) {
    for (int s = 0; s < num_shards(); ++s) {
      const size_t first = tensor_batches_.size();
      // Small tensors of one partition start on different connections, so
      // that the exchange spreads them too.
      AddBatches(s, layout.tensor_slices[t][s], static_cast<int>(t), &tensor_batches_);
      for (size_t g = first; g < tensor_batches_.size(); ++g) {
        by_tensor[t].push_back(tensor_batches_[g].get());
      }
    }
  }
  // Async: see PsClientOptions::exchanges_cover_every_tensor.
  std::vector<uint32_t> step_calls;
  if (options_.exchanges_cover_every_tensor && !sync_) {
    step_calls.assign(channels_.size(), 0);
    for (const std::unique_ptr<BatchCall>& batch : tensor_batches_) ++step_calls[batch->shard()];
  }
  exchange_ = std::make_unique<TensorExchange>(std::move(by_tensor), &versions_,
                                               options_.rpc_timeout, std::move(step_calls));
}

absl::StatusOr<std::vector<std::pair<size_t, int64_t>>> PsClient::MatchShard(
    int group, int shard, const PartitionIndex& index,
    const RegisterResponse& response) const {
  RegisteredShard registered;
  registered.shard = shard;
  registered.address = channels_[shard]->address();
  if (options_.replicas > 1) {
    registered.group = group;
    registered.num_groups = num_shards();
  }
  return MatchPartitions(index, response, registered);
}

absl::Status PsClient::TakeShardState(int shard, const RegisterResponse& response,
                                      bool restarted) {
  ShardChannel& channel = *channels_[shard];
  ASSIGN_OR_RETURN(const auto taken,
                   MatchShard(shard, shard, layout_.partition_index[shard], response));
  int64_t lost = 0;
  for (const auto& [i, version] : taken) {
    const int64_t known = versions_[i].load();
    lost += std::max<int64_t>(0, known - version);
    // Sync: a version is the job's step, which a restarted shard catches up
    // with on this worker's next push (it moves forward, see server/shard.h).
    if (!sync_ || version > known) versions_[i].store(version);
  }
  const uint64_t before = channel.incarnation();
  channel.set_incarnation(response.incarnation());
  channel.set_data_port(static_cast<int>(response.data_port()));
  channel.set_counts_clock_parts(response.counts_clock_parts());
  if (restarted) {
    LOG(WARNING) << absl::StrFormat(
        "shard %d (%s) restarted: incarnation %016x -> %016x, %d updates lost "
        "since its checkpoint",
        shard, channel.address(), before, response.incarnation(), lost);
    if (fault_metrics_ != nullptr) {
      fault_metrics_->shard_restarts(shard).Increment();
      fault_metrics_->lost_updates(shard).Increment(static_cast<double>(lost));
    }
  }
  return absl::OkStatus();
}

void PsClient::Resync(ShardChannel* channel, std::function<void(absl::Status)> done) {
  auto response = std::make_shared<RegisterResponse>();
  const int shard = channel->index();
  ShardRpc rpc;
  rpc.method = "Register";
  rpc.attempt_timeout = options_.rpc_timeout;
  rpc.start = [this, channel, response](const ShardAttempt& attempt,
                                        std::function<void(grpc::Status)> attempt_done) {
    const absl::Time start = absl::Now();
    response->Clear();
    channel->stub()->async()->Register(
        attempt.context, &register_request_, response.get(),
        [this, response, start, attempt_done = std::move(attempt_done)](grpc::Status status) {
          RecordRpc("Register", status, register_request_.ByteSizeLong(),
                    response->ByteSizeLong(), start);
          attempt_done(std::move(status));
        });
  };
  channel->Call(std::move(rpc), [this, shard, response, done = std::move(done)](
                                    absl::Status status) {
    if (!status.ok()) {
      done(absl::Status(status.code(),
                        absl::StrCat("re-registering after a shard restart: ",
                                     status.message())));
      return;
    }
    const absl::Status taken = TakeShardState(shard, *response, /*restarted=*/true);
    if (!taken.ok() || !sync_) {
      done(taken);
      return;
    }
    replay_.SendAgain(channels_[shard].get(), options_.rpc_timeout, batch_context_.recorder,
                      std::move(done));
  });
}

int PsClient::referenced_slices() const {
  int referenced = 0;
  for (const auto* batches : {&shard_batches_, &tensor_batches_}) {
    for (const std::unique_ptr<BatchCall>& batch : *batches) {
      referenced += batch->requests().refs().Outstanding();
    }
  }
  return referenced;
}

std::pair<int64_t, int64_t> PsClient::known_versions() const {
  if (versions_.empty()) return {0, 0};
  int64_t lo = INT64_MAX, hi = INT64_MIN;
  for (const std::atomic<int64_t>& version : versions_) {
    lo = std::min(lo, version.load());
    hi = std::max(hi, version.load());
  }
  return {lo, hi};
}

std::vector<int64_t> PsClient::PulledVersions() const {
  std::vector<int64_t> versions;
  versions.reserve(versions_.size());
  for (const std::atomic<int64_t>& version : versions_) versions.push_back(version.load());
  return versions;
}

void PsClient::SetNextPushComputedAt(std::vector<int64_t> versions) {
  computed_at_.clear();
  // A snapshot from before a re-registration does not fit: versions_ then.
  if (versions.size() != versions_.size()) return;
  for (int64_t version : versions) computed_at_.emplace_back(version);
}

int64_t PsClient::RaiseKnownVersions(int64_t step) {
  int64_t lost = 0;
  for (std::atomic<int64_t>& version : versions_) {
    const int64_t known = version.load();
    if (known >= step) continue;
    lost += step - known;
    version.store(step);
  }
  return lost;
}

// A blocking push to a shard it reaches over several connections (several
// RPCs that land one by one) must not advance this worker's clock there
// before every part is applied, or a pull the staleness bound holds back
// would be let go to read a half-applied step. Sync shards count steps by
// version.
bool PsClient::DefersClock(int shard) const {
  return !sync_ && batches_per_shard_[shard] > 1;
}

void PsClient::SetPushes(int64_t clock, absl::Span<const absl::Span<const float>> grads) {
  const VersionTable& computed_at = computed_at_.empty() ? versions_ : computed_at_;
  // See DefersClock: how many calls the shard counts, or the clock before
  // this step and a Heartbeat after.
  std::vector<uint32_t> clock_parts(channels_.size(), 0);
  advance_shards_.clear();
  for (int s = 0; s < num_shards(); ++s) {
    if (!DefersClock(s)) continue;
    if (channels_[s]->counts_clock_parts()) {
      clock_parts[s] = static_cast<uint32_t>(batches_per_shard_[s]);
    } else {
      advance_shards_.push_back(s);
    }
  }
  for (const std::unique_ptr<BatchCall>& batch : shard_batches_) {
    const int s = batch->shard();
    const int64_t sent_clock =
        DefersClock(s) && clock_parts[s] == 0 ? std::max<int64_t>(0, clock - 1) : clock;
    batch->requests().set_clock_parts(clock_parts[s]);
    batch->requests().SetPush(
        sent_clock, batch->NextSequence(), [grads](int t) { return grads[t]; }, computed_at);
  }
  computed_at_.clear();
}

absl::Status PsClient::AdvanceClock(int64_t clock) {
  const std::vector<int>& shards = advance_shards_;
  if (shards.empty()) return absl::OkStatus();
  HeartbeatRequest request;
  request.set_worker(options_.worker_index);
  request.set_clock(clock);
  request.set_worker_incarnation(worker_incarnation_);
  return control_->AdvanceClock(request, shards);
}

void PsClient::SetPulls(int64_t clock, int64_t min_version,
                        absl::Span<const absl::Span<float>> params) {
  for (const std::unique_ptr<BatchCall>& batch : shard_batches_) {
    batch->requests().SetPull(clock, min_version, [params](int t) { return params[t]; });
  }
}

void PsClient::CollectPush(PushStats* stats) const {
  stats->max_staleness = 0;
  for (const std::unique_ptr<BatchCall>& batch : shard_batches_) {
    stats->max_staleness = std::max(stats->max_staleness, batch->push_result().max_staleness);
  }
}

void PsClient::CollectPull(PullStats* stats) const {
  stats->server_wait_seconds = 0;
  stats->min_version = INT64_MAX;
  for (const std::unique_ptr<BatchCall>& batch : shard_batches_) {
    stats->server_wait_seconds =
        std::max(stats->server_wait_seconds, batch->pull_result().wait_seconds);
    stats->min_version = std::min(stats->min_version, batch->pull_result().min_version);
  }
}

absl::Status PsClient::RunBatches(
    const std::function<void(BatchCall*, std::function<void(absl::Status)>)>& start,
    bool pushed) {
  std::vector<absl::Status> statuses(shard_batches_.size());
  absl::BlockingCounter pending(static_cast<int>(shard_batches_.size()));
  for (size_t g = 0; g < shard_batches_.size(); ++g) {
    start(shard_batches_[g].get(), [&statuses, &pending, g](absl::Status status) {
      statuses[g] = std::move(status);
      pending.DecrementCount();
    });
  }
  pending.Wait();
  absl::Status first;
  for (const absl::Status& status : statuses) KeepFirstError(&first, status);
  if (pushed) {
    // The caller may overwrite the gradients once this returns: nothing may
    // still read them, neither gRPC nor a later replay.
    if (sync_) replay_.Detach();
    const absl::Time deadline = absl::Now() + options_.rpc_timeout;
    for (const std::unique_ptr<BatchCall>& batch : shard_batches_) {
      KeepFirstError(&first, batch->Release(deadline));
    }
  }
  return first;
}

absl::Status PsClient::Push(int64_t clock,
                            absl::Span<const absl::Span<const float>> grads,
                            PushStats* stats) {
  RETURN_IF_ERROR(
      CheckSpans(grads, "push of", "gradient", "has", tensors_, layout_.tensor_sizes));
  SetPushes(clock, grads);
  return SendPushes(clock, stats);
}

absl::Status PsClient::SendPushes(int64_t clock, PushStats* stats) {
  RETURN_IF_ERROR(RunBatches(
      [](BatchCall* batch, std::function<void(absl::Status)> done) {
        batch->StartPush(std::move(done));
      },
      /*pushed=*/true));
  RETURN_IF_ERROR(AdvanceClock(clock));
  CollectPush(stats);
  return absl::OkStatus();
}

absl::Status PsClient::Pull(int64_t clock, int64_t min_version,
                            absl::Span<const absl::Span<float>> params,
                            PullStats* stats) {
  RETURN_IF_ERROR(
      CheckSpans(params, "pull into", "parameters", "have", tensors_, layout_.tensor_sizes));
  SetPulls(clock, min_version, params);
  RETURN_IF_ERROR(RunBatches(
      [](BatchCall* batch, std::function<void(absl::Status)> done) {
        batch->StartPull(std::move(done));
      },
      /*pushed=*/false));
  CollectPull(stats);
  return absl::OkStatus();
}

absl::Status PsClient::PushPull(int64_t clock, int64_t min_version,
                                absl::Span<const absl::Span<const float>> grads,
                                absl::Span<const absl::Span<float>> params,
                                PushStats* push_stats, PullStats* pull_stats) {
  RETURN_IF_ERROR(
      CheckSpans(grads, "push of", "gradient", "has", tensors_, layout_.tensor_sizes));
  RETURN_IF_ERROR(
      CheckSpans(params, "pull into", "parameters", "have", tensors_, layout_.tensor_sizes));
  // Replicated shards: one RPC too, to the chain's head, which answers the
  // pull half once the tail has the push and what it read.
  SetPushes(clock, grads);
  if (!advance_shards_.empty()) {
    // A shard that does not count a split push's calls (replicated, or an
    // older one) reaches this step's clock only with the Heartbeat after
    // them, which a pull half held by a staleness bound would wait for:
    // push, move the clock, then pull.
    RETURN_IF_ERROR(SendPushes(clock, push_stats));
    return Pull(clock, min_version, params, pull_stats);
  }
  SetPulls(clock, min_version, params);
  RETURN_IF_ERROR(RunBatches(
      [](BatchCall* batch, std::function<void(absl::Status)> done) {
        batch->StartPushPull(std::move(done));
      },
      /*pushed=*/true));
  CollectPush(push_stats);
  CollectPull(pull_stats);
  return absl::OkStatus();
}

void PsClient::StartExchange(int tensor, int64_t clock, int64_t min_version,
                             absl::Span<const float> grad, GradReady grad_ready,
                             absl::Span<float> params) {
  exchange_->Start(tensor, clock, min_version, grad, std::move(grad_ready), params);
}

absl::Status PsClient::FinishExchanges(PushStats* push_stats, PullStats* pull_stats) {
  return exchange_->Finish(&push_stats->max_staleness, &pull_stats->server_wait_seconds,
                           &pull_stats->min_version);
}

absl::StatusOr<HeartbeatResponse> PsClient::Heartbeat(int64_t clock, bool done,
                                                     absl::Duration retry_for) {
  HeartbeatRequest request;
  request.set_worker(options_.worker_index);
  request.set_clock(clock);
  request.set_done(done);
  request.set_worker_incarnation(worker_incarnation_);
  return control_->Heartbeat(request, retry_for);
}

absl::StatusOr<std::vector<StatusResponse>> PsClient::ClusterStatus(
    std::vector<int>* unreachable) {
  return control_->Status(unreachable);
}

}  // namespace shardtrain::client
