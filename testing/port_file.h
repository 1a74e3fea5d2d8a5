// Port files: a server started with --port_file=PATH (ps-server, ps-worker,
// wire_bench --serve_echo) writes the ports it serves on there, once it
// serves ("PORT METRICS_PORT" for ps-server), so that a test or a benchmark
// can start it on port 0 and learn where it listens.
//
//   ASSIGN_OR_RETURN(pid_t pid, group.Start({bin + "/ps-server",
//                                            "--port_file=" + file, ...}, log));
//   ASSIGN_OR_RETURN(std::vector<int> ports,
//                    WaitForPorts(group, pid, file, log, absl::Seconds(30)));
//
// Thread-safe (each call reads files only; WaitForPorts uses the group as
// its thread may).
#ifndef SHARDTRAIN_TESTING_PORT_FILE_H_
#define SHARDTRAIN_TESTING_PORT_FILE_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "testing/process_group.h"

namespace shardtrain::testutil {

// Waits up to `timeout` until `path` holds a whitespace-separated list of
// positive integers and returns them. DEADLINE_EXCEEDED otherwise.
absl::StatusOr<std::vector<int>> ReadPortFile(const std::string& path,
                                              absl::Duration timeout);

// The same for the port file of `pid`, one of `group`'s processes, which
// fails at once (UNAVAILABLE, with the process's log from `log_path`) when
// the process exits before writing it; DEADLINE_EXCEEDED, with the log,
// after `timeout`.
absl::StatusOr<std::vector<int>> WaitForPorts(ProcessGroup& group, pid_t pid,
                                              const std::string& path,
                                              const std::string& log_path,
                                              absl::Duration timeout);

}  // namespace shardtrain::testutil

#endif  // SHARDTRAIN_TESTING_PORT_FILE_H_
