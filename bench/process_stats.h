// What the benchmarks measure of processes, this one's and those it starts
// (testing/process_group.h): CPU time, from getrusage and /proc/PID/stat,
// this binary's path and the load average.
//
//   ASSIGN_OR_RETURN(double before, ProcessCpuSeconds(shard_pid));
//   ... timed block ...
//   ASSIGN_OR_RETURN(double after, ProcessCpuSeconds(shard_pid));
//
// Thread-safe.
#ifndef SHARDTRAIN_BENCH_PROCESS_STATS_H_
#define SHARDTRAIN_BENCH_PROCESS_STATS_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace shardtrain::bench {

// CPU time (user + system) of this process, and of its reaped children.
double SelfCpuSeconds();
double ReapedChildrenCpuSeconds();

// utime + stime of a running process, from /proc/PID/stat.
absl::StatusOr<double> ProcessCpuSeconds(pid_t pid);
// Their sum over `pids`.
absl::StatusOr<double> ProcessesCpuSeconds(const std::vector<pid_t>& pids);

// This binary's path, from /proc/self/exe; empty when unknown.
std::string SelfPath();

// "1.23 0.98 0.75" (the 1, 5 and 15 minute load averages) and the first.
struct LoadAverage {
  std::string text;
  double one_minute = 0;
};
LoadAverage ReadLoadAverage();

}  // namespace shardtrain::bench

#endif  // SHARDTRAIN_BENCH_PROCESS_STATS_H_
