#include "worker/model/pipeline/transport.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace shardtrain::worker::pipeline {
namespace {

// A non-owning DeviceBuffer over backend memory the caller owns, so raw
// pointers can go through Backend::CopyToHost / CopyFromHost.
class BufferView final : public DeviceBuffer {
 public:
  BufferView(float* data, size_t size) : data_(data), size_(size) {}
  float* data() override { return data_; }
  const float* data() const override { return data_; }
  size_t size() const override { return size_; }

 private:
  float* const data_;  // Not owned.
  const size_t size_;
};

}  // namespace

std::string TagName(const MessageTag& tag) {
  return absl::StrCat(
      tag.payload == Payload::kActivation ? "activation" : "activation-grad",
      " of microbatch ", tag.microbatch, " from stage ", tag.from_stage,
      " to stage ", tag.to_stage);
}

absl::StatusOr<std::unique_ptr<LocalTransport>> LocalTransport::Create(
    std::vector<Backend*> stage_backends, absl::Duration recv_timeout) {
  if (stage_backends.empty()) {
    return absl::InvalidArgumentError("LocalTransport: no stages");
  }
  for (size_t s = 0; s < stage_backends.size(); ++s) {
    if (stage_backends[s] == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("LocalTransport: backend of stage ", s, " is null"));
    }
  }
  return std::unique_ptr<LocalTransport>(
      new LocalTransport(std::move(stage_backends), recv_timeout));
}

absl::Status LocalTransport::CheckTag(const MessageTag& tag) const {
  const int stages = num_stages();
  const bool in_range = tag.from_stage >= 0 && tag.from_stage < stages &&
                        tag.to_stage >= 0 && tag.to_stage < stages;
  const int step = tag.payload == Payload::kActivation ? 1 : -1;
  if (!in_range || tag.to_stage != tag.from_stage + step) {
    return absl::InvalidArgumentError(absl::StrCat(
        "LocalTransport: cannot carry ", TagName(tag), " between ", stages,
        " stages"));
  }
  return absl::OkStatus();
}

absl::Status LocalTransport::Send(const MessageTag& tag, const float* src,
                                  size_t n) {
  RETURN_IF_ERROR(CheckTag(tag));
  // The copy runs outside the lock: it is the expensive part, and it only
  // touches the sender's backend, which this thread owns.
  std::vector<float> message(n);
  if (n > 0) {
    // The backend copies from buffers; src points into one.
    const BufferView view(const_cast<float*>(src), n);
    RETURN_IF_ERROR(backends_[tag.from_stage]->CopyToHost(
        view, 0, absl::MakeSpan(message)));
  }
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = mailbox_.try_emplace(tag.Key(), std::move(message));
  if (!inserted) {
    return absl::InvalidArgumentError(absl::StrCat(
        "LocalTransport: ", TagName(tag), " sent twice without a receive"));
  }
  return absl::OkStatus();
}

absl::Status LocalTransport::Recv(const MessageTag& tag, float* dst,
                                  size_t n) {
  RETURN_IF_ERROR(CheckTag(tag));
  const auto key = tag.Key();
  std::vector<float> message;
  {
    absl::MutexLock lock(&mu_);
    auto ready = [this, &key]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return cancelled_ || mailbox_.count(key) > 0;
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&ready), recv_timeout_)) {
      return absl::DeadlineExceededError(
          absl::StrCat("LocalTransport: ", TagName(tag), " did not arrive in ",
                       absl::FormatDuration(recv_timeout_)));
    }
    if (cancelled_) {
      return absl::CancelledError(absl::StrCat(
          "LocalTransport: receive of ", TagName(tag), " cancelled"));
    }
    auto it = mailbox_.find(key);
    if (it->second.size() != n) {
      return absl::InvalidArgumentError(
          absl::StrCat("LocalTransport: ", TagName(tag), " has ",
                       it->second.size(), " floats, receiver expects ", n));
    }
    message = std::move(it->second);
    mailbox_.erase(it);
  }
  if (n == 0) return absl::OkStatus();
  BufferView view(dst, n);
  return backends_[tag.to_stage]->CopyFromHost(message, &view, 0);
}

bool LocalTransport::Arrived(const MessageTag& tag) {
  absl::MutexLock lock(&mu_);
  return mailbox_.count(tag.Key()) > 0;
}

void LocalTransport::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
}

void LocalTransport::Reset() {
  absl::MutexLock lock(&mu_);
  mailbox_.clear();
  cancelled_ = false;
}

}  // namespace shardtrain::worker::pipeline
