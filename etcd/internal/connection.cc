#include "etcd/internal/connection.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "glog/logging.h"

namespace shardtrain::etcd::internal {

Member::Member(std::string endpoint_in, std::shared_ptr<grpc::Channel> channel_in)
    : endpoint(std::move(endpoint_in)),
      channel(std::move(channel_in)),
      kv(etcdserverpb::KV::NewStub(channel)),
      lease(etcdserverpb::Lease::NewStub(channel)),
      watch(etcdserverpb::Watch::NewStub(channel)) {}

Connection::Connection(std::vector<std::unique_ptr<Member>> members, size_t first,
                       absl::Duration rpc_timeout)
    : members_(std::move(members)), rpc_timeout_(rpc_timeout), current_(first) {}

const Connection::Member& Connection::current() const { return *members_[current_.load()]; }

void Connection::Prepare(grpc::ClientContext* context) const { Prepare(context, rpc_timeout_); }

void Connection::Prepare(grpc::ClientContext* context, absl::Duration timeout) const {
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

void Connection::RequireLeader(grpc::ClientContext* context) {
  // rpctypes.MetadataRequireLeaderKey: etcd answers UNAVAILABLE "etcdserver:
  // no leader".
  context->AddMetadata("hasleader", "true");
}

absl::Status Connection::Check(const Member& member, absl::string_view method,
                               const grpc::Status& status) {
  const absl::Status converted = common::FromGrpcStatus(status);
  if (converted.ok()) return converted;
  absl::Status named(converted.code(), absl::StrCat("etcd ", member.endpoint, " ", method, ": ",
                                                   converted.message()));
  MemberFailed(member, named);
  return named;
}

bool Connection::MemberFailed(const Member& member, const absl::Status& why) {
  if (members_.size() < 2 || (!absl::IsUnavailable(why) && !absl::IsDeadlineExceeded(why))) {
    return false;
  }
  size_t index = 0;
  while (index < members_.size() && members_[index].get() != &member) ++index;
  if (index == members_.size()) return false;
  size_t expected = index;
  const size_t next = (index + 1) % members_.size();
  // Only the first of several calls failing on the same member moves on.
  if (!current_.compare_exchange_strong(expected, next)) return false;
  LOG(WARNING) << "etcd: moving from " << member.endpoint << " to " << members_[next]->endpoint
               << " (" << why << ")";
  absl::MutexLock lock(&listeners_mu_);
  for (const auto& [id, listener] : listeners_) listener();
  return true;
}

int Connection::AddListener(std::function<void()> listener) {
  absl::MutexLock lock(&listeners_mu_);
  const int id = next_listener_++;
  listeners_.emplace(id, std::move(listener));
  return id;
}

void Connection::RemoveListener(int id) {
  absl::MutexLock lock(&listeners_mu_);
  listeners_.erase(id);
}

}  // namespace shardtrain::etcd::internal
