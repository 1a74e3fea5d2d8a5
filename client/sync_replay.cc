#include "client/sync_replay.h"

#include <algorithm>
#include <memory>
#include <utility>

#include <glog/logging.h>

namespace shardtrain::client {

void SyncReplay::Acked(int shard, const void* key, const wire::PushHeader& header,
                       absl::Span<const wire::GradientPartOut> parts) {
  absl::MutexLock lock(&mu_);
  const int64_t clock = header.clock;
  if (clock > highest_clock_) {
    highest_clock_ = clock;
    for (std::vector<Noted>& noted : pending_) {
      noted.erase(std::remove_if(noted.begin(), noted.end(),
                                 [clock](const Noted& n) { return n.header.clock < clock; }),
                  noted.end());
    }
  } else if (clock < highest_clock_) {
    return;
  }
  std::vector<Noted>& noted = pending_[shard];
  const bool known = std::any_of(noted.begin(), noted.end(), [key](const Noted& n) {
    return n.key == key;
  });
  if (known) return;
  Noted& push = noted.emplace_back();
  push.key = key;
  push.header = header;
  push.parts.reserve(parts.size());
  for (const wire::GradientPartOut& part : parts) {
    Part& copy = push.parts.emplace_back();
    copy.tensor = std::string(part.tensor);
    copy.partition = part.partition;
    copy.version = part.version;
    copy.dtype = part.dtype;
    copy.encoding = part.encoding;
    copy.data = part.data;
    copy.indices = part.indices;
  }
}

void SyncReplay::Pulled(int shard, const void* key) {
  absl::MutexLock lock(&mu_);
  std::vector<Noted>& noted = pending_[shard];
  noted.erase(std::remove_if(noted.begin(), noted.end(),
                             [key](const Noted& n) { return n.key == key; }),
              noted.end());
}

void SyncReplay::Detach() {
  absl::MutexLock lock(&mu_);
  for (std::vector<Noted>& noted : pending_) {
    for (Noted& push : noted) {
      if (push.detached) continue;
      for (Part& part : push.parts) {
        part.owned_data.assign(part.data.data(), part.data.size());
        part.owned_indices.assign(part.indices.data(), part.indices.size());
        part.data = part.indices = absl::string_view();
      }
      push.detached = true;
    }
  }
}

std::vector<PushRequest> SyncReplay::Pending(int shard) const {
  absl::MutexLock lock(&mu_);
  std::vector<PushRequest> copies;
  for (const Noted& noted : pending_[shard]) {
    PushRequest& push = copies.emplace_back();
    push.set_worker(noted.header.worker);
    push.set_clock(noted.header.clock);
    push.set_worker_incarnation(noted.header.worker_incarnation);
    push.set_sequence(noted.header.sequence);
    for (const Part& part : noted.parts) {
      GradientPart* out = push.add_parts();
      out->mutable_key()->set_tensor(part.tensor);
      out->mutable_key()->set_partition(part.partition);
      out->set_version(part.version);
      Payload* grad = out->mutable_grad();
      grad->set_dtype(part.dtype);
      grad->set_encoding(part.encoding);
      if (noted.detached) {
        grad->set_data(part.owned_data);
        if (part.encoding == ENCODING_SPARSE) grad->set_indices(part.owned_indices);
      } else {
        grad->set_data(std::string(part.data));
        if (part.encoding == ENCODING_SPARSE) grad->set_indices(std::string(part.indices));
      }
    }
  }
  return copies;
}

int SyncReplay::Referenced(int shard) const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(std::count_if(pending_[shard].begin(), pending_[shard].end(),
                                        [](const Noted& n) { return !n.detached; }));
}

void SyncReplay::SendAgain(ShardChannel* channel, absl::Duration attempt_timeout,
                           const RpcRecorder& record,
                           std::function<void(absl::Status)> done) const {
  struct Replay {
    std::vector<PushRequest> pushes;
    std::vector<PushResponse> responses;
    absl::Mutex mu;
    int left ABSL_GUARDED_BY(mu) = 0;
    absl::Status first ABSL_GUARDED_BY(mu);
    std::function<void(absl::Status)> done;
  };
  auto replay = std::make_shared<Replay>();
  replay->pushes = Pending(channel->index());
  if (replay->pushes.empty()) {
    done(absl::OkStatus());
    return;
  }
  LOG(INFO) << "shard " << channel->index() << " (" << channel->address()
            << "): sending again " << replay->pushes.size()
            << " push(es) its previous incarnation acknowledged for step "
            << replay->pushes[0].clock() - 1 << ", whose sum it lost";
  replay->responses.resize(replay->pushes.size());
  replay->done = std::move(done);
  {
    absl::MutexLock lock(&replay->mu);
    replay->left = static_cast<int>(replay->pushes.size());
  }
  for (size_t i = 0; i < replay->pushes.size(); ++i) {
    ShardRpc rpc;
    rpc.method = "Push";
    rpc.attempt_timeout = attempt_timeout;
    // shard_incarnation stays 0: an ABORTED here would wait for the resync
    // that is sending it.
    rpc.start = [record, channel, replay, i](const ShardAttempt& attempt,
                                             std::function<void(grpc::Status)> attempt_done) {
      const absl::Time start = absl::Now();
      channel->stub()->async()->Push(
          attempt.context, &replay->pushes[i], &replay->responses[i],
          [record, replay, i, start, attempt_done = std::move(attempt_done)](grpc::Status status) {
            if (record) {
              record("Push", status, replay->pushes[i].ByteSizeLong(),
                     replay->responses[i].ByteSizeLong(), start);
            }
            attempt_done(std::move(status));
          });
    };
    channel->Call(std::move(rpc), [replay](absl::Status status) {
      // Already there (a retry of the same push got in first) or the step
      // completed without it: nothing is missing.
      if (status.code() == absl::StatusCode::kAlreadyExists ||
          status.code() == absl::StatusCode::kFailedPrecondition) {
        status = absl::OkStatus();
      }
      bool last;
      absl::Status first;
      {
        absl::MutexLock lock(&replay->mu);
        if (!status.ok() && replay->first.ok()) replay->first = status;
        last = --replay->left == 0;
        first = replay->first;
      }
      if (last) replay->done(first);
    });
  }
}

}  // namespace shardtrain::client
