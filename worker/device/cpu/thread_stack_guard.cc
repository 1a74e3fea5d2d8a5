// Gives small-stack threads room for OpenBLAS's thread-local storage.
//
// glibc places each thread's static TLS at the top of its stack. Debian's
// OpenBLAS carries 60 KiB of TLS (and glog 30 KiB), while civetweb, the HTTP
// server under prometheus-cpp's Exposer, asks for 100 KiB stacks: in a
// process that links OpenBLAS its threads overflow in their first printf.
// This definition in the executable interposes glibc's and raises any
// request below kMinimumStack; larger requests pass through unchanged.
#include <dlfcn.h>
#include <pthread.h>

#include <algorithm>
#include <cstddef>

namespace {

constexpr size_t kMinimumStack = size_t{1} << 20;

using SetStackSizeFn = int (*)(pthread_attr_t*, size_t);

SetStackSizeFn GlibcSetStackSize() {
  static const SetStackSizeFn real = reinterpret_cast<SetStackSizeFn>(
      dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  return real;
}

}  // namespace

extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr, size_t size) {
  return GlibcSetStackSize()(attr, std::max(size, kMinimumStack));
}
