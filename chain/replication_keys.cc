#include "chain/replication_keys.h"

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace shardtrain::chain {
namespace {

bool IsJobNameChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' ||
         c == '_' || c == '-';
}

// The index after `prefix` in `key`, when `key` is exactly prefix + a
// canonical non-negative decimal int.
absl::StatusOr<int> IndexAfter(absl::string_view prefix, absl::string_view key,
                               absl::string_view what) {
  absl::string_view digits = key;
  if (!absl::ConsumePrefix(&digits, prefix)) {
    return absl::InvalidArgumentError(
        absl::StrCat("key \"", absl::CEscape(key), "\" is not a ", what,
                     " key: it does not start with \"", prefix, "\""));
  }
  int index = 0;
  // Printing the number back refuses signs, spaces and leading zeros.
  const bool canonical = absl::SimpleAtoi(digits, &index) && index >= 0 &&
                         absl::StrCat(index) == digits;
  if (!canonical) {
    return absl::InvalidArgumentError(absl::StrCat(
        "key \"", absl::CEscape(key), "\" is not a ", what,
        " key: \"", absl::CEscape(digits), "\" is not a decimal index"));
  }
  return index;
}

}  // namespace

absl::Status ValidateJobName(absl::string_view job) {
  if (job.empty() || job.size() > kMaxJobNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job name must be 1 to ", kMaxJobNameBytes, " bytes, got ", job.size()));
  }
  for (char c : job) {
    if (!IsJobNameChar(c)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "job name \"", absl::CEscape(job),
          "\" may hold only letters, digits, '.', '_' and '-'"));
    }
  }
  return absl::OkStatus();
}

std::string JobPrefix(absl::string_view job) {
  return absl::StrCat("/shardtrain/", job, "/");
}

std::string ChainsPrefix(absl::string_view job) {
  return absl::StrCat(JobPrefix(job), "chains/");
}

std::string MembersPrefix(absl::string_view job) {
  return absl::StrCat(JobPrefix(job), "shards/");
}

std::string ChainKey(absl::string_view job, int group) {
  return absl::StrCat(ChainsPrefix(job), group);
}

std::string MemberKey(absl::string_view job, int shard) {
  return absl::StrCat(MembersPrefix(job), shard);
}

absl::StatusOr<int> GroupFromChainKey(absl::string_view job,
                                      absl::string_view key) {
  return IndexAfter(ChainsPrefix(job), key, "chain");
}

std::string DrainedPrefix(absl::string_view job) {
  return absl::StrCat(JobPrefix(job), "drained/");
}

std::string DrainedKey(absl::string_view job, int shard) {
  return absl::StrCat(DrainedPrefix(job), shard);
}

absl::StatusOr<int> ShardFromMemberKey(absl::string_view job,
                                       absl::string_view key) {
  return IndexAfter(MembersPrefix(job), key, "shard liveness");
}

}  // namespace shardtrain::chain
