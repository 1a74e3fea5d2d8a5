#include "wire/internal/openssl_reason.h"

#include <openssl/err.h>

namespace shardtrain::wire::internal {

std::string OpenSslReason(const char* fallback) {
  const unsigned long error = ERR_get_error();
  ERR_clear_error();
  if (error == 0) return fallback;
  char text[256];
  ERR_error_string_n(error, text, sizeof(text));
  return text;
}

}  // namespace shardtrain::wire::internal
