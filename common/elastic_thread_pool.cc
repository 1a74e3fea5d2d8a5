#include "common/elastic_thread_pool.h"

#include <algorithm>
#include <utility>

namespace shardtrain::common {

ElasticThreadPool::ElasticThreadPool(int max_threads) : max_threads_(std::max(1, max_threads)) {}

ElasticThreadPool::~ElasticThreadPool() {
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    // Every task handed over runs before its thread ends.
    threads.swap(threads_);
  }
  for (std::thread& thread : threads) thread.join();
}

bool ElasticThreadPool::TryRun(absl::AnyInvocable<void() &&> task) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return false;
  const int started = static_cast<int>(threads_.size());
  if (busy_ >= started) {
    // No thread is free: start one, if the pool may.
    if (started >= max_threads_) return false;
    threads_.emplace_back([this] { Loop(); });
  }
  ++busy_;
  handed_.push_back(std::move(task));
  return true;
}

int ElasticThreadPool::threads() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(threads_.size());
}

int ElasticThreadPool::busy() const {
  absl::MutexLock lock(&mu_);
  return busy_;
}

void ElasticThreadPool::Loop() {
  while (true) {
    absl::AnyInvocable<void() &&> task;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](ElasticThreadPool* pool) ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool->mu_) {
            return pool->stopping_ || !pool->handed_.empty();
          },
          this));
      if (handed_.empty()) return;  // stopping, nothing left to run
      task = std::move(handed_.front());
      handed_.pop_front();
    }
    std::move(task)();
    absl::MutexLock lock(&mu_);
    --busy_;
  }
}

}  // namespace shardtrain::common
