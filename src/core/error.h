// Typed errors. Every failure that reaches a user names the file, tensor or field, what was
// expected and what was found. Inside the library we throw qf::Error; the CLI and the public
// API catch it at the edge and turn it into a message and an exit status.
#pragma once
#include <cstdarg>
#include <stdexcept>
#include <string>

namespace qf {

enum class ErrorKind {
  Io,         // open/read/mmap/write failures
  Format,     // malformed file contents (safetensors header, JSON syntax)
  Config,     // config.json field missing or out of range, model pair mismatch
  Tensor,     // missing or misshapen tensor, wrong dtype
  Tokenizer,  // tokenizer.json problems, invalid ids
  Usage,      // bad CLI/API arguments
  Backend,    // device errors (CUDA), out of memory
  Internal,   // a broken invariant inside qflash
};

const char* error_kind_name(ErrorKind k);

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& msg) : std::runtime_error(msg), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

// printf-style formatting into a std::string (g++ 12 has no <format>).
std::string strf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string vstrf(const char* fmt, va_list ap);

[[noreturn]] void fail(ErrorKind kind, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

}  // namespace qf

// Internal invariant check: cheap, always on.
#define QF_CHECK(cond, ...)                                                                   \
  do {                                                                                       \
    if (!(cond)) ::qf::fail(::qf::ErrorKind::Internal, "%s:%d: check failed: %s: %s", __FILE__, \
                            __LINE__, #cond, ::qf::strf(__VA_ARGS__).c_str());               \
  } while (0)
