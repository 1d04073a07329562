// Logging goes to stderr only: stdout carries generated text and nothing else.
#pragma once
#include <cstdio>

namespace qf {

enum class LogLevel { Quiet = 0, Info = 1, Debug = 2 };
void set_log_level(LogLevel l);
LogLevel log_level();
void log_info(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void log_debug(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void log_warn(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// A progress bar on stderr for long loads, counting bytes; silent when stderr is not a terminal
// unless forced (QFLASH_PROGRESS=1), and when the total is 0.
class Progress {
 public:
  Progress(const char* label, size_t total);
  void add(size_t n);
  void set(size_t done_so_far);
  void done();
  ~Progress();

 private:
  const char* label_;
  size_t total_, cur_ = 0;
  int last_pct_ = -1;
  bool enabled_, finished_ = false;
};

}  // namespace qf
