#pragma once
// Errors: one exception type carrying a one-line, user-facing message.
#include <stdexcept>
#include <string>

namespace ellm {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Throws Error("<where>: <what>"), e.g. fail("model/config.json", "missing field 'hidden_size'").
[[noreturn]] inline void fail(const std::string& where, const std::string& what) {
  throw Error(where + ": " + what);
}

}  // namespace ellm
