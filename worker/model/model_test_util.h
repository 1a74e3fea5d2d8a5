// Test helpers for code that takes a ModelFactory: Mlps on a backend the
// test owns. Header-only; for tests.
//
// Example:
//   std::unique_ptr<Backend> backend = MakeCpuBackend();
//   ModelFactory make_model = MlpFactory(spec, backend.get());
//   ASSERT_OK_AND_ASSIGN(std::unique_ptr<Model> model, make_model(64));
#ifndef SHARDTRAIN_WORKER_MODEL_MODEL_TEST_UTIL_H_
#define SHARDTRAIN_WORKER_MODEL_MODEL_TEST_UTIL_H_

#include <memory>
#include <utility>

#include "absl/status/statusor.h"
#include "worker/device/backend.h"
#include "worker/model/mlp.h"
#include "worker/model/model.h"
#include "worker/model/model_spec.h"

namespace shardtrain::worker {

// Mlps of `spec` on `backend` (not owned; it must outlive every model made).
inline ModelFactory MlpFactory(const ModelSpec& spec, Backend* backend) {
  return [spec, backend](int max_batch) -> absl::StatusOr<std::unique_ptr<Model>> {
    absl::StatusOr<std::unique_ptr<Mlp>> mlp = Mlp::Create(spec, backend, max_batch);
    if (!mlp.ok()) return mlp.status();
    return std::unique_ptr<Model>(std::move(*mlp));
  };
}

}  // namespace shardtrain::worker

#endif  // SHARDTRAIN_WORKER_MODEL_MODEL_TEST_UTIL_H_
