#pragma once
// A Jinja2 template engine that renders chat templates exactly as Hugging Face does
// (Python jinja2, ImmutableSandboxedEnvironment, trim_blocks=True, lstrip_blocks=True,
// loop controls, HF's tojson and raise_exception). See jinja_filters.cc for the filters and
// jinja_builtins.cc for the tests, methods and globals it provides.
//
// Bad templates fail with ellm::Error("<name>:<line>: <problem>"); raise_exception(msg) fails
// with exactly msg. Rendering is bounded by Limits, so no template can hang or exhaust memory.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/jinja/jinja_value.h"

namespace ellm::jinja {

struct Stmt;

struct Limits {
  size_t max_output_bytes = size_t(256) << 20;  // any string or output buffer
  size_t max_list_items = size_t(1) << 20;      // any list built by the template
  uint64_t max_steps = 200'000'000;             // evaluated nodes + work proportional to sizes
  int max_depth = 200;                          // nested evaluation, macro recursion included
};

class Template {
 public:
  // Parses `source`; `name` (e.g. the file path) prefixes error messages.
  static Template parse(const std::string& source, const std::string& name = "template");

  // `context` must be a JSON object: its keys become template variables.
  std::string render(const nlohmann::ordered_json& context, const Limits& limits = {}) const;
  std::string render(const std::vector<std::pair<std::string, Value>>& variables,
                     const Limits& limits = {}) const;

  const std::string& name() const { return name_; }

 private:
  std::shared_ptr<const std::vector<std::unique_ptr<Stmt>>> body_;
  std::string name_;
};

}  // namespace ellm::jinja
