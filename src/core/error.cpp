#include "core/error.h"

#include <cstdio>
#include <vector>

namespace qf {

const char* error_kind_name(ErrorKind k) {
  switch (k) {
    case ErrorKind::Io: return "io";
    case ErrorKind::Format: return "format";
    case ErrorKind::Config: return "config";
    case ErrorKind::Tensor: return "tensor";
    case ErrorKind::Tokenizer: return "tokenizer";
    case ErrorKind::Usage: return "usage";
    case ErrorKind::Backend: return "backend";
    case ErrorKind::Internal: return "internal";
  }
  return "unknown";
}

std::string vstrf(const char* fmt, va_list ap) {
  va_list ap2;
  va_copy(ap2, ap);
  int n = std::vsnprintf(nullptr, 0, fmt, ap2);
  va_end(ap2);
  if (n < 0) return fmt;
  std::string s(static_cast<size_t>(n), '\0');
  std::vsnprintf(s.data(), s.size() + 1, fmt, ap);
  return s;
}

std::string strf(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::string s = vstrf(fmt, ap);
  va_end(ap);
  return s;
}

void fail(ErrorKind kind, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::string s = vstrf(fmt, ap);
  va_end(ap);
  throw Error(kind, s);
}

}  // namespace qf
