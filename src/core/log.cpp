#include "core/log.h"

#include <algorithm>
#include <cstdarg>
#include <cstdlib>
#include <unistd.h>

namespace qf {

static LogLevel g_level = LogLevel::Info;
void set_log_level(LogLevel l) { g_level = l; }
LogLevel log_level() { return g_level; }

static void vlog(const char* tag, const char* fmt, va_list ap) {
  std::fprintf(stderr, "[qflash%s] ", tag);
  std::vfprintf(stderr, fmt, ap);
  std::fputc('\n', stderr);
}

void log_info(const char* fmt, ...) {
  if (g_level < LogLevel::Info) return;
  va_list ap;
  va_start(ap, fmt);
  vlog("", fmt, ap);
  va_end(ap);
}
void log_debug(const char* fmt, ...) {
  if (g_level < LogLevel::Debug) return;
  va_list ap;
  va_start(ap, fmt);
  vlog(" debug", fmt, ap);
  va_end(ap);
}
void log_warn(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vlog(" warning", fmt, ap);
  va_end(ap);
}

Progress::Progress(const char* label, size_t total) : label_(label), total_(total) {
  const char* force = std::getenv("QFLASH_PROGRESS");
  enabled_ = g_level >= LogLevel::Info &&
             ((force && force[0] == '1') || (isatty(2) && !(force && force[0] == '0')));
}

void Progress::add(size_t n) { set(cur_ + n); }

void Progress::set(size_t done_so_far) {
  cur_ = done_so_far;
  if (!enabled_ || total_ == 0) return;
  int pct = std::min(100, static_cast<int>(100.0 * static_cast<double>(cur_) / static_cast<double>(total_)));
  if (pct == last_pct_) return;
  last_pct_ = pct;
  int filled = pct * 30 / 100;
  std::fprintf(stderr, "\r[qflash] %s [", label_);
  for (int i = 0; i < 30; i++) std::fputc(i < filled ? '#' : '.', stderr);
  std::fprintf(stderr, "] %3d%% %.1f/%.1f MB", pct, std::min(cur_, total_) / 1e6, total_ / 1e6);
  std::fflush(stderr);
}

void Progress::done() {
  if (enabled_ && !finished_ && last_pct_ >= 0) std::fputc('\n', stderr);
  finished_ = true;
}

Progress::~Progress() { done(); }

}  // namespace qf
