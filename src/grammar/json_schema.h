#pragma once
// A JSON Schema (or a tool-call format) compiled to a grammar over bytes: a graph of nodes that
// engine/grammar_matcher.h walks one byte at a time and engine/token_mask.h turns into a token
// mask at every decoding step. Compiling is done once per request, on the submitting thread.
//
// What is generated is a subset of what the schema accepts: compact JSON with at most one space
// after ':' and ',', numbers of at most 15 integer and 6 fraction digits without exponent,
// strings whose escapes are \" \\ \/ \b \f \n \r \t \uXXXX, objects whose properties are only
// the listed ones unless additionalProperties is true or a schema. Supported keywords: type
// (a name or a list), properties, required, additionalProperties, enum, const, items,
// minItems, maxItems, minimum / maximum / exclusiveMinimum / exclusiveMaximum of an integer, anyOf, oneOf (as anyOf), allOf with one member, $ref to "#",
// "#/$defs/NAME" or "#/definitions/NAME", minLength, maxLength, pattern (the subset below; with
// a minLength of at most 1024). Annotations (title, description, default, examples, format,
// contentEncoding, $schema, $id, $comment, deprecated, readOnly, writeOnly, strict) are ignored.
//
// Strict (OpenAI's strict: true), anything else is a SchemaError naming it. Not strict, the
// output follows a looser schema: what only narrows the values the schema accepts and cannot be
// enforced is ignored (minimum, maximum, multipleOf, uniqueItems, minProperties, not, if/then/
// else, a pattern outside the subset, keywords beside $ref or anyOf, allOf's later members, ...),
// as are unknown keywords (JSON Schema's own rule). A malformed schema (a keyword of the wrong
// type, a $ref to nothing) is an error either way.
//
// pattern subset: literals, '.', classes [a-z0-9_] and [^...], \d \w \s and escaped punctuation,
// groups (...) and (?:...), '|', quantifiers * + ? {m} {m,} {m,n}; '^' and '$' only at the ends.
// The generated string always matches the whole pattern, in printable ASCII without '"' or '\'.
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/error.h"

namespace ellm {

// A schema the compiler refuses: `keyword` names the part at fault ("minimum", "$ref", ...).
struct SchemaError : Error {
  SchemaError(std::string keyword, const std::string& message, bool unsupported = false)
      : Error(message), keyword(std::move(keyword)), unsupported(unsupported) {}
  std::string keyword;
  bool unsupported;  // a valid schema that cannot be enforced: not strict, it would be ignored
};

enum TypeBit : uint32_t {
  kNull = 1, kBool = 2, kInteger = 4, kNumber = 8, kString = 16, kArray = 32, kObject = 64,
  kAnyType = 127,
};

// A pattern as a Glushkov automaton: position p matches the bytes of class_bits[p]; after it
// may come the positions of follow[p]; the state is the set of positions last matched, with
// kRegexStart for "nothing matched yet". At most 63 positions.
constexpr uint64_t kRegexStart = uint64_t(1) << 63;
struct Regex {
  std::vector<std::array<uint64_t, 2>> class_bits;  // [position] ASCII bitmap
  std::vector<uint64_t> follow;                     // [position]
  // [r * positions + p]: the fewest bytes after position p that reach an accepting one, counting
  // at least r of them (INT32_MAX: none); row 0 always, rows up to a minLength beside the pattern.
  std::vector<int32_t> distance;
  uint64_t first = 0, last = 0;
  bool nullable = false;
};
Regex compile_regex(const std::string& pattern);  // throws SchemaError("pattern", ...)
// Adds the distance rows up to min_length (a minLength beside the pattern).
void regex_require_length(Regex& regex, int32_t min_length);
uint64_t regex_step(const Regex& regex, uint64_t state, uint8_t byte);  // 0 = dead
bool regex_accepts(const Regex& regex, uint64_t state);
// The fewest bytes from `state` to a match at least `at_least` more bytes long (INT32_MAX: none).
int32_t regex_distance(const Regex& regex, uint64_t state, int32_t at_least = 0);

inline constexpr std::string_view kCoderClose = "\n</parameter>\n";  // after a Coder value
inline constexpr int kMaxIntegerDigits = 15, kMaxFractionDigits = 6;  // of a generated number
inline constexpr std::string_view kCoderEnd = "</function>";

enum class NodeKind : uint8_t {
  value,        // a JSON value (or a Qwen3-Coder parameter value when raw)
  literal_set,  // one of a few fixed byte strings (enum, const, tool-call framing)
  choice,       // one of the alternatives (anyOf): followed in parallel until one is left
  sequence,     // the children one after the other
  repeat,       // child (separator child){min-1, max-1}
};

struct Property {
  std::string key;  // as written: "\"name\"" in JSON, "<parameter=name>\n" for Qwen3-Coder
  int32_t node = -1;
  bool required = false;
};

struct GrammarNode {
  NodeKind kind = NodeKind::value;
  uint32_t types = kAnyType;  // value: the allowed TypeBits
  // string
  int32_t min_length = 0, max_length = -1;  // characters; -1 = unbounded
  int32_t regex = -1;                       // index into Grammar::regexes
  bool raw = false;  // a Qwen3-Coder string: no quotes, no '<' or control bytes, ends at "\n"
  // integer (a node without the number type): minimum and maximum, inclusive
  bool bounded = false;
  int64_t minimum = 0, maximum = 0;
  // array
  int32_t items = -1;  // -1 = any value
  int32_t min_items = 0, max_items = -1;
  // object: properties in the listed order, key_order sorts them by key (for prefix matching).
  // A Qwen3-Coder block ends with a last pseudo-property "</function>" whose node is -1.
  std::vector<Property> properties;
  std::vector<int32_t> key_order;
  int32_t additional = -1;  // node for other keys; -1 = none allowed
  uint64_t required_bits = 0;  // bit i: properties[i] is required
  bool ordered = false;     // properties only in the listed order (tool-call objects)
  bool coder = false;       // Qwen3-Coder parameter block: <parameter=k>\nV\n</parameter>\n... </function>
  // literal_set: sorted; choice and sequence: children; repeat: children[0] item, [1] separator
  std::vector<std::string> literals;
  std::vector<int32_t> children;
  int32_t min_count = 1, max_count = 1;  // repeat
  int64_t min_bytes = 0;  // the shortest text this node accepts (filled by the compiler)
};

class Grammar {
 public:
  std::vector<GrammarNode> nodes;
  std::vector<Regex> regexes;
  int32_t root = -1;
  int32_t any_value = -1;  // the node of an unconstrained JSON value
};

// {"type": "json_object"}: any JSON object.
std::shared_ptr<const Grammar> json_object_grammar();
// A JSON Schema; throws SchemaError naming the keyword at fault. strict: see the top of the file.
std::shared_ptr<const Grammar> compile_json_schema(const nlohmann::json& schema, bool strict = true);

enum class ToolCallStyle { hermes, qwen3_coder };
// One or more tool calls (at most max_calls, separated by "\n") in the model's own format, each
// naming one of `tools` (OpenAI tools array) or, when `only` is not empty, that function, with
// arguments valid against its `parameters` schema, strict when the function says `strict: true`.
// Throws SchemaError.
std::shared_ptr<const Grammar> compile_tool_calls(const nlohmann::json& tools, ToolCallStyle style,
                                                  const std::string& only, int max_calls);

}  // namespace ellm
