#include "ctl/status_table.h"

#include <algorithm>
#include <cinttypes>
#include <limits>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace shardtrain::ctl {
namespace {

constexpr int64_t kNoClock = -1;

std::string Count(int64_t n) {
  if (n >= 1'000'000) return absl::StrFormat("%.1fM", n / 1e6);
  if (n >= 10'000) return absl::StrFormat("%.1fk", n / 1e3);
  return absl::StrCat(n);
}

bool Answered(const StatusResponse& status) { return status.mode() != "DOWN"; }

// A shard's partition summary: from the summary fields, or, from a shard
// that predates them, from the listed partitions.
struct PartitionSummary {
  int64_t tensors = 0;
  int64_t partitions = 0;
  int64_t elements = 0;
  int64_t min_version = 0;
  int64_t max_version = 0;
};

PartitionSummary Summarize(const StatusResponse& status) {
  PartitionSummary summary;
  if (status.num_partitions() > 0 || status.partitions().empty()) {
    summary.tensors = status.num_tensors();
    summary.partitions = status.num_partitions();
    summary.elements = status.stored_elements();
    summary.min_version = status.min_version();
    summary.max_version = status.max_version();
    return summary;
  }
  std::map<std::string, bool> tensors;
  summary.min_version = std::numeric_limits<int64_t>::max();
  for (const PartitionInfo& part : status.partitions()) {
    tensors[part.tensor()] = true;
    ++summary.partitions;
    summary.elements += part.size();
    summary.min_version = std::min(summary.min_version, part.version());
    summary.max_version = std::max(summary.max_version, part.version());
  }
  summary.tensors = static_cast<int64_t>(tensors.size());
  return summary;
}

// One worker index as all answering shards see it.
struct WorkerView {
  bool reported = false;   // some shard lists it
  bool seen_any = false;   // some shard has heard from it
  bool seen_all = true;    // every answering shard has
  bool live_all = true;
  bool done_all = true;    // done on every shard that has seen it
  double age = 0;          // the longest time any shard has not heard from it
  int64_t rejoins = 0;     // most on any shard
  std::vector<int64_t> clocks;
  int64_t min_clock = std::numeric_limits<int64_t>::max();
};

enum class WorkerCondition { kLive, kDone, kGone, kNeverJoined };

WorkerCondition Condition(const WorkerView& view) {
  if (!view.seen_any) return WorkerCondition::kNeverJoined;
  if (view.done_all && view.seen_all) return WorkerCondition::kDone;
  if (view.live_all && view.seen_all) return WorkerCondition::kLive;
  return WorkerCondition::kGone;
}

const char* Label(WorkerCondition condition) {
  switch (condition) {
    case WorkerCondition::kLive: return "live";
    case WorkerCondition::kDone: return "done";
    case WorkerCondition::kGone: return "gone";
    case WorkerCondition::kNeverJoined: return "not-joined";
  }
  return "?";
}

// "worker 2 (gone, last heard 45.2s ago)".
std::string Describe(uint32_t worker, const WorkerView& view) {
  switch (Condition(view)) {
    case WorkerCondition::kNeverJoined:
      return view.reported
                 ? absl::StrFormat("worker %d (never joined, waited %s)", worker,
                                   FormatAge(view.age))
                 : absl::StrFormat("worker %d (never joined)", worker);
    case WorkerCondition::kGone:
      return absl::StrFormat("worker %d (gone, last heard %s ago)", worker,
                             FormatAge(view.age));
    case WorkerCondition::kLive:
      return absl::StrFormat("worker %d (live, at clock %d)", worker, view.min_clock);
    case WorkerCondition::kDone:
      return absl::StrFormat("worker %d (done)", worker);
  }
  return "";
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

std::string FormatTableStates(const std::vector<std::string>& addresses,
                              const std::vector<StatusResponse>& statuses) {
  std::map<std::string, std::vector<std::pair<size_t, const TableState*>>> tables;
  for (size_t s = 0; s < statuses.size(); ++s) {
    if (!Answered(statuses[s])) continue;
    for (const TableState& table : statuses[s].tables()) tables[table.name()].push_back({s, &table});
  }
  if (tables.empty()) return "";
  std::string out = "\nsparse tables:\n";
  absl::StrAppendFormat(&out, "%-16s %4s %-16s %-5s %-21s %10s %10s %5s %9s\n", "TABLE", "DIM",
                        "OPTIMIZER", "SHARD", "ADDRESS", "ROWS", "CAPACITY", "FULL",
                        "BYTES/ROW");
  for (const auto& [name, shards] : tables) {
    int64_t total = 0;
    int64_t min_steps = std::numeric_limits<int64_t>::max(), max_steps = 0;
    for (const auto& [s, table] : shards) {
      total += table->rows();
      min_steps = std::min(min_steps, table->steps());
      max_steps = std::max(max_steps, table->steps());
      const double full = table->capacity() > 0
                              ? 100.0 * static_cast<double>(table->rows()) / table->capacity()
                              : 0.0;
      const double per_row = table->rows() > 0 ? static_cast<double>(table->bytes()) /
                                                     static_cast<double>(table->rows())
                                               : 0.0;
      absl::StrAppendFormat(&out, "%-16s %4d %-16s %-5d %-21s %10s %10s %4.0f%% %9.1f\n",
                            table->name(), table->dim(), table->optimizer(),
                            statuses[s].shard(), addresses[s], Count(table->rows()),
                            Count(table->capacity()), full, per_row);
    }
    absl::StrAppendFormat(&out, "table %s: %s rows on %d shards", name, Count(total),
                          shards.size());
    if (shards.front().second->sync()) {
      // A sync table's shards apply each step when its last push arrives:
      // they differ by at most the step in flight.
      absl::StrAppendFormat(&out, "; sync, %s", min_steps == max_steps
                                                    ? absl::StrCat("step ", max_steps)
                                                    : absl::StrCat("steps ", min_steps, "-",
                                                                   max_steps));
    }
    out += "\n";
  }
  return out;
}

std::string FormatChainStates(const std::vector<std::string>& addresses,
                              const std::vector<StatusResponse>& statuses) {
  int replicas = 0;
  for (const StatusResponse& status : statuses) {
    if (Answered(status)) replicas = std::max(replicas, status.replicas());
  }
  if (replicas <= 1) return "";
  std::string out = absl::StrFormat("\nchains (replicas %d):\n", replicas);
  absl::StrAppendFormat(&out, "%-5s %-21s %5s %6s %-12s %-8s %9s %7s %s\n", "SHARD",
                        "ADDRESS", "GROUP", "EPOCH", "MEMBERS", "POSITION", "APPLIED",
                        "LAG", "CATCHUP");
  struct GroupView {
    int64_t epoch = 0;  // the newest any shard reports
    int members = 0;    // in that epoch
    std::map<int64_t, std::vector<uint32_t>> shards_by_epoch;
  };
  std::map<int32_t, GroupView> groups;
  for (size_t s = 0; s < statuses.size(); ++s) {
    const StatusResponse& status = statuses[s];
    if (!Answered(status)) continue;
    for (const ChainState& chain : status.chains()) {
      const int size = chain.members_size();
      std::string position = "-";  // not a member
      if (chain.position() >= 0 && chain.position() < size) {
        position = size == 1                      ? "only"
                   : chain.position() == 0        ? "head"
                   : chain.position() == size - 1 ? "tail"
                                                  : absl::StrCat("#", chain.position());
      }
      // The tail's acknowledgements are counted at the head.
      const std::string lag = chain.position() == 0 && size > 1
                                  ? Count(chain.applied_ops() - chain.acked_ops())
                                  : std::string("-");
      absl::StrAppendFormat(&out, "%-5d %-21s %5d %6d %-12s %-8s %9s %7s %s\n",
                            status.shard(), addresses[s], chain.group(), chain.epoch(),
                            absl::StrJoin(chain.members(), ","), position,
                            Count(chain.applied_ops()), lag,
                            chain.catching_up() ? "yes" : "-");
      GroupView& group = groups[chain.group()];
      group.shards_by_epoch[chain.epoch()].push_back(status.shard());
      if (chain.epoch() >= group.epoch) {
        group.epoch = chain.epoch();
        group.members = size;
      }
    }
  }
  for (const auto& [index, group] : groups) {
    if (group.members < replicas) {
      absl::StrAppendFormat(&out, "group %d DEGRADED: %d of %d replicas at epoch %d\n",
                            index, group.members, replicas, group.epoch);
    }
    if (group.shards_by_epoch.size() > 1) {
      std::vector<std::string> views;
      for (const auto& [epoch, shards] : group.shards_by_epoch) {
        views.push_back(absl::StrCat("epoch ", epoch, " at shard ",
                                     absl::StrJoin(shards, ",")));
      }
      absl::StrAppendFormat(&out, "group %d: shards disagree (%s)\n", index,
                            absl::StrJoin(views, "; "));
    }
  }
  return out;
}

std::string FormatClusterStatus(const std::vector<std::string>& addresses,
                                const std::vector<StatusResponse>& statuses,
                                int max_partitions_shown) {
  std::string out = absl::StrFormat(
      "%-5s %-21s %-5s %-9s %7s %6s %8s %15s %9s %6s %7s %9s %10s %8s %s\n", "SHARD",
      "ADDRESS", "MODE", "OPTIMIZER", "TENSORS", "PARTS", "PARAMS",
      "VERSION min/max", "UPDATES", "DUPS", "DROPPED", "STALENESS", "CHECKPOINT",
      "UPTIME", "INCARNATION");
  const size_t num_shards = statuses.size();
  std::map<uint32_t, WorkerView> workers;
  int64_t max_staleness = 0, bound = -1;
  uint32_t expected = 0;
  bool sync = false;
  int64_t step = std::numeric_limits<int64_t>::max();  // slowest partition
  int answering = 0;
  for (size_t s = 0; s < num_shards; ++s) {
    const StatusResponse& status = statuses[s];
    if (!Answered(status)) {
      absl::StrAppendFormat(&out, "%-5d %-21s DOWN\n", status.shard(), addresses[s]);
      continue;
    }
    ++answering;
    const PartitionSummary summary = Summarize(status);
    absl::StrAppendFormat(
        &out, "%-5d %-21s %-5s %-9s %7s %6s %8s %15s %9s %6d %7d %9s %10s %8s %s\n",
        status.shard(), addresses[s], status.mode(), status.optimizer(),
        Count(summary.tensors), Count(summary.partitions), Count(summary.elements),
        summary.partitions == 0
            ? std::string("-")
            : absl::StrCat(summary.min_version, "/", summary.max_version),
        Count(status.updates_applied()), status.duplicate_pushes(),
        status.dropped_gradients(),
        absl::StrCat(status.max_staleness_seen(), "/",
                     status.max_staleness_bound() < 0
                         ? std::string("-")
                         : absl::StrCat(status.max_staleness_bound())),
        FormatAge(status.seconds_since_checkpoint()), FormatAge(status.uptime_seconds()),
        status.incarnation() == 0 ? std::string("-")
                                  : absl::StrFormat("%016x", status.incarnation()));
    max_staleness = std::max(max_staleness, status.max_staleness_seen());
    bound = status.max_staleness_bound();
    expected = std::max(expected, status.num_workers());
    if (status.mode() == "sync") sync = true;
    if (summary.partitions > 0) step = std::min(step, summary.min_version);
  }
  // Every worker the shards expect, also those no shard lists.
  for (uint32_t w = 0; w < expected; ++w) workers[w];
  for (size_t s = 0; s < num_shards; ++s) {
    if (!Answered(statuses[s])) continue;
    std::map<uint32_t, bool> listed;
    for (const WorkerState& state : statuses[s].workers()) {
      WorkerView& view = workers[state.worker()];
      listed[state.worker()] = true;
      view.reported = true;
      view.clocks.resize(num_shards, kNoClock);
      // A shard that predates `seen` lists only workers it has heard from.
      const bool seen = state.seen() || state.live() || state.done() || state.clock() > 0;
      view.seen_any |= seen;
      view.seen_all &= seen;
      view.live_all &= state.live();
      if (seen) {
        view.done_all &= state.done();
        view.clocks[s] = state.clock();
        view.min_clock = std::min(view.min_clock, state.clock());
      }
      view.age = std::max(view.age, state.seconds_since_heartbeat());
      view.rejoins = std::max(view.rejoins, state.rejoins());
    }
    for (auto& [worker, view] : workers) {
      if (!listed.count(worker)) {
        view.seen_all = false;
        view.live_all = false;
      }
    }
  }

  absl::StrAppendFormat(&out, "\n%-6s %-10s %-10s %7s  %s\n", "WORKER", "STATE",
                        "HEARD", "REJOINS", "CLOCK per shard");
  int64_t slowest = std::numeric_limits<int64_t>::max(), fastest = 0;
  int live = 0, done = 0;
  std::vector<std::string> missing, behind;
  for (auto& [worker, view] : workers) {
    view.clocks.resize(num_shards, kNoClock);
    std::vector<std::string> clock_list;
    for (int64_t clock : view.clocks) {
      clock_list.push_back(clock == kNoClock ? std::string("-") : absl::StrCat(clock));
    }
    const WorkerCondition condition = Condition(view);
    absl::StrAppendFormat(&out, "%-6d %-10s %-10s %7d  %s\n", worker, Label(condition),
                          view.reported ? FormatAge(view.age) : std::string("-"),
                          view.rejoins, absl::StrJoin(clock_list, " "));
    switch (condition) {
      case WorkerCondition::kLive:
        ++live;
        slowest = std::min(slowest, view.min_clock);
        fastest = std::max(fastest, view.min_clock);
        break;
      case WorkerCondition::kDone:
        ++done;
        break;
      default:
        missing.push_back(Describe(worker, view));
    }
    // Sync: a worker that has not finished step `step` (clock = steps
    // finished) and is not done holds that step back.
    if (sync && step != std::numeric_limits<int64_t>::max() &&
        condition != WorkerCondition::kDone &&
        (!view.seen_any || view.min_clock <= step)) {
      behind.push_back(Describe(worker, view));
    }
  }
  if (workers.empty()) out += "(no worker expected or connected)\n";

  absl::StrAppendFormat(&out, "\nworkers: %d expected, %d live, %d done, %d missing\n",
                        static_cast<int>(std::max<size_t>(expected, workers.size())),
                        live, done, static_cast<int>(missing.size()));
  if (sync && step != std::numeric_limits<int64_t>::max()) {
    if (behind.empty()) {
      absl::StrAppendFormat(&out, "sync step %d: every worker has pushed it\n", step);
    } else {
      absl::StrAppendFormat(&out, "sync step %d waits for %s\n", step,
                            absl::StrJoin(behind, ", "));
    }
  } else if (!missing.empty()) {
    absl::StrAppendFormat(&out, "missing: %s\n", absl::StrJoin(missing, ", "));
  }
  if (answering < static_cast<int>(num_shards)) {
    absl::StrAppendFormat(&out, "shards: %d of %d answered\n", answering,
                          static_cast<int>(num_shards));
  }
  absl::StrAppendFormat(&out, "staleness: max seen %d, bound %s", max_staleness,
                        bound < 0 ? std::string("none") : absl::StrCat(bound));
  if (slowest != std::numeric_limits<int64_t>::max()) {
    absl::StrAppendFormat(&out, "; live clocks %d..%d (spread %d)", slowest, fastest,
                          fastest - slowest);
  }
  out += "\n";
  out += FormatChainStates(addresses, statuses);
  out += FormatTableStates(addresses, statuses);

  bool any_partition = false;
  for (const StatusResponse& status : statuses) {
    any_partition |= Answered(status) && !status.partitions().empty();
  }
  if (max_partitions_shown > 0 && any_partition) {
    absl::StrAppendFormat(&out, "\n%-5s %-24s %5s %10s %9s %8s\n", "SHARD", "TENSOR",
                          "PART", "OFFSET", "SIZE", "VERSION");
    for (size_t s = 0; s < num_shards; ++s) {
      const StatusResponse& status = statuses[s];
      if (!Answered(status)) continue;
      const int listed = std::min(status.partitions_size(), max_partitions_shown);
      for (int i = 0; i < listed; ++i) {
        const PartitionInfo& part = status.partitions(i);
        absl::StrAppendFormat(&out, "%-5d %-24s %5d %10d %9d %8d\n", status.shard(),
                              part.tensor(), part.partition(), part.offset(), part.size(),
                              part.version());
      }
      const int64_t total = std::max<int64_t>(Summarize(status).partitions,
                                              status.partitions_size());
      if (total > listed) {
        absl::StrAppendFormat(&out, "%-5d ... %d more partitions (--max_partitions)\n",
                              status.shard(), total - listed);
      }
    }
  }
  return out;
}

}  // namespace shardtrain::ctl
