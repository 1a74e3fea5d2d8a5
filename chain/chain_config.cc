#include "chain/chain_config.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "chain/placement.h"
#include "common/status_macros.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "proto/replication.pb.h"

namespace shardtrain::chain {
namespace {

using Member = ChainConfig::Member;

// host:port with the longest DNS name (253) fits with room to spare; a
// longer one is corruption, not an address.
constexpr size_t kMaxAddressBytes = 512;

absl::Status ValidateMember(const Member& member) {
  if (member.shard < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("chain member has negative shard index ", member.shard));
  }
  if (member.address.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("chain member shard ", member.shard, " has no address"));
  }
  if (member.address.size() > kMaxAddressBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("chain member shard ", member.shard, " has a ",
                     member.address.size(), "-byte address; the limit is ",
                     kMaxAddressBytes));
  }
  if (member.incarnation == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chain member shard ", member.shard,
        " has incarnation 0; a live shard's incarnation is non-zero"));
  }
  return absl::OkStatus();
}

// Collects the text parser's first error instead of logging it.
class FirstError : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    if (error_.empty()) {
      error_ = absl::StrCat("column ", column + 1, " of line ", line + 1, ": ",
                            message);
    }
  }
  const std::string& error() const { return error_; }

 private:
  std::string error_;
};

absl::Status ParseText(absl::string_view text, absl::string_view what,
                       google::protobuf::Message* message) {
  if (text.size() > kMaxEncodedChainConfigBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is ", text.size(), " bytes; the limit is ",
                     kMaxEncodedChainConfigBytes));
  }
  FirstError errors;
  google::protobuf::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(std::string(text), message)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " does not parse: ", errors.error()));
  }
  return absl::OkStatus();
}

std::string PrintText(const google::protobuf::Message& message) {
  google::protobuf::TextFormat::Printer printer;
  printer.SetSingleLineMode(true);
  std::string text;
  printer.PrintToString(message, &text);
  return std::string(absl::StripTrailingAsciiWhitespace(text));
}

void ToProto(const Member& member, ChainMemberProto* proto) {
  proto->set_shard(member.shard);
  proto->set_address(member.address);
  proto->set_incarnation(member.incarnation);
}

Member FromProto(const ChainMemberProto& proto) {
  return Member{proto.shard(), proto.address(), proto.incarnation()};
}

// Every transition starts here: from a valid config that has a next epoch.
absl::Status CheckCanChange(const ChainConfig& config) {
  RETURN_IF_ERROR(ValidateChainConfig(config));
  if (config.epoch == std::numeric_limits<int64_t>::max()) {
    return absl::OutOfRangeError(absl::StrCat(
        "the chain of group ", config.group, " is at the last epoch"));
  }
  return absl::OkStatus();
}

}  // namespace

std::optional<size_t> ChainConfig::IndexOf(int shard) const {
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i].shard == shard) return i;
  }
  return std::nullopt;
}

std::optional<Member> ChainConfig::Successor(int shard) const {
  const std::optional<size_t> i = IndexOf(shard);
  if (!i.has_value() || *i + 1 == members.size()) return std::nullopt;
  return members[*i + 1];
}

std::optional<Member> ChainConfig::Predecessor(int shard) const {
  const std::optional<size_t> i = IndexOf(shard);
  if (!i.has_value() || *i == 0) return std::nullopt;
  return members[*i - 1];
}

absl::StatusOr<ChainConfig> ChainConfig::Remove(
    int shard, std::optional<uint64_t> incarnation) const {
  RETURN_IF_ERROR(CheckCanChange(*this));
  const std::optional<size_t> i = IndexOf(shard);
  if (!i.has_value()) {
    return absl::NotFoundError(absl::StrCat("shard ", shard,
                                            " is not in the chain of group ",
                                            group, " at epoch ", epoch));
  }
  if (incarnation.has_value() && members[*i].incarnation != *incarnation) {
    return absl::NotFoundError(absl::StrCat(
        "shard ", shard, " incarnation ", *incarnation,
        " is not in the chain of group ", group, " at epoch ", epoch,
        "; it holds incarnation ", members[*i].incarnation));
  }
  if (members.size() == 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", shard, " is the last member of the chain of group ", group,
        "; removing it would leave the group's partitions on no shard"));
  }
  ChainConfig next = *this;
  next.epoch = epoch + 1;
  next.members.erase(next.members.begin() + static_cast<std::ptrdiff_t>(*i));
  return next;
}

absl::StatusOr<ChainConfig> ChainConfig::AppendTail(const Member& member) const {
  RETURN_IF_ERROR(CheckCanChange(*this));
  RETURN_IF_ERROR(ValidateMember(member));
  if (const std::optional<size_t> i = IndexOf(member.shard); i.has_value()) {
    return absl::AlreadyExistsError(absl::StrCat(
        "shard ", member.shard, " is already in the chain of group ", group,
        " at epoch ", epoch, " (incarnation ", members[*i].incarnation,
        "); a restarted member must be removed before it rejoins"));
  }
  if (members.size() >= static_cast<size_t>(replicas)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the chain of group ", group, " already has its ", replicas,
        " members at epoch ", epoch));
  }
  ChainConfig next = *this;
  next.epoch = epoch + 1;
  next.members.push_back(member);
  return next;
}

absl::StatusOr<ChainConfig> ChainConfig::Reorder(const std::vector<int>& preferred) const {
  RETURN_IF_ERROR(CheckCanChange(*this));
  auto rank = [&preferred](const Member& m) {
    const auto it = std::find(preferred.begin(), preferred.end(), m.shard);
    return static_cast<size_t>(it - preferred.begin());  // size() when not named
  };
  ChainConfig next = *this;
  next.epoch = epoch + 1;
  std::stable_sort(next.members.begin(), next.members.end(),
                   [&rank](const Member& a, const Member& b) { return rank(a) < rank(b); });
  return next;
}

absl::StatusOr<ChainConfig> MakeChainConfig(int group, int replicas,
                                            std::vector<Member> members) {
  ChainConfig config;
  config.group = group;
  config.epoch = 1;
  config.replicas = replicas;
  config.members = std::move(members);
  RETURN_IF_ERROR(ValidateChainConfig(config));
  return config;
}

absl::Status ValidateChainConfig(const ChainConfig& config) {
  if (config.group < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("chain has negative group ", config.group));
  }
  if (config.epoch < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chain of group ", config.group, " has epoch ", config.epoch,
        "; epochs start at 1"));
  }
  if (config.replicas < 1 || config.replicas > kMaxReplicas) {
    return absl::InvalidArgumentError(
        absl::StrCat("chain of group ", config.group, " has replicas ",
                     config.replicas, "; supported: 1 to ", kMaxReplicas));
  }
  if (config.members.empty() ||
      config.members.size() > static_cast<size_t>(config.replicas)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chain of group ", config.group, " has ", config.members.size(),
        " members; it needs 1 to ", config.replicas));
  }
  for (size_t i = 0; i < config.members.size(); ++i) {
    RETURN_IF_ERROR(ValidateMember(config.members[i]));
    for (size_t j = 0; j < i; ++j) {
      if (config.members[j].shard == config.members[i].shard) {
        return absl::InvalidArgumentError(
            absl::StrCat("chain of group ", config.group, " lists shard ",
                         config.members[i].shard, " twice"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CheckChainFitsShards(const ChainConfig& config, int num_shards) {
  RETURN_IF_ERROR(ValidateReplicas(num_shards, config.replicas));
  if (config.group >= num_shards) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chain of group ", config.group, " does not fit a job of ", num_shards,
        " shards"));
  }
  for (const Member& member : config.members) {
    if (member.shard >= num_shards) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chain of group ", config.group, " lists shard ", member.shard,
          ", but the job has ", num_shards, " shards"));
    }
  }
  return absl::OkStatus();
}

std::string EncodeChainConfig(const ChainConfig& config) {
  ChainConfigProto proto;
  proto.set_group(config.group);
  proto.set_epoch(config.epoch);
  proto.set_replicas(config.replicas);
  for (const Member& member : config.members) {
    ToProto(member, proto.add_members());
  }
  return PrintText(proto);
}

absl::StatusOr<ChainConfig> DecodeChainConfig(absl::string_view text) {
  ChainConfigProto proto;
  RETURN_IF_ERROR(ParseText(text, "chain config", &proto));
  ChainConfig config;
  config.group = proto.group();
  config.epoch = proto.epoch();
  config.replicas = proto.replicas();
  config.members.reserve(proto.members_size());
  for (const ChainMemberProto& member : proto.members()) {
    config.members.push_back(FromProto(member));
  }
  RETURN_IF_ERROR(ValidateChainConfig(config));
  return config;
}

std::string EncodeChainMember(const Member& member) {
  ChainMemberProto proto;
  ToProto(member, &proto);
  return PrintText(proto);
}

absl::StatusOr<Member> DecodeChainMember(absl::string_view text) {
  ChainMemberProto proto;
  RETURN_IF_ERROR(ParseText(text, "chain member", &proto));
  Member member = FromProto(proto);
  RETURN_IF_ERROR(ValidateMember(member));
  return member;
}

}  // namespace shardtrain::chain
