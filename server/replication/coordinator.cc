#include "server/replication/coordinator.h"

#include <algorithm>
#include <utility>
#include <vector>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "chain/placement.h"
#include "chain/replication_keys.h"
#include "common/status_macros.h"

namespace shardtrain::server {
namespace {

constexpr absl::Duration kTick = absl::Milliseconds(100);
// A head handing its place over waits this long for its operations to
// reach the tail (pushes are refused meanwhile), and each member this long
// for its answer.
constexpr absl::Duration kHandOverDrain = absl::Seconds(2);
constexpr absl::Duration kHandOverAsk = absl::Seconds(1);
// A hand-over not yet possible (a new tail still copying) is tried again
// this soon rather than a whole period later, doubling while it waits.
constexpr absl::Duration kHandOverRetry = absl::Milliseconds(50);
// A hand-over that found the members disagreeing after its pause backs off
// up to this.
constexpr absl::Duration kHandOverMaxBackoff = absl::Seconds(60);
// A chain must have stayed unchanged this long before its head hands over.
constexpr absl::Duration kHandOverCalm = absl::Milliseconds(250);

}  // namespace

Coordinator::Coordinator(const CoordinatorOptions& options, Shard* shard, ChainTable* table,
                         Forwarder* forwarder, ReplicationMetrics* metrics)
    : options_(options),
      shard_(shard),
      table_(table),
      forwarder_(forwarder),
      metrics_(metrics),
      start_(absl::Now()),
      hand_over_retry_(kHandOverRetry) {}

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Start(
    const CoordinatorOptions& options, Shard* shard, ChainTable* table,
    Forwarder* forwarder, ReplicationMetrics* metrics) {
  RETURN_IF_ERROR(chain::ValidateJobName(options.job));
  std::unique_ptr<Coordinator> coordinator(
      new Coordinator(options, shard, table, forwarder, metrics));
  etcd::EtcdClient::Options etcd_options;
  etcd_options.endpoints = options.etcd_endpoints;
  etcd_options.credentials = options.etcd_credentials;
  etcd_options.rpc_timeout = std::max(absl::Milliseconds(500), options.lease_ttl / 2);
  absl::StatusOr<std::unique_ptr<etcd::EtcdClient>> etcd =
      etcd::EtcdClient::Create(etcd_options);
  if (!etcd.ok()) {
    return absl::UnavailableError(absl::StrCat("cannot reach etcd at ",
                                               options.etcd_endpoints, ": ",
                                               etcd.status().message()));
  }
  coordinator->etcd_ = *std::move(etcd);
  RETURN_IF_ERROR(coordinator->CheckLayout());
  RETURN_IF_ERROR(coordinator->TakeLease());
  Coordinator* c = coordinator.get();
  c->StartWatches();
  c->ticker_ = std::thread([c] { c->Ticker(); });
  c->loop_ = std::thread([c] { c->Loop(); });
  return coordinator;
}

void Coordinator::StartWatches() {
  // A watch that ends for good (etcd lost its data: its revisions went
  // back) is started again by the loop, from now; its pass re-reads all.
  const auto ended = [this](absl::Status why) {
    LOG(WARNING) << "shard " << table_->shard() << ": " << why << "; watching again";
    absl::MutexLock lock(&mu_);
    watches_ended_ = true;
    wake_ = true;
  };
  chain_watch_ = etcd_->Watch(
      chain::ChainsPrefix(options_.job), 0,
      [this](const etcd::WatchEvent& event) {
        if (event.type != etcd::WatchEvent::Type::kPut) return;
        absl::StatusOr<chain::ChainConfig> config = chain::DecodeChainConfig(event.value);
        if (!config.ok()) {
          LOG(ERROR) << "ignoring chain " << event.key << ": " << config.status();
          return;
        }
        if (Adopt(*config)) Wake();
      },
      ended);
  member_watch_ = etcd_->Watch(chain::MembersPrefix(options_.job), 0,
                               [this](const etcd::WatchEvent&) { Wake(); }, ended);
}

Coordinator::~Coordinator() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (loop_.joinable()) loop_.join();
  if (ticker_.joinable()) ticker_.join();
  chain_watch_.reset();
  member_watch_.reset();
  int64_t lease = 0;
  {
    absl::MutexLock lock(&mu_);
    keeper_.reset();
    lease = lease_.id;
  }
  // The other members drop this shard now rather than after the ttl.
  if (lease != 0) {
    const absl::Status revoked = etcd_->RevokeLease(lease);
    if (!revoked.ok()) LOG(WARNING) << "revoking the etcd lease: " << revoked;
  }
}

absl::Status Coordinator::CheckLayout() {
  const std::string prefix = chain::ChainsPrefix(options_.job);
  absl::StatusOr<etcd::RangeResult> chains = etcd_->GetPrefix(prefix);
  if (!chains.ok()) {
    return absl::UnavailableError(
        absl::StrCat("reading ", prefix, " from etcd: ", chains.status().message()));
  }
  std::vector<std::pair<std::string, chain::ChainConfig>> configs;
  for (const etcd::KeyValue& kv : chains->kvs) {
    absl::StatusOr<chain::ChainConfig> config = chain::DecodeChainConfig(kv.value);
    if (config.ok()) configs.emplace_back(kv.key, *std::move(config));
  }
  const std::string remedy = absl::StrFormat(
      "run the new layout as another --job (or remove the old job's keys first: etcdctl del "
      "--prefix %s)",
      chain::JobPrefix(options_.job));
  for (const auto& [key, config] : configs) {
    if (config.replicas != options_.replicas) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "etcd's chain of group %d of job '%s' (%s) keeps %d replicas, but this shard was "
          "started with --replicas=%d: a job keeps its replica count across restarts. Start "
          "it with --replicas=%d, or %s",
          config.group, options_.job, key, config.replicas, options_.replicas, config.replicas,
          remedy));
    }
    if (config.group < 0 || config.group >= options_.num_shards) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "etcd holds a chain of group %d of job '%s' (%s), which a job of --num_shards=%d "
          "does not have: a job keeps its shard count across restarts. Start it with the "
          "--num_shards it was run with, or %s",
          config.group, options_.job, key, options_.num_shards, remedy));
    }
  }
  // Members join only the groups the placement gives them, so a member
  // outside them is from a job with another shard count.
  for (const auto& [key, config] : configs) {
    const std::vector<int> placed =
        chain::InitialChain(config.group, options_.num_shards, options_.replicas);
    for (const chain::ChainConfig::Member& member : config.members) {
      if (std::find(placed.begin(), placed.end(), member.shard) != placed.end()) continue;
      return absl::FailedPreconditionError(absl::StrFormat(
          "etcd's chain of group %d of job '%s' (%s) has shard %d as a member, which a job "
          "of --num_shards=%d --replicas=%d never places in that group: a job keeps its "
          "shard count across restarts. Start it with the --num_shards it was run with, or %s",
          config.group, options_.job, key, member.shard, options_.num_shards,
          options_.replicas, remedy));
    }
  }
  return absl::OkStatus();
}

absl::Status Coordinator::TakeLease() {
  ASSIGN_OR_RETURN(etcd::Lease lease, ClaimMemberKey());
  chain::ChainConfig::Member me{table_->shard(), options_.advertise_address,
                                 table_->incarnation()};
  absl::MutexLock lock(&mu_);
  lease_ = lease;
  keeper_ = etcd_->KeepLeaseAlive(lease, [this](absl::Status why) { OnLeaseLost(why); });
  lease_problem_ = LeaseProblem::kNone;
  metrics_->lease_alive().Set(1);
  LOG(INFO) << "shard " << me.shard << ": etcd lease " << lease.id << " (ttl "
            << lease.ttl << ") at " << etcd_->endpoint();
  return absl::OkStatus();
}

absl::StatusOr<etcd::Lease> Coordinator::ClaimMemberKey() {
  const chain::ChainConfig::Member me{table_->shard(), options_.advertise_address,
                                       table_->incarnation()};
  const std::string key = chain::MemberKey(options_.job, me.shard);
  const std::string value = chain::EncodeChainMember(me);
  // A dead predecessor's key goes with its lease, within about a ttl (etcd
  // checks expiry every 500 ms); a key kept alive longer than this belongs
  // to a live process.
  const absl::Duration patience = 2 * options_.lease_ttl + absl::Seconds(1);
  const absl::Time deadline = absl::Now() + patience;
  int64_t expected = 0;  // absent
  while (true) {
    // Waiting here is no pause of the process (ChainTable's pause check
    // would otherwise fence the shard once it starts ticking).
    table_->Tick(absl::Now());
    // A lease per attempt: one granted before a wait would expire unkept.
    ASSIGN_OR_RETURN(etcd::Lease lease, etcd_->GrantLease(options_.lease_ttl));
    absl::StatusOr<etcd::CasResult> cas =
        etcd_->CompareAndSwap(key, expected, value, lease.id);
    if (cas.ok() && cas->succeeded) return lease;
    const absl::Status revoked = etcd_->RevokeLease(lease.id);
    if (!revoked.ok()) LOG(WARNING) << "revoking an unused etcd lease: " << revoked;
    if (!cas.ok()) return cas.status();
    expected = 0;
    if (!cas->current.has_value()) continue;  // it went between the two reads
    absl::StatusOr<chain::ChainConfig::Member> holder =
        chain::DecodeChainMember(cas->current->value);
    if (holder.ok() && holder->incarnation == me.incarnation) {
      expected = cas->current->mod_revision;  // this process's own, from a lost lease
      continue;
    }
    if (absl::Now() >= deadline) {
      return absl::AlreadyExistsError(absl::StrCat(
          "shard ", me.shard, " of job '", options_.job, "' is already live",
          holder.ok() ? absl::StrCat(" at ", holder->address, " (incarnation ",
                                     absl::Hex(holder->incarnation), ")")
                      : "",
          ": its etcd key ", key, " stayed alive for ", absl::FormatDuration(patience),
          ". Another job on this etcd needs its own --job; each shard of a job its own "
          "--shard_index"));
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
}

void Coordinator::OnLeaseLost(absl::Status why) {
  const bool expired = why.code() == absl::StatusCode::kNotFound;
  metrics_->lease_alive().Set(0);
  if (expired) {
    // The chains have moved on (or will) without this incarnation's key.
    table_->Fence(absl::StrCat("etcd lease expired: ", why.message()));
  } else {
    LOG(WARNING) << "shard " << table_->shard() << ": cannot refresh the etcd lease ("
                 << why << "); serving the current chains until etcd is back";
  }
  absl::MutexLock lock(&mu_);
  lease_problem_ = expired ? LeaseProblem::kExpired : LeaseProblem::kUnreachable;
  wake_ = true;
}

bool Coordinator::Adopt(const chain::ChainConfig& config) {
  if (!table_->Update(config)) return false;
  // Forwards stuck on a successor this chain dropped (it hangs, or is cut
  // off) go to the new one now rather than at their deadline.
  forwarder_->AbandonDeparted(config.group);
  return true;
}

void Coordinator::Wake() {
  absl::MutexLock lock(&mu_);
  wake_ = true;
}

void Coordinator::Ticker() {
  while (true) {
    table_->Tick(absl::Now());
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      LiftPauseFence();
    }
    absl::SleepFor(kTick);
  }
}

void Coordinator::LiftPauseFence() {
  if (!table_->Fenced()) {
    fenced_at_refreshes_ = -1;
    return;
  }
  if (keeper_ == nullptr || lease_problem_ != LeaseProblem::kNone) return;
  const int64_t refreshes = keeper_->refreshes();
  if (fenced_at_refreshes_ < 0) {
    fenced_at_refreshes_ = refreshes;
  } else if (refreshes > fenced_at_refreshes_) {
    // A refresh after the pause succeeded: the lease never expired, so no
    // chain dropped this shard.
    table_->Unfence();
    fenced_at_refreshes_ = -1;
    metrics_->lease_alive().Set(1);
  }
}

void Coordinator::Loop() {
  // The watches wake this loop on every change; the timer only catches up
  // on what they may have missed (etcd restarts), once per lease ttl.
  const absl::Duration period = std::max(absl::Seconds(1), options_.lease_ttl);
  while (true) {
    LeaseProblem problem;
    bool restart_watches = false;
    {
      absl::MutexLock lock(&mu_);
      auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return wake_ || stopping_; };
      if (hand_over_pending_) {
        mu_.AwaitWithTimeout(absl::Condition(&woken), hand_over_retry_);
        hand_over_retry_ = std::min(period, hand_over_retry_ * 2);
      } else {
        mu_.AwaitWithTimeout(absl::Condition(&woken), period);
        hand_over_retry_ = kHandOverRetry;
      }
      if (stopping_) return;
      wake_ = false;
      hand_over_pending_ = false;
      problem = lease_problem_;
      restart_watches = watches_ended_;
      watches_ended_ = false;
    }
    if (restart_watches) {
      chain_watch_.reset();  // their threads have ended: this joins them
      member_watch_.reset();
      StartWatches();
    }
    if (problem == LeaseProblem::kExpired) {
      const absl::Status taken = TakeLease();
      if (!taken.ok()) {
        LOG_EVERY_N(WARNING, 20) << "re-taking the etcd lease: " << taken;
        continue;
      }
      table_->Unfence();  // outside every chain now: it rejoins as a tail
    } else if (problem == LeaseProblem::kUnreachable) {
      // Keep the same lease once etcd answers again (it renews leases on
      // restart); if it expired meanwhile the new keeper says so.
      absl::MutexLock lock(&mu_);
      keeper_ = etcd_->KeepLeaseAlive(lease_, [this](absl::Status why) { OnLeaseLost(why); });
      lease_problem_ = LeaseProblem::kNone;
      fenced_at_refreshes_ = -1;
    }
    Reconcile();
  }
}

void Coordinator::Reconcile() {
  absl::StatusOr<etcd::RangeResult> members =
      etcd_->GetPrefix(chain::MembersPrefix(options_.job));
  absl::StatusOr<etcd::RangeResult> chains =
      etcd_->GetPrefix(chain::ChainsPrefix(options_.job));
  absl::StatusOr<etcd::KeyValue> drained =
      etcd_->Get(chain::DrainedKey(options_.job, table_->shard()));
  if (!members.ok() || !chains.ok() ||
      (!drained.ok() && drained.status().code() != absl::StatusCode::kNotFound)) {
    LOG_EVERY_N(WARNING, 50) << "shard " << table_->shard() << ": etcd unreachable ("
                             << (!members.ok() ? members.status() : chains.status())
                             << "); chains unchanged";
    return;
  }
  std::map<int, chain::ChainConfig::Member> live;
  for (const etcd::KeyValue& kv : members->kvs) {
    absl::StatusOr<chain::ChainConfig::Member> member =
        chain::DecodeChainMember(kv.value);
    if (member.ok()) live[member->shard] = *std::move(member);
  }
  std::map<int, etcd::KeyValue> by_group;
  for (const etcd::KeyValue& kv : chains->kvs) {
    absl::StatusOr<int> group = chain::GroupFromChainKey(options_.job, kv.key);
    if (group.ok()) by_group[*group] = kv;
  }
  // A shard whose own liveness key is gone (its lease expired: after an
  // etcd outage every lease may have) changes no chain until it has taken
  // a new lease: it would remove members that are alive, whose keys are
  // gone for the same reason, and they it, copying state back and forth.
  auto self = live.find(table_->shard());
  const bool may_change =
      self != live.end() && self->second.incarnation == table_->incarnation();
  if (!may_change) {
    LOG_EVERY_N(WARNING, 20) << "shard " << table_->shard()
                             << ": its own etcd liveness key is gone; no chain changes "
                                "until it has a lease again";
  }
  for (int group : table_->groups()) {
    std::optional<etcd::KeyValue> chain;
    auto it = by_group.find(group);
    if (it != by_group.end()) chain = it->second;
    ReconcileGroup(group, live, drained.ok(), may_change, chain);
  }
}

void Coordinator::ReconcileGroup(int group,
                                 const std::map<int, chain::ChainConfig::Member>& live,
                                 bool drained, bool may_change,
                                 std::optional<etcd::KeyValue> chain) {
  const int me = table_->shard();
  const uint64_t incarnation = table_->incarnation();
  const chain::ChainConfig::Member self{me, options_.advertise_address, incarnation};
  auto alive = [&](const chain::ChainConfig::Member& m) {
    auto it = live.find(m.shard);
    return it != live.end() && it->second.incarnation == m.incarnation;
  };
  // etcd's chain of the group; NOT_FOUND when there is none.
  const absl::StatusOr<chain::ChainConfig> config =
      chain ? chain::DecodeChainConfig(chain->value)
            : absl::StatusOr<chain::ChainConfig>(absl::NotFoundError("no chain in etcd"));
  const std::optional<chain::ChainConfig> known = table_->Get(group);
  if (known.has_value() && may_change &&
      (!config.ok() || config->epoch < known->epoch ||
       (config->epoch == known->epoch && config->members != known->members))) {
    // etcd lost its data (a chain this shard served is gone, or older than
    // the one it holds): put back the newest one it knows.
    RestoreChain(group, *known, live);
    return;
  }
  if (!chain) {
    if (group != me || drained || !may_change || known.has_value()) return;
    // The initial head forms it.
    std::vector<chain::ChainConfig::Member> members;
    bool all_up = true;
    for (int shard : chain::InitialChain(group, options_.num_shards, options_.replicas)) {
      if (shard == me) {
        members.push_back(self);
        continue;
      }
      auto it = live.find(shard);
      if (it == live.end()) {
        all_up = false;
      } else {
        members.push_back(it->second);  // its address is in its liveness key
      }
    }
    if (!all_up && absl::Now() - start_ < options_.form_timeout) return;
    absl::StatusOr<chain::ChainConfig> formed =
        chain::MakeChainConfig(group, options_.replicas, std::move(members));
    if (!formed.ok()) {
      LOG(ERROR) << "forming group " << group << ": " << formed.status();
      return;
    }
    Swap(group, std::nullopt, *formed, "formed");
    return;
  }
  if (!config.ok()) {
    LOG_EVERY_N(ERROR, 50) << "chain of group " << group << " in etcd: " << config.status();
    return;
  }
  if (Adopt(*config)) Wake();
  const std::optional<size_t> index = config->IndexOf(me);
  const bool member = index && config->members[*index].incarnation == incarnation;
  // Whatever a tail holds is committed, also versions it applied as head
  // whose forward failed before the chain dropped its successor.
  if (member && config->tail().shard == me) shard_->replica().CommitGroup(group);
  if (member && !may_change) {
    if (table_->CatchingUp(group)) CatchUp(group, *config);
    return;
  }
  if (member) {
    // Drop members whose liveness key is gone (or belongs to a newer
    // incarnation: they restarted and will rejoin as tails).
    for (const chain::ChainConfig::Member& m : config->members) {
      if (m.shard == me || alive(m)) continue;
      absl::StatusOr<chain::ChainConfig> next = config->Remove(m.shard, m.incarnation);
      if (!next.ok()) {
        LOG_EVERY_N(ERROR, 50) << "group " << group << ": cannot drop shard " << m.shard
                               << ": " << next.status();
        return;
      }
      if (table_->CatchingUp(group) && !LastCopyWaitOver(group, *next, m)) return;
      LOG(WARNING) << "group " << group << ": shard " << m.shard
                   << " lost its etcd lease; removing it from the chain";
      Swap(group, chain, *next, "member_lost");
      return;  // one change per pass: the next pass re-reads
    }
    orphaned_since_.erase(group);
    if (table_->CatchingUp(group)) {
      CatchUp(group, *config);
    } else if (options_.restore_order && *index == 0) {
      RestoreOrder(group, *chain, *config, live);
    }
    return;
  }
  orphaned_since_.erase(group);
  if (drained || !may_change) return;
  // A dead incarnation of this shard still listed: drop it first.
  if (index) {
    absl::StatusOr<chain::ChainConfig> next =
        config->Remove(me, config->members[*index].incarnation);
    // This shard was the group's last copy, or the only members left are
    // tails still copying the state from it: nothing can be caught up from
    // them, and this shard's checkpoint is the newest state there is.
    const bool last = next.ok() ? StillCopying(group, *next)
                                : next.status().code() == absl::StatusCode::kFailedPrecondition;
    if (next.ok() && !last) {
      Swap(group, chain, *next, "member_lost");
    } else if (last) {
      LOG(ERROR) << "group " << group << " had no live replica left"
                 << (next.ok() ? " with the whole state (the members left were still copying it)"
                               : "")
                 << "; shard " << me
                 << " takes it over with the parameters it holds now (updates since "
                 << "its last checkpoint are lost)";
      chain::ChainConfig next_config = *config;
      next_config.members = {self};
      ++next_config.epoch;
      Swap(group, chain, next_config, "member_joined");
    }
    return;
  }
  if (static_cast<int>(config->members.size()) >= config->replicas) return;
  absl::StatusOr<chain::ChainConfig> next = config->AppendTail(self);
  if (!next.ok()) return;
  table_->SetCatchingUp(group, true);
  metrics_->catchup_in_progress().Set(1);
  if (Swap(group, chain, *next, "member_joined")) {
    CatchUp(group, *next);
  } else {
    table_->SetCatchingUp(group, false);
    metrics_->catchup_in_progress().Set(0);
  }
}

bool Coordinator::StillCopying(int group, const chain::ChainConfig& chain) {
  for (const chain::ChainConfig::Member& m : chain.members) {
    absl::StatusOr<ChainState> state = forwarder_->MemberState(m.address, group, kHandOverAsk);
    if (!state.ok() || !state->catching_up()) return false;
  }
  return true;
}

bool Coordinator::LastCopyWaitOver(int group, const chain::ChainConfig& next,
                                   const chain::ChainConfig::Member& gone) {
  // A member left before this one that is not copying holds the state.
  // Tails join one at a time behind the others, so one that answers it is
  // still copying (R=3, two rejoining) has only copying members behind it.
  for (const chain::ChainConfig::Member& m : next.members) {
    if (m.shard == table_->shard()) break;
    absl::StatusOr<ChainState> state = forwarder_->MemberState(m.address, group, kHandOverAsk);
    if (state.ok() && !state->catching_up()) return true;
  }
  // If `gone` restarted, the new process drops its old incarnation itself
  // and, since every member left is copying, takes the group over with its
  // checkpoint (StillCopying), newer than whatever this shard restored.
  const absl::Time since = orphaned_since_.try_emplace(group, absl::Now()).first->second;
  const absl::Duration waited = absl::Now() - since;
  if (waited < options_.last_copy_wait) {
    LOG_EVERY_N(WARNING, 10)
        << "group " << group << ": shard " << gone.shard
        << " lost its etcd lease while this shard was still copying the group's state, "
           "and no member before this one has the whole state; waiting up to "
        << options_.last_copy_wait - waited
        << " for it to come back (a hung or cut-off process) before taking the group "
           "over with the parameters this shard holds";
    return false;  // looked at again on the loop's next pass (every lease ttl)
  }
  LOG(ERROR) << "group " << group << ": shard " << gone.shard << " did not come back within "
             << options_.last_copy_wait << "; shard " << table_->shard()
             << ", which had not finished copying the group's state, takes it over with "
                "the parameters it holds (updates since its last checkpoint are lost)";
  orphaned_since_.erase(group);
  return true;
}

void Coordinator::RestoreChain(int group, const chain::ChainConfig& known,
                               const std::map<int, chain::ChainConfig::Member>& live) {
  // Its members whose lease is alive (they took new ones after the loss),
  // in order; the first of them puts it back, the others wait for it.
  chain::ChainConfig next = known;
  next.members.clear();
  for (const chain::ChainConfig::Member& m : known.members) {
    auto it = live.find(m.shard);
    if (it != live.end() && it->second.incarnation == m.incarnation) next.members.push_back(m);
  }
  if (next.members.empty() || next.members.front().shard != table_->shard() ||
      next.members.front().incarnation != table_->incarnation()) {
    return;
  }
  // Read again: the pass's read may predate a change this shard adopted
  // since. The table only ever holds what etcd held, and etcd's epochs
  // only grow, so a chain still absent or older now was lost.
  std::optional<etcd::KeyValue> kv;
  int64_t etcd_epoch = 0;
  absl::StatusOr<etcd::KeyValue> fresh = etcd_->Get(chain::ChainKey(options_.job, group));
  if (fresh.ok()) {
    absl::StatusOr<chain::ChainConfig> held = chain::DecodeChainConfig(fresh->value);
    if (held.ok() && (held->epoch > known.epoch ||
                      (held->epoch == known.epoch && held->members == known.members))) {
      lost_since_.erase(group);
      return;  // not lost: the table is behind
    }
    if (held.ok()) etcd_epoch = held->epoch;
    kv = *std::move(fresh);
  } else if (!absl::IsNotFound(fresh.status())) {
    return;  // etcd unreachable: the next pass
  }
  if (table_->CatchingUp(group)) {
    LOG_EVERY_N(ERROR, 20) << "group " << group << ": its chain in etcd is gone or older than "
                           << "epoch " << known.epoch << ", and the first live member, shard "
                           << table_->shard() << ", is still copying its state: not put back";
    return;
  }
  // Members re-take their leases within about a ttl of the loss: wait that
  // long for them rather than leave one out, which would then copy the
  // whole group's state back as a new tail.
  const absl::Time lost = lost_since_.try_emplace(group, absl::Now()).first->second;
  if (next.members.size() < known.members.size() &&
      absl::Now() - lost < 2 * options_.lease_ttl) {
    absl::MutexLock lock(&mu_);
    hand_over_pending_ = true;  // the next pass comes soon
    return;
  }
  lost_since_.erase(group);
  next.epoch = std::max(known.epoch, etcd_epoch) + 1;
  LOG(WARNING) << "group " << group << ": its chain in etcd is "
               << (kv ? absl::StrCat("at epoch ", etcd_epoch) : std::string("gone"))
               << ", this shard held epoch " << known.epoch
               << " (etcd lost its data?): putting it back";
  Swap(group, kv, next, "restored");
}

bool Coordinator::Swap(int group, const std::optional<etcd::KeyValue>& kv,
                       const chain::ChainConfig& next, const char* reason) {
  absl::StatusOr<etcd::CasResult> cas =
      etcd_->CompareAndSwap(chain::ChainKey(options_.job, group),
                            kv ? kv->mod_revision : 0, chain::EncodeChainConfig(next));
  if (!cas.ok()) {
    LOG(WARNING) << "group " << group << ": chain change (" << reason
                 << ") not made: " << cas.status();
    return false;
  }
  if (!cas->succeeded) return false;  // another member changed it first
  LOG(INFO) << "group " << group << ": chain " << reason << " -> epoch " << next.epoch;
  if (std::string(reason) != "formed") metrics_->reconfigurations(reason).Increment();
  Adopt(next);
  if (next.tail().shard == table_->shard() && next.tail().incarnation == table_->incarnation()) {
    shard_->replica().CommitGroup(group);
  }
  return true;
}

void Coordinator::RestoreOrder(int group, const etcd::KeyValue& kv,
                               const chain::ChainConfig& config,
                               const std::map<int, chain::ChainConfig::Member>& live) {
  if (static_cast<int>(config.members.size()) < config.replicas) return;  // a tail may join
  absl::StatusOr<chain::ChainConfig> next = config.Reorder(
      chain::InitialChain(group, options_.num_shards, options_.replicas));
  if (!next.ok() || next->members == config.members) return;
  HandOverBackoff& backoff = hand_over_backoff_[group];
  if (backoff.epoch == config.epoch && absl::Now() < backoff.not_before) return;
  // Only in calm: the chain unchanged for a moment, every member's lease
  // alive with its incarnation, this shard's own lease sound. A storm of
  // changes (every lease expired at once after an etcd outage, members
  // dropping and re-adding each other) is left to settle first.
  ChainSeen& seen = chain_seen_[group];
  if (seen.epoch != config.epoch) seen = ChainSeen{config.epoch, absl::Now()};
  bool calm = absl::Now() - seen.since >= kHandOverCalm && !table_->Fenced();
  for (const chain::ChainConfig::Member& m : config.members) {
    auto it = live.find(m.shard);
    calm = calm && it != live.end() && it->second.incarnation == m.incarnation;
  }
  {
    absl::MutexLock lock(&mu_);
    calm = calm && lease_problem_ == LeaseProblem::kNone;
    if (!calm) {
      hand_over_pending_ = true;
      return;
    }
  }
  // Asked before pushes pause: a new tail copying state is the usual wait.
  std::string behind = MembersBehind(group, config, std::nullopt);
  if (!behind.empty()) {
    VLOG(1) << "group " << group << ": head hand-over waits: " << behind;
    absl::MutexLock lock(&mu_);
    hand_over_pending_ = true;
    return;
  }
  const absl::Time start = absl::Now();
  if (!table_->Freeze(group, kHandOverDrain)) {
    behind = absl::StrCat("its operations did not reach the tail within ",
                          absl::FormatDuration(kHandOverDrain));
  } else {
    behind = MembersBehind(group, config, shard_->replica().Ops(group));
  }
  if (behind.empty() && Swap(group, kv, *next, "head_restored")) {
    LOG(INFO) << "group " << group << ": handed the head to shard " << next->head().shard
              << " (placement order restored); its pushes paused for "
              << absl::Now() - start;
  } else if (!behind.empty()) {
    // Not a transient state: try again later, less and less often.
    backoff.delay = backoff.epoch == config.epoch
                        ? std::min(kHandOverMaxBackoff, backoff.delay * 2)
                        : kHandOverRetry;
    backoff.epoch = config.epoch;
    backoff.not_before = absl::Now() + backoff.delay;
    LOG(WARNING) << "group " << group << ": head stays on shard " << table_->shard()
                 << " (tried again in " << backoff.delay << "): " << behind;
  }
  table_->Unfreeze(group);
}

std::string Coordinator::MembersBehind(int group, const chain::ChainConfig& config,
                                       std::optional<int64_t> ops) {
  for (const chain::ChainConfig::Member& m : config.members) {
    if (m.shard == table_->shard()) continue;
    absl::StatusOr<ChainState> state = forwarder_->MemberState(m.address, group, kHandOverAsk);
    if (!state.ok()) return state.status().ToString();
    const int position = static_cast<int>(*config.IndexOf(m.shard));
    if (state->epoch() != config.epoch || state->position() != position ||
        state->catching_up() || (ops && state->applied_ops() != *ops)) {
      return absl::StrFormat(
          "shard %d is at epoch %d, position %d, with %d operations%s (the chain: epoch %d, "
          "position %d; the head: %d operations)",
          m.shard, state->epoch(), state->position(), state->applied_ops(),
          state->catching_up() ? ", copying state" : "", config.epoch, position,
          shard_->replica().Ops(group));
    }
  }
  return "";
}

void Coordinator::CatchUp(int group, const chain::ChainConfig& config) {
  const std::optional<chain::ChainConfig::Member> from = config.Predecessor(table_->shard());
  if (!from) {  // the only member: nothing to copy
    LOG(WARNING) << "group " << group << ": shard " << table_->shard()
                 << " is the chain's only member before it finished copying the group's "
                    "state; it serves the parameters it holds";
    table_->SetCatchingUp(group, false);
    metrics_->catchup_in_progress().Set(0);
    return;
  }
  // A predecessor that hangs (or is cut off) would hold this loop, and so
  // every other group's reconciliation, for the whole copy's deadline:
  // it must answer a Status call first. Tried again on the loop's next pass.
  const absl::StatusOr<ChainState> answering =
      forwarder_->MemberState(from->address, group, kHandOverAsk);
  if (!answering.ok()) {
    LOG_EVERY_N(WARNING, 10) << "group " << group << ": catching up: shard " << from->shard
                             << " does not answer (" << answering.status() << ")";
    return;
  }
  const absl::Time start = absl::Now();
  absl::StatusOr<GroupStateResponse> state = forwarder_->FetchGroupState(
      from->address, group, config.epoch, std::max(absl::Seconds(10), options_.lease_ttl * 4),
      options_.catchup_timeout);
  if (!state.ok()) {
    LOG_EVERY_N(WARNING, 10) << "group " << group << ": catching up: " << state.status();
    Wake();  // retried on the next pass while still a member
    return;
  }
  metrics_->catchup_bytes().Increment(static_cast<double>(state->ByteSizeLong()));
  const absl::Status imported = shard_->replica().Import(group, *state);
  if (!imported.ok()) {
    LOG(ERROR) << "group " << group << ": installing the state from shard " << from->shard
               << ": " << imported;
    return;
  }
  table_->SetCatchingUp(group, false);
  metrics_->catchup_in_progress().Set(0);
  metrics_->catchup_last_seconds().Set(absl::ToDoubleSeconds(absl::Now() - start));
  LOG(INFO) << "group " << group << ": caught up from shard " << from->shard << " ("
            << state->records_size() << " records, " << state->ByteSizeLong()
            << " bytes) in " << absl::Now() - start;
}

}  // namespace shardtrain::server
