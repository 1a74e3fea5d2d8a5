#include "server/replication/chain_table.h"

#include <algorithm>
#include <utility>

#include <glog/logging.h>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace shardtrain::server {

ChainTable::ChainTable(int shard, uint64_t incarnation, std::vector<int> groups,
                       absl::Duration lease_ttl, ReplicationMetrics* metrics)
    : shard_(shard),
      incarnation_(incarnation),
      groups_(std::move(groups)),
      max_tick_gap_(lease_ttl / 2),
      metrics_(metrics),
      last_tick_(absl::Now()) {
  absl::MutexLock lock(&mu_);
  for (int group : groups_) PublishLocked(group);
}

bool ChainTable::Serves(int group) const {
  return std::find(groups_.begin(), groups_.end(), group) != groups_.end();
}

bool ChainTable::IsMember(const chain::ChainConfig& config) const {
  const std::optional<size_t> index = config.IndexOf(shard_);
  return index && config.members[*index].incarnation == incarnation_;
}

bool ChainTable::Update(const chain::ChainConfig& config) {
  if (!Serves(config.group)) return false;
  absl::MutexLock lock(&mu_);
  auto it = configs_.find(config.group);
  if (it != configs_.end() && it->second.epoch >= config.epoch) return false;
  const bool was_member = it != configs_.end() && IsMember(it->second);
  configs_[config.group] = config;
  const bool member = IsMember(config);
  LOG(INFO) << "shard " << shard_ << ": group " << config.group << " chain epoch "
            << config.epoch << ": ["
            << absl::StrJoin(config.members, ", ",
                             [](std::string* out, const chain::ChainConfig::Member& m) {
                               absl::StrAppend(out, m.shard);
                             })
            << "]" << (was_member && !member ? " (this shard left it)" : "");
  PublishLocked(config.group);
  return true;
}

void ChainTable::PublishLocked(int group) {
  if (metrics_ == nullptr) return;
  auto it = configs_.find(group);
  if (it == configs_.end()) {
    metrics_->chain_members(group).Set(0);
    metrics_->chain_epoch(group).Set(0);
    metrics_->chain_position(group).Set(-1);
    return;
  }
  const chain::ChainConfig& config = it->second;
  metrics_->chain_members(group).Set(static_cast<double>(config.members.size()));
  metrics_->chain_epoch(group).Set(static_cast<double>(config.epoch));
  metrics_->chain_position(group).Set(
      IsMember(config) ? static_cast<double>(*config.IndexOf(shard_)) : -1);
}

std::optional<chain::ChainConfig> ChainTable::Get(int group) const {
  absl::MutexLock lock(&mu_);
  auto it = configs_.find(group);
  if (it == configs_.end()) return std::nullopt;
  return it->second;
}

absl::Status ChainTable::Refuse(std::string message) const {
  if (metrics_ != nullptr) metrics_->stale_epoch_refusals().Increment();
  return absl::UnavailableError(std::move(message));
}

absl::Status ChainTable::Check(int group, uint64_t epoch, Role role) const {
  absl::MutexLock lock(&mu_);
  return CheckLocked(group, epoch, role);
}

absl::Status ChainTable::CheckLocked(int group, uint64_t epoch, Role role) const {
  if (!Serves(group)) {
    // No configuration routes this group here: the sender is wrong, not late.
    return absl::InvalidArgumentError(absl::StrFormat(
        "shard %d does not hold replica group %d", shard_, group));
  }
  if (!fenced_.empty()) {
    return Refuse(absl::StrFormat("not serving group %d: shard %d is fenced (%s)", group,
                                  shard_, fenced_));
  }
  if (absl::Now() - last_tick_ > max_tick_gap_) {
    return Refuse(absl::StrFormat(
        "not serving group %d: shard %d was paused; waiting to confirm its lease",
        group, shard_));
  }
  auto it = configs_.find(group);
  if (it == configs_.end()) {
    return Refuse(absl::StrFormat("not serving group %d: shard %d has no chain for it",
                                  group, shard_));
  }
  const chain::ChainConfig& config = it->second;
  if (static_cast<int64_t>(epoch) > config.epoch) {
    // The sender read a newer configuration than this shard's watch has
    // delivered yet: a moment's wait, not a stale sender.
    return Refuse(absl::StrFormat(
        "not serving group %d yet: shard %d is at chain epoch %d, behind the request's %d",
        group, shard_, config.epoch, epoch));
  }
  if (static_cast<int64_t>(epoch) != config.epoch) {
    return Refuse(absl::StrFormat(
        "stale chain epoch %d for group %d: shard %d is at epoch %d", epoch, group,
        shard_, config.epoch));
  }
  if (!IsMember(config)) {
    return Refuse(absl::StrFormat(
        "not serving group %d: shard %d is not in its chain at epoch %d", group, shard_,
        config.epoch));
  }
  auto catching = catching_up_.find(group);
  if (catching != catching_up_.end() && catching->second) {
    return Refuse(absl::StrFormat(
        "not serving group %d yet: shard %d is copying its state", group, shard_));
  }
  if (role == Role::kHead && config.head().shard != shard_) {
    return Refuse(absl::StrFormat(
        "stale chain epoch %d for group %d: shard %d is not its head (shard %d is)",
        epoch, group, shard_, config.head().shard));
  }
  if (role == Role::kTail && config.tail().shard != shard_) {
    return Refuse(absl::StrFormat(
        "stale chain epoch %d for group %d: shard %d is not its tail (shard %d is)",
        epoch, group, shard_, config.tail().shard));
  }
  return absl::OkStatus();
}

bool ChainTable::MemberAt(int group, uint64_t epoch) const {
  absl::MutexLock lock(&mu_);
  auto it = configs_.find(group);
  return it != configs_.end() && fenced_.empty() &&
         it->second.epoch == static_cast<int64_t>(epoch) && IsMember(it->second);
}

bool ChainTable::IsHead(int group) const {
  absl::MutexLock lock(&mu_);
  return IsHeadLocked(group);
}

bool ChainTable::IsHeadLocked(int group) const {
  auto it = configs_.find(group);
  return it != configs_.end() && IsMember(it->second) &&
         it->second.head().shard == shard_;
}

absl::Status ChainTable::AdmitHead(int group, uint64_t epoch) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckLocked(group, epoch, Role::kHead));
  if (frozen_[group]) {
    return Refuse(absl::StrFormat(
        "not serving group %d: shard %d is handing its head over (chain epoch %d); retry",
        group, shard_, epoch));
  }
  ++admitted_[group];
  return absl::OkStatus();
}

bool ChainTable::AdmitLead(int group) {
  absl::MutexLock lock(&mu_);
  if (!IsHeadLocked(group) || frozen_[group]) return false;
  ++admitted_[group];
  return true;
}

void ChainTable::Release(int group) {
  absl::MutexLock lock(&mu_);
  int64_t& admitted = admitted_[group];
  if (admitted <= 0) {
    LOG(DFATAL) << "group " << group << ": Release without an admission";
    return;
  }
  --admitted;
}

bool ChainTable::Freeze(int group, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  frozen_[group] = true;
  auto drained = [this, group]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return admitted_[group] == 0;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&drained), timeout);
}

void ChainTable::Unfreeze(int group) {
  absl::MutexLock lock(&mu_);
  frozen_[group] = false;
}

std::optional<chain::ChainConfig::Member> ChainTable::Successor(int group,
                                                                  int64_t* epoch,
                                                                  bool* is_member) const {
  absl::MutexLock lock(&mu_);
  *is_member = false;
  auto it = configs_.find(group);
  if (it == configs_.end() || !fenced_.empty() || !IsMember(it->second)) {
    return std::nullopt;
  }
  *is_member = true;
  *epoch = it->second.epoch;
  return it->second.Successor(shard_);
}

void ChainTable::SetCatchingUp(int group, bool catching_up) {
  absl::MutexLock lock(&mu_);
  catching_up_[group] = catching_up;
}

bool ChainTable::CatchingUp(int group) const {
  absl::MutexLock lock(&mu_);
  auto it = catching_up_.find(group);
  return it != catching_up_.end() && it->second;
}

void ChainTable::Tick(absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (now - last_tick_ > max_tick_gap_ && fenced_.empty()) {
    fenced_ = absl::StrFormat("paused for %s", absl::FormatDuration(absl::Trunc(
                                                   now - last_tick_, absl::Milliseconds(1))));
    LOG(WARNING) << "shard " << shard_ << ": " << fenced_
                 << "; refusing requests until its etcd lease is confirmed";
  }
  last_tick_ = now;
}

void ChainTable::Fence(const std::string& why) {
  absl::MutexLock lock(&mu_);
  if (fenced_.empty()) LOG(WARNING) << "shard " << shard_ << " fenced: " << why;
  fenced_ = why;
}

bool ChainTable::Fenced() const {
  absl::MutexLock lock(&mu_);
  return !fenced_.empty();
}

void ChainTable::Unfence() {
  absl::MutexLock lock(&mu_);
  if (!fenced_.empty()) LOG(INFO) << "shard " << shard_ << " serving again";
  fenced_.clear();
}

void ChainTable::Describe(const std::function<int64_t(int)>& ops,
                          const std::function<int64_t(int)>& acked,
                          google::protobuf::RepeatedPtrField<ChainState>* out) const {
  std::map<int, chain::ChainConfig> configs;
  std::map<int, bool> catching;
  {
    absl::MutexLock lock(&mu_);
    configs = configs_;
    catching = catching_up_;
  }
  for (int group : groups_) {
    ChainState& state = *out->Add();
    state.set_group(group);
    state.set_position(-1);
    auto it = configs.find(group);
    if (it != configs.end()) {
      state.set_epoch(it->second.epoch);
      for (const chain::ChainConfig::Member& m : it->second.members) {
        state.add_members(m.shard);
      }
      if (IsMember(it->second)) {
        state.set_position(static_cast<int32_t>(*it->second.IndexOf(shard_)));
      }
    }
    state.set_applied_ops(ops(group));
    state.set_acked_ops(acked(group));
    state.set_catching_up(catching[group]);
  }
}

}  // namespace shardtrain::server
