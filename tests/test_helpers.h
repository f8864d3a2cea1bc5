#pragma once
// Helpers every layer's tests may use: the shared folder and the message of an Error.
#include <algorithm>
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

// A model folder's name as a test name: tiny-qwen3 -> tiny_qwen3.
inline std::string model_test_name(std::string name) {
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

// INSTANTIATE_TEST_SUITE_P's name generator for suites over model folder names.
struct ModelTestName {
  template <class Info>
  std::string operator()(const Info& info) const { return model_test_name(info.param); }
};

}  // namespace ellm::test
