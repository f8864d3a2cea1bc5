#include "engine/stop.h"

#include <algorithm>

namespace ellm {

void StopStringMatcher::reset(const std::vector<std::string>& stops) {
  stops_.clear();
  for (const std::string& s : stops)
    if (!s.empty()) stops_.push_back(s);
  held_.clear();
  matched_.clear();
  stopped_ = false;
}

std::string StopStringMatcher::push(std::string_view text) {
  if (stopped_) return {};
  if (stops_.empty()) return std::string(text);
  held_.append(text);

  // Earliest occurrence of any stop string. An occurrence cannot start in text already emitted:
  // every suffix of it that began a stop string was held back.
  size_t first = std::string::npos;
  for (const std::string& s : stops_) {
    size_t at = held_.find(s);
    if (at < first) {
      first = at;
      matched_ = s;
    }
  }
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }

  // Hold the longest suffix that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const std::string& s : stops_) {
    for (size_t len = std::min(held_.size(), s.size() - 1); len > keep; --len) {
      if (std::string_view(held_).substr(held_.size() - len) == std::string_view(s).substr(0, len)) {
        keep = len;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopStringMatcher::flush() {
  std::string out;
  if (!stopped_) out.swap(held_);
  held_.clear();
  return out;
}

}  // namespace ellm
