// The command-line flags that secure a process's connection to etcd
// (--etcd_ca, --etcd_cert, --etcd_key), shared by ps-server, ps-worker and
// psctl.
//
// An etcd that serves https (its --cert-file/--key-file) needs --etcd_ca,
// the CA that signed its certificate; one that also runs with
// --client-cert-auth needs each client's certificate and key, signed by
// its --trusted-ca-file. Then only holders of such a certificate can read
// or change the chains. With all three empty the connection is plaintext.
#ifndef SHARDTRAIN_APP_ETCD_SECURITY_FLAGS_H_
#define SHARDTRAIN_APP_ETCD_SECURITY_FLAGS_H_

#include "common/credentials.h"

namespace shardtrain::app {

// The flags' current values (ca_file, cert_file, key_file), for
// MakeEtcdCredentials (common/credentials.h).
common::ClientSecurity EtcdSecurityFromFlags();

}  // namespace shardtrain::app

#endif  // SHARDTRAIN_APP_ETCD_SECURITY_FLAGS_H_
