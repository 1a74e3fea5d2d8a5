#include "etcd/watcher.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "etcd/etcd_client.h"
#include "etcd/internal/connection.h"
#include "glog/logging.h"

namespace shardtrain::etcd {
namespace {

constexpr absl::Duration kFirstBackoff = absl::Milliseconds(100);
constexpr absl::Duration kMaxBackoff = absl::Seconds(2);

WatchEvent FromProto(const mvccpb::Event& event) {
  WatchEvent out;
  out.type = event.type() == mvccpb::Event::DELETE ? WatchEvent::Type::kDelete
                                                   : WatchEvent::Type::kPut;
  out.key = event.kv().key();
  if (out.type == WatchEvent::Type::kPut) out.value = event.kv().value();
  out.mod_revision = event.kv().mod_revision();
  return out;
}

}  // namespace

// Threading: one thread per watcher with the synchronous API. A watch is
// one long stream that mostly waits, so a blocked Read costs nothing but
// the thread; the destructor unblocks it with TryCancel. Callbacks then run
// on that thread in stream order without any queue between them.
Watcher::Watcher(std::shared_ptr<internal::Connection> connection, std::string prefix,
                 int64_t start_revision, EventCallback on_event, ErrorCallback on_error)
    : connection_(std::move(connection)),
      prefix_(std::move(prefix)),
      on_event_(std::move(on_event)),
      on_error_(std::move(on_error)),
      next_revision_(std::max<int64_t>(start_revision, 0)),
      // A stream open on a member the connection moved away from (another
      // call found it dead or cut off) is ended, so the watch resumes on
      // the new member instead of waiting on a stopped one.
      listener_(connection_->AddListener([this] {
        absl::MutexLock lock(&mu_);
        if (in_flight_ != nullptr && in_flight_member_ != &connection_->current()) {
          in_flight_->TryCancel();
        }
      })),
      thread_([this] { Run(); }) {}

Watcher::~Watcher() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    if (in_flight_ != nullptr) in_flight_->TryCancel();
  }
  thread_.join();
  connection_->RemoveListener(listener_);
}

int64_t Watcher::next_revision() const {
  absl::MutexLock lock(&mu_);
  return next_revision_;
}

int64_t Watcher::streams() const {
  absl::MutexLock lock(&mu_);
  return streams_;
}

bool Watcher::Stopping() const {
  absl::MutexLock lock(&mu_);
  return stopping_;
}

void Watcher::Run() {
  absl::Duration backoff = kFirstBackoff;
  while (true) {
    bool created = false;
    const internal::Member* member = &connection_->current();
    absl::Status status = RunStream(*member, &created);
    const bool moved = &connection_->current() != member;
    if (Stopping()) return;
    if (absl::IsFailedPrecondition(status) || absl::IsOutOfRange(status) ||
        absl::IsDataLoss(status)) {
      LOG(WARNING) << "watch on " << prefix_ << " ended: " << status;
      if (on_error_) on_error_(status);
      return;
    }
    if (created || moved) backoff = kFirstBackoff;
    LOG(WARNING) << "watch on " << prefix_ << " broke (" << status << "); resuming from revision "
                 << next_revision() << " in " << absl::FormatDuration(backoff);
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), backoff);
    if (stopping_) return;
    backoff = std::min(backoff * 2, kMaxBackoff);
  }
}

absl::Status Watcher::RunStream(const internal::Member& member, bool* created) {
  grpc::ClientContext context;  // No deadline: a watch is open-ended.
  internal::Connection::RequireLeader(&context);
  int64_t start = 0;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::OkStatus();
    in_flight_ = &context;
    in_flight_member_ = &member;
    start = next_revision_;
    ++streams_;
  }
  etcdserverpb::WatchRequest request;
  etcdserverpb::WatchCreateRequest* create = request.mutable_create_request();
  create->set_key(prefix_.empty() ? std::string(1, '\0') : prefix_);
  create->set_range_end(PrefixRangeEnd(prefix_));
  create->set_start_revision(start);

  absl::Status ended;  // Set when etcd refused the watch.
  grpc::Status finished;
  {
    std::unique_ptr<grpc::ClientReaderWriter<etcdserverpb::WatchRequest,
                                             etcdserverpb::WatchResponse>>
        stream = member.watch->Watch(&context);
    etcdserverpb::WatchResponse response;
    if (stream->Write(request)) {
      while (stream->Read(&response)) {
        if (response.compact_revision() > 0) {
          ended = absl::OutOfRangeError(absl::StrCat(
              "etcd ", member.endpoint, " Watch: revision ", start,
              " was compacted; the oldest available is ", response.compact_revision()));
          break;
        }
        if (response.canceled()) {
          ended = absl::FailedPreconditionError(absl::StrCat(
              "etcd ", member.endpoint, " Watch: cancelled: ", response.cancel_reason()));
          break;
        }
        int64_t resume_from = 0;
        {
          absl::MutexLock lock(&mu_);
          if (response.created() && start > 0 && response.header().revision() + 1 < start) {
            ended = absl::DataLossError(absl::StrCat(
                "etcd ", member.endpoint, " Watch: etcd is at revision ",
                response.header().revision(), ", before revision ", start - 1,
                " this watch has seen: it lost its data or was restored from a backup"));
          } else if (response.created()) {
            *created = true;
            // Watching from "now": the events come after this revision.
            if (next_revision_ == 0) next_revision_ = response.header().revision() + 1;
          }
          resume_from = next_revision_;
        }
        if (!ended.ok()) break;
        // One revision's events always come in one response (no fragments
        // requested), so resuming between responses splits no revision. The
        // resume point moves before the callbacks run: it is then current
        // inside them, and a watcher stopped half-way is never resumed.
        if (response.events_size() > 0) {
          absl::MutexLock lock(&mu_);
          next_revision_ = std::max(
              next_revision_,
              response.events(response.events_size() - 1).kv().mod_revision() + 1);
        }
        for (const mvccpb::Event& event : response.events()) {
          if (event.kv().mod_revision() < resume_from) continue;  // Seen before a reconnect.
          if (Stopping()) break;
          on_event_(FromProto(event));
        }
        if (Stopping()) break;
      }
    }
    context.TryCancel();  // Ends the stream at once whatever stopped the loop.
    finished = stream->Finish();
  }
  {
    absl::MutexLock lock(&mu_);
    in_flight_ = nullptr;
    in_flight_member_ = nullptr;
  }
  if (!ended.ok()) return ended;
  if (finished.ok() || finished.error_code() == grpc::StatusCode::CANCELLED) {
    absl::Status broke =
        absl::UnavailableError(absl::StrCat("etcd ", member.endpoint, " Watch: stream ended"));
    if (!Stopping()) connection_->MemberFailed(member, broke);
    return broke;
  }
  return connection_->Check(member, "Watch", finished);
}

}  // namespace shardtrain::etcd
