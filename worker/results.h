// Progress lines and the machine-readable results file of a training run.
//
// Example:
//   std::cout << FormatEpoch(epoch, /*epochs=*/10) << "\n";
//   RETURN_IF_ERROR(WriteResults("results.json", run, result));
#ifndef SHARDTRAIN_WORKER_RESULTS_H_
#define SHARDTRAIN_WORKER_RESULTS_H_

#include <string>

#include "absl/status/status.h"
#include "worker/trainer.h"

namespace shardtrain::worker {

// What a run was, for the results file.
struct RunDescription {
  std::string mode;
  std::string model;
  std::string optimizer;  // as the shards report it
  int workers = 1;
  int shards = 1;
  int batch = 0;
  int epochs = 0;
};

// "epoch 3/10  loss 0.4123  test_acc 0.8612  samples/s 12345  staleness
//  mean 0.8 max 3  time 4.2s (compute 2.1 push 0.7 pull 0.9 wait 0.5)"
std::string FormatEpoch(const EpochResult& epoch, int epochs);

// The results as a JSON object (final_test_accuracy, epochs, wall_seconds,
// samples_per_second, mode, workers, shards, ..., per_epoch: [...]).
std::string ResultsJson(const RunDescription& run, const TrainResult& result);

// Writes ResultsJson atomically to `path`.
absl::Status WriteResults(const std::string& path, const RunDescription& run,
                          const TrainResult& result);

}  // namespace shardtrain::worker

#endif  // SHARDTRAIN_WORKER_RESULTS_H_
