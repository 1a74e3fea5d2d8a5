// StageTransport: moves activations and activation gradients between adjacent
// pipeline stages, tagged by microbatch; LocalTransport: the in-process one.
//
// Every message is identified by a MessageTag (sender, receiver, payload,
// microbatch); within one step each tag is sent and received exactly once.
// Semantics the pipeline schedules rely on (see schedule.h):
//   - Send never waits for the matching Recv: the message is buffered, and
//     the sender may reuse `src` as soon as Send returns.
//   - Recv waits until the message with its tag has been sent, then copies it
//     into `dst`; the order of sends does not have to match the order of
//     receives.
// Pointers are memory of the sending / receiving stage's Backend.
//
// Other implementations: NcclTransport (nccl_transport.h, CUDA builds only).
//
// Example:
//   ASSIGN_OR_RETURN(std::unique_ptr<StageTransport> t,
//                    LocalTransport::Create({backend0, backend1}));
//   MessageTag tag{0, 1, Payload::kActivation, /*microbatch=*/3};
//   RETURN_IF_ERROR(t->Send(tag, out->data(), n));   // on stage 0's thread
//   RETURN_IF_ERROR(t->Recv(tag, in->data(), n));    // on stage 1's thread
#ifndef SHARDTRAIN_WORKER_MODEL_PIPELINE_TRANSPORT_H_
#define SHARDTRAIN_WORKER_MODEL_PIPELINE_TRANSPORT_H_

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "worker/device/backend.h"

namespace shardtrain::worker::pipeline {

enum class Payload {
  kActivation,      // Output of stage s, input of stage s+1.
  kActivationGrad,  // dL/d(input of stage s+1), sent back to stage s.
};

struct MessageTag {
  int from_stage;
  int to_stage;
  Payload payload;
  int microbatch;

  std::tuple<int, int, int, int> Key() const {
    return {from_stage, to_stage, static_cast<int>(payload), microbatch};
  }
};

std::string TagName(const MessageTag& tag);

// Thread-safety: implementations say whether Send/Recv of *different* stages
// may run on different threads at once (SupportsConcurrentStages). Calls for
// one stage always come from one thread at a time.
class StageTransport {
 public:
  virtual ~StageTransport() = default;

  virtual int num_stages() const = 0;

  // Sends n floats at src. INVALID_ARGUMENT for stages that are not adjacent
  // or out of range, or a tag already sent and not yet received.
  virtual absl::Status Send(const MessageTag& tag, const float* src,
                            size_t n) = 0;
  // Receives the message `tag` into dst (n floats). INVALID_ARGUMENT if its
  // size is not n; DEADLINE_EXCEEDED if it does not arrive within the
  // transport's timeout; CANCELLED after Cancel().
  virtual absl::Status Recv(const MessageTag& tag, float* dst, size_t n) = 0;

  // True if the message `tag` has been sent and not yet received, so Recv
  // would not wait.
  virtual bool Arrived(const MessageTag& tag) = 0;

  // True if stages may call Send/Recv from one thread each, concurrently.
  // When false the caller drives all stages from one thread and only calls
  // Recv for messages that have Arrived.
  virtual bool SupportsConcurrentStages() const = 0;

  // Wakes every waiting and future Recv with CANCELLED (after a stage failed,
  // so its neighbours stop waiting for it), until Reset().
  virtual void Cancel() = 0;
  // Drops undelivered messages and clears Cancel(); called before each step.
  virtual void Reset() = 0;
};

// In-process transport between stages that each have their own Backend:
// Send copies to a host-side mailbox through the sender's backend, Recv
// copies from it through the receiver's backend. Works for CPU backends and
// for device backends (at the cost of a host round trip). Thread-safe;
// stages may run concurrently.
class LocalTransport final : public StageTransport {
 public:
  // stage_backends[s] is stage s's backend, not owned, must outlive the
  // transport. INVALID_ARGUMENT if empty or any is null.
  static absl::StatusOr<std::unique_ptr<LocalTransport>> Create(
      std::vector<Backend*> stage_backends,
      absl::Duration recv_timeout = absl::Seconds(60));

  int num_stages() const override {
    return static_cast<int>(backends_.size());
  }
  absl::Status Send(const MessageTag& tag, const float* src,
                    size_t n) override;
  absl::Status Recv(const MessageTag& tag, float* dst, size_t n) override;
  bool Arrived(const MessageTag& tag) override;
  bool SupportsConcurrentStages() const override { return true; }
  void Cancel() override;
  void Reset() override;

 private:
  LocalTransport(std::vector<Backend*> backends, absl::Duration recv_timeout)
      : backends_(std::move(backends)), recv_timeout_(recv_timeout) {}

  absl::Status CheckTag(const MessageTag& tag) const;

  // Constant after construction.
  const std::vector<Backend*> backends_;  // Not owned.
  const absl::Duration recv_timeout_;

  absl::Mutex mu_;
  // Sent, not yet received messages.
  std::map<std::tuple<int, int, int, int>, std::vector<float>> mailbox_
      ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace shardtrain::worker::pipeline

#endif  // SHARDTRAIN_WORKER_MODEL_PIPELINE_TRANSPORT_H_
