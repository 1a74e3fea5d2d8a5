// NcclComm: move-only owner of one ncclComm_t, plus NCCL_RETURN_IF_ERROR.
//
// CreateAll makes one communicator per GPU of this process (ncclCommInitAll):
// rank i runs on devices[i]. One GPU is allowed (a communicator of size 1,
// e.g. a one-stage pipeline). The destructor logs a failure, never throws.
//
// Built only when NCCL is found (SHARDTRAIN_HAVE_NCCL). Thread-compatible:
// each communicator is used by one thread at a time (typically the thread
// driving its GPU). Host-only header.
//
// Example:
//   ASSIGN_OR_RETURN(std::vector<NcclComm> comms, NcclComm::CreateAll({0, 1}));
//   NCCL_RETURN_IF_ERROR(ncclSend(buf, n, ncclFloat, /*peer=*/1,
//                                 comms[0].get(), stream));
#ifndef SHARDTRAIN_WORKER_DEVICE_CUDA_NCCL_COMM_H_
#define SHARDTRAIN_WORKER_DEVICE_CUDA_NCCL_COMM_H_

#include <nccl.h>

#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace shardtrain::worker::cuda {

// Ok for ncclSuccess, otherwise an error naming `expr`, ncclGetErrorString
// and file:line (INVALID_ARGUMENT for ncclInvalidArgument/ncclInvalidUsage,
// UNAVAILABLE for ncclRemoteError, INTERNAL otherwise).
absl::Status NcclStatus(ncclResult_t code, const char* expr, const char* file,
                        int line);

class NcclComm {
 public:
  // One communicator per entry of `devices` (CUDA device ordinals, distinct).
  // INVALID_ARGUMENT for an empty list.
  static absl::StatusOr<std::vector<NcclComm>> CreateAll(
      absl::Span<const int> devices);

  NcclComm() = default;  // Empty: get() is null.
  NcclComm(NcclComm&& other) noexcept
      : comm_(std::exchange(other.comm_, nullptr)),
        rank_(other.rank_),
        size_(other.size_),
        device_(other.device_) {}
  NcclComm& operator=(NcclComm&& other) noexcept {
    NcclComm(std::move(other)).Swap(*this);
    return *this;
  }
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;
  ~NcclComm();

  ncclComm_t get() const { return comm_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  int device() const { return device_; }

 private:
  void Swap(NcclComm& other) noexcept {
    std::swap(comm_, other.comm_);
    std::swap(rank_, other.rank_);
    std::swap(size_, other.size_);
    std::swap(device_, other.device_);
  }

  ncclComm_t comm_ = nullptr;  // Owned, unless null.
  int rank_ = -1;
  int size_ = 0;
  int device_ = -1;
};

}  // namespace shardtrain::worker::cuda

#define NCCL_RETURN_IF_ERROR(expr)                                     \
  do {                                                                 \
    const ncclResult_t shardtrain_nccl_code_ = (expr);                 \
    if (shardtrain_nccl_code_ != ncclSuccess) {                        \
      return ::shardtrain::worker::cuda::NcclStatus(                   \
          shardtrain_nccl_code_, #expr, __FILE__, __LINE__);           \
    }                                                                  \
  } while (0)

#endif  // SHARDTRAIN_WORKER_DEVICE_CUDA_NCCL_COMM_H_
