// Credentials: TLS, mutual TLS and a shared auth token for every gRPC
// connection between shardtrain processes.
//
// A shard serves TLS when given a certificate and key, additionally demands
// and verifies client certificates (mutual TLS) when given a client CA, and
// checks a shared token on every call, the health and reflection services
// included, when given a token file: a call without "authorization: Bearer
// <token>" fails with UNAUTHENTICATED before any handler runs. Clients
// (workers, psctl) verify the shard against a CA bundle, present their own
// certificate for mutual TLS, and send the token with every call.
//
// A token only ever travels inside TLS: asking for one without TLS is an
// INVALID_ARGUMENT at start, on either side. With every field empty the
// connections are plaintext, as on a laptop.
//
// Example:
//   ServerSecurity security{.cert_file = "shard.pem", .key_file = "shard.key",
//                           .client_ca_file = "ca.pem",
//                           .token_file = "token"};
//   ASSIGN_OR_RETURN(auto creds, MakeServerCredentials(security, nullptr));
//   builder.AddListeningPort(address, creds, &port);
#ifndef SHARDTRAIN_COMMON_CREDENTIALS_H_
#define SHARDTRAIN_COMMON_CREDENTIALS_H_

#include <memory>
#include <string>

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/support/channel_arguments.h>
#include <prometheus/counter.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shardtrain::common {

// PEM and token files of a shard; empty means off.
struct ServerSecurity {
  std::string cert_file;       // Certificate chain served to clients.
  std::string key_file;        // Its private key.
  std::string client_ca_file;  // Set: require client certificates it signed.
  std::string token_file;      // Set: require this token on every call.

  bool tls() const { return !cert_file.empty(); }
};

// PEM and token files of a client; empty means off.
struct ClientSecurity {
  std::string ca_file;    // Set: TLS, verifying the shard against this CA.
  std::string cert_file;  // Client certificate for mutual TLS ...
  std::string key_file;   // ... and its private key.
  std::string token_file;
  // The token itself, for programs that hold it rather than a file (the
  // Python client); same rules as the file's contents. At most one of
  // token_file and token.
  std::string token;
  // Name the shard's certificate must carry, when the address used to reach
  // it differs (e.g. an IP address, or a load balancer).
  std::string server_name;

  bool tls() const { return !ca_file.empty(); }
};

// INVALID_ARGUMENT for inconsistent settings (a key without a certificate,
// a client CA or token without TLS, a token that is empty or not printable
// ASCII); NOT_FOUND / PERMISSION_DENIED for unreadable files.
// `auth_failures`, if not null, counts calls refused for their token and
// must outlive the credentials.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerSecurity& security, prometheus::Counter* auth_failures);

// Same errors as MakeServerCredentials. `args` receives what the channel
// needs besides the credentials (the server name override); may be null
// when server_name is empty.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ClientSecurity& security, grpc::ChannelArguments* args);

// For etcd (EtcdClient::Options::credentials): its CA in ca_file, and this
// client's certificate and key when etcd runs with --client-cert-auth; no
// token. Null when all are empty (plaintext). INVALID_ARGUMENT naming
// ps-server's flags (--etcd_ca, --etcd_cert, --etcd_key) for a certificate
// or key without a CA or one without the other; NOT_FOUND /
// PERMISSION_DENIED for unreadable files.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeEtcdCredentials(
    const ClientSecurity& security);

// For the data path's own TLS connections (wire/tls_context.h), which take
// the same settings with the same checks:
//
// The errors of MakeServerCredentials / MakeChannelCredentials for
// inconsistent settings, without reading any file.
absl::Status CheckServerSecurity(const ServerSecurity& security);
absl::Status CheckClientSecurity(const ClientSecurity& security);
// The token every call must carry (server) or carries (client); empty when
// there is none. Errors as above.
absl::StatusOr<std::string> ServerToken(const ServerSecurity& security);
absl::StatusOr<std::string> ClientToken(const ClientSecurity& security);
// Whether `given` is `expected`, in time that depends only on the lengths,
// so that a wrong token does not reveal how much of it was right.
bool TokensEqual(absl::string_view given, absl::string_view expected);

}  // namespace shardtrain::common

#endif  // SHARDTRAIN_COMMON_CREDENTIALS_H_
