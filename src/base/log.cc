#include "base/log.h"

#include <unistd.h>

namespace ellm {

void log_info(const std::string& msg) { std::fprintf(stderr, "%s\n", msg.c_str()); }
void log_warn(const std::string& msg) { std::fprintf(stderr, "warning: %s\n", msg.c_str()); }

std::string format_bytes(double bytes) {
  static const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return std::to_string(static_cast<long long>(bytes)) + " bytes";
  int unit = -1;
  while (bytes >= 1024 && unit < 3) {
    bytes /= 1024;
    unit++;
  }
  char text[32];
  std::snprintf(text, sizeof text, "%.1f %s", bytes, units[unit]);
  return text;
}

std::string format_mib(double bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f MiB", bytes / (1024.0 * 1024.0));
  return text;
}

Progress::Progress(std::string label, size_t total)
    : label_(std::move(label)), total_(total ? total : 1), tty_(isatty(2)) {}

void Progress::update(size_t done) {
  int percent = int(done * 100 / total_);
  if (percent == last_percent_) return;
  // On a terminal redraw every percent; in a log file, one line per 25%.
  if (!tty_ && percent / 25 == last_percent_ / 25 && last_percent_ >= 0) return;
  last_percent_ = percent;
  std::fprintf(stderr, tty_ ? "\r%s %3d%% (%zu/%zu)" : "%s %3d%% (%zu/%zu)\n", label_.c_str(),
               percent, done, total_);
  std::fflush(stderr);
}

void Progress::finish(const std::string& summary) {
  std::fprintf(stderr, tty_ ? "\r%s done: %s\033[K\n" : "%s done: %s\n", label_.c_str(),
               summary.c_str());
}

}  // namespace ellm
