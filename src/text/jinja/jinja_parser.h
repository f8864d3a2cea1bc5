#pragma once
// Jinja parser: tokens -> syntax tree, following jinja2's grammar and operator precedence
// (filters and tests bind tighter than arithmetic; `x if c else y` is loosest).
#include <string>
#include <vector>

#include "text/jinja/jinja_ast.h"
#include "text/jinja/jinja_lexer.h"

namespace ellm::jinja {

// Throws ellm::Error("<name>:<line>: ...") on syntax errors, unknown tags and nesting deeper
// than a fixed limit.
Body parse(const std::vector<Token>& tokens, const std::string& name);

}  // namespace ellm::jinja
