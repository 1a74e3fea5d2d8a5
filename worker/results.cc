#include "worker/results.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/atomic_file.h"

namespace shardtrain::worker {
namespace {

// Names here are fixed identifiers; only these characters need escaping.
std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace

std::string FormatEpoch(const EpochResult& e, int epochs) {
  std::string accuracy =
      e.test_accuracy >= 0 ? absl::StrFormat("%.4f", e.test_accuracy) : "-";
  return absl::StrFormat(
      "epoch %d/%d  loss %.4f  test_acc %s  samples/s %.0f  staleness mean "
      "%.2f max %d  time %.1fs (compute %.1f push %.1f pull %.1f wait %.1f)",
      e.epoch, epochs, e.train_loss, accuracy, e.samples_per_second,
      e.mean_staleness, e.max_staleness, e.seconds, e.compute_seconds,
      e.push_seconds, e.pull_seconds, e.wait_seconds);
}

std::string ResultsJson(const RunDescription& run, const TrainResult& result) {
  std::string json = absl::StrFormat(
      "{\n  \"final_test_accuracy\": %.6f,\n  \"epochs\": %d,\n"
      "  \"wall_seconds\": %.3f,\n  \"samples_per_second\": %.1f,\n"
      "  \"mode\": %s,\n  \"workers\": %d,\n  \"shards\": %d,\n"
      "  \"model\": %s,\n  \"optimizer\": %s,\n  \"batch\": %d,\n"
      "  \"steps_per_worker\": %d,\n  \"per_epoch\": [",
      result.final_test_accuracy, run.epochs, result.wall_seconds,
      result.samples_per_second, JsonString(run.mode), run.workers, run.shards,
      JsonString(run.model), JsonString(run.optimizer), run.batch, result.steps);
  for (size_t i = 0; i < result.epochs.size(); ++i) {
    const EpochResult& e = result.epochs[i];
    absl::StrAppendFormat(
        &json,
        "%s\n    {\"epoch\": %d, \"train_loss\": %.6f, \"test_accuracy\": %.6f, "
        "\"seconds\": %.3f, \"samples_per_second\": %.1f, "
        "\"mean_staleness\": %.4f, \"max_staleness\": %d, "
        "\"compute_seconds\": %.3f, \"push_seconds\": %.3f, "
        "\"pull_seconds\": %.3f, \"wait_seconds\": %.3f}",
        i == 0 ? "" : ",", e.epoch, e.train_loss, e.test_accuracy, e.seconds,
        e.samples_per_second, e.mean_staleness, e.max_staleness,
        e.compute_seconds, e.push_seconds, e.pull_seconds, e.wait_seconds);
  }
  json += "\n  ]\n}\n";
  return json;
}

absl::Status WriteResults(const std::string& path, const RunDescription& run,
                          const TrainResult& result) {
  return common::WriteFileAtomically(path, ResultsJson(run, result));
}

}  // namespace shardtrain::worker
