// The reason of OpenSSL's last error on the calling thread, for the
// messages of wire's TLS code (tls_context.cc, frame_socket.cc).
//
//   return absl::UnavailableError(StrCat("TLS: ", OpenSslReason("unknown")));
#ifndef SHARDTRAIN_WIRE_INTERNAL_OPENSSL_REASON_H_
#define SHARDTRAIN_WIRE_INTERNAL_OPENSSL_REASON_H_

#include <string>

namespace shardtrain::wire::internal {

// OpenSSL's last error on this thread as text, or `fallback` when there is
// none; clears the thread's error queue.
std::string OpenSslReason(const char* fallback);

}  // namespace shardtrain::wire::internal

#endif  // SHARDTRAIN_WIRE_INTERNAL_OPENSSL_REASON_H_
