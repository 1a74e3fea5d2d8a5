// ExchangeThread: one thread, kept for a run, that makes a worker's
// PushPull behind its compute (TrainerOptions::stale_overlap).
//
// Start hands it one exchange; Land waits for that exchange and returns
// its result. The thread sleeps on a condition between exchanges, so a
// step costs a wake-up instead of a thread's creation (clone, a fresh
// stack, its first page faults) as a thread per exchange did.
//
// Example (a step that lands the exchange before and starts its own):
//   ExchangeThread exchange(client);
//   exchange.Start(clock, computed_at, grads, params);
//   ...compute the next step on other buffers...
//   RETURN_IF_ERROR(exchange.Land(&push, &pull));  // params hold the pull
//
// Thread-compatible: one thread calls Start and Land; the exchange runs on
// this object's thread. The destructor waits for an exchange in flight.
#ifndef SHARDTRAIN_WORKER_EXCHANGE_THREAD_H_
#define SHARDTRAIN_WORKER_EXCHANGE_THREAD_H_

#include <cstdint>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "client/parameter_client.h"

namespace shardtrain::worker {

class ExchangeThread {
 public:
  // `client` is not owned and must outlive this.
  explicit ExchangeThread(client::ParameterClient* client);
  ~ExchangeThread();

  ExchangeThread(const ExchangeThread&) = delete;
  ExchangeThread& operator=(const ExchangeThread&) = delete;

  // Starts client->PushPull(clock, /*min_version=*/0, grads, params) on the
  // thread, its push saying the gradients were computed at `computed_at`
  // (ParameterClient::SetNextPushComputedAt, set on the thread that
  // pushes). REQUIRES: !in_flight(); `grads` is not written and `params`
  // is neither read nor written, and both stay valid, until Land returns.
  void Start(int64_t clock, std::vector<int64_t> computed_at,
             std::vector<absl::Span<const float>> grads,
             std::vector<absl::Span<float>> params);

  // Waits for the exchange started last and returns its status; on OK its
  // figures go to `push` and `pull` (either may be null). OK at once when
  // none is in flight.
  absl::Status Land(client::PushStats* push, client::PullStats* pull);

  bool in_flight() const { return in_flight_; }

 private:
  // What one exchange sends and fetches.
  struct Job {
    int64_t clock = 0;
    std::vector<int64_t> computed_at;
    std::vector<absl::Span<const float>> grads;
    std::vector<absl::Span<float>> params;
  };

  void Loop();
  bool HasJobOrStop() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  client::ParameterClient* const client_;
  // Started and not yet landed; only the caller's thread touches it.
  bool in_flight_ = false;

  absl::Mutex mu_;
  // An exchange waiting for the thread to take it.
  bool job_pending_ ABSL_GUARDED_BY(mu_) = false;
  // The thread has finished the exchange last taken.
  bool job_done_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  Job job_ ABSL_GUARDED_BY(mu_);
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  client::PushStats push_ ABSL_GUARDED_BY(mu_);
  client::PullStats pull_ ABSL_GUARDED_BY(mu_);

  // Last, so it starts once the fields above exist.
  std::thread thread_;
};

}  // namespace shardtrain::worker

#endif  // SHARDTRAIN_WORKER_EXCHANGE_THREAD_H_
