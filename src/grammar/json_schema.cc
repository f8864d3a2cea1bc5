// JSON Schema -> grammar nodes (engine/json_schema.h), and the tool-call grammars built on it.
#include "grammar/json_schema.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <map>
#include <set>

namespace ellm {

using nlohmann::json;

namespace {

constexpr int kMaxDepth = 48;
constexpr int kMaxProperties = 63;  // the matcher keeps the properties seen in a 64-bit set
constexpr int32_t kMaxPatternMinLength = 1024;  // a pattern's distance table has a row per character
constexpr int64_t kInfinite = INT64_MAX / 4;

const std::set<std::string> kIgnored = {
    "title", "description", "default", "examples", "format", "contentEncoding", "contentMediaType",
    "$schema", "$id", "$comment", "deprecated", "readOnly", "writeOnly", "strict", "$defs",
    "definitions", "name"};
const std::set<std::string> kSupported = {
    "type", "properties", "required", "additionalProperties", "enum", "const", "items",
    "minItems", "maxItems", "anyOf", "oneOf", "allOf", "$ref", "minLength", "maxLength", "pattern"};

// Keywords that only narrow what a schema accepts and that the compiler cannot enforce, by the
// JSON type their value must have. Not strict, they are ignored once that type is right.
enum class ValueKind { number, number_or_boolean, boolean, count, schema, object, array };
const std::map<std::string, ValueKind> kNarrowing = {
    {"minimum", ValueKind::number}, {"maximum", ValueKind::number}, {"multipleOf", ValueKind::number},
    {"exclusiveMinimum", ValueKind::number_or_boolean}, {"exclusiveMaximum", ValueKind::number_or_boolean},
    {"uniqueItems", ValueKind::boolean}, {"minProperties", ValueKind::count}, {"maxProperties", ValueKind::count},
    {"minContains", ValueKind::count}, {"maxContains", ValueKind::count}, {"contains", ValueKind::schema},
    {"not", ValueKind::schema}, {"if", ValueKind::schema}, {"then", ValueKind::schema}, {"else", ValueKind::schema},
    {"propertyNames", ValueKind::schema}, {"additionalItems", ValueKind::schema},
    {"unevaluatedProperties", ValueKind::schema}, {"unevaluatedItems", ValueKind::schema},
    {"contentSchema", ValueKind::schema}, {"patternProperties", ValueKind::object},
    {"dependentRequired", ValueKind::object}, {"dependentSchemas", ValueKind::object},
    {"dependencies", ValueKind::object}, {"prefixItems", ValueKind::array}};

// What a narrowing keyword's value must be, or nullptr when it is that.
const char* misfit(const json& value, ValueKind kind) {
  switch (kind) {
    case ValueKind::number: return value.is_number() ? nullptr : "a number";
    case ValueKind::number_or_boolean: return value.is_number() || value.is_boolean() ? nullptr : "a number";
    case ValueKind::boolean: return value.is_boolean() ? nullptr : "a boolean";
    case ValueKind::count: return value.is_number_integer() && value.get<int64_t>() >= 0 ? nullptr : "a non-negative integer";
    case ValueKind::schema: return value.is_object() || value.is_boolean() ? nullptr : "a schema";
    case ValueKind::object: return value.is_object() ? nullptr : "an object";
    case ValueKind::array: return value.is_array() ? nullptr : "an array";
  }
  return nullptr;
}

// Numeric bounds are enforced on integers, whose digits are checked as they come.
const std::set<std::string> kBounds = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};

bool integer_typed(const json& schema) {
  if (!schema.contains("type")) return false;
  const json& type = schema["type"];
  bool integer = false;
  for (const json& name : type.is_array() ? type : json::array({type})) {
    if (name == "number") return false;
    integer |= name == "integer";
  }
  return integer;
}

// The text length of the integer in [lo, hi] closest to zero.
int64_t integer_text_bytes(int64_t lo, int64_t hi) {
  if (lo <= 0 && hi >= 0) return 1;
  const int64_t nearest = lo > 0 ? lo : -hi;
  return int64_t(std::to_string(nearest).size()) + (lo > 0 ? 0 : 1);
}

int32_t add_node(Grammar& g, GrammarNode node) {
  g.nodes.push_back(std::move(node));
  return int32_t(g.nodes.size() - 1);
}

int32_t literal_node(Grammar& g, std::vector<std::string> literals) {
  std::sort(literals.begin(), literals.end());
  literals.erase(std::unique(literals.begin(), literals.end()), literals.end());
  GrammarNode node;
  node.kind = NodeKind::literal_set;
  node.literals = std::move(literals);
  return add_node(g, std::move(node));
}

int32_t sequence_node(Grammar& g, std::vector<int32_t> children) {
  GrammarNode node;
  node.kind = NodeKind::sequence;
  node.children = std::move(children);
  return add_node(g, std::move(node));
}

int32_t any_value_node(Grammar& g) {
  if (g.any_value >= 0) return g.any_value;
  GrammarNode any;
  g.any_value = add_node(g, any);
  g.nodes[g.any_value].items = g.any_value;
  g.nodes[g.any_value].additional = g.any_value;
  return g.any_value;
}

void sort_keys(GrammarNode& node) {
  node.key_order.resize(node.properties.size());
  for (size_t i = 0; i < node.key_order.size(); ++i) node.key_order[i] = int32_t(i);
  std::sort(node.key_order.begin(), node.key_order.end(),
            [&](int32_t a, int32_t b) { return node.properties[a].key < node.properties[b].key; });
}

int32_t non_negative(const json& schema, const char* keyword) {
  const json& v = schema[keyword];
  if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > 1'000'000)
    throw SchemaError(keyword, std::string("'") + keyword + "' must be a non-negative integer");
  return int32_t(v.get<int64_t>());
}

uint32_t type_bit(const json& name) {
  static const std::map<std::string, uint32_t> bits = {
      {"null", kNull}, {"boolean", kBool}, {"integer", kInteger}, {"number", kNumber | kInteger},
      {"string", kString}, {"array", kArray}, {"object", kObject}};
  auto it = name.is_string() ? bits.find(name.get<std::string>()) : bits.end();
  if (it == bits.end()) throw SchemaError("type", "'type' must name JSON types (null, boolean, integer, number, string, array, object)");
  return it->second;
}

class Compiler {
 public:
  Compiler(Grammar& g, const json& root, bool strict) : g_(g), root_(root), strict_(strict) {}

  int32_t compile(const json& schema, int depth) {
    if (depth > kMaxDepth) throw SchemaError("schema", "the schema is nested too deeply");
    if (schema.is_boolean()) {
      if (!schema.get<bool>()) throw SchemaError("false", "the schema 'false' accepts nothing");
      return any_value_node(g_);
    }
    if (!schema.is_object()) throw SchemaError("schema", "a schema must be an object or a boolean");
    const bool integer = integer_typed(schema);
    for (auto& [name, value] : schema.items()) {
      if (kIgnored.count(name) || kSupported.count(name) || (integer && kBounds.count(name))) continue;
      const std::string key = name.empty() ? "\"\"" : name;  // an error always names its keyword
      auto narrowing = kNarrowing.find(name);
      if (narrowing == kNarrowing.end()) {
        cannot_enforce(key, "the schema keyword '" + key + "' is not supported");
      } else if (const char* expected = misfit(value, narrowing->second)) {
        throw SchemaError(key, "'" + key + "' must be " + expected);
      } else {
        cannot_enforce(key, "the schema keyword '" + key + "' cannot be enforced");
      }
    }
    if (schema.contains("$ref")) return reference(schema, depth);
    for (const char* keyword : {"anyOf", "oneOf"})
      if (schema.contains(keyword)) return alternatives(schema, keyword, depth);
    if (schema.contains("allOf")) {
      const json& all = schema["allOf"];
      if (!all.is_array() || all.empty()) throw SchemaError("allOf", "'allOf' must be a non-empty array");
      const bool alone = !has_siblings(schema);
      if (all.size() > 1 || !alone)
        cannot_enforce("allOf", "'allOf' is supported only with a single schema and nothing beside it");
      // Not strict: the first member, or else the keywords beside allOf, accept more than all together.
      if (alone) return compile(all[0], depth + 1);
    }
    if (schema.contains("const")) return literal_node(g_, {schema["const"].dump()});
    if (schema.contains("enum")) {
      const json& values = schema["enum"];
      if (!values.is_array() || values.empty()) throw SchemaError("enum", "'enum' must be a non-empty array");
      std::vector<std::string> literals;
      for (const json& v : values) literals.push_back(v.dump());
      return literal_node(g_, std::move(literals));
    }
    return value(schema, depth);
  }

 private:
  // A keyword the compiler cannot enforce: an error when strict, else the caller ignores it.
  void cannot_enforce(const std::string& keyword, const std::string& message) const {
    if (strict_) throw SchemaError(keyword, message, /*unsupported=*/true);
  }

  // Keywords beside the one at hand ($ref, anyOf, allOf) that would have to hold too.
  bool has_siblings(const json& schema) const {
    size_t used = 0;
    for (auto& [key, value] : schema.items()) used += kSupported.count(key);
    return used > 1;
  }

  int32_t reference(const json& schema, int depth) {
    if (has_siblings(schema)) cannot_enforce("$ref", "'$ref' is supported only with nothing beside it");
    if (!schema["$ref"].is_string()) throw SchemaError("$ref", "'$ref' must be a string");
    const std::string ref = schema["$ref"];
    auto known = refs_.find(ref);
    if (known != refs_.end()) return known->second;
    const json* target = nullptr;
    if (ref == "#") {
      target = &root_;
    } else {
      for (auto [prefix, defs] : {std::pair{"#/$defs/", "$defs"}, std::pair{"#/definitions/", "definitions"}}) {
        std::string name = ref.substr(0, std::string(prefix).size()) == prefix ? ref.substr(std::string(prefix).size()) : "";
        if (!name.empty() && root_.contains(defs) && root_[defs].is_object() && root_[defs].contains(name))
          target = &root_[defs][name];
      }
    }
    if (!target) throw SchemaError("$ref", "'$ref' " + ref + " is not '#' or an entry of $defs or definitions");
    // A placeholder first, so a recursive reference finds it.
    int32_t placeholder = add_node(g_, GrammarNode{});
    refs_[ref] = placeholder;
    int32_t compiled = compile(*target, depth + 1);
    g_.nodes[placeholder] = g_.nodes[compiled];
    return placeholder;
  }

  int32_t alternatives(const json& schema, const char* keyword, int depth) {
    const json& list = schema[keyword];
    if (!list.is_array() || list.empty()) throw SchemaError(keyword, std::string("'") + keyword + "' must be a non-empty array");
    if (has_siblings(schema))
      cannot_enforce(keyword, std::string("'") + keyword + "' is supported only with nothing beside it");
    GrammarNode node;
    node.kind = NodeKind::choice;
    for (const json& alternative : list) node.children.push_back(compile(alternative, depth + 1));
    return add_node(g_, std::move(node));
  }

  int32_t value(const json& schema, int depth) {
    GrammarNode node;
    if (schema.contains("type")) {
      const json& type = schema["type"];
      node.types = 0;
      if (type.is_array()) {
        if (type.empty()) throw SchemaError("type", "'type' must not be an empty list");
        for (const json& t : type) node.types |= type_bit(t);
      } else {
        node.types = type_bit(type);
      }
    } else if (schema.contains("properties") || schema.contains("required") || schema.contains("additionalProperties")) {
      node.types = kObject;
    } else if (schema.contains("items") || schema.contains("minItems") || schema.contains("maxItems")) {
      node.types = kArray;
    } else if (schema.contains("minLength") || schema.contains("maxLength") || schema.contains("pattern")) {
      node.types = kString;
    } else {
      return any_value_node(g_);
    }
    if (schema.contains("minLength")) node.min_length = non_negative(schema, "minLength");
    if (schema.contains("maxLength")) node.max_length = non_negative(schema, "maxLength");
    if (node.max_length >= 0 && node.max_length < node.min_length)
      throw SchemaError("maxLength", "'maxLength' is below 'minLength'");
    if (schema.contains("pattern")) {
      if (!schema["pattern"].is_string()) throw SchemaError("pattern", "'pattern' must be a string");
      try {
        g_.regexes.push_back(compile_regex(schema["pattern"]));
        node.regex = int32_t(g_.regexes.size() - 1);
      } catch (const SchemaError& e) {
        if (strict_ || !e.unsupported) throw;  // not strict: any string
      }
    }
    if (node.regex >= 0) {
      // Lengths beside a pattern: the matcher keeps to strings that can still end within both
      // (Regex::distance has a row per length still to write, so a minimum costs a table).
      Regex& regex = g_.regexes[size_t(node.regex)];
      if (node.min_length > kMaxPatternMinLength) {
        cannot_enforce("minLength", "'minLength' above " + std::to_string(kMaxPatternMinLength) + " together with 'pattern' is not supported");
        node.min_length = 0;
      }
      regex_require_length(regex, node.min_length);
      const int32_t shortest = regex_distance(regex, kRegexStart, node.min_length);
      if (shortest == INT32_MAX) throw SchemaError("minLength", "no string matching 'pattern' is 'minLength' characters long");
      if (node.max_length >= 0 && shortest > node.max_length)
        throw SchemaError("maxLength", "'maxLength' is shorter than any string matching 'pattern' and 'minLength'");
    }
    if (integer_typed(schema)) integer_bounds(schema, node);
    if (schema.contains("minItems")) node.min_items = non_negative(schema, "minItems");
    if (schema.contains("maxItems")) node.max_items = non_negative(schema, "maxItems");
    if (node.max_items >= 0 && node.max_items < node.min_items)
      throw SchemaError("maxItems", "'maxItems' is below 'minItems'");
    if (schema.contains("items")) {
      const json& items = schema["items"];
      if (items.is_array()) {
        cannot_enforce("items", "'items' as a list (tuple validation) is not supported");
        node.items = any_value_node(g_);
      } else if (items.is_boolean() && !items.get<bool>()) {
        node.max_items = 0;
      } else {
        node.items = compile(items, depth + 1);
      }
    } else {
      node.items = any_value_node(g_);
    }
    object(schema, node, depth);
    return add_node(g_, std::move(node));
  }

  // minimum, maximum and their exclusive forms (numbers; draft 4's booleans too) as the
  // integers inside them, within the digits a generated integer may have.
  void integer_bounds(const json& schema, GrammarNode& node) {
    const double largest = std::pow(10.0, kMaxIntegerDigits) - 1;
    double lo = -largest, hi = largest;
    auto bound = [&](const char* keyword) -> const json* {
      if (!schema.contains(keyword)) return nullptr;
      const json& v = schema[keyword];
      const bool flag = v.is_boolean() && std::string_view(keyword).starts_with("exclusive");
      if (!v.is_number() && !flag) throw SchemaError(keyword, std::string("'") + keyword + "' must be a number");
      return &v;
    };
    const json *minimum = bound("minimum"), *maximum = bound("maximum");
    const json *above = bound("exclusiveMinimum"), *below = bound("exclusiveMaximum");
    if (minimum) lo = std::max(lo, std::ceil(minimum->get<double>()));
    if (maximum) hi = std::min(hi, std::floor(maximum->get<double>()));
    if (above && above->is_number()) lo = std::max(lo, std::floor(above->get<double>()) + 1);
    if (below && below->is_number()) hi = std::min(hi, std::ceil(below->get<double>()) - 1);
    if (above && above->is_boolean() && above->get<bool>() && minimum) lo = std::max(lo, std::floor(minimum->get<double>()) + 1);
    if (below && below->is_boolean() && below->get<bool>() && maximum) hi = std::min(hi, std::ceil(maximum->get<double>()) - 1);
    if (lo > hi)
      throw SchemaError(minimum || above ? "minimum" : "maximum",
                        "no integer of at most " + std::to_string(kMaxIntegerDigits) + " digits lies within 'minimum' and 'maximum'");
    node.bounded = true;
    node.minimum = int64_t(lo), node.maximum = int64_t(hi);
  }

  void object(const json& schema, GrammarNode& node, int depth) {
    const json empty = json::object();
    const json& properties = schema.contains("properties") ? schema["properties"] : empty;
    if (!properties.is_object()) throw SchemaError("properties", "'properties' must be an object");
    if (properties.size() > size_t(kMaxProperties))
      throw SchemaError("properties", "more than " + std::to_string(kMaxProperties) + " properties are not supported");
    std::set<std::string> required;
    if (schema.contains("required")) {
      const json& list = schema["required"];
      if (!list.is_array()) throw SchemaError("required", "'required' must be an array of strings");
      for (const json& name : list) {
        if (!name.is_string()) throw SchemaError("required", "'required' must be an array of strings");
        if (!properties.contains(name.get<std::string>()))
          throw SchemaError("required", "the required property '" + name.get<std::string>() + "' is not in 'properties'");
        required.insert(name.get<std::string>());
      }
    }
    for (auto& [name, sub] : properties.items()) {
      std::string key = json(name).dump();
      if (key.find('\\') != std::string::npos)
        throw SchemaError("properties", "property names that need escapes in JSON are not supported");
      node.properties.push_back({key, compile(sub, depth + 1), required.count(name) > 0});
    }
    sort_keys(node);
    if (schema.contains("additionalProperties")) {
      const json& additional = schema["additionalProperties"];
      if (!(additional.is_boolean() && !additional.get<bool>())) node.additional = compile(additional, depth + 1);
    } else if (!schema.contains("properties")) {
      node.additional = any_value_node(g_);  // {"type": "object"}: any object
    }
  }

  Grammar& g_;
  const json& root_;
  const bool strict_;
  std::map<std::string, int32_t> refs_;
};

int64_t add(int64_t a, int64_t b) { return std::min(kInfinite, a + b); }

// The shortest text of each node, by fixed point (references may be recursive).
void compute_min_bytes(Grammar& g) {
  for (GrammarNode& node : g.nodes) node.min_bytes = kInfinite;
  for (bool changed = true; changed;) {
    changed = false;
    for (GrammarNode& node : g.nodes) {
      int64_t best = kInfinite;
      switch (node.kind) {
        case NodeKind::literal_set:
          for (const std::string& l : node.literals) best = std::min<int64_t>(best, int64_t(l.size()));
          break;
        case NodeKind::choice:
          for (int32_t c : node.children) best = std::min(best, g.nodes[c].min_bytes);
          break;
        case NodeKind::sequence:
          best = 0;
          for (int32_t c : node.children) best = add(best, g.nodes[c].min_bytes);
          break;
        case NodeKind::repeat: {
          int64_t item = g.nodes[node.children[0]].min_bytes, sep = g.nodes[node.children[1]].min_bytes;
          best = node.min_count == 0 ? 0 : add(item, (node.min_count - 1) * add(item, sep));
          break;
        }
        case NodeKind::value: {
          if (node.types & kNull) best = 4;
          if (node.types & kBool) best = std::min<int64_t>(best, 4);
          if (node.types & (kInteger | kNumber))
            best = std::min(best, node.bounded ? integer_text_bytes(node.minimum, node.maximum) : 1);
          if (node.types & kString) {
            int64_t chars = node.min_length;
            if (node.regex >= 0) chars = regex_distance(g.regexes[node.regex], kRegexStart, node.min_length);
            best = std::min(best, chars + (node.raw ? 0 : 2));
          }
          if ((node.types & kArray) && node.items >= 0) {
            int64_t items = node.min_items == 0 ? 0 : add(node.min_items * g.nodes[node.items].min_bytes, node.min_items - 1);
            best = std::min(best, add(items, 2));
          } else if (node.types & kArray) {
            best = std::min<int64_t>(best, 2);
          }
          if (node.types & kObject) {
            int64_t total = node.coder ? 0 : 2;
            int n = 0;
            for (const Property& p : node.properties) {
              if (p.node < 0) total = add(total, int64_t(p.key.size()));
              if (!p.required) continue;
              total = add(total, add(int64_t(p.key.size()) + (node.coder ? int64_t(kCoderClose.size()) : 1), g.nodes[p.node].min_bytes));
              if (!node.coder && n++ > 0) total = add(total, 1);
            }
            best = std::min(best, total);
          }
          break;
        }
      }
      if (best < node.min_bytes) node.min_bytes = best, changed = true;
      node.required_bits = 0;
      for (size_t i = 0; i < node.properties.size(); ++i)
        if (node.properties[i].required) node.required_bits |= uint64_t(1) << i;
    }
  }
  if (g.nodes[g.root].min_bytes >= kInfinite)
    throw SchemaError("$ref", "the schema has no finite instance (a required recursion never ends)");
}

std::shared_ptr<const Grammar> finish(Grammar&& g) {
  compute_min_bytes(g);
  return std::make_shared<const Grammar>(std::move(g));
}

// A Qwen3-Coder parameter value: strings without quotes, the rest as JSON.
int32_t coder_value(Grammar& g, int32_t node) {
  const GrammarNode& n = g.nodes[node];
  if (n.kind == NodeKind::value && n.types == kString) {
    GrammarNode raw = n;
    raw.raw = true;
    return add_node(g, std::move(raw));
  }
  if (n.kind == NodeKind::literal_set &&
      std::all_of(n.literals.begin(), n.literals.end(), [](const std::string& l) { return l.size() >= 2 && l[0] == '"'; })) {
    std::vector<std::string> bare;
    for (const std::string& l : n.literals) {
      std::string text = l.substr(1, l.size() - 2);
      if (text.find_first_of("\\<\n") != std::string::npos || text.empty())
        throw SchemaError("enum", "enum strings with escapes, '<' or nothing are not supported in the Qwen3-Coder format");
      bare.push_back(text);
    }
    return literal_node(g, std::move(bare));
  }
  return node;
}

}  // namespace

std::shared_ptr<const Grammar> json_object_grammar() {
  Grammar g;
  GrammarNode object;
  object.types = kObject;
  object.additional = any_value_node(g);
  g.root = add_node(g, std::move(object));
  return finish(std::move(g));
}

std::shared_ptr<const Grammar> compile_json_schema(const json& schema, bool strict) {
  Grammar g;
  g.root = Compiler(g, schema, strict).compile(schema, 0);
  return finish(std::move(g));
}

std::shared_ptr<const Grammar> compile_tool_calls(const json& tools, ToolCallStyle style, const std::string& only,
                                                  int max_calls) {
  Grammar g;
  GrammarNode calls;
  calls.kind = NodeKind::choice;
  const bool coder = style == ToolCallStyle::qwen3_coder;
  for (const json& tool : tools) {
    const json& function = tool.contains("function") ? tool["function"] : tool;
    if (!function.is_object() || !function.contains("name") || !function["name"].is_string()) continue;
    const std::string name = function["name"];
    if (!only.empty() && name != only) continue;
    if (name.find_first_of("\"\\<>\n") != std::string::npos)
      throw SchemaError("name", "function names with quotes, backslashes, '<', '>' or newlines are not supported");
    const json parameters = function.contains("parameters") ? function["parameters"] : json{{"type", "object"}, {"properties", json::object()}};
    if (function.contains("strict") && !function["strict"].is_boolean()) throw SchemaError("strict", "'strict' must be a boolean");
    const bool strict = function.value("strict", false);
    int32_t arguments = Compiler(g, parameters, strict).compile(parameters, 0);
    if (coder) {
      GrammarNode block = g.nodes[arguments];
      if (block.kind != NodeKind::value || block.types != kObject)
        throw SchemaError("parameters", "Qwen3-Coder tool parameters must be an object schema with properties");
      block.additional = -1;
      block.coder = true;
      for (Property& p : block.properties) {
        std::string bare = p.key.substr(1, p.key.size() - 2);
        if (bare.find_first_of("<>\n") != std::string::npos)
          throw SchemaError("properties", "parameter names with '<', '>' or newlines are not supported");
        p.key = "<parameter=" + bare + ">\n";
        p.node = coder_value(g, p.node);
      }
      block.properties.push_back({std::string(kCoderEnd), -1, false});
      sort_keys(block);
      int32_t block_node = add_node(g, std::move(block));
      calls.children.push_back(sequence_node(g, {literal_node(g, {name + ">\n"}), block_node}));
    } else {
      GrammarNode call;
      call.types = kObject;
      call.ordered = true;
      call.properties.push_back({"\"name\"", literal_node(g, {json(name).dump()}), true});
      call.properties.push_back({"\"arguments\"", arguments, true});
      sort_keys(call);
      calls.children.push_back(add_node(g, std::move(call)));
    }
  }
  if (calls.children.empty())
    throw SchemaError("tool_choice", only.empty() ? "there are no tools to call" : "no tool is named '" + only + "'");
  int32_t choice = add_node(g, std::move(calls));
  int32_t open = literal_node(g, {coder ? "<tool_call>\n<function=" : "<tool_call>\n"});
  int32_t close = literal_node(g, {"\n</tool_call>"});
  GrammarNode repeat;
  repeat.kind = NodeKind::repeat;
  repeat.children = {sequence_node(g, {open, choice, close}), literal_node(g, {"\n"})};
  repeat.min_count = 1;
  repeat.max_count = std::max(1, max_calls);
  g.root = add_node(g, std::move(repeat));
  return finish(std::move(g));
}

}  // namespace ellm
