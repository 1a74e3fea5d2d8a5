// TlsContext: the TLS settings of the data path's framed connections
// (wire/frame_socket.h): an OpenSSL context made from the same files and
// with the same checks as the process's gRPC credentials
// (common/credentials.h), so that a shard serving TLS also serves its data
// port in TLS, and its workers and chain predecessors reach it there.
//
// A server context serves the certificate chain and, given a client CA,
// demands and verifies client certificates (mutual TLS). A client context
// verifies the shard against its CA and the name it was reached by (or
// server_name), and presents its own certificate for mutual TLS. TLS 1.2
// at least; no session tickets (a connection lives as long as its process).
// Each connection reads ahead and gathers its writes in buffers of
// buffer_bytes() (the shard's --data_tls_buffer_kib): up to twice that per
// connection.
//
// The shared token does not travel in TLS itself: a client with one sends
// it in its connection's first frame (DataMethod::kHello, the body), and a
// server with one ends every connection whose first frame is not that
// hello with its token (server/data_connection.h).
//
//   ASSIGN_OR_RETURN(std::shared_ptr<const TlsContext> tls,
//                    TlsContext::ForClient(security));  // null: plaintext
//   RETURN_IF_ERROR(socket->StartTls(*tls, host, deadline));
//
// Immutable once made; thread-safe.
#ifndef SHARDTRAIN_WIRE_TLS_CONTEXT_H_
#define SHARDTRAIN_WIRE_TLS_CONTEXT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/credentials.h"

struct ssl_ctx_st;  // OpenSSL's SSL_CTX

namespace shardtrain::wire {

class TlsContext {
 public:
  // A connection's read-ahead and write buffers, each.
  static constexpr size_t kDefaultBufferBytes = 256 << 10;
  // The smallest: one TLS record, 16 KiB of plaintext and its overhead.
  static constexpr size_t kMinBufferBytes = 17 << 10;
  static constexpr size_t kMaxBufferBytes = 64 << 20;
  // INVALID_ARGUMENT unless kMinBufferBytes <= bytes <= kMaxBufferBytes.
  static absl::Status CheckBufferBytes(int64_t bytes);

  // Null (plaintext) when `security` has no certificate; the errors of
  // common::MakeServerCredentials for bad settings or unreadable files,
  // and INVALID_ARGUMENT for PEM that OpenSSL does not take (a key that is
  // not the certificate's) or `buffer_bytes` outside [kMinBufferBytes,
  // kMaxBufferBytes].
  static absl::StatusOr<std::shared_ptr<const TlsContext>> ForServer(
      const common::ServerSecurity& security, size_t buffer_bytes = kDefaultBufferBytes);
  // Null (plaintext) when `security` has no CA; errors as ForServer's.
  static absl::StatusOr<std::shared_ptr<const TlsContext>> ForClient(
      const common::ClientSecurity& security, size_t buffer_bytes = kDefaultBufferBytes);

  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  bool server() const { return server_; }
  // Server: the token a connection's hello must carry; client: the one it
  // sends. Empty: none.
  const std::string& token() const { return token_; }
  // Client: the name the shard's certificate must carry, when it is not
  // the host the shard is reached by; empty otherwise.
  const std::string& server_name() const { return server_name_; }
  // Each connection's read-ahead, and the buffer its writes are gathered in.
  size_t buffer_bytes() const { return buffer_bytes_; }

  ssl_ctx_st* native() const { return ctx_; }

 private:
  TlsContext(ssl_ctx_st* ctx, bool server, std::string token, std::string server_name,
             size_t buffer_bytes);

  ssl_ctx_st* const ctx_;
  const bool server_;
  const std::string token_;
  const std::string server_name_;
  const size_t buffer_bytes_;
};

}  // namespace shardtrain::wire

#endif  // SHARDTRAIN_WIRE_TLS_CONTEXT_H_
