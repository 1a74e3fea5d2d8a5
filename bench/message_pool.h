// MessagePool: a gRPC MessageAllocator that recycles request/response pairs.
//
// Push and Pull carry megabytes in bytes fields. A cleared protobuf message
// keeps the capacity of its strings and repeated fields, so parsing the next
// request into a recycled message reuses those buffers instead of faulting in
// fresh pages for every call. Thread-safe.
#ifndef SHARDTRAIN_BENCH_MESSAGE_POOL_H_
#define SHARDTRAIN_BENCH_MESSAGE_POOL_H_

#include <memory>
#include <vector>

#include <grpcpp/support/message_allocator.h>

#include "absl/synchronization/mutex.h"

namespace shardtrain::bench {

template <typename Request, typename Response>
class MessagePool : public grpc::MessageAllocator<Request, Response> {
 public:
  // Keeps at most `max_idle` pairs; more are freed when released.
  explicit MessagePool(size_t max_idle) : max_idle_(max_idle) {}

  grpc::MessageHolder<Request, Response>* AllocateMessages() override {
    {
      absl::MutexLock lock(&mu_);
      if (!idle_.empty()) {
        Holder* holder = idle_.back().release();
        idle_.pop_back();
        return holder;
      }
    }
    return new Holder(this);
  }

 private:
  class Holder : public grpc::MessageHolder<Request, Response> {
   public:
    explicit Holder(MessagePool* pool) : pool_(pool) {
      this->set_request(&request_);
      this->set_response(&response_);
    }
    void Release() override { pool_->Recycle(this); }

    Request request_;
    Response response_;

   private:
    MessagePool* const pool_;
  };

  void Recycle(Holder* holder) {
    holder->request_.Clear();
    holder->response_.Clear();
    absl::MutexLock lock(&mu_);
    if (idle_.size() < max_idle_) {
      idle_.emplace_back(holder);
    } else {
      delete holder;
    }
  }

  const size_t max_idle_;
  absl::Mutex mu_;
  std::vector<std::unique_ptr<Holder>> idle_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardtrain::bench

#endif  // SHARDTRAIN_BENCH_MESSAGE_POOL_H_
