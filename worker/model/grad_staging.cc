#include "worker/model/grad_staging.h"

#include <utility>

#include "common/status_macros.h"

namespace shardtrain::worker {

absl::StatusOr<PendingGrad> GradStaging::Start(int index, Backend& backend,
                                               const DeviceBuffer& grad) {
  std::unique_ptr<HostBuffer>& host = host_[index];
  if (host == nullptr || host->size() != grad.size()) {
    ASSIGN_OR_RETURN(host, backend.AllocateHost(grad.size()));
  }
  const absl::Span<float> values(host->data(), host->size());
  ASSIGN_OR_RETURN(std::unique_ptr<Fence> ready,
                   backend.CopyToHostAsync(grad, 0, values));
  return PendingGrad{values, std::move(ready)};
}

}  // namespace shardtrain::worker
