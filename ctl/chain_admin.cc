#include "ctl/chain_admin.h"

#include <algorithm>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "chain/placement.h"
#include "chain/replication_keys.h"
#include "common/status_macros.h"

namespace shardtrain::ctl {
namespace {

using chain::ChainConfig;

absl::Status CheckArguments(absl::string_view job, int shard) {
  RETURN_IF_ERROR(chain::ValidateJobName(job));
  if (shard < 0) {
    return absl::InvalidArgumentError(absl::StrCat("shard index ", shard, " is negative"));
  }
  return absl::OkStatus();
}

std::string Position(const ChainConfig& chain, size_t i) {
  if (chain.members.size() == 1) return "only";
  if (i == 0) return "head";
  if (i + 1 == chain.members.size()) return "tail";
  return absl::StrCat("#", i);
}

// Removes `shard` from group `group`'s chain (now `kv`) by compare-and-swap,
// re-reading on conflict. Appends the change, if any, to `result`.
absl::Status RemoveFromChain(etcd::EtcdClient& etcd, int group, int shard,
                             etcd::KeyValue kv, const DrainOptions& options,
                             DrainResult* result) {
  for (int attempt = 0; attempt < options.max_attempts_per_chain; ++attempt) {
    ASSIGN_OR_RETURN(ChainConfig chain, chain::DecodeChainConfig(kv.value));
    if (!chain.Contains(shard)) return absl::OkStatus();  // someone else did it
    ASSIGN_OR_RETURN(ChainConfig next, chain.Remove(shard));
    if (options.before_cas) options.before_cas(group, attempt);
    // The chain keeps its lease, if it has one.
    ASSIGN_OR_RETURN(etcd::CasResult cas,
                     etcd.CompareAndSwap(kv.key, kv.mod_revision,
                                         chain::EncodeChainConfig(next), kv.lease));
    if (cas.succeeded) {
      result->changes.push_back({std::move(chain), std::move(next)});
      return absl::OkStatus();
    }
    ++result->cas_conflicts;
    if (!cas.current.has_value()) return absl::OkStatus();  // the chain is gone
    kv = *std::move(cas.current);
  }
  return absl::AbortedError(absl::StrCat(
      "the chain of group ", group, " changed under each of ",
      options.max_attempts_per_chain, " attempts to remove shard ", shard,
      " from it; try again"));
}

std::string GroupList(const std::vector<ChainChange>& changes) {
  std::vector<int> groups;
  for (const ChainChange& change : changes) groups.push_back(change.after.group);
  return absl::StrJoin(groups, ", ");
}

}  // namespace

bool Degraded(const ChainConfig& chain) {
  return static_cast<int>(chain.members.size()) < chain.replicas;
}

bool OutOfPlacementOrder(const ChainConfig& chain, int num_shards) {
  if (Degraded(chain) || chain.group < 0 || chain.group >= num_shards ||
      !chain::ValidateReplicas(num_shards, chain.replicas).ok()) {
    return false;
  }
  const std::vector<int> placement =
      chain::InitialChain(chain.group, num_shards, chain.replicas);
  if (placement.size() != chain.members.size()) return false;
  for (size_t i = 0; i < placement.size(); ++i) {
    if (chain.members[i].shard != placement[i]) return true;
  }
  return false;
}

std::string FormatMember(const ChainConfig::Member& member) {
  return absl::StrFormat("%d@%s/%08x", member.shard, member.address,
                         static_cast<uint32_t>(member.incarnation >> 32));
}

std::string FormatChains(const ChainsView& view) {
  std::string out = absl::StrFormat("job %s (etcd revision %d)\n", view.job, view.revision);
  if (view.chains.empty()) {
    absl::StrAppendFormat(&out,
                          "no chains under %s: is --job right, and do its shards run "
                          "with --replicas > 1?\n",
                          chain::ChainsPrefix(view.job));
  } else {
    absl::StrAppendFormat(&out, "%-5s %6s %7s %-9s  %s\n", "GROUP", "EPOCH", "MEMBERS",
                          "STATE", "CHAIN head..tail (shard@address/incarnation)");
  }
  std::set<int> shards;
  std::vector<int> degraded;
  std::vector<int> reordered;
  // Every shard heads one group in the placement: as many shards as groups.
  const int num_shards = static_cast<int>(view.chains.size());
  for (const ChainConfig& chain : view.chains) {
    std::vector<std::string> members;
    for (const ChainConfig::Member& member : chain.members) {
      members.push_back(FormatMember(member));
      shards.insert(member.shard);
    }
    shards.insert(chain.group);  // its primary shard
    const char* state = "ok";
    if (Degraded(chain)) {
      degraded.push_back(chain.group);
      state = "DEGRADED";
    } else if (OutOfPlacementOrder(chain, num_shards)) {
      reordered.push_back(chain.group);
      state = "reordered";
    }
    absl::StrAppendFormat(&out, "%-5d %6d %7s %-9s  %s\n", chain.group, chain.epoch,
                          absl::StrCat(chain.members.size(), "/", chain.replicas), state,
                          absl::StrJoin(members, " -> "));
  }
  for (const auto& [shard, member] : view.live) shards.insert(shard);
  for (const auto& [shard, note] : view.drained) shards.insert(shard);

  if (!shards.empty()) {
    absl::StrAppendFormat(&out, "\n%-5s %-5s %-21s %-11s %-26s %s\n", "SHARD", "LIVE",
                          "ADDRESS", "INCARNATION", "CHAINS", "DRAINED");
  }
  std::vector<int> live, drained, down;
  for (int shard : shards) {
    const auto live_it = view.live.find(shard);
    const bool is_live = live_it != view.live.end();
    std::vector<std::string> places;
    for (const ChainConfig& chain : view.chains) {
      const std::optional<size_t> i = chain.IndexOf(shard);
      if (!i.has_value()) continue;
      std::string place = absl::StrCat("g", chain.group, ":", Position(chain, *i));
      // A chain naming an incarnation that no longer holds the liveness key:
      // the shard restarted and has not been replaced in the chain yet.
      if (is_live && chain.members[*i].incarnation != live_it->second.incarnation) {
        absl::StrAppend(&place, "(old)");
      }
      places.push_back(std::move(place));
    }
    const auto drained_it = view.drained.find(shard);
    (is_live ? live : down).push_back(shard);
    if (drained_it != view.drained.end()) drained.push_back(shard);
    absl::StrAppendFormat(
        &out, "%-5d %-5s %-21s %-11s %-26s %s\n", shard, is_live ? "live" : "-",
        is_live ? live_it->second.address : "-",
        is_live ? absl::StrFormat("%08x", static_cast<uint32_t>(
                                              live_it->second.incarnation >> 32))
                : "-",
        places.empty() ? "-" : absl::StrJoin(places, " "),
        drained_it == view.drained.end() ? "-"
                                         : absl::StrCat("yes: ", absl::CEscape(drained_it->second)));
  }
  if (!view.chains.empty()) {
    absl::StrAppendFormat(&out, "\ngroups: %d, degraded: %s\n",
                          static_cast<int>(view.chains.size()),
                          degraded.empty() ? "none" : absl::StrJoin(degraded, ", "));
    if (!reordered.empty()) {
      absl::StrAppendFormat(
          &out,
          "reordered (all members, not in the placement's order): %s; the head hands "
          "its place back once the chain is calm (not with --restore_chain_order=false)\n",
          absl::StrJoin(reordered, ", "));
    }
  }
  if (!shards.empty()) {
    absl::StrAppendFormat(&out, "shards: live %s; not live %s; drained %s\n",
                          live.empty() ? "none" : absl::StrJoin(live, ", "),
                          down.empty() ? "none" : absl::StrJoin(down, ", "),
                          drained.empty() ? "none" : absl::StrJoin(drained, ", "));
  }
  for (const ChainsView::BadKey& bad : view.bad_keys) {
    absl::StrAppendFormat(&out, "BAD KEY %s: %s\n", absl::CEscape(bad.key), bad.why);
  }
  return out;
}

absl::StatusOr<DrainResult> DrainShard(etcd::EtcdClient& etcd, absl::string_view job,
                                       int shard, const DrainOptions& options) {
  RETURN_IF_ERROR(CheckArguments(job, shard));
  ASSIGN_OR_RETURN(ChainsView view, ReadChains(etcd, job));
  if (view.chains.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "job \"", job, "\" has no chains in etcd (under ", chain::ChainsPrefix(job),
        "): is --job right, and do its shards run with --replicas > 1?"));
  }
  for (const ChainsView::BadKey& bad : view.bad_keys) {
    if (absl::StartsWith(bad.key, chain::ChainsPrefix(job))) {
      return absl::FailedPreconditionError(absl::StrCat(
          "chain key ", absl::CEscape(bad.key), " does not decode (", bad.why,
          "), so it is unknown whether it holds shard ", shard, "; nothing changed"));
    }
  }
  bool known = view.live.count(shard) > 0 || view.drained.count(shard) > 0;
  for (const ChainConfig& chain : view.chains) {
    known |= chain.group == shard || chain.Contains(shard);
    if (chain.Contains(shard) && chain.members.size() == 1) {
      return absl::FailedPreconditionError(absl::StrCat(
          "shard ", shard, " is the last member of the chain of group ", chain.group,
          " (epoch ", chain.epoch, "): draining it would leave group ", chain.group,
          "'s partitions on no shard. Bring another replica of group ", chain.group,
          " up first; nothing changed"));
    }
  }
  if (!known) {
    return absl::NotFoundError(absl::StrCat("job \"", job, "\" has ", view.chains.size(),
                                            " groups and no shard ", shard,
                                            "; nothing changed"));
  }

  DrainResult result;
  // The marker first: a shard removed from a chain must not rejoin it.
  const std::string drained_key = chain::DrainedKey(job, shard);
  ASSIGN_OR_RETURN(etcd::CasResult put,
                   etcd.CompareAndSwap(drained_key, /*expected_mod_revision=*/0,
                                       options.note));
  result.already_drained = !put.succeeded;

  // Each chain holding the shard, in group order; then a fresh read, in
  // case the shard rejoined a chain before it saw the marker.
  constexpr int kRounds = 3;
  absl::Status status;
  for (int round = 0; round < kRounds && status.ok(); ++round) {
    bool any = false;
    for (const ChainConfig& chain : view.chains) {
      if (!chain.Contains(shard)) continue;
      any = true;
      absl::StatusOr<etcd::KeyValue> kv = etcd.Get(chain::ChainKey(job, chain.group));
      if (absl::IsNotFound(kv.status())) continue;  // deleted since: nothing to remove
      status = kv.ok() ? RemoveFromChain(etcd, chain.group, shard, *std::move(kv), options,
                                         &result)
                       : kv.status();
      if (!status.ok()) break;
    }
    if (!any || !status.ok()) break;
    absl::StatusOr<ChainsView> again = ReadChains(etcd, job);
    if (!again.ok()) {
      status = again.status();
      break;
    }
    view = *std::move(again);
    if (round + 1 == kRounds &&
        std::any_of(view.chains.begin(), view.chains.end(),
                    [&](const ChainConfig& c) { return c.Contains(shard); })) {
      status = absl::AbortedError(absl::StrCat("shard ", shard,
                                               " keeps rejoining chains; try again"));
    }
  }
  std::sort(result.changes.begin(), result.changes.end(),
            [](const ChainChange& a, const ChainChange& b) {
              return a.after.group < b.after.group;
            });
  if (status.ok()) return result;

  // Undo the marker when the drain is refused (the shard must keep a copy
  // of its group) or when nothing changed yet.
  const bool refused = absl::IsFailedPrecondition(status);
  std::string undo;
  if (!result.already_drained && (refused || result.changes.empty())) {
    absl::StatusOr<bool> deleted = etcd.Delete(drained_key);
    undo = deleted.ok() ? " The drained key was deleted again."
                        : absl::StrCat(" Deleting the drained key again failed (",
                                       deleted.status().message(), "): run psctl undrain ",
                                       shard, ".");
  } else if (!result.changes.empty()) {
    undo = absl::StrCat(" Shard ", shard, " stays drained: run psctl drain ", shard,
                        " again to finish, or psctl undrain ", shard, " to cancel.");
  }
  if (!result.changes.empty()) {
    absl::StrAppend(&undo, " It was already removed from the chains of groups ",
                    GroupList(result.changes), refused && !result.already_drained
                                                   ? "; it rejoins them as tail by itself."
                                                   : ".");
  }
  return absl::Status(status.code(), absl::StrCat("drain of shard ", shard, " stopped: ",
                                                  status.message(), ".", undo));
}

absl::StatusOr<bool> UndrainShard(etcd::EtcdClient& etcd, absl::string_view job,
                                  int shard) {
  RETURN_IF_ERROR(CheckArguments(job, shard));
  return etcd.Delete(chain::DrainedKey(job, shard));
}

}  // namespace shardtrain::ctl
