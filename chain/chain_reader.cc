#include "chain/chain_reader.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "chain/replication_keys.h"
#include "common/status_macros.h"

namespace shardtrain::chain {
namespace {

// The shard index a drained key names; nullopt for any other key.
std::optional<int> ShardFromDrainedKey(absl::string_view job, absl::string_view key) {
  absl::string_view digits = key;
  if (!absl::ConsumePrefix(&digits, DrainedPrefix(job))) return std::nullopt;
  int shard = 0;
  if (!absl::SimpleAtoi(digits, &shard) || shard < 0 || absl::StrCat(shard) != digits) {
    return std::nullopt;
  }
  return shard;
}

}  // namespace

absl::StatusOr<ChainsView> ReadChains(etcd::EtcdClient& etcd, absl::string_view job) {
  RETURN_IF_ERROR(ValidateJobName(job));
  // One read of the whole job: chains, liveness and drained keys agree.
  ASSIGN_OR_RETURN(etcd::RangeResult range, etcd.GetPrefix(JobPrefix(job)));
  ChainsView view;
  view.job = std::string(job);
  view.revision = range.revision;
  for (const etcd::KeyValue& kv : range.kvs) {
    if (absl::StartsWith(kv.key, ChainsPrefix(job))) {
      absl::StatusOr<int> group = GroupFromChainKey(job, kv.key);
      if (!group.ok()) {
        view.bad_keys.push_back({kv.key, std::string(group.status().message())});
        continue;
      }
      absl::StatusOr<ChainConfig> chain = DecodeChainConfig(kv.value);
      if (!chain.ok()) {
        view.bad_keys.push_back({kv.key, std::string(chain.status().message())});
      } else if (chain->group != *group) {
        view.bad_keys.push_back({kv.key, absl::StrCat("holds the chain of group ", chain->group)});
      } else {
        view.chains.push_back(*std::move(chain));
      }
    } else if (absl::StartsWith(kv.key, MembersPrefix(job))) {
      absl::StatusOr<int> shard = ShardFromMemberKey(job, kv.key);
      if (!shard.ok()) {
        view.bad_keys.push_back({kv.key, std::string(shard.status().message())});
        continue;
      }
      absl::StatusOr<ChainConfig::Member> member = DecodeChainMember(kv.value);
      if (!member.ok()) {
        view.bad_keys.push_back({kv.key, std::string(member.status().message())});
      } else if (member->shard != *shard) {
        view.bad_keys.push_back({kv.key, absl::StrCat("holds the liveness of shard ", member->shard)});
      } else {
        view.live[*shard] = *std::move(member);
      }
    } else if (absl::StartsWith(kv.key, DrainedPrefix(job))) {
      const std::optional<int> shard = ShardFromDrainedKey(job, kv.key);
      if (!shard.has_value()) {
        view.bad_keys.push_back({kv.key, "not a drained key: bad shard index"});
        continue;
      }
      view.drained[*shard] = kv.value;
    }
    // Other keys of the job are not the chains' business.
  }
  std::sort(view.chains.begin(), view.chains.end(),
            [](const ChainConfig& a, const ChainConfig& b) { return a.group < b.group; });
  return view;
}

absl::StatusOr<ChainConfig> ReadChain(etcd::EtcdClient& etcd, absl::string_view job, int group) {
  ASSIGN_OR_RETURN(const etcd::KeyValue kv, etcd.Get(ChainKey(job, group)));
  return DecodeChainConfig(kv.value);
}

absl::StatusOr<std::vector<ChainConfig>> ReadAllChains(etcd::EtcdClient& etcd,
                                                       absl::string_view job, int num_groups) {
  ASSIGN_OR_RETURN(ChainsView view, ReadChains(etcd, job));
  for (int g = 0; g < num_groups; ++g) {
    if (g >= static_cast<int>(view.chains.size()) || view.chains[g].group != g) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", job, " has no chain for group ", g));
    }
  }
  view.chains.resize(num_groups);
  return std::move(view.chains);
}

}  // namespace shardtrain::chain
