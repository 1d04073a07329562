#include "backend/cuda/cuda_util.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace qf::cuda {

std::string vfmt(const char* fmt, va_list ap) {
  va_list ap2;
  va_copy(ap2, ap);
  const int n = std::vsnprintf(nullptr, 0, fmt, ap2);
  va_end(ap2);
  if (n < 0) return fmt;
  std::string s(static_cast<size_t>(n), '\0');
  std::vsnprintf(s.data(), s.size() + 1, fmt, ap);
  return s;
}

std::string fmt_str(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::string s = vfmt(fmt, ap);
  va_end(ap);
  return s;
}

void backend_fail(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::string s = vfmt(fmt, ap);
  va_end(ap);
  throw Error(ErrorKind::Backend, s);
}

void cuda_fail(cudaError_t e, const char* what, const char* file, int line) {
  throw Error(ErrorKind::Backend, fmt_str("%s:%d: %s failed: %s (%s)", file, line, what, cudaGetErrorName(e),
                                          cudaGetErrorString(e)));
}

bool pdl_enabled() {  // on unless QFLASH_PDL=0
  static const bool on = [] {
    const char* e = std::getenv("QFLASH_PDL");
    return !(e && std::strcmp(e, "0") == 0);
  }();
  return on;
}

}  // namespace qf::cuda
