#include "bench/process_stats.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "testing/files.h"

namespace shardtrain::bench {

using testutil::ReadFile;
namespace {

double Seconds(const rusage& usage) {
  return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec +
         1e-6 * (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
}

}  // namespace

double SelfCpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return Seconds(usage);
}

double ReapedChildrenCpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_CHILDREN, &usage);
  return Seconds(usage);
}

absl::StatusOr<double> ProcessCpuSeconds(pid_t pid) {
  const std::string stat = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) {
    return absl::NotFoundError(absl::StrCat("cannot read /proc/", pid, "/stat"));
  }
  // Fields after the command name start at field 3 (state); utime and
  // stime are fields 14 and 15.
  const std::vector<std::string> fields =
      absl::StrSplit(stat.substr(paren + 2), ' ', absl::SkipEmpty());
  if (fields.size() < 13) return absl::InternalError("short /proc/PID/stat");
  const double ticks = std::strtod(fields[11].c_str(), nullptr) +
                       std::strtod(fields[12].c_str(), nullptr);
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

absl::StatusOr<double> ProcessesCpuSeconds(const std::vector<pid_t>& pids) {
  double total = 0;
  for (pid_t pid : pids) {
    ASSIGN_OR_RETURN(double seconds, ProcessCpuSeconds(pid));
    total += seconds;
  }
  return total;
}

std::string SelfPath() {
  std::error_code error;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  return error ? "" : self.string();
}

LoadAverage ReadLoadAverage() {
  LoadAverage load;
  const std::vector<std::string> fields =
      absl::StrSplit(ReadFile("/proc/loadavg"), ' ', absl::SkipEmpty());
  if (fields.size() < 3) {
    load.text = "unknown";
    return load;
  }
  load.text = absl::StrCat(fields[0], " ", fields[1], " ", fields[2]);
  load.one_minute = std::strtod(fields[0].c_str(), nullptr);
  return load;
}

}  // namespace shardtrain::bench
