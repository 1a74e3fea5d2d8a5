#include "python/src/table_queue.h"

namespace shardtrain::python {

TableQueue::~TableQueue() { Close(); }

std::shared_ptr<const TableQueue::Call> TableQueue::Add(Fn fn) {
  auto call = std::make_shared<Call>();
  absl::MutexLock lock(&mu_);
  if (closed_) {
    call->status_ = absl::FailedPreconditionError("a table call on a closed client");
    call->done_.Notify();
    return call;
  }
  queue_.emplace_back(std::move(fn), call);
  if (!thread_.joinable()) thread_ = std::thread([this] { Run(); });
  return call;
}

void TableQueue::Close() {
  std::thread thread;
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    thread.swap(thread_);
  }
  // Run() leaves once the queue is empty and closed_ is set.
  if (thread.joinable()) thread.join();
}

bool TableQueue::HasWorkOrClosed() const { return !queue_.empty() || closed_; }

void TableQueue::Run() {
  for (;;) {
    std::pair<Fn, std::shared_ptr<Call>> next;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &TableQueue::HasWorkOrClosed));
      if (queue_.empty()) return;
      next = std::move(queue_.front());
      queue_.pop_front();
    }
    Call& call = *next.second;
    call.status_ = next.first(&call.stats_);
    // The work goes before the call is seen done: it may hold references
    // the waiter releases.
    next.first = nullptr;
    call.done_.Notify();
  }
}

}  // namespace shardtrain::python
