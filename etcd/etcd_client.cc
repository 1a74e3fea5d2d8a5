#include "etcd/etcd_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/reconnect.h"
#include "common/status_macros.h"
#include "etcd/internal/connection.h"

namespace shardtrain::etcd {

namespace {

using internal::Connection;

KeyValue FromProto(const mvccpb::KeyValue& kv) {
  KeyValue out;
  out.key = kv.key();
  out.value = kv.value();
  out.create_revision = kv.create_revision();
  out.mod_revision = kv.mod_revision();
  out.version = kv.version();
  out.lease = kv.lease();
  return out;
}

absl::Status CheckKey(absl::string_view key) {
  if (key.empty()) return absl::InvalidArgumentError("etcd: an empty key is not allowed");
  return absl::OkStatus();
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& endpoint,
                                           const EtcdClient::Options& options) {
  grpc::ChannelArguments args;
  // Reconnect quickly after an etcd restart instead of gRPC's default
  // backoff of up to two minutes, but give each attempt 2 s: an etcd that
  // is starting accepts connections before it answers them, and attempts
  // cut off after 100 ms kept a watch from reconnecting to a restarted
  // etcd for over 13 s on a loaded machine.
  common::SetQuickReconnect(args, options.max_reconnect_backoff, absl::Seconds(2));
  // Notice a peer that stopped answering while a watch is open. etcd
  // refuses pings more often than every 5 s (--grpc-keepalive-min-time)
  // and pings without a call in flight.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 0);
  // A channel of its own per client, so that one client's keepalive
  // settings and failures do not leak into another's.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(
      endpoint,
      options.credentials != nullptr ? options.credentials : grpc::InsecureChannelCredentials(),
      args);
}

}  // namespace

std::string PrefixRangeEnd(absl::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    unsigned char last = static_cast<unsigned char>(end.back());
    if (last < 0xff) {
      end.back() = static_cast<char>(last + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');
}

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Create(const Options& options) {
  if (options.rpc_timeout <= absl::ZeroDuration() ||
      options.connect_timeout <= absl::ZeroDuration() ||
      options.max_reconnect_backoff < absl::Milliseconds(1)) {
    return absl::InvalidArgumentError(
        "etcd: rpc_timeout, connect_timeout and max_reconnect_backoff must be positive");
  }
  std::vector<std::string> endpoints;
  for (absl::string_view e : absl::StrSplit(options.endpoints, ',', absl::SkipWhitespace())) {
    endpoints.emplace_back(absl::StripAsciiWhitespace(e));
  }
  if (endpoints.empty()) return absl::InvalidArgumentError("etcd: no endpoints given");
  std::vector<std::unique_ptr<Connection::Member>> members;
  for (const std::string& endpoint : endpoints) {
    members.push_back(
        std::make_unique<Connection::Member>(endpoint, MakeChannel(endpoint, options)));
  }
  // The others stay idle until a failure moves the connection to them.
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i]->channel->WaitForConnected(
            absl::ToChronoTime(absl::Now() + options.connect_timeout))) {
      return absl::WrapUnique(new EtcdClient(
          std::make_shared<Connection>(std::move(members), i, options.rpc_timeout)));
    }
  }
  return absl::UnavailableError(absl::StrCat(
      "etcd: no endpoint accepted a connection within ",
      absl::FormatDuration(options.connect_timeout), ": ", absl::StrJoin(endpoints, ","),
      options.credentials != nullptr
          ? " (over TLS: does etcd serve https, does its certificate verify against the CA "
            "given, and is this client's certificate one etcd trusts?)"
          : " (plaintext: an etcd that serves https needs a CA, --etcd_ca)"));
}

EtcdClient::EtcdClient(std::shared_ptr<Connection> connection)
    : connection_(std::move(connection)) {}

EtcdClient::~EtcdClient() = default;

const std::string& EtcdClient::endpoint() const { return connection_->current().endpoint; }

absl::StatusOr<KeyValue> EtcdClient::Get(absl::string_view key) {
  RETURN_IF_ERROR(CheckKey(key));
  etcdserverpb::RangeRequest request;
  request.set_key(std::string(key));
  etcdserverpb::RangeResponse response;
  const Connection::Member& member = connection_->current();
  grpc::ClientContext context;
  connection_->Prepare(&context);
  RETURN_IF_ERROR(
      connection_->Check(member, "Range", member.kv->Range(&context, request, &response)));
  if (response.kvs_size() == 0) {
    return absl::NotFoundError(absl::StrCat("etcd: no key ", key));
  }
  return FromProto(response.kvs(0));
}

absl::StatusOr<RangeResult> EtcdClient::GetPrefix(absl::string_view prefix) {
  etcdserverpb::RangeRequest request;
  request.set_key(prefix.empty() ? std::string(1, '\0') : std::string(prefix));
  request.set_range_end(PrefixRangeEnd(prefix));
  etcdserverpb::RangeResponse response;
  const Connection::Member& member = connection_->current();
  grpc::ClientContext context;
  connection_->Prepare(&context);
  RETURN_IF_ERROR(
      connection_->Check(member, "Range", member.kv->Range(&context, request, &response)));
  RangeResult result;
  result.revision = response.header().revision();
  result.kvs.reserve(response.kvs_size());
  for (const mvccpb::KeyValue& kv : response.kvs()) result.kvs.push_back(FromProto(kv));
  return result;
}

absl::StatusOr<int64_t> EtcdClient::Put(absl::string_view key, absl::string_view value,
                                        int64_t lease) {
  RETURN_IF_ERROR(CheckKey(key));
  etcdserverpb::PutRequest request;
  request.set_key(std::string(key));
  request.set_value(std::string(value));
  request.set_lease(lease);
  etcdserverpb::PutResponse response;
  const Connection::Member& member = connection_->current();
  grpc::ClientContext context;
  connection_->Prepare(&context);
  RETURN_IF_ERROR(connection_->Check(member, "Put", member.kv->Put(&context, request, &response)));
  return response.header().revision();
}

absl::StatusOr<bool> EtcdClient::Delete(absl::string_view key) {
  RETURN_IF_ERROR(CheckKey(key));
  etcdserverpb::DeleteRangeRequest request;
  request.set_key(std::string(key));
  etcdserverpb::DeleteRangeResponse response;
  const Connection::Member& member = connection_->current();
  grpc::ClientContext context;
  connection_->Prepare(&context);
  RETURN_IF_ERROR(connection_->Check(member, "DeleteRange",
                                     member.kv->DeleteRange(&context, request, &response)));
  return response.deleted() > 0;
}

absl::StatusOr<CasResult> EtcdClient::CompareAndSwap(absl::string_view key,
                                                     int64_t expected_mod_revision,
                                                     absl::string_view new_value, int64_t lease) {
  RETURN_IF_ERROR(CheckKey(key));
  if (expected_mod_revision < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd: expected_mod_revision must be >= 0, got ", expected_mod_revision));
  }
  etcdserverpb::TxnRequest request;
  // An absent key compares as mod_revision 0, so one comparison covers both
  // "unchanged since I read it" and "must not exist".
  etcdserverpb::Compare* compare = request.add_compare();
  compare->set_result(etcdserverpb::Compare::EQUAL);
  compare->set_target(etcdserverpb::Compare::MOD);
  compare->set_key(std::string(key));
  compare->set_mod_revision(expected_mod_revision);
  etcdserverpb::PutRequest* put = request.add_success()->mutable_request_put();
  put->set_key(std::string(key));
  put->set_value(std::string(new_value));
  put->set_lease(lease);
  request.add_failure()->mutable_request_range()->set_key(std::string(key));

  etcdserverpb::TxnResponse response;
  const Connection::Member& member = connection_->current();
  grpc::ClientContext context;
  connection_->Prepare(&context);
  RETURN_IF_ERROR(connection_->Check(member, "Txn", member.kv->Txn(&context, request, &response)));
  CasResult result;
  result.succeeded = response.succeeded();
  result.revision = response.header().revision();
  if (!result.succeeded) {
    if (response.responses_size() != 1 || !response.responses(0).has_response_range()) {
      return absl::InternalError(absl::StrCat("etcd ", member.endpoint,
                                              " Txn: a failed compare answered without the range"
                                              " it was asked for"));
    }
    const etcdserverpb::RangeResponse& range = response.responses(0).response_range();
    if (range.kvs_size() > 0) result.current = FromProto(range.kvs(0));
  }
  return result;
}

absl::StatusOr<Lease> EtcdClient::GrantLease(absl::Duration ttl) {
  const int64_t seconds = absl::ToInt64Seconds(absl::Ceil(ttl, absl::Seconds(1)));
  if (seconds <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd: a lease ttl must be positive, got ", absl::FormatDuration(ttl)));
  }
  etcdserverpb::LeaseGrantRequest request;
  request.set_ttl(seconds);
  etcdserverpb::LeaseGrantResponse response;
  const Connection::Member& member = connection_->current();
  grpc::ClientContext context;
  connection_->Prepare(&context);
  RETURN_IF_ERROR(connection_->Check(member, "LeaseGrant",
                                     member.lease->LeaseGrant(&context, request, &response)));
  if (!response.error().empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("etcd ", member.endpoint, " LeaseGrant: ", response.error()));
  }
  if (response.id() == 0 || response.ttl() <= 0) {
    return absl::InternalError(absl::StrCat("etcd ", member.endpoint,
                                            " LeaseGrant: granted id ", response.id(),
                                            " with ttl ", response.ttl()));
  }
  return Lease{response.id(), absl::Seconds(response.ttl())};
}

absl::Status EtcdClient::RevokeLease(int64_t lease_id) {
  etcdserverpb::LeaseRevokeRequest request;
  request.set_id(lease_id);
  etcdserverpb::LeaseRevokeResponse response;
  const Connection::Member& member = connection_->current();
  grpc::ClientContext context;
  connection_->Prepare(&context);
  return connection_->Check(member, "LeaseRevoke",
                            member.lease->LeaseRevoke(&context, request, &response));
}

std::unique_ptr<LeaseKeeper> EtcdClient::KeepLeaseAlive(const Lease& lease,
                                                        LeaseKeeper::LossCallback on_lost) {
  return std::unique_ptr<LeaseKeeper>(new LeaseKeeper(connection_, lease, std::move(on_lost)));
}

std::unique_ptr<Watcher> EtcdClient::Watch(absl::string_view prefix, int64_t start_revision,
                                           Watcher::EventCallback on_event,
                                           Watcher::ErrorCallback on_error) {
  return std::unique_ptr<Watcher>(new Watcher(connection_, std::string(prefix), start_revision,
                                              std::move(on_event), std::move(on_error)));
}

}  // namespace shardtrain::etcd
