// OneWorkerJob: one worker training a small MLP for a few steps against
// fresh in-process sync shards, for tests that compare how a worker sends
// its gradients (late copies, compression) by the parameters it ends with.
#ifndef SHARDTRAIN_TESTS_ONE_WORKER_JOB_H_
#define SHARDTRAIN_TESTS_ONE_WORKER_JOB_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "client/ps_client.h"
#include "common/rpc_metrics.h"
#include "worker/model/model.h"
#include "worker/trainer.h"

namespace shardtrain::testutil {

struct OneWorkerJob {
  int shards = 2;
  int64_t partition_elements = 200;  // Small, so tensors span both shards.
  int steps = 6;
  int batch = 8;
  bool overlap = false;
  // Fills in what the job does not (servers, partitioning, timeouts are set).
  client::PsClientOptions client;
  // Wraps the job's Mlp (mlp:30-20-12-4 on a CPU backend); null: as is.
  std::function<std::unique_ptr<worker::Model>(std::unique_ptr<worker::Model>)> wrap_model;
  // If set, the client records its RPCs here.
  common::RpcMetrics* rpc_metrics = nullptr;
};

struct OneWorkerResult {
  std::vector<std::vector<float>> params;  // After the last step.
  std::vector<float> losses;               // One per step.
};

// Runs the job on momentum-SGD shards (lr 0.05) with fixed data; the first
// error of any step, if one fails.
absl::StatusOr<OneWorkerResult> RunOneWorkerJob(const OneWorkerJob& job);

}  // namespace shardtrain::testutil

#endif  // SHARDTRAIN_TESTS_ONE_WORKER_JOB_H_
