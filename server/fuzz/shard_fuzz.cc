// shard_fuzz: libFuzzer target over a shard's request path.
//
// Each input builds a fresh in-process Shard (mode, optimizer, workers,
// partitioning and staleness bound from its first two bytes) and sends it a
// short sequence of requests parsed from binary protobuf (format in
// server/fuzz/fuzz_input.h): Register, Push, Pull, PushPull (as the service
// runs it), Heartbeat, Status, Tick, the table requests, and SparseOps sent
// to a replica of the shard's tables (SparseTables with --replicas 2).
// Besides the sanitizers it checks what the shard promises:
//  - a rejected request changes nothing: the partitions' checksum, the
//    registered partitions and every worker's membership record are as
//    before;
//  - a pull changes nothing, valid or not, and answers every part it
//    names with the partition's size in the asked dtype;
//  - a PushPull whose pull was valid before the push is still valid after;
//  - the replica applies every table operation the shard applied (its
//    SparseOp) and then holds the same rows, bit for bit; a SparseOp it
//    refuses changes nothing.
// A broken promise aborts, which libFuzzer reports as a crash. Memory is
// bounded by libFuzzer's -malloc_limit_mb / -rss_limit_mb (scripts/fuzz.sh)
// and the shard's ResourceLimits (FuzzLimits()). server/fuzz/regressions/
// holds inputs that once broke it; scripts/fuzz.sh replays them first.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <glog/logging.h>
#include <google/protobuf/stubs/logging.h>
#include <prometheus/registry.h>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "common/payload.h"
#include "proto/shardtrain.pb.h"
#include "server/fuzz/fuzz_input.h"
#include "server/fuzz/request_mutator.h"
#include "server/shard.h"
#include "server/shard_metrics.h"
#include "wire/message_encoder.h"

namespace shardtrain::server::fuzz {
namespace {

[[noreturn]] void Fail(const char* what, const absl::Status& status) {
  std::fprintf(stderr, "shard_fuzz: %s (request status: %s)\n", what,
               status.ToString().c_str());
  std::abort();
}

// What a rejected request must leave unchanged: the checksum of every
// partition's state, the partitions held and the workers' records. Counters
// and times are left out (a late push is rejected and counted as dropped).
struct Digest {
  uint64_t checksum = 0;
  std::string state;
  std::string tables;  // every table's spec and rows, as checkpointed

  bool operator==(const Digest& other) const {
    return checksum == other.checksum && state == other.state && tables == other.tables;
  }
  bool operator!=(const Digest& other) const { return !(*this == other); }
};

// The records of `tables`' rows of `group`.
std::string TableDigest(const SparseTables& tables, int group) {
  std::vector<CheckpointRecord> records;
  tables.Snapshot(int64_t{1} << 30, &records);
  std::string digest;
  for (const CheckpointRecord& record : records) {
    if (record.table_group() == group) digest += record.SerializeAsString();
  }
  return digest;
}

// A replica of `options`' shard's tables: --replicas 2, holding the shard's
// group and (with more shards) the next.
ShardOptions ReplicaOptions(ShardOptions options) {
  options.replicas = 2;
  return options;
}
std::vector<int> ReplicaGroups(const ShardOptions& options) {
  const int n = options.partitioning.num_shards;
  const int own = options.shard_index;
  if (n == 1) return {own};
  return {own, (own + 1) % n};
}

Digest TakeDigest(const Shard& shard) {
  StatusRequest all;
  all.set_max_partitions(~0u);
  StatusResponse status;
  shard.FillStatus(all, &status);
  StatusResponse kept;
  for (const PartitionInfo& info : status.partitions()) *kept.add_partitions() = info;
  for (const WorkerState& worker : status.workers()) {
    WorkerState* out = kept.add_workers();
    *out = worker;
    out->clear_seconds_since_heartbeat();
  }
  Digest digest;
  digest.checksum = shard.Checksum();
  digest.state = kept.SerializeAsString();
  std::vector<CheckpointRecord> records;
  shard.tables().Snapshot(int64_t{1} << 30, &records);
  for (const CheckpointRecord& record : records) digest.tables += record.SerializeAsString();
  return digest;
}

// One input's shard and what the fuzzer learnt about it.
class Session {
 public:
  explicit Session(std::unique_ptr<Shard> shard)
      : shard_(std::move(shard)),
        replica_(ReplicaOptions(shard_->options()), ReplicaGroups(shard_->options()),
                 /*incarnation=*/7, /*metrics=*/nullptr) {}

  void Run(Op op, const uint8_t* data, size_t size) {
    switch (op) {
      case Op::kRegister: {
        RegisterRequest request;
        if (!request.ParseFromArray(data, static_cast<int>(size))) return;
        Register(request);
        return;
      }
      case Op::kPush: {
        PushRequest request;
        if (!request.ParseFromArray(data, static_cast<int>(size))) return;
        Push(request).IgnoreError();  // checked inside
        return;
      }
      case Op::kPull: {
        PullRequest request;
        if (!request.ParseFromArray(data, static_cast<int>(size))) return;
        Pull(request);
        return;
      }
      case Op::kPushPull: {
        PushPullRequest request;
        if (!request.ParseFromArray(data, static_cast<int>(size))) return;
        PushPull(request);
        return;
      }
      case Op::kHeartbeat: {
        HeartbeatRequest request;
        if (!request.ParseFromArray(data, static_cast<int>(size))) return;
        Heartbeat(request);
        return;
      }
      case Op::kStatus: {
        StatusRequest request;
        if (!request.ParseFromArray(data, static_cast<int>(size))) return;
        StatusResponse response;
        shard_->FillStatus(request, &response);
        if (response.partitions_size() < static_cast<int>(sizes_.size()) &&
            !response.partitions_truncated()) {
          Fail("status lists fewer partitions than were registered", absl::OkStatus());
        }
        return;
      }
      case Op::kTick: {
        const int seconds = size > 0 ? data[0] : 0;
        shard_->Tick(absl::Now() + absl::Seconds(seconds));
        return;
      }
      case Op::kRegisterTables: {
        RegisterTablesRequest request;
        if (!request.ParseFromArray(data, static_cast<int>(size))) return;
        const Digest before = TakeDigest(*shard_);
        const absl::Status status = shard_->tables().Register(request);
        if (!status.ok() && TakeDigest(*shard_) != before) {
          Fail("a rejected RegisterTables changed the shard", status);
        }
        if (status.ok() && !replica_.Register(request).ok()) {
          Fail("the replica refused a RegisterTables the shard took", status);
        }
        return;
      }
      case Op::kLookup: {
        LookupRequest request;
        if (!request.ParseFromArray(data, static_cast<int>(size))) return;
        const Digest before = TakeDigest(*shard_);
        // The service parks a lookup that waits; here it is answered
        // anyway, as one woken by its step would be.
        (void)shard_->tables().LookupWaits(request);
        wire::LookupResponseBuilder builder;
        SparseOp op;
        const absl::Status status = shard_->tables().Lookup(request, &builder, &op);
        if (status.ok() && request.train()) Replicate(op);
        if ((!status.ok() || !request.train()) && TakeDigest(*shard_) != before) {
          Fail("a rejected or read-only Lookup changed the shard", status);
        }
        // What is sent must be a LookupResponse that stock protobuf reads.
        LookupResponse response;
        if (status.ok()) {
          grpc::ByteBuffer sent;
          builder.Finish(&sent);
          std::vector<grpc::Slice> slices;
          std::string bytes;
          if (sent.Dump(&slices).ok()) {
            for (const grpc::Slice& slice : slices) {
              bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
            }
          }
          if (!response.ParseFromString(bytes)) Fail("Lookup's response does not parse", status);
        }
        const size_t ids = request.ids().size() / 8;
        // Values of the request's dtype (2 or 4 bytes; unspecified is f32).
        const size_t width =
            static_cast<size_t>(common::DTypeSize(common::PayloadDType(request.dtype())));
        if (status.ok() && (width == 0 || response.rows().size() % width != 0 ||
                            (ids > 0 && response.rows().size() % (width * ids) != 0))) {
          Fail("Lookup answered rows of a wrong size", status);
        }
        return;
      }
      case Op::kPushSparse: {
        PushSparseRequest request;
        if (!request.ParseFromArray(data, static_cast<int>(size))) return;
        const Digest before = TakeDigest(*shard_);
        PushSparseResponse response;
        bool step_applied = false;
        SparseOp op;
        const absl::Status status =
            shard_->tables().PushSparse(request, &response, &step_applied, &op);
        if ((!status.ok() || response.duplicate()) && TakeDigest(*shard_) != before) {
          Fail("a rejected or duplicate PushSparse changed the shard", status);
        }
        if (!status.ok() && step_applied) Fail("a rejected PushSparse applied a step", status);
        if (status.ok() && !response.duplicate()) Replicate(op);
        return;
      }
      case Op::kApplySparseOp: {
        SparseOp op;
        if (!op.ParseFromArray(data, static_cast<int>(size))) return;
        std::string before[2];
        for (int g = 0; g < 2; ++g) before[g] = TableDigest(replica_, g);
        const absl::Status status =
            replica_.ApplyReplicated(op, absl::ZeroDuration(), [] { return true; });
        if (status.ok()) diverged_ = true;
        if (!status.ok()) {
          for (int g = 0; g < 2; ++g) {
            if (TableDigest(replica_, g) != before[g]) {
              Fail("a refused SparseOp changed the replica", status);
            }
          }
        }
        return;
      }
    }
  }

 private:
  using Key = std::pair<std::string, uint32_t>;

  void Register(const RegisterRequest& request) {
    const Digest before = TakeDigest(*shard_);
    RegisterResponse response;
    const absl::Status status = shard_->Register(request, &response);
    if (!status.ok()) {
      if (TakeDigest(*shard_) != before) Fail("a rejected Register changed the shard", status);
      return;
    }
    for (const PartitionInfo& info : response.partitions()) {
      // A partition may be empty: a tensor of fewer elements than the
      // partitions its shard count rounds it up to (common/partition.h).
      if (info.size() < 0) Fail("Register answered a negative partition size", status);
      sizes_[Key(info.tensor(), info.partition())] = info.size();
    }
  }

  absl::Status Push(const PushRequest& request) {
    const Digest before = TakeDigest(*shard_);
    PushResponse response;
    const absl::Status status = shard_->Push(request, &response);
    if (!status.ok()) {
      if (TakeDigest(*shard_) != before) Fail("a rejected Push changed the shard", status);
    } else if (response.max_staleness() < 0) {
      Fail("Push answered a negative staleness", status);
    }
    return status;
  }

  void Pull(const PullRequest& request) {
    const Digest before = TakeDigest(*shard_);
    const absl::Status status = shard_->pulls().Validate(request);
    if (status.ok()) Answer(request);
    if (TakeDigest(*shard_) != before) Fail("a Pull changed the shard", status);
  }

  // As ParameterServerService::PushPull: the pull is checked first, so a
  // bad pull rejects the whole request.
  void PushPull(const PushPullRequest& request) {
    const Digest before = TakeDigest(*shard_);
    absl::Status status;
    if (request.pull().worker() != request.push().worker()) {
      status = absl::InvalidArgumentError("push and pull from different workers");
    }
    if (status.ok()) status = shard_->pulls().Validate(request.pull());
    if (!status.ok()) {
      if (TakeDigest(*shard_) != before) Fail("a rejected PushPull changed the shard", status);
      return;
    }
    if (!Push(request.push()).ok()) return;
    const absl::Status again = shard_->pulls().Validate(request.pull());
    if (!again.ok()) Fail("a pull valid before its push is invalid after it", again);
    Answer(request.pull());
  }

  // REQUIRES: pulls().Validate(request).ok().
  void Answer(const PullRequest& request) {
    shard_->pulls().Ready(request);
    PullResponse response;
    shard_->pulls().Fill(request, &response);
    if (response.parts_size() != request.parts_size()) {
      Fail("Fill answered a different number of parts", absl::OkStatus());
    }
    const int width = common::DTypeSize(common::PayloadDType(request.dtype()));
    for (const ParameterPart& part : response.parts()) {
      auto it = sizes_.find(Key(part.key().tensor(), part.key().partition()));
      if (it == sizes_.end()) Fail("Fill answered an unregistered partition", absl::OkStatus());
      if (part.version() < 0 ||
          part.value().data().size() != static_cast<size_t>(it->second) * width) {
        Fail("Fill answered a part of the wrong size or version", absl::OkStatus());
      }
    }
  }

  void Heartbeat(const HeartbeatRequest& request) {
    const Digest before = TakeDigest(*shard_);
    HeartbeatResponse response;
    const absl::Status status = shard_->Heartbeat(request, &response);
    if (!status.ok()) {
      if (TakeDigest(*shard_) != before) Fail("a rejected Heartbeat changed the shard", status);
      return;
    }
    // Each worker at most once, in order, within the job.
    int64_t previous = -1;
    for (const WorkerState& worker : response.workers()) {
      if (static_cast<int64_t>(worker.worker()) <= previous ||
          worker.worker() >= static_cast<uint32_t>(shard_->options().num_workers)) {
        Fail("Heartbeat lists workers out of order or outside the job", status);
      }
      previous = worker.worker();
    }
  }

  // The replica applies the shard's operation `op`: it must take it, and
  // then hold the shard's rows (unless fuzzed SparseOps put it elsewhere).
  void Replicate(const SparseOp& op) {
    if (diverged_) return;
    const absl::Status status =
        replica_.ApplyReplicated(op, absl::ZeroDuration(), [] { return true; });
    if (!status.ok()) {
      // Fuzzed SparseOps may have moved it on: only a replica in step
      // with the shard must take it.
      if (replica_.GroupOps(op.group()) != op.op()) {
        diverged_ = true;
        return;
      }
      Fail("the replica refused an operation the shard applied", status);
    }
    const int group = shard_->options().shard_index;
    if (TableDigest(replica_, group) != TableDigest(shard_->tables(), group)) {
      Fail("the replica's rows differ from the shard's after its operation", status);
    }
  }

  std::unique_ptr<Shard> shard_;
  // The shard's tables at --replicas 2, fed the shard's operations.
  SparseTables replica_;
  // A fuzzed SparseOp was applied to the replica: it no longer follows.
  bool diverged_ = false;
  // Size of every partition a Register answered.
  std::map<Key, int64_t> sizes_;
};

}  // namespace
}  // namespace shardtrain::server::fuzz

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

// Half the mutations change one field of one request through protobuf
// reflection (server/fuzz/request_mutator.h), the rest are libFuzzer's own.
extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size,
                                          size_t max_size, unsigned int seed) {
  std::minstd_rand rng(seed);
  if (rng() % 2 == 0) {
    const size_t mutated =
        shardtrain::server::fuzz::MutateRequests(data, size, max_size, rng);
    if (mutated > 0) return mutated;
  }
  return LLVMFuzzerMutate(data, size, max_size);
}

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  // Rejections and unparseable requests are expected by the thousand; keep
  // the logs quiet.
  google::protobuf::SetLogHandler(nullptr);
  FLAGS_minloglevel = 2;
  FLAGS_logtostderr = true;
  google::InitGoogleLogging("shard_fuzz");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardtrain::server;
  using namespace shardtrain::server::fuzz;
  if (size < kHeaderBytes) return 0;
  const ShardOptions options = OptionsFromHeader(data[0], data[1]);
  prometheus::Registry registry;
  ShardMetrics metrics(registry);
  absl::StatusOr<std::unique_ptr<Shard>> shard = Shard::Create(options, &metrics);
  if (!shard.ok()) Fail("the fuzz options do not make a shard", shard.status());
  Session session(std::move(*shard));
  size_t at = kHeaderBytes;
  for (int ops = 0; ops < kMaxOps && at + 3 <= size; ++ops) {
    const uint8_t op = data[at];
    const size_t length = data[at + 1] | (static_cast<size_t>(data[at + 2]) << 8);
    at += 3;
    if (length > size - at) return 0;
    session.Run(static_cast<Op>(op % kNumOps), data + at, length);
    at += length;
  }
  return 0;
}
