// Keeps libquadmath from installing printf hooks in processes that link
// OpenBLAS.
//
// Debian's OpenBLAS pulls in libgfortran and with it libquadmath, whose
// constructor registers __float128 printf handlers through glibc's
// register_printf_* functions. Once any handler is registered, glibc formats
// every printf through its slower positional path, which needs more stack
// than civetweb's 100 KiB threads have: the Prometheus exposer's threads
// crash in their first snprintf. libquadmath binds these functions weakly,
// so these definitions in the executable take precedence and decline the
// registration. Nothing in shardtrain prints __float128.
#include <printf.h>

extern "C" {

int register_printf_specifier(int, printf_function*,
                              printf_arginfo_size_function*) {
  return -1;
}

int register_printf_modifier(const wchar_t*) { return -1; }

int register_printf_type(printf_va_arg_function*) { return -1; }

}  // extern "C"
