#pragma once
// Helpers every layer's tests may use: the shared folder and the message of an Error.
#include <cstdlib>
#include <string>

#include "base/error.h"

namespace ellm::test {

// Runs fn and returns the Error message it throws ("" if none).
template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// shared/ (models, goldens, text): $ELLM_SHARED, else the build's default beside the repository.
inline std::string shared_dir() {
  const char* env = std::getenv("ELLM_SHARED");
  return env ? env : ELLM_SHARED;
}

}  // namespace ellm::test
