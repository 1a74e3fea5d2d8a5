#include "server/replication/replicator.h"

#include <memory>
#include <utility>
#include <vector>

#include <glog/logging.h>
#include <grpcpp/alarm.h>
#include <grpcpp/support/proto_buffer_writer.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace shardtrain::server {
namespace {

// `request` followed by the replicated ops of its parts (no copy of it).
grpc::ByteBuffer WithOps(const grpc::ByteBuffer& request,
                         const std::vector<ReplicatedOp>& ops) {
  std::vector<grpc::Slice> slices;
  if (request.Valid()) {
    grpc::ByteBuffer copy(request);
    (void)copy.Dump(&slices);
  }
  PushRequest trailer;
  for (const ReplicatedOp& op : ops) *trailer.add_replicated() = op;
  slices.emplace_back(trailer.SerializeAsString());
  return grpc::ByteBuffer(slices.data(), slices.size());
}

// `request` serialized straight into gRPC's slices (a sparse op's rows are
// copied once, not into a string and then again into a slice).
grpc::ByteBuffer Serialized(const PushRequest& request) {
  grpc::ByteBuffer buffer;
  bool own_buffer = false;
  const grpc::Status status = grpc::GenericSerialize<grpc::ProtoBufferWriter, PushRequest>(
      request, &buffer, &own_buffer);
  CHECK(status.ok()) << "serializing a forward: " << status.error_message();
  return buffer;
}

}  // namespace

Replicator::Replicator(Shard* shard, ChainTable* table, Forwarder* forwarder,
                       ReplicationMetrics* metrics, absl::Duration forward_timeout,
                       int max_waiting_forwards)
    : shard_(shard),
      table_(table),
      forwarder_(forwarder),
      metrics_(metrics),
      forward_timeout_(forward_timeout),
      waiting_(max_waiting_forwards) {
  GroupReplica::Hooks hooks;
  hooks.leads = [table](int group) { return table->AdmitLead(group); };
  hooks.on_closed = [this](int group, std::vector<ReplicatedOp> closes) {
    if (closes.empty()) {
      table_->Release(group);
    } else {
      ForwardCloses(group, std::move(closes));
    }
  };
  shard_->replica().SetHooks(std::move(hooks));
}

void Replicator::Push(const grpc::ByteBuffer& request, const wire::PushView& view,
                      Done done) {
  PushResponse response;
  absl::StatusOr<int> group = shard_->replica().GroupOf(view);
  absl::Status status = group.status();
  if (status.ok()) status = table_->AdmitHead(*group, view.chain_epoch);
  if (!status.ok()) {
    done(status, response);
    return;
  }
  GroupReplica::Applied applied;
  status = shard_->Push(view, *group, &response, &applied);
  if (!status.ok()) {
    table_->Release(*group);
    done(status, response);
    return;
  }
  const PushKey key{*group, view.worker, view.worker_incarnation, view.sequence};
  if (response.duplicate()) {
    bool in_flight;
    {
      absl::MutexLock lock(&mu_);
      in_flight = in_flight_.count(key) > 0;
    }
    if (in_flight) {
      status = absl::UnavailableError(absl::StrFormat(
          "push %d of worker %d is still being replicated; retry", view.sequence,
          view.worker));
    }
    table_->Release(*group);
    done(status, response);
    return;
  }
  std::optional<PushKey> tracked;
  if (view.sequence != 0) tracked = key;
  grpc::ByteBuffer forward = WithOps(request, applied.ops);
  const int64_t ops = static_cast<int64_t>(applied.ops.size());
  ForwardAndAnswer(*group, std::move(forward), ops, tracked, /*admitted=*/true, absl::Now(),
                   std::move(applied), std::move(response), std::move(done));
}

void Replicator::Sparse(int group, uint64_t epoch, uint32_t worker,
                        uint64_t worker_incarnation, uint64_t sequence,
                        const SparseApply& apply, std::function<void(absl::Status)> done) {
  absl::Status status = table_->AdmitHead(group, epoch);
  if (!status.ok()) {
    done(status);
    return;
  }
  PushRequest forward;
  forward.set_worker(worker);
  ReplicatedOp* op = forward.add_replicated();
  bool duplicate = false;
  status = apply(op->mutable_sparse(), &duplicate);
  const PushKey key{-1 - group, worker, worker_incarnation, sequence};
  if (status.ok() && duplicate) {
    absl::MutexLock lock(&mu_);
    if (in_flight_.count(key) > 0) {
      status = absl::UnavailableError(absl::StrFormat(
          "sparse push %d of worker %d is still being replicated; retry", sequence, worker));
    }
  }
  if (!status.ok() || duplicate) {
    table_->Release(group);
    done(status);
    return;
  }
  op->set_op(op->sparse().op());
  std::optional<PushKey> tracked;
  if (sequence != 0) tracked = key;
  ForwardAndAnswer(group, Serialized(forward), /*ops=*/1, tracked, /*admitted=*/true,
                   absl::Now(), GroupReplica::Applied(), PushResponse(),
                   [done = std::move(done)](absl::Status status, const PushResponse&) {
                     done(std::move(status));
                   });
}

Replicator::~Replicator() { Stop(); }

void Replicator::Stop() { stopped_.store(true); }

void Replicator::Replicate(const grpc::ByteBuffer& request, const wire::PushView& view,
                           Done done) {
  // First without waiting: a forward whose operations are next here (the
  // usual case) is applied on this thread, with no hand-off.
  if (ApplyAndForward(request, view, absl::ZeroDuration(), done)) return;
  // An operation before it has not arrived; it may be behind this forward
  // on the connection this thread reads. Wait for it elsewhere.
  const grpc::ByteBuffer* kept = &request;
  const bool waits = !stopped_.load() && waiting_.TryRun([this, kept, done] {
    wire::ReceivedMessage message;
    wire::PushView again;
    absl::Status parsed = message.Take(*kept);
    if (parsed.ok()) {
      parsed = wire::ParsePush(
          message, &again,
          static_cast<size_t>(shard_->options().limits.max_parts_per_request));
    }
    if (!parsed.ok()) {  // it parsed on the receiving thread
      done(absl::InternalError(absl::StrCat("a forward parsed again: ", parsed.message())),
           PushResponse());
      return;
    }
    (void)ApplyAndForward(*kept, again, forward_timeout_ / 2, done);
  });
  metrics_->early_forwards(waits).Increment();
  if (waits) return;
  done(absl::UnavailableError(absl::StrCat(
           "an operation before this forward's has not arrived here, and ",
           stopped_.load() ? "this shard is stopping"
                           : "--max_waiting_forwards forwards wait for theirs already",
           "; retry")),
       PushResponse());
}

bool Replicator::ApplyAndForward(const grpc::ByteBuffer& request, const wire::PushView& view,
                                 absl::Duration wait, const Done& done) {
  PushResponse response;
  int group = -1;
  absl::Status status;
  const bool sparse = view.parts.empty() && view.replicated.size() == 1 &&
                      view.replicated.front().has_sparse();
  if (sparse) {
    group = view.replicated.front().sparse().group();
  } else if (!view.parts.empty()) {
    absl::StatusOr<int> found = shard_->replica().GroupOf(view);
    status = found.status();
    if (found.ok()) group = *found;
  } else if (!view.replicated.empty() && view.replicated.front().has_close()) {
    group = shard_->replica().GroupOf(view.replicated.front().close());
  } else {
    status = absl::InvalidArgumentError("a forwarded push names no partition");
  }
  const uint64_t epoch = view.chain_epoch;
  if (status.ok()) status = table_->Check(group, epoch, ChainTable::Role::kMember);
  GroupReplica::Applied applied;
  const auto still_valid = [this, group, epoch] {
    return !stopped_.load() && table_->MemberAt(group, epoch);
  };
  const bool checked = status.ok();
  if (status.ok() && sparse) {
    status = shard_->tables().ApplyReplicated(view.replicated.front().sparse(), wait,
                                              still_valid);
  } else if (status.ok()) {
    status = shard_->replica().ApplyForwarded(view, wait, still_valid, &response, &applied);
  }
  // UNAVAILABLE from the apply: an operation before it is missing (or the
  // chain moved on, which the wait sees at once).
  if (checked && absl::IsUnavailable(status) && wait == absl::ZeroDuration()) return false;
  if (!status.ok()) {
    done(status, response);
    return true;
  }
  // Sent on as received: the ops are the same at every member.
  ForwardAndAnswer(group, request, 0, std::nullopt, /*admitted=*/false, absl::Now(),
                   std::move(applied), std::move(response), done);
  return true;
}

// The answer to a head operation's requester: given once, by the forward's
// end or, if that comes later, by the alarm at forward_timeout.
struct Replicator::Answer {
  absl::Mutex mu;
  Done done ABSL_GUARDED_BY(mu);
  std::unique_ptr<grpc::Alarm> alarm;

  // The requester's callback, or null once it was taken.
  Done Take() {
    absl::MutexLock lock(&mu);
    return std::exchange(done, nullptr);
  }
};

void Replicator::ForwardAndAnswer(int group, grpc::ByteBuffer request, int64_t ops,
                                  std::optional<PushKey> key, bool admitted, absl::Time applied,
                                  GroupReplica::Applied committed, PushResponse response,
                                  Done done) {
  {
    absl::MutexLock lock(&mu_);
    if (key) in_flight_.insert(*key);
    pending_ops_[group] += ops;
    metrics_->inflight().Set(static_cast<double>(in_flight_.size()));
  }
  auto answer = std::make_shared<Answer>();
  {
    absl::MutexLock lock(&answer->mu);
    answer->done = std::move(done);
  }
  // An operation this head started is applied here: its forward must not
  // give up while this shard heads the chain and the successor is in it,
  // or the successor would wait forever for it (every later operation of
  // the group waits for the one before) while a retry of the push, a
  // duplicate here, would be told OK. So it goes on until the tail has it
  // or the chain changes; the requester hears UNAVAILABLE at
  // forward_timeout (its retry is refused until the forward ends).
  // A member's forward (Replicate) keeps the timeout: the head sends the
  // operation again until it is through.
  if (admitted) {
    answer->alarm = std::make_unique<grpc::Alarm>();
    std::weak_ptr<Answer> weak = answer;
    answer->alarm->Set(
        absl::ToChronoTime(absl::Now() + forward_timeout_),
        [this, weak, group](bool fired) {
          std::shared_ptr<Answer> pending = fired ? weak.lock() : nullptr;
          if (pending == nullptr) return;
          Done late = pending->Take();
          if (late == nullptr) return;
          metrics_->late_forwards().Increment();
          const absl::Status status = absl::UnavailableError(absl::StrFormat(
              "group %d: the update is applied at the chain's head but has not reached "
              "its tail after %s; it is still being forwarded: retry",
              group, absl::FormatDuration(forward_timeout_)));
          LOG_EVERY_N(WARNING, 100) << status;
          late(status, PushResponse());
        });
  }
  forwarder_->Forward(
      group, std::move(request), admitted ? absl::InfiniteDuration() : forward_timeout_,
      [this, group, ops, key, admitted, applied, committed = std::move(committed),
       response = std::move(response), answer](absl::Status status) {
        // Before the answer: a PushPull's pull half waits for this.
        if (status.ok()) shard_->replica().MarkCommitted(committed, table_->IsHead(group));
        {
          absl::MutexLock lock(&mu_);
          if (key) in_flight_.erase(*key);
          pending_ops_[group] -= ops;
          metrics_->inflight().Set(static_cast<double>(in_flight_.size()));
        }
        // The tail has it, or it failed.
        if (admitted) table_->Release(group);
        if (status.ok() && ops > 0) {
          metrics_->lag().Observe(absl::ToDoubleSeconds(absl::Now() - applied));
        }
        if (!status.ok()) {
          LOG_EVERY_N(WARNING, 100) << "group " << group << ": " << status;
        }
        if (Done done = answer->Take()) done(status, response);
      });
}

void Replicator::ForwardCloses(int group, std::vector<ReplicatedOp> closes) {
  PushRequest request;
  for (ReplicatedOp& op : closes) *request.add_replicated() = std::move(op);
  GroupReplica::Applied committed;
  committed.ops.assign(request.replicated().begin(), request.replicated().end());
  ForwardAndAnswer(group, Serialized(request), request.replicated_size(),
                   std::nullopt, /*admitted=*/true, absl::Now(), std::move(committed),
                   PushResponse(),
                   [group](absl::Status status, const PushResponse&) {
                     if (!status.ok()) {
                       LOG(WARNING) << "group " << group
                                    << ": forwarding closed sync steps: " << status;
                     }
                   });
}

absl::Status Replicator::CheckPull(const PullRequest& pull) const {
  ASSIGN_OR_RETURN(int group, shard_->replica().GroupOf(pull));
  return table_->Check(group, pull.chain_epoch(), ChainTable::Role::kTail);
}

absl::Status Replicator::CheckHeadPull(const PullRequest& pull) const {
  ASSIGN_OR_RETURN(int group, shard_->replica().GroupOf(pull));
  return table_->Check(group, pull.chain_epoch(), ChainTable::Role::kHead);
}

absl::Status Replicator::CheckPushPull(const wire::PushView& push,
                                       const PullRequest& pull) const {
  ASSIGN_OR_RETURN(int push_group, shard_->replica().GroupOf(push));
  ASSIGN_OR_RETURN(int pull_group, shard_->replica().GroupOf(pull));
  if (push_group != pull_group) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a replicated PushPull pushes to replica group %d but pulls from group %d; "
        "send one per group",
        push_group, pull_group));
  }
  return table_->Check(pull_group, pull.chain_epoch(), ChainTable::Role::kHead);
}

absl::StatusOr<GroupStateResponse> Replicator::GroupState(
    const GroupStateRequest& request) const {
  if (!table_->Serves(request.group())) {
    return absl::InvalidArgumentError(
        absl::StrFormat("this shard does not serve group %d", request.group()));
  }
  // The caller joined at request.chain_epoch; answering from an older
  // configuration could miss updates this shard acknowledged as the tail.
  const std::optional<chain::ChainConfig> config = table_->Get(request.group());
  if (!config || config->epoch < static_cast<int64_t>(request.chain_epoch())) {
    return absl::UnavailableError(absl::StrFormat(
        "group %d: this shard has not seen epoch %d yet", request.group(),
        request.chain_epoch()));
  }
  RETURN_IF_ERROR(table_->Check(request.group(), config->epoch, ChainTable::Role::kMember));
  return shard_->replica().Export(request.group());
}

int64_t Replicator::Acked(int group) const {
  int64_t pending = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = pending_ops_.find(group);
    if (it != pending_ops_.end()) pending = it->second;
  }
  return shard_->replica().Ops(group) - pending;
}

}  // namespace shardtrain::server
