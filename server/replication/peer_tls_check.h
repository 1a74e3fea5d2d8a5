// CheckPeerTls: before a replicated shard with TLS joins its chains, it
// calls itself the way the shard before it in a chain will forward to it:
// with the peer credentials (its own certificate as the client certificate
// under mutual TLS, --tls_peer_ca, the token) and expecting the name of its
// advertised address in its certificate. A certificate without the
// clientAuth extended key usage, a peer CA that did not sign it or an
// advertised name it does not carry would otherwise fail every forward at
// run time, silently from the worker's side; here it fails the start with
// the handshake's error and what to fix.
//
//   RETURN_IF_ERROR(CheckPeerTls(peer_security, "127.0.0.1:7000",
//                                "shard-1.shards:7000", absl::Seconds(10)));
#ifndef SHARDTRAIN_SERVER_REPLICATION_PEER_TLS_CHECK_H_
#define SHARDTRAIN_SERVER_REPLICATION_PEER_TLS_CHECK_H_

#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/credentials.h"

namespace shardtrain::server {

// Calls Status on the shard listening at `local_address` with `peer`'s
// credentials, verifying its certificate for the host of
// `advertise_address`. OK or FAILED_PRECONDITION naming the cause.
absl::Status CheckPeerTls(const common::ClientSecurity& peer, const std::string& local_address,
                          const std::string& advertise_address, absl::Duration timeout);

}  // namespace shardtrain::server

#endif  // SHARDTRAIN_SERVER_REPLICATION_PEER_TLS_CHECK_H_
