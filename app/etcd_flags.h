// The command-line flags of a process's connection to etcd, shared by
// ps-server, ps-worker and psctl: where etcd is (--etcd_endpoints), the
// job whose keys they read (--job), and TLS to it (--etcd_ca, --etcd_cert,
// --etcd_key).
//
// An etcd that serves https (its --cert-file/--key-file) needs --etcd_ca,
// the CA that signed its certificate; one that also runs with
// --client-cert-auth needs each client's certificate and key, signed by
// its --trusted-ca-file. Then only holders of such a certificate can read
// or change the chains. With all three empty the connection is plaintext.
//
//   const app::EtcdFlags etcd = app::EtcdFromFlags();
//   options.endpoints = etcd.endpoints;
//   options.credentials = common::MakeEtcdCredentials(etcd.security);
#ifndef SHARDTRAIN_APP_ETCD_FLAGS_H_
#define SHARDTRAIN_APP_ETCD_FLAGS_H_

#include <string>

#include "common/credentials.h"

namespace shardtrain::app {

// The flags' current values.
struct EtcdFlags {
  std::string endpoints;            // --etcd_endpoints: host:port[,host:port...]
  std::string job;                  // --job: keys under /shardtrain/<job>/
  common::ClientSecurity security;  // --etcd_ca, --etcd_cert, --etcd_key
};
EtcdFlags EtcdFromFlags();

}  // namespace shardtrain::app

#endif  // SHARDTRAIN_APP_ETCD_FLAGS_H_
