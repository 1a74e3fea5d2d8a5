// GradStaging: host memory a model copies its gradients into for sending.
//
// One HostBuffer per parameter, allocated on first use from the backend
// that holds that parameter (page-locked on a GPU), so each gradient copy
// runs on the backend's copy stream while backward goes on. Mlp and
// PipelineModel each keep one to implement Model::StartGradCopy.
//
// Thread-compatible, and calls for different indices may run on different
// threads at once (each touches only its own buffer).
//
// Example (inside a model's StartGradCopy):
//   GradStaging staging(params.size());
//   ASSIGN_OR_RETURN(PendingGrad pending, staging.Start(i, *backend, grad));
//   RETURN_IF_ERROR(pending.ready->Wait());  // pending.values holds it
#ifndef SHARDTRAIN_WORKER_MODEL_GRAD_STAGING_H_
#define SHARDTRAIN_WORKER_MODEL_GRAD_STAGING_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/device/backend.h"
#include "worker/model/model.h"

namespace shardtrain::worker {

class GradStaging {
 public:
  explicit GradStaging(size_t num_params) : host_(num_params) {}

  // Starts copying `grad`, the gradient of parameter `index` (held by
  // `backend`), into this parameter's host buffer; the previous copy of
  // `index` must have been waited for or abandoned. REQUIRES: index <
  // num_params, grad is not written until the returned fence has passed.
  absl::StatusOr<PendingGrad> Start(int index, Backend& backend,
                                    const DeviceBuffer& grad);

 private:
  std::vector<std::unique_ptr<HostBuffer>> host_;
};

}  // namespace shardtrain::worker

#endif  // SHARDTRAIN_WORKER_MODEL_GRAD_STAGING_H_
