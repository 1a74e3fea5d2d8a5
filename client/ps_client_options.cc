#include "client/ps_client_options.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "chain/placement.h"
#include "chain/replication_keys.h"
#include "common/payload.h"

namespace shardtrain::client {
namespace {

absl::Status Invalid(OptionName name, absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(name(field), " ", why));
}

// A check's own error, prefixed with the option's name.
absl::Status Named(OptionName name, absl::string_view field, const absl::Status& status) {
  return absl::InvalidArgumentError(absl::StrCat(name(field), ": ", status.message()));
}

// `field` is a duration that must be positive (or >= 0 with zero_ok).
absl::Status CheckDuration(OptionName name, absl::string_view field, absl::Duration value,
                           bool zero_ok) {
  if (value > absl::ZeroDuration() || (zero_ok && value == absl::ZeroDuration())) {
    if (value != absl::InfiniteDuration()) return absl::OkStatus();
  }
  return Invalid(name, field,
                 absl::StrCat("must be a finite time ", zero_ok ? ">= 0" : "> 0", ", got ",
                              absl::FormatDuration(value)));
}

}  // namespace

absl::Status ValidatePsClientOptions(const PsClientOptions& options, OptionName name) {
  if (options.servers.empty()) {
    return Invalid(name, "servers", "is empty: give the shard addresses");
  }
  if (options.num_workers > static_cast<uint32_t>(std::numeric_limits<int32_t>::max())) {
    return Invalid(name, "num_workers", absl::StrCat("must be at most 2^31 - 1, got ",
                                                     options.num_workers));
  }
  if (options.num_workers > 0 && options.worker_index >= options.num_workers) {
    return Invalid(name, "worker_index",
                   absl::StrCat("must be in [0, ", options.num_workers - 1, "] (",
                                name("num_workers"), " is ", options.num_workers, "), got ",
                                options.worker_index));
  }
  if (common::DTypeSize(options.wire_dtype) == 0) {
    return Invalid(name, "wire_dtype", "must be f32, f16 or bf16");
  }
  if (!(options.topk_ratio >= 0 && options.topk_ratio <= 1)) {
    return Invalid(name, "topk_ratio",
                   absl::StrCat("must be 0 (dense) or in (0, 1], got ", options.topk_ratio));
  }
  if (options.channels_per_shard < 1 || options.channels_per_shard > 64) {
    return Invalid(name, "channels_per_shard",
                   absl::StrCat("must be in [1, 64], got ", options.channels_per_shard));
  }
  struct Timeout {
    absl::string_view field;
    absl::Duration value;
    bool zero_ok;
  };
  for (const Timeout& t : {Timeout{"rpc_timeout", options.rpc_timeout, false},
                           Timeout{"pull_timeout", options.pull_timeout, false},
                           Timeout{"reconnect_timeout", options.reconnect_timeout, true},
                           Timeout{"initial_backoff", options.initial_backoff, false},
                           Timeout{"max_backoff", options.max_backoff, false},
                           Timeout{"keepalive_time", options.keepalive_time, true},
                           Timeout{"keepalive_timeout", options.keepalive_timeout, true},
                           Timeout{"member_timeout", options.member_timeout, false}}) {
    if (absl::Status valid = CheckDuration(name, t.field, t.value, t.zero_ok); !valid.ok()) {
      return valid;
    }
  }
  if (options.max_backoff < options.initial_backoff) {
    return Invalid(name, "max_backoff",
                   absl::StrCat("must be at least ", name("initial_backoff"), " (",
                                absl::FormatDuration(options.initial_backoff), "), got ",
                                absl::FormatDuration(options.max_backoff)));
  }
  if (options.max_partition_elements < 1 ||
      options.max_partition_elements > (int64_t{1} << 32)) {
    return Invalid(name, "max_partition_elements",
                   absl::StrCat("must be in [1, 2^32], got ", options.max_partition_elements));
  }
  if (options.max_message_bytes < (1 << 20) ||
      options.max_message_bytes > (kMaxMessageMb << 20)) {
    return Invalid(name, "max_message_bytes",
                   absl::StrCat("must be 1 to ", kMaxMessageMb, " MiB, got ",
                                options.max_message_bytes, " bytes"));
  }
  const int num_shards = static_cast<int>(options.servers.size());
  if (absl::Status valid = chain::ValidateReplicas(num_shards, options.replicas); !valid.ok()) {
    return Named(name, "replicas", valid);
  }
  if (options.replicas > 1 && options.etcd_endpoints.empty()) {
    return Invalid(name, "etcd_endpoints",
                   absl::StrCat("is required with ", options.replicas,
                                " replicas: the worker routes by the chains kept there"));
  }
  if (absl::Status valid = chain::ValidateJobName(options.job); !valid.ok()) {
    return Named(name, "job", valid);
  }
  return absl::OkStatus();
}

absl::Status ValidatePsClientOptions(const PsClientOptions& options) {
  return ValidatePsClientOptions(options,
                                 [](absl::string_view field) { return std::string(field); });
}

}  // namespace shardtrain::client
