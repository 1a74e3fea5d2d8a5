// shard_fuzz_seeds DIR: writes the seed corpus of shard_fuzz into DIR.
//
// Each seed is a short session of the requests a ps-worker sends (format in
// server/fuzz/fuzz_input.h): a Register of a small MLP's tensors (the names,
// shapes and initialisers worker/model/tensor_specs.cc gives them), dense f32, f16
// and bf16 pushes, a sparse top-k push from the worker's compressor, pulls in
// every dtype, PushPulls, heartbeats, status and ticks, in sync and async
// mode with each optimizer; plus a few that the shard must reject (unknown
// tensor, NaN gradient, wrong size, a partition twice, a conflicting spec).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "common/initializer.h"
#include "common/partition.h"
#include "common/payload.h"
#include "common/topk_compressor.h"
#include "proto/shardtrain.pb.h"
#include "server/fuzz/fuzz_input.h"

namespace shardtrain::server::fuzz {
namespace {

constexpr uint64_t kIncarnationBase = 0x5eed0000;

// fc0: 12 -> 8, fc1: 8 -> 3, as worker/model/tensor_specs.cc registers an MLP.
std::vector<TensorSpec> MlpSpecs() {
  struct Param {
    const char* name;
    std::vector<int64_t> shape;
    Initializer::Kind kind;
  };
  const Param params[] = {
      {"fc0.weight", {12, 8}, Initializer::KIND_HE_UNIFORM},
      {"fc0.bias", {8}, Initializer::KIND_ZEROS},
      {"fc1.weight", {8, 3}, Initializer::KIND_GLOROT_UNIFORM},
      {"fc1.bias", {3}, Initializer::KIND_ZEROS},
  };
  std::vector<TensorSpec> specs;
  for (const Param& param : params) {
    TensorSpec spec;
    spec.set_name(param.name);
    for (int64_t dim : param.shape) spec.add_shape(dim);
    spec.set_dtype(DTYPE_F32);
    spec.mutable_init()->set_kind(param.kind);
    spec.mutable_init()->set_seed(42);
    specs.push_back(spec);
  }
  return specs;
}

struct LocalPart {
  std::string tensor;
  int64_t partition;
  int64_t size;
};

// The partitions of the MLP that the fuzzed shard holds under `options`.
std::vector<LocalPart> LocalParts(const ShardOptions& options) {
  std::vector<LocalPart> parts;
  for (const TensorSpec& spec : MlpSpecs()) {
    for (const common::PlacedPartition& placed : common::PlaceTensor(
             spec.name(), common::NumElements(spec), options.partitioning)) {
      if (placed.shard != options.shard_index) continue;
      parts.push_back({spec.name(), placed.partition, placed.range.size});
    }
  }
  return parts;
}

enum class Grad { kF32, kF16, kBf16, kTopK, kNaN, kShort };

class SeedBuilder {
 public:
  SeedBuilder(uint8_t flags, uint8_t layout)
      : options_(OptionsFromHeader(flags, layout)), parts_(LocalParts(options_)) {
    input_.push_back(static_cast<char>(flags));
    input_.push_back(static_cast<char>(layout));
  }

  SeedBuilder& Register(uint32_t worker) {
    RegisterRequest request;
    for (const TensorSpec& spec : MlpSpecs()) *request.add_tensors() = spec;
    request.set_worker(worker);
    request.set_num_workers(static_cast<uint32_t>(options_.num_workers));
    request.set_worker_incarnation(kIncarnationBase + worker);
    AppendOp(Op::kRegister, request.SerializeAsString(), &input_);
    return *this;
  }

  PushRequest MakePush(uint32_t worker, int64_t version, Grad grad) {
    PushRequest request;
    request.set_worker(worker);
    request.set_clock(version + 1);
    request.set_worker_incarnation(kIncarnationBase + worker);
    request.set_sequence(++sequence_[worker % 4]);
    for (size_t i = 0; i < parts_.size(); ++i) {
      const LocalPart& local = parts_[i];
      GradientPart* part = request.add_parts();
      part->mutable_key()->set_tensor(local.tensor);
      part->mutable_key()->set_partition(static_cast<uint32_t>(local.partition));
      part->set_version(version);
      std::vector<float> values(local.size);
      for (int64_t e = 0; e < local.size; ++e) {
        values[e] = 0.01f * std::sin(static_cast<float>(e + 7 * worker + i));
      }
      Payload* payload = part->mutable_grad();
      switch (grad) {
        case Grad::kF32:
          payload->set_dtype(DTYPE_F32);
          common::EncodeDense(values, DTYPE_F32, payload->mutable_data());
          break;
        case Grad::kF16:
          payload->set_dtype(DTYPE_F16);
          common::EncodeDense(values, DTYPE_F16, payload->mutable_data());
          break;
        case Grad::kBf16:
          payload->set_dtype(DTYPE_BF16);
          common::EncodeDense(values, DTYPE_BF16, payload->mutable_data());
          break;
        case Grad::kTopK: {
          absl::StatusOr<common::TopKCompressor> topk =
              common::TopKCompressor::Create(0.25, {local.size});
          topk->Encode(0, values, i % 2 ? DTYPE_F16 : DTYPE_F32, payload);
          break;
        }
        case Grad::kNaN:
          values[local.size / 2] = std::nanf("");
          payload->set_dtype(DTYPE_F32);
          common::EncodeDense(values, DTYPE_F32, payload->mutable_data());
          break;
        case Grad::kShort:
          values.pop_back();
          payload->set_dtype(DTYPE_F32);
          common::EncodeDense(values, DTYPE_F32, payload->mutable_data());
          break;
      }
    }
    return request;
  }

  SeedBuilder& Push(uint32_t worker, int64_t version, Grad grad) {
    AppendOp(Op::kPush, MakePush(worker, version, grad).SerializeAsString(), &input_);
    return *this;
  }

  // The same request twice: the retry of a push whose answer was lost.
  SeedBuilder& PushTwice(uint32_t worker, int64_t version) {
    const std::string bytes = MakePush(worker, version, Grad::kF32).SerializeAsString();
    AppendOp(Op::kPush, bytes, &input_);
    AppendOp(Op::kPush, bytes, &input_);
    return *this;
  }

  // A push naming its first partition twice.
  SeedBuilder& PushDuplicatePart(uint32_t worker) {
    PushRequest request = MakePush(worker, 0, Grad::kF32);
    *request.add_parts() = request.parts(0);
    AppendOp(Op::kPush, request.SerializeAsString(), &input_);
    return *this;
  }

  PullRequest MakePull(uint32_t worker, int64_t clock, int64_t min_version, DType dtype) {
    PullRequest request;
    request.set_worker(worker);
    request.set_clock(clock);
    request.set_min_version(min_version);
    request.set_dtype(dtype);
    request.set_worker_incarnation(kIncarnationBase + worker);
    for (const LocalPart& local : parts_) {
      PartitionKey* key = request.add_parts();
      key->set_tensor(local.tensor);
      key->set_partition(static_cast<uint32_t>(local.partition));
    }
    return request;
  }

  SeedBuilder& Pull(uint32_t worker, int64_t clock, int64_t min_version, DType dtype) {
    AppendOp(Op::kPull, MakePull(worker, clock, min_version, dtype).SerializeAsString(),
             &input_);
    return *this;
  }

  SeedBuilder& PushPull(uint32_t worker, int64_t version, Grad grad, DType dtype) {
    PushPullRequest request;
    *request.mutable_push() = MakePush(worker, version, grad);
    *request.mutable_pull() = MakePull(worker, version + 1, version + 1, dtype);
    AppendOp(Op::kPushPull, request.SerializeAsString(), &input_);
    return *this;
  }

  SeedBuilder& Heartbeat(uint32_t worker, int64_t clock, bool done) {
    HeartbeatRequest request;
    request.set_worker(worker);
    request.set_clock(clock);
    request.set_done(done);
    request.set_worker_incarnation(kIncarnationBase + worker);
    AppendOp(Op::kHeartbeat, request.SerializeAsString(), &input_);
    return *this;
  }

  SeedBuilder& Status() {
    StatusRequest request;
    request.set_max_partitions(4);
    AppendOp(Op::kStatus, request.SerializeAsString(), &input_);
    return *this;
  }

  // A table (dim 4, the given optimizer, count admission, a capacity, sync
  // or not), a training lookup of ids 1..8, a push for them by worker 0,
  // the same push again, and a second push by worker 0 (a sync table's
  // step then waits for the other workers).
  SeedBuilder& Tables(const char* optimizer, bool sync = false) {
    RegisterTablesRequest reg;
    TableSpec* spec = reg.add_tables();
    spec->set_name("t");
    spec->set_dim(4);
    spec->set_optimizer(optimizer);
    spec->set_learning_rate(0.1f);
    spec->set_admission("count");
    spec->set_admission_count(2);
    spec->set_admission_filter_counters(1024);
    spec->set_capacity(64);
    spec->set_ttl(3);
    spec->set_sync(sync);
    AppendOp(Op::kRegisterTables, reg.SerializeAsString(), &input_);
    std::string ids;
    for (uint64_t id = 1; id <= 8; ++id) ids.append(reinterpret_cast<const char*>(&id), 8);
    LookupRequest lookup;
    lookup.set_table("t");
    lookup.set_ids(ids);
    lookup.set_train(true);
    lookup.set_clock(1);
    AppendOp(Op::kLookup, lookup.SerializeAsString(), &input_);
    AppendOp(Op::kLookup, lookup.SerializeAsString(), &input_);
    PushSparseRequest push;
    push.set_table("t");
    push.set_ids(ids);
    push.set_grads(std::string(8 * 4 * sizeof(float), '\x01'));
    push.set_sequence(1);
    push.set_clock(2);
    AppendOp(Op::kPushSparse, push.SerializeAsString(), &input_);
    AppendOp(Op::kPushSparse, push.SerializeAsString(), &input_);
    push.set_sequence(2);
    AppendOp(Op::kPushSparse, push.SerializeAsString(), &input_);
    AppendOp(Op::kLookup, lookup.SerializeAsString(), &input_);
    lookup.set_train(false);
    AppendOp(Op::kLookup, lookup.SerializeAsString(), &input_);
    lookup.set_dtype(DTYPE_BF16);
    AppendOp(Op::kLookup, lookup.SerializeAsString(), &input_);
    push.set_sequence(3);
    push.set_dtype(DTYPE_BF16);
    push.set_grads(std::string(8 * 4 * 2, '\x01'));
    AppendOp(Op::kPushSparse, push.SerializeAsString(), &input_);
    // Forwarded operations at the replica: one not next (refused), one
    // that names its group twice, one that may be next.
    SparseOp op;
    op.set_op(100);
    op.set_now(2);
    lookup.set_train(true);
    lookup.clear_dtype();
    *op.mutable_lookup() = lookup;
    AppendOp(Op::kApplySparseOp, op.SerializeAsString(), &input_);
    op.set_group(1);
    AppendOp(Op::kApplySparseOp, op.SerializeAsString(), &input_);
    op.set_group(0);
    op.set_op(6);
    op.clear_lookup();
    *op.mutable_push() = push;
    AppendOp(Op::kApplySparseOp, op.SerializeAsString(), &input_);
    return *this;
  }

  SeedBuilder& Tick(uint8_t seconds) {
    AppendOp(Op::kTick, std::string(1, static_cast<char>(seconds)), &input_);
    return *this;
  }

  // A Register of fc0.bias with another shape.
  SeedBuilder& RegisterConflict() {
    RegisterRequest request;
    TensorSpec spec = MlpSpecs()[1];
    spec.set_shape(0, 9);
    *request.add_tensors() = spec;
    AppendOp(Op::kRegister, request.SerializeAsString(), &input_);
    return *this;
  }

  // A Register of `count` tensors of `elements` elements each.
  SeedBuilder& RegisterMany(int count, int64_t elements) {
    RegisterRequest request;
    for (int t = 0; t < count; ++t) {
      TensorSpec* spec = request.add_tensors();
      spec->set_name("t" + std::to_string(t));
      spec->add_shape(elements);
      spec->set_dtype(DTYPE_F32);
    }
    AppendOp(Op::kRegister, request.SerializeAsString(), &input_);
    return *this;
  }

  // A pull naming every partition `times` times.
  SeedBuilder& PullRepeated(uint32_t worker, int times) {
    PullRequest request = MakePull(worker, 0, 0, DTYPE_F32);
    const PullRequest once = request;
    for (int t = 1; t < times; ++t) {
      for (const PartitionKey& key : once.parts()) *request.add_parts() = key;
    }
    AppendOp(Op::kPull, request.SerializeAsString(), &input_);
    return *this;
  }

  const std::string& input() const { return input_; }

 private:
  const ShardOptions options_;
  const std::vector<LocalPart> parts_;
  uint64_t sequence_[4] = {};
  std::string input_;
};

// flags: bit 0 sync, bits 1-3 optimizer (0 sgd, 1 momentum, 2 nesterov,
// 3 adam, 4 adamw, 5 adagrad), bit 4 staleness bound.
constexpr uint8_t Flags(bool sync, int optimizer, bool bounded = false) {
  return static_cast<uint8_t>((sync ? 1 : 0) | (optimizer << 1) | (bounded ? 0x10 : 0));
}
// layout: workers, partition size index (16384, 64, 7, 1), shards index.
constexpr uint8_t Layout(int workers, int partition_size, int shards = 0) {
  return static_cast<uint8_t>((workers - 1) | (partition_size << 2) | (shards << 4));
}

bool Write(const std::string& dir, const std::string& name, const std::string& bytes) {
  std::ofstream out(dir + "/" + name, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) {
    std::fprintf(stderr, "shard_fuzz_seeds: cannot write %s/%s\n", dir.c_str(), name.c_str());
    return false;
  }
  return true;
}

int Main(const std::string& dir) {
  std::vector<std::pair<std::string, SeedBuilder>> seeds;
  auto add = [&](const char* name, uint8_t flags, uint8_t layout) -> SeedBuilder& {
    seeds.emplace_back(name, SeedBuilder(flags, layout));
    return seeds.back().second;
  };
  add("async_sgd_f32", Flags(false, 0), Layout(1, 0))
      .Register(0).Pull(0, 0, 0, DTYPE_F32).Push(0, 0, Grad::kF32)
      .Pull(0, 1, 1, DTYPE_F32).Heartbeat(0, 1, false).Status();
  add("async_adam_topk", Flags(false, 3), Layout(2, 1))
      .Register(0).Register(1).Push(0, 0, Grad::kTopK).Push(1, 0, Grad::kTopK)
      .Pull(1, 1, 0, DTYPE_BF16).Tick(0);
  add("async_ssp_momentum", Flags(false, 1, true), Layout(2, 1))
      .Register(0).Heartbeat(0, 0, false).Heartbeat(1, 0, false)
      .PushPull(0, 0, Grad::kF16, DTYPE_F16).PushPull(0, 1, Grad::kF32, DTYPE_F32)
      .Heartbeat(1, 0, true).Pull(0, 2, 0, DTYPE_F32);
  add("sync_nesterov_two_workers", Flags(true, 2), Layout(2, 1))
      .Register(0).Register(1).Push(0, 0, Grad::kF16).Push(1, 0, Grad::kBf16)
      .Pull(0, 1, 1, DTYPE_F16).PushPull(0, 1, Grad::kF32, DTYPE_F32)
      .PushPull(1, 1, Grad::kTopK, DTYPE_BF16).Status();
  add("sync_adamw_silent_worker", Flags(true, 4), Layout(3, 2, 1))
      .Register(0).Heartbeat(0, 0, false).Heartbeat(1, 0, false).Push(0, 0, Grad::kF32)
      .Tick(30).Push(0, 1, Grad::kF32).Heartbeat(1, 0, false).Push(1, 1, Grad::kF32);
  add("sync_adagrad_late_and_done", Flags(true, 5), Layout(2, 1, 2))
      .Register(0).Push(0, 0, Grad::kF32).Push(1, 0, Grad::kF32).Push(0, 0, Grad::kF32)
      .Heartbeat(0, 1, true).Push(1, 1, Grad::kBf16).Pull(1, 2, 2, DTYPE_F32);
  add("async_retry_same_sequence", Flags(false, 0), Layout(1, 3))
      .Register(0).PushTwice(0, 0).Pull(0, 1, 1, DTYPE_F32);
  add("rejected_requests", Flags(false, 3), Layout(2, 1))
      .Push(0, 0, Grad::kF32).Pull(0, 0, 0, DTYPE_F32).Register(0).Push(0, 0, Grad::kNaN)
      .Push(0, 0, Grad::kShort).PushDuplicatePart(0).Push(0, 5, Grad::kF32)
      .RegisterConflict().Pull(0, 0, 9, DTYPE_F32).Heartbeat(7, 0, false).Status();
  // Requests over the shard's ResourceLimits (FuzzLimits()): more elements
  // than max_stored_elements, more tensors than max_tensors_per_request,
  // more parts than max_parts_per_request.
  const ResourceLimits limits = FuzzLimits();
  add("over_limits", Flags(false, 0), Layout(1, 0))
      .RegisterMany(1, limits.max_stored_elements + 1)
      .RegisterMany(limits.max_tensors_per_request + 1, 1)
      .Register(0)
      .PullRepeated(0, static_cast<int>(limits.max_parts_per_request / 4 + 1));
  add("tables_rowwise_adagrad", Flags(false, 0), Layout(1, 0)).Tables("rowwise_adagrad");
  add("tables_adam_two_shards", Flags(false, 0), Layout(1, 0, 1)).Tables("adam").Status();
  add("tables_ftrl", Flags(false, 0), Layout(1, 0)).Tables("ftrl");
  add("tables_sync_two_workers", Flags(false, 0), Layout(2, 0)).Tables("adam", true);
  for (const auto& [name, seed] : seeds) {
    if (!Write(dir, name, seed.input())) return 1;
  }
  std::printf("shard_fuzz_seeds: wrote %zu seeds to %s\n", seeds.size(), dir.c_str());
  return 0;
}

}  // namespace
}  // namespace shardtrain::server::fuzz

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  return shardtrain::server::fuzz::Main(argv[1]);
}
