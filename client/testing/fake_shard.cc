#include "client/testing/fake_shard.h"

#include <algorithm>

#include <grpcpp/server_builder.h>
#include <grpcpp/support/channel_arguments.h>

#include "absl/strings/str_cat.h"
#include "common/partition.h"
#include "common/payload.h"

namespace shardtrain::client::testing {

FakeShard::FakeShard(int index, int num_shards, int64_t max_partition_elements)
    : index_(index),
      num_shards_(num_shards),
      max_partition_elements_(max_partition_elements),
      incarnation_(1000 + static_cast<uint64_t>(index)) {
  grpc::ServerBuilder builder;
  builder.RegisterService(this);
  server_ = builder.BuildAndStart();
}

FakeShard::~FakeShard() { server_->Shutdown(); }

std::shared_ptr<grpc::Channel> FakeShard::Channel() {
  return server_->InProcessChannel(grpc::ChannelArguments());
}

void FakeShard::FailNext(const std::string& method, int count, grpc::StatusCode code) {
  absl::MutexLock lock(&mu_);
  for (int i = 0; i < count; ++i) failures_[method].push_back(code);
}

void FakeShard::LoseNextAnswers(int count) {
  absl::MutexLock lock(&mu_);
  lose_answers_ += count;
}

void FakeShard::Restart(int lost) {
  absl::MutexLock lock(&mu_);
  incarnation_ += 100;
  for (int i = 0; i < lost && !history_.empty(); ++i) {
    state_ = std::move(history_.back());
    history_.pop_back();
  }
}

uint64_t FakeShard::incarnation() const {
  absl::MutexLock lock(&mu_);
  return incarnation_;
}

int FakeShard::calls(const std::string& method) const {
  absl::MutexLock lock(&mu_);
  auto it = calls_.find(method);
  return it == calls_.end() ? 0 : it->second;
}

std::vector<PushRequest> FakeShard::pushes() const {
  absl::MutexLock lock(&mu_);
  return pushes_;
}

int FakeShard::applied() const {
  absl::MutexLock lock(&mu_);
  return applied_;
}

std::vector<float> FakeShard::values(const std::string& tensor, int64_t partition) const {
  absl::MutexLock lock(&mu_);
  auto it = state_.parts.find({tensor, partition});
  return it == state_.parts.end() ? std::vector<float>() : it->second.values;
}

int64_t FakeShard::version(const std::string& tensor, int64_t partition) const {
  absl::MutexLock lock(&mu_);
  auto it = state_.parts.find({tensor, partition});
  return it == state_.parts.end() ? 0 : it->second.version;
}

grpc::Status FakeShard::Admit(const std::string& method) {
  ++calls_[method];
  std::vector<grpc::StatusCode>& failures = failures_[method];
  if (failures.empty()) return grpc::Status::OK;
  const grpc::StatusCode code = failures.front();
  failures.erase(failures.begin());
  return grpc::Status(code, absl::StrCat("fake shard ", index_, ": scripted ", method,
                                         " failure"));
}

grpc::ServerUnaryReactor* FakeShard::Answer(grpc::CallbackServerContext* context,
                                            const grpc::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

grpc::ServerUnaryReactor* FakeShard::Register(grpc::CallbackServerContext* context,
                                              const RegisterRequest* request,
                                              RegisterResponse* response) {
  absl::MutexLock lock(&mu_);
  grpc::Status status = Admit("Register");
  if (!status.ok()) return Answer(context, status);
  const common::PartitionConfig config{max_partition_elements_, num_shards_};
  for (const TensorSpec& spec : request->tensors()) {
    int64_t elements = 1;
    for (int64_t dim : spec.shape()) elements *= dim;
    for (const common::PlacedPartition& placed :
         common::PlaceTensor(spec.name(), elements, config)) {
      if (placed.shard != index_) continue;
      const Key key(spec.name(), placed.partition);
      // A partition registered now was there, at its initial values, in
      // every earlier state too.
      if (state_.parts.count(key) == 0) {
        Part fresh;
        fresh.values.assign(static_cast<size_t>(placed.range.size), 0.0f);
        for (State& old : history_) old.parts[key] = fresh;
        state_.parts[key] = std::move(fresh);
      }
      const Part& part = state_.parts[key];
      PartitionInfo* info = response->add_partitions();
      info->set_tensor(spec.name());
      info->set_partition(static_cast<uint32_t>(placed.partition));
      info->set_offset(placed.range.offset);
      info->set_size(placed.range.size);
      info->set_version(part.version);
    }
  }
  response->set_incarnation(incarnation_);
  response->set_counts_clock_parts(counts_clock_parts_);
  return Answer(context, grpc::Status::OK);
}

void FakeShard::set_counts_clock_parts(bool counts) {
  absl::MutexLock lock(&mu_);
  counts_clock_parts_ = counts;
}

grpc::Status FakeShard::ApplyPush(const PushRequest& request, PushResponse* response) {
  pushes_.push_back(request);
  response->set_incarnation(incarnation_);
  if (request.shard_incarnation() != 0 && request.shard_incarnation() != incarnation_) {
    return grpc::Status(grpc::StatusCode::ABORTED, "fake shard restarted: re-register");
  }
  const auto sequence =
      std::make_tuple(request.worker(), request.worker_incarnation(), request.sequence());
  if (request.sequence() != 0 && state_.sequences.count(sequence) > 0) {
    response->set_duplicate(true);
    return grpc::Status::OK;
  }
  // Every part is checked and decoded before any is applied.
  std::vector<std::pair<Part*, std::vector<float>>> updates;
  for (const GradientPart& gradient : request.parts()) {
    auto it = state_.parts.find({gradient.key().tensor(), gradient.key().partition()});
    if (it == state_.parts.end()) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND,
                          absl::StrCat(gradient.key().tensor(), "/",
                                       gradient.key().partition(), " is not here"));
    }
    std::vector<float> grad(it->second.values.size());
    const absl::Status decoded = common::DecodePayload(gradient.grad(), absl::MakeSpan(grad));
    if (!decoded.ok()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, std::string(decoded.message()));
    }
    response->set_max_staleness(
        std::max(response->max_staleness(), it->second.version - gradient.version()));
    updates.emplace_back(&it->second, std::move(grad));
  }
  history_.push_back(state_);  // a copy: `updates` still points into state_
  for (auto& [part, grad] : updates) {
    for (size_t i = 0; i < grad.size(); ++i) part->values[i] -= grad[i];
    ++part->version;
  }
  if (request.sequence() != 0) state_.sequences.insert(sequence);
  ++applied_;
  if (lose_answers_ > 0) {
    --lose_answers_;
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "fake shard: answer lost");
  }
  return grpc::Status::OK;
}

grpc::Status FakeShard::FillPull(const PullRequest& request, PullResponse* response) const {
  if (request.shard_incarnation() != 0 && request.shard_incarnation() != incarnation_) {
    return grpc::Status(grpc::StatusCode::ABORTED, "fake shard restarted: re-register");
  }
  response->set_incarnation(incarnation_);
  const DType dtype = common::PayloadDType(request.dtype());
  for (const PartitionKey& key : request.parts()) {
    auto it = state_.parts.find({key.tensor(), key.partition()});
    if (it == state_.parts.end()) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND,
                          absl::StrCat(key.tensor(), "/", key.partition(), " is not here"));
    }
    ParameterPart* part = response->add_parts();
    *part->mutable_key() = key;
    part->set_version(it->second.version);
    part->mutable_value()->set_dtype(dtype);
    common::EncodeDense(it->second.values, dtype, part->mutable_value()->mutable_data());
  }
  return grpc::Status::OK;
}

grpc::ServerUnaryReactor* FakeShard::Push(grpc::CallbackServerContext* context,
                                          const PushRequest* request,
                                          PushResponse* response) {
  absl::MutexLock lock(&mu_);
  grpc::Status status = Admit("Push");
  if (status.ok()) status = ApplyPush(*request, response);
  return Answer(context, status);
}

grpc::ServerUnaryReactor* FakeShard::Pull(grpc::CallbackServerContext* context,
                                          const PullRequest* request,
                                          PullResponse* response) {
  absl::MutexLock lock(&mu_);
  grpc::Status status = Admit("Pull");
  if (status.ok()) status = FillPull(*request, response);
  return Answer(context, status);
}

grpc::ServerUnaryReactor* FakeShard::PushPull(grpc::CallbackServerContext* context,
                                              const PushPullRequest* request,
                                              PushPullResponse* response) {
  absl::MutexLock lock(&mu_);
  grpc::Status status = Admit("PushPull");
  if (status.ok()) status = ApplyPush(request->push(), response->mutable_push());
  if (status.ok()) status = FillPull(request->pull(), response->mutable_pull());
  return Answer(context, status);
}

grpc::ServerUnaryReactor* FakeShard::Heartbeat(grpc::CallbackServerContext* context,
                                               const HeartbeatRequest* request,
                                               HeartbeatResponse* response) {
  absl::MutexLock lock(&mu_);
  const grpc::Status status = Admit("Heartbeat");
  if (status.ok()) {
    response->set_incarnation(incarnation_);
    WorkerState* worker = response->add_workers();
    worker->set_worker(request->worker());
    worker->set_clock(request->clock());
    worker->set_live(true);
    worker->set_done(request->done());
    worker->set_incarnation(request->worker_incarnation());
  }
  return Answer(context, status);
}

}  // namespace shardtrain::client::testing
