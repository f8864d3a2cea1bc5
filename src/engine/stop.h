#pragma once
// Stop strings are never emitted: text that could still grow into one is held back until the
// next piece of text decides it.
#include <string>
#include <string_view>
#include <vector>

namespace ellm {

class StopStringMatcher {
 public:
  // Starts a request; empty strings are ignored.
  void reset(const std::vector<std::string>& stops);

  // Adds newly decoded text; returns the text that is now safe to emit. After a stop string
  // appears, stopped() is true, the returned text ends just before it, and the rest is dropped.
  std::string push(std::string_view text);
  // At the end of generation: the held-back text (it did not become a stop string).
  std::string flush();

  bool stopped() const { return stopped_; }
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  std::string matched_;
  bool stopped_ = false;
};

}  // namespace ellm
