#include "ctl/status_table.h"

#include <algorithm>
#include <limits>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace shardtrain::ctl {
namespace {

std::string Count(int64_t n) {
  if (n >= 10'000'000) return absl::StrFormat("%.1fM", n / 1e6);
  if (n >= 10'000) return absl::StrFormat("%.1fk", n / 1e3);
  return absl::StrCat(n);
}

}  // namespace

std::string FormatAge(double seconds) {
  if (seconds < 0) return "never";
  if (seconds < 1) return absl::StrFormat("%.0fms", seconds * 1e3);
  if (seconds < 60) return absl::StrFormat("%.1fs", seconds);
  const int64_t whole = static_cast<int64_t>(seconds);
  if (whole < 3600) return absl::StrFormat("%dm%02ds", whole / 60, whole % 60);
  return absl::StrFormat("%dh%02dm", whole / 3600, whole % 3600 / 60);
}

std::string FormatClusterStatus(const std::vector<std::string>& addresses,
                                const std::vector<StatusResponse>& statuses) {
  std::string out = absl::StrFormat(
      "%-5s %-21s %-5s %-9s %5s %8s %15s %9s %7s %9s %10s %8s\n", "SHARD",
      "ADDRESS", "MODE", "OPTIMIZER", "PARTS", "PARAMS", "VERSION min/max",
      "UPDATES", "DROPPED", "STALENESS", "CHECKPOINT", "UPTIME");
  // worker -> clock per shard, and its state as the first shard saw it.
  std::map<uint32_t, std::vector<int64_t>> clocks;
  std::map<uint32_t, WorkerState> states;
  int64_t max_staleness = 0, bound = -1;
  for (size_t s = 0; s < statuses.size(); ++s) {
    const StatusResponse& status = statuses[s];
    int64_t params = 0;
    int64_t lo = std::numeric_limits<int64_t>::max(), hi = 0;
    for (const PartitionInfo& part : status.partitions()) {
      params += part.size();
      lo = std::min(lo, part.version());
      hi = std::max(hi, part.version());
    }
    if (status.partitions().empty()) lo = 0;
    absl::StrAppendFormat(
        &out, "%-5d %-21s %-5s %-9s %5d %8s %15s %9s %7d %9s %10s %8s\n",
        status.shard(), addresses[s], status.mode(), status.optimizer(),
        status.partitions_size(), Count(params), absl::StrCat(lo, "/", hi),
        Count(status.updates_applied()), status.dropped_gradients(),
        absl::StrCat(status.max_staleness_seen(), "/",
                     status.max_staleness_bound() < 0
                         ? std::string("-")
                         : absl::StrCat(status.max_staleness_bound())),
        FormatAge(status.seconds_since_checkpoint()),
        FormatAge(status.uptime_seconds()));
    max_staleness = std::max(max_staleness, status.max_staleness_seen());
    bound = status.max_staleness_bound();
    for (const WorkerState& worker : status.workers()) {
      auto& per_shard = clocks[worker.worker()];
      per_shard.resize(statuses.size(), -1);
      per_shard[s] = worker.clock();
      states.emplace(worker.worker(), worker);
    }
  }
  absl::StrAppendFormat(&out, "\n%-6s %-7s %-10s %s\n", "WORKER", "STATE",
                        "HEARTBEAT", "CLOCK per shard");
  int64_t slowest = std::numeric_limits<int64_t>::max(), fastest = 0;
  for (const auto& [worker, per_shard] : clocks) {
    const WorkerState& state = states[worker];
    std::string clock_list;
    int64_t worker_clock = std::numeric_limits<int64_t>::max();
    for (int64_t clock : per_shard) {
      absl::StrAppend(&clock_list, clock_list.empty() ? "" : " ",
                      clock < 0 ? std::string("-") : absl::StrCat(clock));
      if (clock >= 0) worker_clock = std::min(worker_clock, clock);
    }
    const char* label = state.done() ? "done" : state.live() ? "live" : "gone";
    absl::StrAppendFormat(&out, "%-6d %-7s %-10s %s\n", worker, label,
                          FormatAge(state.seconds_since_heartbeat()), clock_list);
    if (!state.done() && state.live()) {
      slowest = std::min(slowest, worker_clock);
      fastest = std::max(fastest, worker_clock);
    }
  }
  if (clocks.empty()) out += "(no worker has connected)\n";
  absl::StrAppendFormat(&out, "\nstaleness: max seen %d, bound %s", max_staleness,
                        bound < 0 ? std::string("none") : absl::StrCat(bound));
  if (slowest != std::numeric_limits<int64_t>::max()) {
    absl::StrAppendFormat(&out, "; active clocks %d..%d (spread %d)", slowest,
                          fastest, fastest - slowest);
  }
  out += "\n";
  return out;
}

}  // namespace shardtrain::ctl
