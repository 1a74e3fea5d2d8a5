#include "worker/exchange_thread.h"

#include <utility>

namespace shardtrain::worker {

ExchangeThread::ExchangeThread(client::ParameterClient* client)
    : client_(client), thread_([this] { Loop(); }) {}

ExchangeThread::~ExchangeThread() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  // The loop finishes an exchange it has taken before it looks at stop_.
  thread_.join();
}

void ExchangeThread::Start(int64_t clock, std::vector<int64_t> computed_at,
                           std::vector<absl::Span<const float>> grads,
                           std::vector<absl::Span<float>> params) {
  absl::MutexLock lock(&mu_);
  job_ = Job{clock, std::move(computed_at), std::move(grads), std::move(params)};
  job_pending_ = true;
  job_done_ = false;
  in_flight_ = true;
}

absl::Status ExchangeThread::Land(client::PushStats* push, client::PullStats* pull) {
  if (!in_flight_) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&job_done_));
  in_flight_ = false;
  if (!status_.ok()) return status_;
  if (push != nullptr) *push = push_;
  if (pull != nullptr) *pull = pull_;
  return absl::OkStatus();
}

bool ExchangeThread::HasJobOrStop() const { return job_pending_ || stop_; }

void ExchangeThread::Loop() {
  while (true) {
    Job job;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &ExchangeThread::HasJobOrStop));
      if (!job_pending_) return;  // stopped with nothing to do
      job = std::move(job_);
      job_pending_ = false;
    }
    client_->SetNextPushComputedAt(std::move(job.computed_at));
    client::PushStats push;
    client::PullStats pull;
    absl::Status status = client_->PushPull(job.clock, /*min_version=*/0, job.grads,
                                            job.params, &push, &pull);
    absl::MutexLock lock(&mu_);
    status_ = std::move(status);
    push_ = push;
    pull_ = pull;
    job_done_ = true;
  }
}

}  // namespace shardtrain::worker
