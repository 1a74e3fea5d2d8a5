#include "app/etcd_security_flags.h"

#include <string>

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, etcd_ca, "",
          "PEM CA bundle that signed etcd's certificate; set: reach etcd over TLS (https)");
ABSL_FLAG(std::string, etcd_cert, "",
          "PEM client certificate for an etcd with --client-cert-auth (with --etcd_key "
          "and --etcd_ca)");
ABSL_FLAG(std::string, etcd_key, "", "PEM private key of --etcd_cert");

namespace shardtrain::app {

common::ClientSecurity EtcdSecurityFromFlags() {
  common::ClientSecurity security;
  security.ca_file = absl::GetFlag(FLAGS_etcd_ca);
  security.cert_file = absl::GetFlag(FLAGS_etcd_cert);
  security.key_file = absl::GetFlag(FLAGS_etcd_key);
  return security;
}

}  // namespace shardtrain::app
