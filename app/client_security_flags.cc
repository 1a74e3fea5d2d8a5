#include "app/client_security_flags.h"

#include <string>

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA bundle to verify the shards with; set: connect over TLS");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM client certificate for mutual TLS (with --tls_key and --tls_ca)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_server_name, "",
          "Name the shards' certificates carry, if not the host in --servers");
ABSL_FLAG(std::string, auth_token_file, "",
          "File holding the shared token sent with every call (needs --tls_ca)");

namespace shardtrain::app {

common::ClientSecurity ClientSecurityFromFlags() {
  common::ClientSecurity security;
  security.ca_file = absl::GetFlag(FLAGS_tls_ca);
  security.cert_file = absl::GetFlag(FLAGS_tls_cert);
  security.key_file = absl::GetFlag(FLAGS_tls_key);
  security.server_name = absl::GetFlag(FLAGS_tls_server_name);
  security.token_file = absl::GetFlag(FLAGS_auth_token_file);
  return security;
}

}  // namespace shardtrain::app
