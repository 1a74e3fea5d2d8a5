// PickFreePort: a TCP port for a test's or a benchmark's server process,
// picked so that nothing else takes it before the process binds it.
//
//   ASSIGN_OR_RETURN(const int port, testutil::PickFreePort());
//   Start({"ps-server", absl::StrCat("--listen=127.0.0.1:", port), ...});
//
// Thread-safe.
#ifndef SHARDTRAIN_TESTING_FREE_PORT_H_
#define SHARDTRAIN_TESTING_FREE_PORT_H_

#include "absl/status/statusor.h"

namespace shardtrain::testutil {

// A TCP port that is free on every local address now (bound and released),
// for a process that must keep its address across restarts. It is picked
// below the kernel's ephemeral range (/proc/sys/net/ipv4/ip_local_port_range):
// a port the kernel hands out itself (bind to port 0) can be given to an
// outgoing connection (a shard's to etcd or to a peer) between the pick and
// the bind, or before a killed process is started again on it. Falls back
// to a kernel-picked port only when nothing below the range is free.
absl::StatusOr<int> PickFreePort();

// The lowest port the kernel hands out on its own.
int EphemeralPortLow();

}  // namespace shardtrain::testutil

#endif  // SHARDTRAIN_TESTING_FREE_PORT_H_
