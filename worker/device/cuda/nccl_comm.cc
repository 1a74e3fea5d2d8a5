#include "worker/device/cuda/nccl_comm.h"

#include <glog/logging.h>

#include "absl/strings/str_cat.h"

namespace shardtrain::worker::cuda {

absl::Status NcclStatus(ncclResult_t code, const char* expr, const char* file,
                        int line) {
  if (code == ncclSuccess) return absl::OkStatus();
  absl::StatusCode canonical = absl::StatusCode::kInternal;
  if (code == ncclInvalidArgument || code == ncclInvalidUsage) {
    canonical = absl::StatusCode::kInvalidArgument;
  } else if (code == ncclRemoteError) {
    canonical = absl::StatusCode::kUnavailable;
  }
  return absl::Status(canonical,
                      absl::StrCat(expr, " failed: ", ncclGetErrorString(code),
                                   " at ", file, ":", line));
}

absl::StatusOr<std::vector<NcclComm>> NcclComm::CreateAll(
    absl::Span<const int> devices) {
  if (devices.empty()) {
    return absl::InvalidArgumentError("NcclComm::CreateAll: no devices");
  }
  const int n = static_cast<int>(devices.size());
  std::vector<ncclComm_t> raw(n, nullptr);
  NCCL_RETURN_IF_ERROR(ncclCommInitAll(raw.data(), n, devices.data()));
  std::vector<NcclComm> comms(n);
  for (int i = 0; i < n; ++i) {
    comms[i].comm_ = raw[i];
    comms[i].rank_ = i;
    comms[i].size_ = n;
    comms[i].device_ = devices[i];
  }
  return comms;
}

NcclComm::~NcclComm() {
  if (comm_ == nullptr) return;
  const ncclResult_t code = ncclCommDestroy(comm_);
  LOG_IF(ERROR, code != ncclSuccess)
      << "ncclCommDestroy (rank " << rank_ << ") failed: "
      << ncclGetErrorString(code);
}

}  // namespace shardtrain::worker::cuda
