#include "common/credentials.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <utility>

#include <grpcpp/security/auth_metadata_processor.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace shardtrain::common {
namespace {

constexpr char kAuthorization[] = "authorization";
constexpr char kBearer[] = "Bearer ";

absl::StatusOr<std::string> ReadWholeFile(const std::string& path, const char* what) {
  std::error_code error_code;
  if (std::filesystem::is_directory(path, error_code)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the ", what, " file ", path, " is a directory"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int error = errno;
    const std::string message =
        absl::StrCat("cannot read the ", what, " file ", path, ": ", std::strerror(error));
    if (error == EACCES) return absl::PermissionDeniedError(message);
    return absl::NotFoundError(message);
  }
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

// `token` without surrounding whitespace; it travels as an HTTP/2 header
// value, so it must be printable ASCII. `source` names where it came from.
absl::StatusOr<std::string> CheckToken(std::string token, const std::string& source) {
  absl::StripAsciiWhitespace(&token);
  if (token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("the auth token ", source, " is empty"));
  }
  for (const char c : token) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the auth token ", source, " must be printable ASCII without spaces"));
    }
  }
  return token;
}

absl::StatusOr<std::string> ReadToken(const std::string& path) {
  ASSIGN_OR_RETURN(std::string token, ReadWholeFile(path, "auth token"));
  return CheckToken(std::move(token), absl::StrCat("in ", path));
}

// Refuses every call whose "authorization" header is not the bearer token.
class TokenChecker final : public grpc::AuthMetadataProcessor {
 public:
  TokenChecker(const std::string& token, prometheus::Counter* failures)
      : expected_(absl::StrCat(kBearer, token)), failures_(failures) {}

  // Cheap: run inline on the transport rather than on a separate thread.
  bool IsBlocking() const override { return false; }

  grpc::Status Process(const InputMetadata& metadata, grpc::AuthContext* /*context*/,
                       OutputMetadata* consumed, OutputMetadata* /*response*/) override {
    const auto it = metadata.find(kAuthorization);
    if (it == metadata.end() || !TokensEqual(absl::string_view(it->second.data(), it->second.size()), expected_)) {
      if (failures_ != nullptr) failures_->Increment();
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          it == metadata.end() ? "no auth token" : "wrong auth token");
    }
    // Handlers never see the token.
    consumed->insert(std::make_pair(std::string(it->first.data(), it->first.size()),
                                    std::string(it->second.data(), it->second.size())));
    return grpc::Status::OK;
  }

 private:
  const std::string expected_;
  prometheus::Counter* const failures_;
};

// Adds the bearer token to every call.
class TokenSender final : public grpc::MetadataCredentialsPlugin {
 public:
  explicit TokenSender(const std::string& token) : header_(absl::StrCat(kBearer, token)) {}

  bool IsBlocking() const override { return false; }
  const char* GetType() const override { return "shardtrain-token"; }

  grpc::Status GetMetadata(grpc::string_ref /*service_url*/, grpc::string_ref /*method_name*/,
                           const grpc::AuthContext& /*channel_auth_context*/,
                           std::multimap<std::string, std::string>* metadata) override {
    metadata->insert({kAuthorization, header_});
    return grpc::Status::OK;
  }

 private:
  const std::string header_;
};

}  // namespace

absl::Status CheckServerSecurity(const ServerSecurity& s) {
  if (s.cert_file.empty() != s.key_file.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together");
  }
  if (!s.tls() && !s.client_ca_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls_client_ca (mutual TLS) needs --tls_cert and --tls_key");
  }
  if (!s.tls() && !s.token_file.empty()) {
    return absl::InvalidArgumentError(
        "--auth_token_file needs --tls_cert and --tls_key: a token must not travel in "
        "plaintext");
  }
  return absl::OkStatus();
}

absl::Status CheckClientSecurity(const ClientSecurity& s) {
  if (s.cert_file.empty() != s.key_file.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together");
  }
  if (!s.tls() && !s.cert_file.empty()) {
    return absl::InvalidArgumentError("--tls_cert (mutual TLS) needs --tls_ca");
  }
  if (!s.token_file.empty() && !s.token.empty()) {
    return absl::InvalidArgumentError("give the auth token or its file, not both");
  }
  if (!s.tls() && !s.token_file.empty()) {
    return absl::InvalidArgumentError(
        "--auth_token_file needs --tls_ca: a token must not travel in plaintext");
  }
  if (!s.tls() && !s.token.empty()) {
    return absl::InvalidArgumentError(
        "an auth token needs TLS (a CA to verify the shards with): a token must not "
        "travel in plaintext");
  }
  if (!s.tls() && !s.server_name.empty()) {
    return absl::InvalidArgumentError("--tls_server_name needs --tls_ca");
  }
  return absl::OkStatus();
}

bool TokensEqual(absl::string_view given, absl::string_view expected) {
  if (given.size() != expected.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    diff |= static_cast<unsigned char>(given[i] ^ expected[i]);
  }
  return diff == 0;
}

absl::StatusOr<std::string> ServerToken(const ServerSecurity& security) {
  RETURN_IF_ERROR(CheckServerSecurity(security));
  if (security.token_file.empty()) return std::string();
  return ReadToken(security.token_file);
}

absl::StatusOr<std::string> ClientToken(const ClientSecurity& security) {
  RETURN_IF_ERROR(CheckClientSecurity(security));
  if (!security.token.empty()) return CheckToken(security.token, "given");
  if (security.token_file.empty()) return std::string();
  return ReadToken(security.token_file);
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerSecurity& security, prometheus::Counter* auth_failures) {
  RETURN_IF_ERROR(CheckServerSecurity(security));
  if (!security.tls()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions options(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  ASSIGN_OR_RETURN(pair.cert_chain, ReadWholeFile(security.cert_file, "TLS certificate"));
  ASSIGN_OR_RETURN(pair.private_key, ReadWholeFile(security.key_file, "TLS key"));
  options.pem_key_cert_pairs.push_back(std::move(pair));
  if (!security.client_ca_file.empty()) {
    ASSIGN_OR_RETURN(options.pem_root_certs,
                     ReadWholeFile(security.client_ca_file, "client CA"));
    options.client_certificate_request =
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::SslServerCredentials(options);
  if (!security.token_file.empty()) {
    ASSIGN_OR_RETURN(const std::string token, ReadToken(security.token_file));
    credentials->SetAuthMetadataProcessor(
        std::make_shared<TokenChecker>(token, auth_failures));
  }
  return credentials;
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ClientSecurity& security, grpc::ChannelArguments* args) {
  RETURN_IF_ERROR(CheckClientSecurity(security));
  if (!security.tls()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions options;
  ASSIGN_OR_RETURN(options.pem_root_certs, ReadWholeFile(security.ca_file, "TLS CA"));
  if (!security.cert_file.empty()) {
    ASSIGN_OR_RETURN(options.pem_cert_chain,
                     ReadWholeFile(security.cert_file, "TLS certificate"));
    ASSIGN_OR_RETURN(options.pem_private_key, ReadWholeFile(security.key_file, "TLS key"));
  }
  if (!security.server_name.empty()) {
    if (args == nullptr) {
      return absl::InvalidArgumentError("--tls_server_name needs channel arguments");
    }
    args->SetSslTargetNameOverride(security.server_name);
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::SslCredentials(options);
  ASSIGN_OR_RETURN(const std::string token, ClientToken(security));
  if (token.empty()) return credentials;
  return grpc::CompositeChannelCredentials(
      credentials, grpc::MetadataCredentialsFromPlugin(std::make_unique<TokenSender>(token)));
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeEtcdCredentials(
    const ClientSecurity& security) {
  if (security.ca_file.empty() && security.cert_file.empty() && security.key_file.empty()) {
    return nullptr;
  }
  if (security.ca_file.empty()) {
    return absl::InvalidArgumentError(
        "--etcd_cert/--etcd_key need --etcd_ca (the CA that signed etcd's certificate)");
  }
  if (security.cert_file.empty() != security.key_file.empty()) {
    return absl::InvalidArgumentError("--etcd_cert and --etcd_key go together");
  }
  if (!security.token_file.empty() || !security.token.empty()) {
    return absl::InvalidArgumentError("etcd takes no shardtrain auth token");
  }
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      MakeChannelCredentials(security, nullptr);
  if (!credentials.ok()) {
    return absl::Status(credentials.status().code(),
                        absl::StrCat("etcd TLS: ", credentials.status().message()));
  }
  return credentials;
}

}  // namespace shardtrain::common
