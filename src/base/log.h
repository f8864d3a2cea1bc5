#pragma once
// Logging to stderr. Progress lines redraw in place on a terminal and print sparsely otherwise.
#include <cstdio>
#include <string>

namespace ellm {

void log_info(const std::string& msg);
void log_warn(const std::string& msg);

// A byte count in the largest binary unit that keeps it at 1 or more, one decimal:
// "512 bytes", "1.5 KiB", "28.0 MiB", "1.2 GiB", "3.0 TiB".
std::string format_bytes(double bytes);

// "12.5 MiB": a byte count for messages.
std::string format_mib(double bytes);

// "loading weights  37% (120/311 tensors)": call update() as work advances, finish() at the end.
class Progress {
 public:
  Progress(std::string label, size_t total);
  void update(size_t done);
  void finish(const std::string& summary);

 private:
  std::string label_;
  size_t total_;
  int last_percent_ = -1;
  bool tty_;
};

}  // namespace ellm
