#include "client/chain_router.h"

#include <algorithm>
#include <set>
#include <utility>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/notification.h"
#include "chain/replication_keys.h"
#include "common/status_macros.h"

namespace shardtrain::client {
namespace {

// "[2, 3]": the member shards, head first.
std::string MembersOf(const chain::ChainConfig& config) {
  std::vector<int> shards;
  for (const chain::ChainConfig::Member& member : config.members) {
    shards.push_back(member.shard);
  }
  return absl::StrCat("[", absl::StrJoin(shards, ", "), "]");
}

bool SameShards(const chain::ChainConfig& a, const chain::ChainConfig& b) {
  if (a.members.size() != b.members.size()) return false;
  for (size_t i = 0; i < a.members.size(); ++i) {
    if (a.members[i].shard != b.members[i].shard) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ChainRouter>> ChainRouter::Create(const Options& options,
                                                                 PsClientMetrics* metrics) {
  if (options.etcd_endpoints.empty()) {
    return absl::InvalidArgumentError(
        "replicated shards need the etcd endpoints that hold their chains");
  }
  RETURN_IF_ERROR(chain::ValidateJobName(options.job));
  if (options.num_groups < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("a job has at least one replica group, not %d", options.num_groups));
  }
  if (options.etcd_timeout <= absl::ZeroDuration() ||
      options.refresh_interval < absl::ZeroDuration() ||
      options.etcd_down_backoff < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "the etcd timeout must be positive, the refresh intervals not negative");
  }
  etcd::EtcdClient::Options etcd_options;
  etcd_options.endpoints = options.etcd_endpoints;
  etcd_options.credentials = options.etcd_credentials;
  etcd_options.rpc_timeout = options.etcd_timeout;
  etcd_options.connect_timeout = options.etcd_timeout;
  absl::StatusOr<std::unique_ptr<etcd::EtcdClient>> etcd =
      etcd::EtcdClient::Create(etcd_options);
  if (!etcd.ok()) {
    return absl::Status(etcd.status().code(),
                        absl::StrFormat("connecting to etcd (%s) for the chains of job %s: %s",
                                        options.etcd_endpoints, options.job,
                                        etcd.status().message()));
  }
  std::unique_ptr<ChainRouter> router(
      new ChainRouter(options, *std::move(etcd), metrics));
  const absl::StatusOr<int64_t> revision = router->ReadAll();
  if (!revision.ok()) {
    return absl::Status(revision.status().code(),
                        absl::StrFormat("reading the chains of job %s from etcd (%s): %s",
                                        options.job, router->etcd_->endpoint(),
                                        revision.status().message()));
  }
  if (options.watch) {
    absl::MutexLock lock(&router->mu_);
    router->StartWatch(*revision + 1);
  }
  return router;
}

ChainRouter::ChainRouter(const Options& options, std::unique_ptr<etcd::EtcdClient> etcd,
                         PsClientMetrics* metrics)
    : options_(options),
      etcd_(std::move(etcd)),
      metrics_(metrics),
      entries_(options.num_groups),
      last_read_(options.num_groups, absl::InfinitePast()) {
  thread_ = std::thread([this] { Loop(); });
}

ChainRouter::~ChainRouter() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
  std::unique_ptr<etcd::Watcher> watcher;
  std::vector<std::function<void()>> left;
  {
    absl::MutexLock lock(&mu_);
    watcher = std::move(watcher_);
    for (auto* waiting : {&pending_, &reading_}) {
      for (auto& [group, callbacks] : *waiting) {
        for (auto& callback : callbacks) left.push_back(std::move(callback));
      }
      waiting->clear();
    }
  }
  // Outside the lock: the watch's callback may be waiting for it.
  watcher.reset();
  // Nobody should still wait; if someone does, let the call go on.
  for (auto& callback : left) callback();
}

absl::StatusOr<ChainRoute> ChainRouter::Route(int group, ChainRole role) const {
  if (group < 0 || group >= options_.num_groups) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "replica group %d is not one of the job's %d", group, options_.num_groups));
  }
  if (role == ChainRole::kNone) {
    return absl::InvalidArgumentError("a route needs the head or the tail");
  }
  absl::ReaderMutexLock lock(&mu_);
  const std::optional<Entry>& entry = entries_[group];
  if (!entry.has_value()) {
    return absl::UnavailableError(absl::StrFormat(
        "no chain configuration for group %d in etcd (%s, key %s)", group,
        etcd_->endpoint(), chain::ChainKey(options_.job, group)));
  }
  const chain::ChainConfig::Member& member =
      role == ChainRole::kHead ? entry->config.head() : entry->config.tail();
  return ChainRoute{member.shard, static_cast<uint64_t>(entry->config.epoch)};
}

std::optional<chain::ChainConfig> ChainRouter::Config(int group) const {
  absl::ReaderMutexLock lock(&mu_);
  if (group < 0 || group >= options_.num_groups || !entries_[group].has_value()) {
    return std::nullopt;
  }
  return entries_[group]->config;
}

std::vector<int> ChainRouter::MemberShards() const {
  std::set<int> shards;
  absl::ReaderMutexLock lock(&mu_);
  for (const std::optional<Entry>& entry : entries_) {
    if (!entry.has_value()) continue;
    for (const chain::ChainConfig::Member& member : entry->config.members) {
      shards.insert(member.shard);
    }
  }
  return std::vector<int>(shards.begin(), shards.end());
}

void ChainRouter::SetOnChange(std::function<void(const chain::ChainConfig&)> on_change) {
  absl::MutexLock lock(&mu_);
  on_change_ = std::move(on_change);
}

int64_t ChainRouter::changes() const {
  absl::ReaderMutexLock lock(&mu_);
  return changes_;
}

int64_t ChainRouter::refresh_reads() const {
  absl::ReaderMutexLock lock(&mu_);
  return refresh_reads_;
}

void ChainRouter::Apply(const std::string& key, const std::string& value,
                        int64_t mod_revision, const char* source) {
  const absl::StatusOr<int> group = chain::GroupFromChainKey(options_.job, key);
  if (!group.ok()) {
    VLOG(1) << "ignoring etcd key " << key << " (" << source << "): " << group.status();
    return;
  }
  if (*group >= options_.num_groups) {
    LOG_EVERY_N(WARNING, 100) << "ignoring the chain of group " << *group << " (" << key
                              << "): this job has " << options_.num_groups << " groups";
    return;
  }
  absl::StatusOr<chain::ChainConfig> config = chain::DecodeChainConfig(value);
  absl::Status valid = config.status();
  if (valid.ok() && config->group != *group) {
    valid = absl::InvalidArgumentError(
        absl::StrFormat("it describes group %d", config->group));
  }
  if (valid.ok()) valid = chain::CheckChainFitsShards(*config, options_.num_groups);
  if (!valid.ok()) {
    LOG_EVERY_N(WARNING, 100) << "ignoring the chain of group " << *group << " in etcd ("
                              << key << ", " << source << "): " << valid
                              << "; keeping the last good one";
    return;
  }
  std::function<void(const chain::ChainConfig&)> on_change;
  {
    absl::MutexLock lock(&mu_);
    std::optional<Entry>& entry = entries_[*group];
    // Newer: a later epoch (every change makes one), or the same epoch read
    // at a later revision. Not the revision alone: etcd that lost its data
    // starts its revisions again while the shards put the chains back at
    // later epochs.
    if (entry.has_value() &&
        (config->epoch < entry->config.epoch ||
         (config->epoch == entry->config.epoch && entry->mod_revision >= mod_revision))) {
      return;
    }
    if (!entry.has_value()) {
      LOG(INFO) << absl::StrFormat("group %d: chain epoch %d, members %s (head first)", *group,
                                   config->epoch, MembersOf(*config));
    } else if (!SameShards(entry->config, *config)) {
      LOG(INFO) << absl::StrFormat("group %d: chain epoch %d -> %d, members %s -> %s (%s)",
                                   *group, entry->config.epoch, config->epoch,
                                   MembersOf(entry->config), MembersOf(*config), source);
      ++changes_;
      if (metrics_ != nullptr) metrics_->chain_changes(*group).Increment();
    }
    entry = Entry{*config, mod_revision};
    on_change = on_change_;
  }
  // Outside the lock: the listener may read routes.
  if (on_change) on_change(*config);
}

absl::StatusOr<int64_t> ChainRouter::ReadAll() {
  ASSIGN_OR_RETURN(const etcd::RangeResult range,
                   etcd_->GetPrefix(chain::ChainsPrefix(options_.job)));
  for (const etcd::KeyValue& kv : range.kvs) Apply(kv.key, kv.value, kv.mod_revision, "read");
  return range.revision;
}

void ChainRouter::StartWatch(int64_t from_revision) {
  watcher_ = etcd_->Watch(
      chain::ChainsPrefix(options_.job), from_revision,
      [this](const etcd::WatchEvent& event) {
        if (event.type == etcd::WatchEvent::Type::kPut) {
          Apply(event.key, event.value, event.mod_revision, "watch");
        } else {
          LOG(WARNING) << "etcd key " << event.key
                       << " was deleted; routing by its last configuration";
        }
      },
      [this](absl::Status status) {
        LOG(WARNING) << "the watch of the chains in etcd ended (" << status
                     << "); reading them again";
        absl::MutexLock lock(&mu_);
        watch_ended_ = true;
      });
}

void ChainRouter::Refresh(int group, std::function<void()> then) {
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_ && group >= 0 && group < options_.num_groups) {
      auto pending = pending_.find(group);
      if (pending != pending_.end()) {
        pending->second.push_back(std::move(then));
        return;
      }
      const absl::Time now = absl::Now();
      if (now - last_read_[group] >= options_.refresh_interval && now >= etcd_down_until_) {
        pending_[group].push_back(std::move(then));
        return;
      }
    }
  }
  then();
}

void ChainRouter::Refresh(int group) {
  absl::Notification done;
  Refresh(group, [&done] { done.Notify(); });
  done.WaitForNotification();
}

void ChainRouter::RefreshAll() {
  absl::BlockingCounter pending(options_.num_groups);
  for (int g = 0; g < options_.num_groups; ++g) {
    Refresh(g, [&pending] { pending.DecrementCount(); });
  }
  pending.Wait();
}

bool ChainRouter::HasWork() const { return stopping_ || watch_ended_ || !pending_.empty(); }

void ChainRouter::Loop() {
  while (true) {
    std::vector<int> groups;
    bool restart = false;
    std::unique_ptr<etcd::Watcher> ended;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &ChainRouter::HasWork));
      if (stopping_) return;
      restart = watch_ended_;
      watch_ended_ = false;
      if (restart) ended = std::move(watcher_);
      for (auto& [group, callbacks] : pending_) {
        groups.push_back(group);
        std::vector<std::function<void()>>& reading = reading_[group];
        for (auto& callback : callbacks) reading.push_back(std::move(callback));
      }
      pending_.clear();
    }
    ended.reset();  // its stream is over; joins its thread
    absl::Status read;
    int64_t revision = 0;
    if (restart || groups.size() > 1) {
      // A restarted watch needs a fresh read of everything, which also
      // serves every refresh asked for.
      const absl::StatusOr<int64_t> all = ReadAll();
      read = all.status();
      if (all.ok()) revision = *all;
    } else if (groups.size() == 1) {
      const absl::StatusOr<etcd::KeyValue> kv =
          etcd_->Get(chain::ChainKey(options_.job, groups[0]));
      if (kv.ok()) {
        Apply(kv->key, kv->value, kv->mod_revision, "refresh");
      } else if (kv.status().code() != absl::StatusCode::kNotFound) {
        read = kv.status();
      }
    }
    std::vector<std::function<void()>> callbacks;
    {
      absl::MutexLock lock(&mu_);
      const absl::Time now = absl::Now();
      if (!read.ok()) etcd_down_until_ = now + options_.etcd_down_backoff;
      if (restart) {
        if (!read.ok()) {
          watch_ended_ = true;  // again after the pause below
        } else if (!stopping_) {
          StartWatch(revision + 1);
        }
      }
      if (!groups.empty()) ++refresh_reads_;
      for (int group : groups) {
        last_read_[group] = now;
        auto reading = reading_.find(group);
        if (reading == reading_.end()) continue;
        for (auto& callback : reading->second) callbacks.push_back(std::move(callback));
        reading_.erase(reading);
      }
    }
    if (!read.ok()) {
      WarnEtcd(read, restart ? "restarting the watch of the chains"
                             : "re-reading the chain configuration");
    }
    for (auto& callback : callbacks) callback();
    if (restart && !read.ok()) {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), options_.etcd_down_backoff);
    }
  }
}

void ChainRouter::WarnEtcd(const absl::Status& status, const char* what) {
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    if (now - last_warning_ < absl::Seconds(10)) return;
    last_warning_ = now;
  }
  LOG(WARNING) << "etcd (" << etcd_->endpoint() << ") failed " << what << ": " << status
               << "; routing by the configuration last read";
}

absl::Status ChainRouter::WaitForGroups(int num_groups, absl::Duration timeout) {
  if (num_groups < 0 || num_groups > options_.num_groups) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "waiting for %d groups of a job of %d", num_groups, options_.num_groups));
  }
  absl::MutexLock lock(&mu_);
  auto all_known = [this, num_groups]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (int g = 0; g < num_groups; ++g) {
      if (!entries_[g].has_value()) return false;
    }
    return true;
  };
  if (mu_.AwaitWithTimeout(absl::Condition(&all_known), timeout)) return absl::OkStatus();
  std::vector<int> missing;
  for (int g = 0; g < num_groups; ++g) {
    if (!entries_[g].has_value()) missing.push_back(g);
  }
  return absl::DeadlineExceededError(absl::StrFormat(
      "no chain configuration in etcd (%s, under %s) for group%s %s after %s: are the "
      "shards started with --replicas > 1 and the same --job?",
      etcd_->endpoint(), chain::ChainsPrefix(options_.job), missing.size() == 1 ? "" : "s",
      absl::StrJoin(missing, ", "), absl::FormatDuration(timeout)));
}

void RouteChannels(ChainRouter* router, const std::vector<ShardChannel*>& channels) {
  for (ShardChannel* channel : channels) channel->set_chain(router, channels);
  // A member that hangs or is cut off sends no reset: calls waiting on it
  // move to the new chain as soon as the router sees it dropped.
  router->SetOnChange([channels](const chain::ChainConfig& config) {
    if (config.group < 0 || config.group >= static_cast<int>(channels.size())) return;
    std::vector<int> members;
    for (const chain::ChainConfig::Member& member : config.members) {
      members.push_back(member.shard);
    }
    channels[config.group]->AbandonDeparted(static_cast<uint64_t>(config.epoch), members);
  });
}

}  // namespace shardtrain::client
