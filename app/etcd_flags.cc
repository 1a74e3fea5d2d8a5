#include "app/etcd_flags.h"

#include <string>

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, etcd_endpoints, "",
          "etcd host:port[,host:port...] holding the chains and the shards' leases, "
          "used with --replicas > 1 (psctl: by chains, drain and undrain); list "
          "every member: calls move to the next one when one is dead, stopped or "
          "without a leader");
ABSL_FLAG(std::string, job, "shardtrain",
          "The job's name, the same for its shards, workers and psctl: its keys "
          "live under /shardtrain/<job>/ in etcd");
ABSL_FLAG(std::string, etcd_ca, "",
          "PEM CA bundle that signed etcd's certificate; set: reach etcd over TLS (https)");
ABSL_FLAG(std::string, etcd_cert, "",
          "PEM client certificate for an etcd with --client-cert-auth (with --etcd_key "
          "and --etcd_ca)");
ABSL_FLAG(std::string, etcd_key, "", "PEM private key of --etcd_cert");

namespace shardtrain::app {

EtcdFlags EtcdFromFlags() {
  EtcdFlags flags;
  flags.endpoints = absl::GetFlag(FLAGS_etcd_endpoints);
  flags.job = absl::GetFlag(FLAGS_job);
  flags.security.ca_file = absl::GetFlag(FLAGS_etcd_ca);
  flags.security.cert_file = absl::GetFlag(FLAGS_etcd_cert);
  flags.security.key_file = absl::GetFlag(FLAGS_etcd_key);
  return flags;
}

}  // namespace shardtrain::app
