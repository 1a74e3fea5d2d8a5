// The command-line flags that secure a client's connections to the shards
// (--tls_ca, --tls_cert, --tls_key, --tls_server_name, --auth_token_file),
// shared by ps-worker and psctl. Link only into client binaries: ps-server
// defines its own --tls_cert/--tls_key.
#ifndef SHARDTRAIN_APP_CLIENT_SECURITY_FLAGS_H_
#define SHARDTRAIN_APP_CLIENT_SECURITY_FLAGS_H_

#include "common/credentials.h"

namespace shardtrain::app {

// The flags' current values.
common::ClientSecurity ClientSecurityFromFlags();

}  // namespace shardtrain::app

#endif  // SHARDTRAIN_APP_CLIENT_SECURITY_FLAGS_H_
