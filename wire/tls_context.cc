#include "wire/tls_context.h"

#include <openssl/ssl.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "wire/internal/openssl_reason.h"

namespace shardtrain::wire {
namespace {

using internal::OpenSslReason;

absl::Status Refused(const char* what, const std::string& file) {
  return absl::InvalidArgumentError(
      absl::StrCat("data port TLS: cannot use the ", what, " ", file, ": ", OpenSslReason("unknown error")));
}

struct CtxDeleter {
  void operator()(SSL_CTX* ctx) const { SSL_CTX_free(ctx); }
};
using CtxPtr = std::unique_ptr<SSL_CTX, CtxDeleter>;

absl::StatusOr<CtxPtr> NewContext(bool server, size_t buffer_bytes) {
  RETURN_IF_ERROR(TlsContext::CheckBufferBytes(static_cast<int64_t>(buffer_bytes)));
  CtxPtr ctx(SSL_CTX_new(server ? TLS_server_method() : TLS_client_method()));
  if (ctx == nullptr) {
    return absl::InternalError(absl::StrCat("data port TLS: SSL_CTX_new: ", OpenSslReason("unknown error")));
  }
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
  // A peer that closes its socket without close_notify ends the connection
  // as a plain TCP close does: frames carry their own lengths, so nothing
  // can be cut short unnoticed.
  SSL_CTX_set_options(ctx.get(), SSL_OP_IGNORE_UNEXPECTED_EOF | SSL_OP_NO_TICKET |
                                     SSL_OP_NO_RENEGOTIATION);
  // One read takes as many records as the socket holds, up to
  // buffer_bytes (FrameSocket buffers its writes likewise): a record
  // carries at most 16 KiB, and a syscall per record cost more than the
  // encryption.
  SSL_CTX_set_mode(ctx.get(), SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  SSL_CTX_set_read_ahead(ctx.get(), 1);
  SSL_CTX_set_default_read_buffer_len(ctx.get(), buffer_bytes);
  if (server) SSL_CTX_set_num_tickets(ctx.get(), 0);
  return ctx;
}

absl::Status UseCertificate(SSL_CTX* ctx, const std::string& cert_file,
                            const std::string& key_file) {
  if (SSL_CTX_use_certificate_chain_file(ctx, cert_file.c_str()) != 1) {
    return Refused("certificate", cert_file);
  }
  if (SSL_CTX_use_PrivateKey_file(ctx, key_file.c_str(), SSL_FILETYPE_PEM) != 1) {
    return Refused("key", key_file);
  }
  if (SSL_CTX_check_private_key(ctx) != 1) {
    return Refused("key (it is not the certificate's)", key_file);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status TlsContext::CheckBufferBytes(int64_t bytes) {
  if (bytes >= static_cast<int64_t>(kMinBufferBytes) &&
      bytes <= static_cast<int64_t>(kMaxBufferBytes)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "data port TLS: a connection's buffers of ", bytes, " bytes are not in [",
      kMinBufferBytes, ", ", kMaxBufferBytes, "] (--data_tls_buffer_kib: ",
      kMinBufferBytes >> 10, " to ", kMaxBufferBytes >> 10, ")"));
}

TlsContext::TlsContext(SSL_CTX* ctx, bool server, std::string token, std::string server_name,
                       size_t buffer_bytes)
    : ctx_(ctx),
      server_(server),
      token_(std::move(token)),
      server_name_(std::move(server_name)),
      buffer_bytes_(buffer_bytes) {}

TlsContext::~TlsContext() { SSL_CTX_free(ctx_); }

absl::StatusOr<std::shared_ptr<const TlsContext>> TlsContext::ForServer(
    const common::ServerSecurity& security, size_t buffer_bytes) {
  ASSIGN_OR_RETURN(std::string token, common::ServerToken(security));
  if (!security.tls()) return nullptr;
  ASSIGN_OR_RETURN(CtxPtr ctx, NewContext(/*server=*/true, buffer_bytes));
  RETURN_IF_ERROR(UseCertificate(ctx.get(), security.cert_file, security.key_file));
  if (!security.client_ca_file.empty()) {
    if (SSL_CTX_load_verify_locations(ctx.get(), security.client_ca_file.c_str(), nullptr) != 1) {
      return Refused("client CA", security.client_ca_file);
    }
    STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(security.client_ca_file.c_str());
    if (names == nullptr) return Refused("client CA", security.client_ca_file);
    SSL_CTX_set_client_CA_list(ctx.get(), names);
    SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  }
  return std::shared_ptr<const TlsContext>(
      new TlsContext(ctx.release(), /*server=*/true, std::move(token), "", buffer_bytes));
}

absl::StatusOr<std::shared_ptr<const TlsContext>> TlsContext::ForClient(
    const common::ClientSecurity& security, size_t buffer_bytes) {
  ASSIGN_OR_RETURN(std::string token, common::ClientToken(security));
  if (!security.tls()) return nullptr;
  ASSIGN_OR_RETURN(CtxPtr ctx, NewContext(/*server=*/false, buffer_bytes));
  if (SSL_CTX_load_verify_locations(ctx.get(), security.ca_file.c_str(), nullptr) != 1) {
    return Refused("CA", security.ca_file);
  }
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
  if (!security.cert_file.empty()) {
    RETURN_IF_ERROR(UseCertificate(ctx.get(), security.cert_file, security.key_file));
  }
  return std::shared_ptr<const TlsContext>(new TlsContext(
      ctx.release(), /*server=*/false, std::move(token), security.server_name, buffer_bytes));
}

}  // namespace shardtrain::wire
