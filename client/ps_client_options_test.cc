#include "client/ps_client_options.h"

#include <cmath>
#include <functional>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardtrain::client {
namespace {

using ::testing::HasSubstr;

PsClientOptions Good() {
  PsClientOptions options;
  options.servers = {"127.0.0.1:7000", "127.0.0.1:7001"};
  options.num_workers = 2;
  options.worker_index = 1;
  return options;
}

// The error for `options` changed by `change`, or OK.
absl::Status With(const std::function<void(PsClientOptions&)>& change) {
  PsClientOptions options = Good();
  change(options);
  return ValidatePsClientOptions(options);
}

TEST(PsClientOptionsTest, TheDefaultsWithServersAreValid) {
  EXPECT_TRUE(ValidatePsClientOptions(Good()).ok());
  PsClientOptions defaults;
  defaults.servers = {"a:1"};
  EXPECT_TRUE(ValidatePsClientOptions(defaults).ok());
  // Edges that are allowed: no worker count check, top-k 1, 64 channels,
  // no reconnect wait, keepalive off, 2047 MiB messages.
  EXPECT_TRUE(With([](PsClientOptions& o) {
                o.num_workers = 0;
                o.worker_index = 7;
                o.topk_ratio = 1;
                o.channels_per_shard = 64;
                o.reconnect_timeout = absl::ZeroDuration();
                o.keepalive_time = o.keepalive_timeout = absl::ZeroDuration();
                o.max_message_bytes = kMaxMessageMb << 20;
                o.max_partition_elements = int64_t{1} << 32;
              }).ok());
}

TEST(PsClientOptionsTest, EachOptionOutOfItsRangeIsNamed) {
  struct Case {
    std::function<void(PsClientOptions&)> change;
    std::string message;
  };
  const Case cases[] = {
      {[](PsClientOptions& o) { o.servers.clear(); }, "servers is empty"},
      {[](PsClientOptions& o) { o.worker_index = 2; },
       "worker_index must be in [0, 1] (num_workers is 2), got 2"},
      {[](PsClientOptions& o) { o.num_workers = 1u << 31; }, "num_workers must be at most"},
      {[](PsClientOptions& o) { o.wire_dtype = DTYPE_UNSPECIFIED; }, "wire_dtype must be f32"},
      {[](PsClientOptions& o) { o.topk_ratio = 1.5; }, "topk_ratio must be 0 (dense)"},
      {[](PsClientOptions& o) { o.topk_ratio = std::nan(""); }, "topk_ratio"},
      {[](PsClientOptions& o) { o.channels_per_shard = 0; }, "channels_per_shard must be in"},
      {[](PsClientOptions& o) { o.channels_per_shard = 65; }, "channels_per_shard"},
      {[](PsClientOptions& o) { o.rpc_timeout = absl::ZeroDuration(); },
       "rpc_timeout must be a finite time > 0, got 0"},
      {[](PsClientOptions& o) { o.pull_timeout = absl::InfiniteDuration(); }, "pull_timeout"},
      {[](PsClientOptions& o) { o.reconnect_timeout = absl::Seconds(-1); },
       "reconnect_timeout must be a finite time >= 0"},
      {[](PsClientOptions& o) { o.keepalive_timeout = absl::Seconds(-1); }, "keepalive_timeout"},
      {[](PsClientOptions& o) { o.member_timeout = absl::ZeroDuration(); }, "member_timeout"},
      {[](PsClientOptions& o) { o.max_backoff = absl::Milliseconds(10); },
       "max_backoff must be at least initial_backoff"},
      {[](PsClientOptions& o) { o.max_partition_elements = 0; }, "max_partition_elements"},
      {[](PsClientOptions& o) { o.max_message_bytes = 1000; },
       "max_message_bytes must be 1 to 2047 MiB, got 1000 bytes"},
      {[](PsClientOptions& o) { o.replicas = 3; }, "replicas: "},
      {[](PsClientOptions& o) { o.replicas = 2; },
       "etcd_endpoints is required with 2 replicas"},
      {[](PsClientOptions& o) { o.job = "a/b"; }, "job: "},
  };
  for (const Case& c : cases) {
    const absl::Status status = With(c.change);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(status.message(), HasSubstr(c.message));
  }
  // Replicas with their etcd endpoints are fine.
  EXPECT_TRUE(With([](PsClientOptions& o) {
                o.replicas = 2;
                o.etcd_endpoints = "127.0.0.1:2379";
              }).ok());
}

TEST(PsClientOptionsTest, ErrorsNameTheOptionAsTheCallerKnowsIt) {
  PsClientOptions options = Good();
  options.rpc_timeout = absl::ZeroDuration();
  auto flag = [](absl::string_view field) {
    return field == "rpc_timeout" ? std::string("--rpc_timeout_s") : absl::StrCat("--", field);
  };
  absl::Status status = ValidatePsClientOptions(options, flag);
  EXPECT_THAT(status.message(), HasSubstr("--rpc_timeout_s must be"));
  options = Good();
  options.worker_index = 5;
  status = ValidatePsClientOptions(options, flag);
  EXPECT_THAT(status.message(), HasSubstr("--worker_index must be in [0, 1] (--num_workers is 2)"));
}

}  // namespace
}  // namespace shardtrain::client
