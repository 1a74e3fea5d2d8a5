#include "etcd/lease_keeper.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "etcd/internal/connection.h"
#include "glog/logging.h"

namespace shardtrain::etcd {
namespace {

// How soon a failed refresh is retried (never later than the normal interval).
constexpr absl::Duration kRetryAfterFailure = absl::Milliseconds(200);

}  // namespace

// Threading: one thread per keeper with the synchronous API, and one short
// LeaseKeepAlive stream per round (a request, its answer, half-close). A
// refresh is due only every ttl/3, so a stream per round costs one HTTP/2
// stream on the shared connection, and in return every round has its own
// deadline: a stopped etcd can never hold the keeper past the point where
// it must report the loss, and stopping needs only to cancel the one round
// in flight.
LeaseKeeper::LeaseKeeper(std::shared_ptr<internal::Connection> connection, Lease lease,
                         LossCallback on_lost)
    : connection_(std::move(connection)),
      lease_(lease),
      on_lost_(std::move(on_lost)),
      thread_([this] { Run(); }) {}

LeaseKeeper::~LeaseKeeper() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    if (in_flight_ != nullptr) in_flight_->TryCancel();
  }
  thread_.join();
}

bool LeaseKeeper::alive() const {
  absl::MutexLock lock(&mu_);
  return alive_;
}

int64_t LeaseKeeper::refreshes() const {
  absl::MutexLock lock(&mu_);
  return refreshes_;
}

absl::Status LeaseKeeper::RefreshOnce(const internal::Member& member, absl::Duration timeout,
                                      int64_t* ttl_seconds) {
  grpc::ClientContext context;
  connection_->Prepare(&context, timeout);
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::CancelledError("lease keeper stopping");
    in_flight_ = &context;
  }
  etcdserverpb::LeaseKeepAliveRequest request;
  request.set_id(lease_.id);
  etcdserverpb::LeaseKeepAliveResponse response;
  grpc::Status status;
  bool answered = false;
  {
    std::unique_ptr<grpc::ClientReaderWriter<etcdserverpb::LeaseKeepAliveRequest,
                                             etcdserverpb::LeaseKeepAliveResponse>>
        stream = member.lease->LeaseKeepAlive(&context);
    answered = stream->Write(request) && stream->Read(&response);
    stream->WritesDone();
    status = stream->Finish();
  }
  {
    absl::MutexLock lock(&mu_);
    in_flight_ = nullptr;
  }
  if (answered) {
    // The answer is what counts; etcd closing its half late changes nothing.
    *ttl_seconds = response.ttl();
    return absl::OkStatus();
  }
  if (status.ok()) {
    absl::Status unanswered = absl::UnavailableError(absl::StrCat(
        "etcd ", member.endpoint, " LeaseKeepAlive: stream ended without an answer"));
    connection_->MemberFailed(member, unanswered);
    return unanswered;
  }
  return connection_->Check(member, "LeaseKeepAlive", status);
}

void LeaseKeeper::Run() {
  const absl::Duration interval = lease_.ttl / 3;
  // Until the first refresh, the lease counts as fresh when the keeper starts.
  absl::Time last_ok_sent = absl::Now();
  absl::Status last_error = absl::UnavailableError("no refresh attempted");
  absl::Status lost;
  while (true) {
    const absl::Time sent = absl::Now();
    const absl::Duration left = last_ok_sent + lease_.ttl - sent;
    if (left <= absl::ZeroDuration()) {
      lost = absl::Status(last_error.code(),
                          absl::StrCat("lease ", lease_.id, " not refreshed for its ttl of ",
                                       absl::FormatDuration(lease_.ttl),
                                       "; last error: ", last_error.message()));
      break;
    }
    // With other members to move to, a round that waits longer than the
    // refresh interval is given up, so that a stopped member (whose
    // connection stays open) leaves time to refresh through another.
    absl::Duration timeout = std::min(connection_->rpc_timeout(), left);
    if (connection_->size() > 1) timeout = std::min(timeout, interval);
    const internal::Member* member = &connection_->current();
    int64_t ttl_seconds = 0;
    absl::Status status = RefreshOnce(*member, timeout, &ttl_seconds);
    absl::Duration wait = interval;
    if (status.ok()) {
      if (ttl_seconds <= 0) {
        lost = absl::NotFoundError(absl::StrCat("etcd ", member->endpoint, ": lease ",
                                                lease_.id, " has expired"));
        break;
      }
      last_ok_sent = sent;
      absl::MutexLock lock(&mu_);
      ++refreshes_;
    } else {
      {
        absl::MutexLock lock(&mu_);
        if (stopping_) return;
      }
      LOG(WARNING) << "lease " << lease_.id << " refresh failed: " << status;
      last_error = status;
      // Retry soon, but check for the loss as soon as the ttl has run out.
      wait = std::min({interval, kRetryAfterFailure,
                       std::max(last_ok_sent + lease_.ttl - absl::Now(), absl::ZeroDuration())});
      // The round failed over to another member: try it at once.
      if (&connection_->current() != member) wait = absl::ZeroDuration();
    }
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), wait);
    if (stopping_) return;
  }
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    alive_ = false;
  }
  LOG(WARNING) << lost;
  if (on_lost_) on_lost_(lost);
}

}  // namespace shardtrain::etcd
