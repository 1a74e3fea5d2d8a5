// ArenaMessages: a gRPC MessageAllocator that parses each request into its
// own protobuf arena whose blocks are mapped from (and on release given back
// to) the kernel.
//
// For rare requests that may hold very many small messages (Register: up to
// a million tensor specs in one message). Parsed on the heap, such a request
// would leave its memory in the allocator's free lists (the heap is not
// trimmed, see app/malloc_tuning.h); in an arena it is returned whole as
// soon as the call is done. Thread-safe.
#ifndef SHARDTRAIN_SERVER_INTERNAL_ARENA_MESSAGES_H_
#define SHARDTRAIN_SERVER_INTERNAL_ARENA_MESSAGES_H_

#include <sys/mman.h>

#include <cstddef>
#include <new>

#include <google/protobuf/arena.h>
#include <grpcpp/support/message_allocator.h>

namespace shardtrain::server::internal {

template <typename Request, typename Response>
class ArenaMessages : public grpc::MessageAllocator<Request, Response> {
 public:
  grpc::MessageHolder<Request, Response>* AllocateMessages() override {
    return new Holder();
  }

 private:
  static void* MapBlock(size_t bytes) {
    void* block = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (block == MAP_FAILED) throw std::bad_alloc();
    return block;
  }
  static void UnmapBlock(void* block, size_t bytes) { munmap(block, bytes); }

  static google::protobuf::ArenaOptions Options() {
    google::protobuf::ArenaOptions options;
    options.start_block_size = 64 << 10;
    options.max_block_size = 4 << 20;
    options.block_alloc = &MapBlock;
    options.block_dealloc = &UnmapBlock;
    return options;
  }

  class Holder : public grpc::MessageHolder<Request, Response> {
   public:
    Holder() : arena_(Options()) {
      this->set_request(google::protobuf::Arena::CreateMessage<Request>(&arena_));
      this->set_response(google::protobuf::Arena::CreateMessage<Response>(&arena_));
    }
    void Release() override { delete this; }

   private:
    google::protobuf::Arena arena_;
  };
};

}  // namespace shardtrain::server::internal

#endif  // SHARDTRAIN_SERVER_INTERNAL_ARENA_MESSAGES_H_
