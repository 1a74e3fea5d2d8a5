#include "server/replication/forwarder.h"

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <glog/logging.h>
#include <grpcpp/alarm.h>
#include <grpcpp/client_context.h>
#include <grpcpp/completion_queue.h>
#include <grpcpp/create_channel.h>

#include "absl/strings/str_format.h"
#include "common/grpc_status.h"
#include "common/reconnect.h"
#include "server/replication/group_state_parts.h"
#include "wire/frame_header.h"
#include "wire/frame_listener.h"

namespace shardtrain::server {
namespace {

constexpr char kReplicateMethod[] = "/shardtrain.ParameterServer/Replicate";
constexpr absl::Duration kAttemptTimeout = absl::Seconds(10);
constexpr absl::Duration kMaxBackoff = absl::Milliseconds(200);
constexpr absl::Duration kReconnectWait = absl::Milliseconds(50);
constexpr absl::Duration kChainPoll = absl::Milliseconds(20);
// The longest Replicate answer (a PushResponse) taken from a data port.
constexpr uint64_t kMaxAnswerBytes = 4 << 20;
// How long a Status call asking for a data port may take, and how long a
// successor whose port did not answer (or did not take a call) gets gRPC
// before it is asked again.
constexpr absl::Duration kAskTimeout = absl::Seconds(2);
constexpr absl::Duration kFramesPause = absl::Seconds(1);

// `request` followed by a chain_epoch field: protobuf keeps the last value
// of a repeated scalar, so this re-stamps the push without copying it.
grpc::ByteBuffer Stamped(const grpc::ByteBuffer& request, int64_t epoch) {
  std::vector<grpc::Slice> slices;
  if (request.Valid()) {
    grpc::ByteBuffer copy(request);
    (void)copy.Dump(&slices);
  }
  PushRequest trailer;
  trailer.set_chain_epoch(static_cast<uint64_t>(epoch));
  slices.emplace_back(trailer.SerializeAsString());
  return grpc::ByteBuffer(slices.data(), slices.size());
}

bool Retryable(const grpc::Status& status) {
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::CANCELLED:
    case grpc::StatusCode::UNKNOWN:
      return true;
    default:
      return false;
  }
}

}  // namespace

struct Forwarder::Call {
  int group = 0;
  grpc::ByteBuffer request;
  absl::Time deadline;
  std::function<void(absl::Status)> done;
  // Shared with AbandonDeparted, which may cancel them outside the lock.
  std::shared_ptr<grpc::ClientContext> context;
  std::shared_ptr<wire::AttemptCancel> cancel;  // a frame's
  grpc::ByteBuffer sent;
  grpc::ByteBuffer response;
  std::unique_ptr<grpc::Alarm> alarm;
  int attempts = 0;
  std::string target;
  int64_t epoch = 0;   // the chain epoch of the last attempt
  absl::Time retry_at;  // the end of the backoff being waited out
};

Forwarder::Forwarder(const ChainTable* table,
                     std::shared_ptr<grpc::ChannelCredentials> credentials,
                     grpc::ChannelArguments args, ReplicationMetrics* metrics,
                     bool data_ports, std::shared_ptr<const wire::TlsContext> data_tls)
    : table_(table),
      credentials_(std::move(credentials)),
      args_(std::move(args)),
      metrics_(metrics),
      data_ports_(data_ports),
      data_tls_(std::move(data_tls)) {}

Forwarder::~Forwarder() {
  Stop();
  std::map<std::string, DataPeer> peers;
  {
    absl::MutexLock lock(&mu_);
    auto ended = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return in_flight_ == 0; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&ended), absl::Seconds(5))) {
      LOG(ERROR) << in_flight_ << " forwards still in flight at shutdown";
    }
    peers.swap(data_peers_);
  }
  // Closed while the rest of the forwarder is alive: a frame still in
  // flight ends (CANCELLED) through it.
  peers.clear();
}

void Forwarder::Stop() {
  absl::MutexLock lock(&mu_);
  stopped_ = true;
}

std::shared_ptr<grpc::Channel> Forwarder::ChannelTo(const std::string& address) {
  absl::MutexLock lock(&mu_);
  std::shared_ptr<grpc::Channel>& channel = channels_[address];
  if (channel == nullptr) {
    channel = grpc::CreateCustomChannel(address, credentials_, args_);
  }
  return channel;
}

void Forwarder::Forward(int group, grpc::ByteBuffer request, absl::Duration timeout,
                        std::function<void(absl::Status)> done) {
  {
    absl::MutexLock lock(&mu_);
    ++in_flight_;
  }
  auto* call = new Call;
  call->group = group;
  call->request = std::move(request);
  call->deadline = absl::Now() + timeout;
  call->done = std::move(done);
  Attempt(call);
}

void Forwarder::End(Call* call, absl::Status status) {
  std::function<void(absl::Status)> done = std::move(call->done);
  delete call;
  done(std::move(status));
  absl::MutexLock lock(&mu_);
  --in_flight_;
}

void Forwarder::Attempt(Call* call) {
  int64_t epoch = 0;
  bool member = false;
  const std::optional<chain::ChainConfig::Member> next =
      table_->Successor(call->group, &epoch, &member);
  if (!member && table_->Fenced()) {
    // The lease is being confirmed or renewed (etcd restarted, a pause):
    // this shard may still be in the chain, with this push applied here and
    // not yet at its successor. Hold it: sent once the shard serves again
    // and still has a successor, failed once the chain has dropped it (or
    // at the deadline). Failing it now would leave the successor without an
    // operation the shard goes on from.
    Retry(call, absl::UnavailableError("this shard is fenced until its etcd lease is confirmed"));
    return;
  }
  if (!member) {
    End(call, absl::UnavailableError(absl::StrFormat(
                  "this shard left group %d's chain before the push reached its tail",
                  call->group)));
    return;
  }
  if (!next) {  // this shard is the tail now
    End(call, absl::OkStatus());
    return;
  }
  ++call->attempts;
  call->target = next->address;
  call->context = std::make_shared<grpc::ClientContext>();
  call->cancel = std::make_shared<wire::AttemptCancel>();
  call->sent = Stamped(call->request, epoch);
  call->epoch = epoch;
  call->response.Clear();
  wire::FrameChannel* frames = nullptr;
  bool ask = false;
  bool stopped;
  {
    absl::MutexLock lock(&mu_);
    stopped = stopped_;
    if (!stopped) {
      frames = FramesToLocked(*next, &ask);
      attempts_.insert(call);
    }
  }
  if (stopped) {
    End(call, absl::UnavailableError("shard is shutting down"));
    return;
  }
  if (ask) AskDataPort(next->address, next->incarnation);
  if (metrics_ != nullptr) {
    metrics_->forwarded_bytes().Increment(static_cast<double>(call->sent.Length()));
  }
  if (frames != nullptr) {
    SendFrame(call, frames);
  } else {
    SendGrpc(call);
  }
}

void Forwarder::SendGrpc(Call* call) {
  if (metrics_ != nullptr) metrics_->forwards(/*frames=*/false).Increment();
  const std::shared_ptr<grpc::Channel> channel = ChannelTo(call->target);
  absl::Duration attempt_timeout = kAttemptTimeout;
  // A successor that came back (it rejoined as tail) may still sit in the
  // channel's reconnect backoff from when it was down: connect now and let
  // this attempt wait briefly for that rather than fail.
  if (common::ReconnectIfBackingOff(*channel)) {
    call->context->set_wait_for_ready(true);
    attempt_timeout = kReconnectWait;
  }
  call->context->set_deadline(
      absl::ToChronoTime(std::min(call->deadline, absl::Now() + attempt_timeout)));
  grpc::GenericStub stub(channel);
  stub.UnaryCall(call->context.get(), kReplicateMethod, grpc::StubOptions(), &call->sent,
                 &call->response,
                 [this, call](grpc::Status status) { Attempted(call, status); });
}

void Forwarder::SendFrame(Call* call, wire::FrameChannel* frames) {
  if (metrics_ != nullptr) metrics_->forwards(/*frames=*/true).Increment();
  const absl::Time deadline = std::min(call->deadline, absl::Now() + kAttemptTimeout);
  frames->Call(
      wire::DataMethod::kReplicate, call->sent, &call->response, deadline,
      [this, call](grpc::Status status, bool reached) {
        if (!reached) {
          // Nothing reached the successor's handlers: by gRPC at once.
          FramesUnreachable(call->target);
          call->response.Clear();
          SendGrpc(call);
          return;
        }
        Attempted(call, status);
      },
      call->cancel.get());
}

void Forwarder::Attempted(Call* call, const grpc::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    attempts_.erase(call);
  }
  if (status.ok()) {
    End(call, absl::OkStatus());
  } else if (Retryable(status)) {
    Retry(call, common::FromGrpcStatus(status));
  } else {
    const absl::Status error = common::FromGrpcStatus(status);
    End(call, absl::Status(error.code(), absl::StrFormat("forward to %s: %s", call->target,
                                                         error.message())));
  }
}

wire::FrameChannel* Forwarder::FramesToLocked(const chain::ChainConfig::Member& member,
                                              bool* ask) {
  *ask = false;
  if (!data_ports_) return nullptr;
  DataPeer& peer = data_peers_[member.address];
  if (peer.frames == nullptr && peer.incarnation == 0) {
    if (const std::optional<std::string> host = wire::DataPortHost(member.address)) {
      peer.frames = std::make_unique<wire::FrameChannel>(*host, 0, kMaxAnswerBytes,
                                                         absl::Seconds(5), data_tls_);
    }
  }
  if (peer.frames == nullptr) return nullptr;
  if (peer.incarnation != member.incarnation) {
    // A new process at that address: its port is asked for anew.
    peer.incarnation = member.incarnation;
    peer.known = false;
    peer.ask_after = absl::InfinitePast();
  }
  if (peer.known) return peer.frames.get();
  if (!peer.asking && absl::Now() >= peer.ask_after) {
    peer.asking = true;
    ++in_flight_;
    *ask = true;
  }
  return nullptr;
}

void Forwarder::AskDataPort(const std::string& address, uint64_t incarnation) {
  struct Ask {
    grpc::ClientContext context;
    StatusRequest request;
    StatusResponse response;
  };
  auto ask = std::make_shared<Ask>();
  ask->context.set_deadline(absl::ToChronoTime(absl::Now() + kAskTimeout));
  ask->request.set_max_partitions(1);  // the data port is all that is read
  std::unique_ptr<ParameterServer::Stub> stub = ParameterServer::NewStub(ChannelTo(address));
  stub->async()->Status(
      &ask->context, &ask->request, &ask->response,
      [this, ask, address, incarnation](grpc::Status status) {
        absl::MutexLock lock(&mu_);
        --in_flight_;
        DataPeer& peer = data_peers_[address];
        peer.asking = false;
        if (peer.incarnation != incarnation) return;  // asked again for a newer one
        if (status.ok() && ask->response.incarnation() == incarnation &&
            ask->response.data_port() != 0) {
          peer.frames->set_port(static_cast<int>(ask->response.data_port()));
          peer.known = true;
          VLOG(1) << "forwards to " << address << " go to its data port "
                  << ask->response.data_port();
        } else {
          // No data port (or not yet an answer from that process): gRPC,
          // and ask again in a while.
          peer.ask_after = absl::Now() + kFramesPause;
        }
      });
}

void Forwarder::FramesUnreachable(const std::string& address) {
  absl::MutexLock lock(&mu_);
  auto it = data_peers_.find(address);
  if (it == data_peers_.end() || !it->second.known) return;
  it->second.known = false;
  it->second.ask_after = absl::Now() + kFramesPause;
  LOG(WARNING) << "the data port of " << address << " did not take a forward; forwards use "
               << "gRPC for " << kFramesPause;
}

int Forwarder::AbandonDeparted(int group) {
  int64_t epoch = 0;
  bool member = false;
  const std::optional<chain::ChainConfig::Member> next =
      table_->Successor(group, &epoch, &member);
  std::vector<std::pair<std::shared_ptr<grpc::ClientContext>,
                        std::shared_ptr<wire::AttemptCancel>>>
      cancel;
  {
    absl::MutexLock lock(&mu_);
    for (Call* call : attempts_) {
      if (call->group != group || call->epoch >= epoch) continue;
      if (member && next && next->address == call->target) continue;  // still the successor
      cancel.emplace_back(call->context, call->cancel);
    }
  }
  // Outside the lock: an attempt may end (and retry) at once. CANCELLED is
  // retried, and the retry sees the new epoch.
  for (const auto& [context, frame] : cancel) {
    context->TryCancel();
    frame->Cancel();
  }
  if (!cancel.empty()) {
    LOG(INFO) << "group " << group << ": chain epoch " << epoch << " dropped the successor of "
              << cancel.size() << " forward(s) in flight; sending them again";
  }
  return static_cast<int>(cancel.size());
}

void Forwarder::Retry(Call* call, absl::Status why) {
  const absl::Time now = absl::Now();
  if (now >= call->deadline) {
    End(call, absl::UnavailableError(absl::StrFormat(
                  "group %d: the push did not reach the tail in time (%d attempts, last "
                  "to %s: %s)",
                  call->group, call->attempts, call->target, why.message())));
    return;
  }
  const absl::Duration backoff =
      std::min(kMaxBackoff, absl::Milliseconds(5) * (1 << std::min(call->attempts, 6)));
  VLOG(1) << "forward of group " << call->group << " to " << call->target
          << " failed (" << why << "); again in " << backoff;
  call->retry_at = std::min(call->deadline, now + backoff);
  ArmRetry(call);
}

void Forwarder::ArmRetry(Call* call) {
  // Looks every kChainPoll whether the chain moved on (the dead successor
  // removed): then the next attempt goes at once, not after the backoff.
  // Replacing the alarm from its own callback is safe: gRPC keeps the
  // firing alarm's state alive until the callback returns.
  call->alarm = std::make_unique<grpc::Alarm>();
  call->alarm->Set(absl::ToChronoTime(std::min(call->retry_at, absl::Now() + kChainPoll)),
                   [this, call](bool) {
                     int64_t epoch = 0;
                     bool member = false;
                     (void)table_->Successor(call->group, &epoch, &member);
                     if (absl::Now() < call->retry_at && member && epoch == call->epoch) {
                       ArmRetry(call);
                     } else {
                       Attempt(call);
                     }
                   });
}

absl::StatusOr<GroupStateResponse> Forwarder::FetchGroupState(const std::string& address,
                                                              int group, int64_t epoch,
                                                              absl::Duration part_timeout,
                                                              absl::Duration timeout) {
  std::unique_ptr<ParameterServer::Stub> stub = ParameterServer::NewStub(ChannelTo(address));
  grpc::ClientContext context;
  const absl::Time start = absl::Now();
  context.set_deadline(absl::ToChronoTime(start + timeout));
  context.set_wait_for_ready(true);
  GroupStateRequest request;
  request.set_group(group);
  request.set_chain_epoch(static_cast<uint64_t>(epoch));
  // The asynchronous reader, one operation at a time, so that each waits at
  // most part_timeout: a synchronous Read has no deadline of its own.
  grpc::CompletionQueue cq;
  std::unique_ptr<grpc::ClientAsyncReader<GroupStateResponse>> reader =
      stub->PrepareAsyncFetchGroupState(&context, request, &cq);
  bool stalled = false;
  // Waits for the operation in flight; false when it failed (the stream
  // ended, or the call did) or no answer came within part_timeout, in which
  // case the call is cancelled and the operation's end awaited.
  auto finished = [&]() {
    void* tag = nullptr;
    bool ok = false;
    if (cq.AsyncNext(&tag, &ok, absl::ToChronoTime(absl::Now() + part_timeout)) ==
        grpc::CompletionQueue::GOT_EVENT) {
      return ok;
    }
    stalled = true;
    context.TryCancel();
    (void)cq.Next(&tag, &ok);
    return false;
  };
  GroupStateResponse response;
  GroupStateResponse part;
  int parts = 0;
  reader->StartCall(nullptr);
  if (finished()) {
    while (true) {
      reader->Read(&part, nullptr);
      if (!finished()) break;
      AppendGroupStatePart(std::move(part), &response);
      part.Clear();
      ++parts;
    }
  }
  grpc::Status status;
  reader->Finish(&status, nullptr);
  void* tag = nullptr;
  bool ok = false;
  (void)cq.Next(&tag, &ok);  // Finish always completes (the deadline bounds it)
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  if (stalled) {
    return absl::DeadlineExceededError(absl::StrFormat(
        "state of group %d from %s: no part came within %s (%d part(s), %d bytes in %s)",
        group, address, absl::FormatDuration(part_timeout), parts, response.ByteSizeLong(),
        absl::FormatDuration(absl::Now() - start)));
  }
  if (!status.ok()) {
    const absl::Status error = common::FromGrpcStatus(status);
    return absl::Status(error.code(), absl::StrFormat("state of group %d from %s: %s",
                                                      group, address, error.message()));
  }
  return response;
}

absl::StatusOr<ChainState> Forwarder::MemberState(const std::string& address, int group,
                                                  absl::Duration timeout) {
  std::unique_ptr<ParameterServer::Stub> stub = ParameterServer::NewStub(ChannelTo(address));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  StatusRequest request;
  request.set_max_partitions(1);  // the chains are all that is read
  StatusResponse response;
  const grpc::Status status = stub->Status(&context, request, &response);
  if (!status.ok()) {
    const absl::Status error = common::FromGrpcStatus(status);
    return absl::Status(error.code(), absl::StrFormat("status of %s: %s", address,
                                                      error.message()));
  }
  for (const ChainState& chain : response.chains()) {
    if (chain.group() == group) return chain;
  }
  return absl::NotFoundError(absl::StrFormat("%s does not hold group %d", address, group));
}

}  // namespace shardtrain::server
