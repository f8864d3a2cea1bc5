#include "server/anthropic_request.h"

#include <array>
#include <atomic>
#include <set>

#include "base/log.h"

namespace ellm {

using json = nlohmann::ordered_json;

namespace {

constexpr std::string_view kBillingHeader = "x-anthropic-billing-header:";

// Types of Anthropic's own tools (server tools and the client tools whose schema the API
// supplies): they carry no input_schema this server could show the model.
constexpr std::array<std::string_view, 9> kAnthropicToolTypes = {
    "web_search_", "web_fetch_", "code_execution_", "bash_", "text_editor_", "computer_", "memory_",
    "tool_search_tool_", "mcp_toolset"};

std::string where(size_t message, size_t block) {
  return "messages[" + std::to_string(message) + "].content[" + std::to_string(block) + "]";
}

const json* field(const json& object, const char* name) {
  auto it = object.find(name);
  return it == object.end() || it->is_null() ? nullptr : &*it;
}

std::string block_type(const json& block, const std::string& at) {
  if (!block.is_object() || !block.contains("type") || !block["type"].is_string())
    throw_bad_request(at + ": a content block must be an object with a string 'type'", "messages");
  return block["type"].get<std::string>();
}

std::string block_text(const json& block, const std::string& at) {
  const json* text = field(block, "text");
  if (!text || !text->is_string()) throw_bad_request(at + ": a text block needs a string 'text'", "messages");
  return text->get<std::string>();
}

// An image block ({"source": {"type": "base64", "media_type", "data"}}) as a chat image_url
// part with a data: URI; the server reads it when the model has a vision tower. Images by URL
// are not fetched.
json image_part(const json& block, const std::string& at) {
  const json* source = field(block, "source");
  const json* type = source && source->is_object() ? field(*source, "type") : nullptr;
  if (!type || !type->is_string()) throw_bad_request(at + ": an image block needs a 'source' with a 'type'", "messages");
  if (*type != "base64")
    throw_bad_request(at + ": image sources of type '" + type->get<std::string>() +
                          "' are not supported (send the image as base64)", "messages");
  const json* media = field(*source, "media_type");
  const json* data = field(*source, "data");
  if (!media || !media->is_string() || !data || !data->is_string())
    throw_bad_request(at + ": a base64 image source needs string 'media_type' and 'data'", "messages");
  json image_url = json::object();
  image_url["url"] = "data:" + media->get<std::string>() + ";base64," + data->get<std::string>();
  return {{"type", "image_url"}, {"image_url", std::move(image_url)}};
}

[[noreturn]] void unsupported_block(const std::string& type, const std::string& at) {
  if (type == "document")
    throw_bad_request(at + ": '" + type + "' content is not supported: this server reads text and images", "messages");
  throw_bad_request(at + ": content block type '" + type + "' is not supported here", "messages");
}

// Text of a string or of a list of text blocks (system prompts, tool results); a tool result's
// image blocks go to `images` as chat parts.
std::string text_of(const json& content, const std::string& at, bool drop_billing_header = false,
                    json* images = nullptr) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) throw_bad_request(at + ": expected a string or a list of text blocks", "messages");
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string part_at = at + "[" + std::to_string(i) + "]";
    const std::string type = block_type(content[i], part_at);
    if (type == "tool_reference") {  // a deferred tool that tool search loaded: it joins the tools
      const json* name = field(content[i], "tool_name");
      text += std::string(text.empty() ? "" : "\n\n") + "Tool loaded: " + (name && name->is_string() ? name->get<std::string>() : "");
      continue;
    }
    if (type == "image" && images) {
      images->push_back(image_part(content[i], part_at));
      continue;
    }
    if (type != "text") unsupported_block(type, part_at);
    std::string part = block_text(content[i], part_at);
    // Claude Code's per-request nonce: kept, it would change the prompt's first tokens each turn.
    if (drop_billing_header && std::string_view(part).starts_with(kBillingHeader)) continue;
    if (!text.empty()) text += "\n\n";
    text += part;
  }
  return text;
}

json text_part(std::string text) { return {{"type", "text"}, {"text", std::move(text)}}; }

// One Anthropic message (its content as blocks) after system entries were folded.
struct Entry {
  std::string role;
  json blocks;
  size_t index;  // in the request's messages, for errors
};

// A user turn: its text as parts (the template joins them as chat completions' parts), each
// tool_result as a tool message in place. Results must answer the last assistant turn's calls.
void add_user(const Entry& e, const std::set<std::string>& open_calls, json& out) {
  json parts = json::array();
  auto flush = [&] {
    if (!parts.empty()) out.push_back({{"role", "user"}, {"content", std::move(parts)}});
    parts = json::array();
  };
  for (size_t j = 0; j < e.blocks.size(); ++j) {
    const std::string at = where(e.index, j);
    const json& block = e.blocks[j];
    const std::string type = block_type(block, at);
    if (type == "text") {
      parts.push_back(text_part(block_text(block, at)));
    } else if (type == "image") {
      parts.push_back(image_part(block, at));
    } else if (type == "tool_result") {
      const json* id = field(block, "tool_use_id");
      if (!id || !id->is_string()) throw_bad_request(at + ": a tool_result needs a string 'tool_use_id'", "messages");
      if (!open_calls.count(id->get<std::string>()))
        throw_bad_request(at + ": tool_result '" + id->get<std::string>() +
                              "' answers no tool_use of the last assistant message", "messages");
      const json* content = field(block, "content");
      json images = json::array();
      std::string text = content ? text_of(*content, at + ".content", false, &images) : "";
      const json* is_error = field(block, "is_error");
      if (is_error && !is_error->is_boolean()) throw_bad_request(at + ": 'is_error' must be a boolean", "messages");
      if (is_error && is_error->get<bool>()) text = "Error: " + text;
      flush();
      // A screenshot a tool returns: the result's text, then its images, as parts.
      json result = images.empty() ? json(std::move(text)) : json::array();
      if (!images.empty()) {
        if (!text.empty()) result.push_back(text_part(std::move(text)));
        for (json& image : images) result.push_back(std::move(image));
      }
      out.push_back({{"role", "tool"}, {"tool_call_id", *id}, {"content", std::move(result)}});
    } else if (type == "tool_use" || type == "thinking" || type == "redacted_thinking") {
      throw_bad_request(at + ": a '" + type + "' block belongs in an assistant message", "messages");
    } else {
      unsupported_block(type, at);
    }
  }
  flush();
}

// An assistant turn: text blocks as content, thinking as reasoning_content (from the signature
// when the text was omitted), tool_use as tool_calls. Returns the ids of its calls.
std::set<std::string> add_assistant(const Entry& e, json& out) {
  std::string content, reasoning;
  json calls = json::array();
  std::set<std::string> ids;
  for (size_t j = 0; j < e.blocks.size(); ++j) {
    const std::string at = where(e.index, j);
    const json& block = e.blocks[j];
    const std::string type = block_type(block, at);
    if (type == "text") {
      content += block_text(block, at);
    } else if (type == "thinking") {
      const json* thinking = field(block, "thinking");
      if (!thinking || !thinking->is_string()) throw_bad_request(at + ": a thinking block needs a string 'thinking'", "messages");
      std::string text = thinking->get<std::string>();
      const json* signature = field(block, "signature");
      if (text.empty() && signature && signature->is_string())
        text = reasoning_from_signature(signature->get<std::string>()).value_or("");
      reasoning += text;
    } else if (type == "redacted_thinking") {
      continue;  // opaque to this server
    } else if (type == "tool_use") {
      const json* id = field(block, "id");
      const json* name = field(block, "name");
      const json* input = field(block, "input");
      if (!id || !id->is_string() || !name || !name->is_string() || !input || !input->is_object())
        throw_bad_request(at + ": a tool_use needs a string 'id' and 'name' and an object 'input'", "messages");
      ids.insert(id->get<std::string>());
      calls.push_back({{"id", *id}, {"type", "function"}, {"function", {{"name", *name}, {"arguments", *input}}}});
    } else if (type == "tool_result") {
      throw_bad_request(at + ": a tool_result block belongs in a user message", "messages");
    } else {
      unsupported_block(type, at);
    }
  }
  json message = {{"role", "assistant"}, {"content", content}};
  if (!reasoning.empty()) message["reasoning_content"] = reasoning;
  if (!calls.empty()) message["tool_calls"] = std::move(calls);
  out.push_back(std::move(message));
  return ids;
}

// Anthropic messages -> OpenAI chat messages, the system prompt first. A system entry inside
// `messages` (Claude Code sends one second) is folded in place, since chat templates take a
// system message only first: before any turn it joins the system prompt; after a user turn it
// becomes that turn's last text part; after an assistant turn it is a user turn of its own.
json chat_messages(std::string system, const json& messages) {
  std::vector<Entry> entries;
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) throw_bad_request(at + ": each message must be an object", "messages");
    const json* role = field(m, "role");
    const json* content = field(m, "content");
    if (!role || !role->is_string()) throw_bad_request(at + ": each message needs a string 'role'", "messages");
    if (!content || !(content->is_string() || content->is_array()))
      throw_bad_request(at + ": 'content' must be a string or a list of content blocks", "messages");
    const std::string r = role->get<std::string>();
    if (r != "user" && r != "assistant" && r != "system")
      throw_bad_request(at + ": 'role' must be user or assistant (or system), not '" + r + "'", "messages");
    json blocks = content->is_string() ? json::array({text_part(content->get<std::string>())}) : *content;
    if (r == "system") {
      std::string text = text_of(*content, at + ".content", /*drop_billing_header=*/true);
      if (entries.empty()) {
        system += (system.empty() || text.empty() ? "" : "\n\n") + text;
      } else if (entries.back().role == "user") {
        entries.back().blocks.push_back(text_part("\n\n" + text));
      } else {
        entries.push_back({"user", json::array({text_part(std::move(text))}), i});
      }
      continue;
    }
    entries.push_back({r, std::move(blocks), i});
  }
  if (entries.empty()) throw_bad_request("'messages' needs a user message", "messages");
  if (entries.back().role == "assistant")
    throw_bad_request("the last message is the assistant's: continuing a prefilled reply is not supported", "messages");

  json out = json::array();
  if (!system.empty()) out.push_back({{"role", "system"}, {"content", std::move(system)}});
  std::set<std::string> open_calls;  // the calls of the last assistant turn
  for (const Entry& e : entries) {
    if (e.role == "assistant") open_calls = add_assistant(e, out);
    else add_user(e, open_calls, out);
  }
  return out;
}

void log_skipped_once(const std::string& type) {
  static std::atomic<bool> logged{false};
  if (!logged.exchange(true))
    log_info("messages: tools of Anthropic's own types (here '" + type + "') carry no schema and are left out");
}

// The tools that tool search loaded: tool_reference blocks in the tool results.
std::set<std::string> loaded_tools(const json& messages) {
  std::set<std::string> names;
  for (const json& m : messages) {
    const json* content = m.is_object() ? field(m, "content") : nullptr;
    if (!content || !content->is_array()) continue;
    for (const json& block : *content) {
      const json* result = block.is_object() ? field(block, "content") : nullptr;
      if (!result || !result->is_array()) continue;
      for (const json& part : *result)
        if (part.is_object() && part.value("type", json()) == "tool_reference" && part.contains("tool_name") &&
            part["tool_name"].is_string())
          names.insert(part["tool_name"].get<std::string>());
    }
  }
  return names;
}

// Anthropic tools -> OpenAI function tools. Anthropic's own tool types are skipped, as are
// deferred tools (defer_loading) until tool search loads them, as the API shows them.
json chat_tools(const json& tools, const std::set<std::string>& loaded) {
  if (!tools.is_array()) throw_bad_request("'tools' must be a list", "tools");
  json out = json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const json& t = tools[i];
    const std::string at = "tools[" + std::to_string(i) + "]";
    if (!t.is_object()) throw_bad_request(at + ": each tool must be an object", "tools");
    const json* type = field(t, "type");
    if (type && !type->is_string()) throw_bad_request(at + ": 'type' must be a string", "tools");
    const std::string kind = type ? type->get<std::string>() : "custom";
    if (kind != "custom") {
      bool known = false;
      for (std::string_view prefix : kAnthropicToolTypes) known = known || kind.starts_with(prefix);
      if (!known) throw_bad_request(at + ": unknown tool type '" + kind + "'", "tools");
      log_skipped_once(kind);
      continue;
    }
    const json* name = field(t, "name");
    const json* schema = field(t, "input_schema");
    if (!name || !name->is_string() || name->get<std::string>().empty() || !schema || !schema->is_object())
      throw_bad_request(at + ": a tool needs a string 'name' and an object 'input_schema'", "tools");
    const json* deferred = field(t, "defer_loading");
    if (deferred && deferred->is_boolean() && deferred->get<bool>() && !loaded.count(name->get<std::string>())) continue;
    json function = {{"name", *name}};
    if (const json* description = field(t, "description"); description && description->is_string())
      function["description"] = *description;
    function["parameters"] = *schema;
    out.push_back({{"type", "function"}, {"function", std::move(function)}});
  }
  return out;
}

// tool_choice {type: auto|any|tool|none, name, disable_parallel_tool_use} -> OpenAI's fields.
void add_tool_choice(const json& choice, json& body) {
  const char* param = "tool_choice";
  if (!choice.is_object() || !field(choice, "type") || !choice["type"].is_string())
    throw_bad_request("'tool_choice' must be an object with a string 'type'", param);
  const std::string type = choice["type"];
  if (type == "auto" || type == "none") {
    body["tool_choice"] = type;
  } else if (type == "any") {
    body["tool_choice"] = "required";
  } else if (type == "tool") {
    const json* name = field(choice, "name");
    if (!name || !name->is_string()) throw_bad_request("'tool_choice' of type tool needs a string 'name'", param);
    body["tool_choice"] = {{"type", "function"}, {"function", {{"name", *name}}}};
  } else {
    throw_bad_request("'tool_choice.type' must be auto, any, tool or none", param);
  }
  if (const json* single = field(choice, "disable_parallel_tool_use")) {
    if (!single->is_boolean()) throw_bad_request("'tool_choice.disable_parallel_tool_use' must be a boolean", param);
    body["parallel_tool_calls"] = !single->get<bool>();
  }
}

}  // namespace

MessagesRequest parse_messages_request(const json& body, const SamplingParams& defaults, bool count_only) {
  // The OpenAI chat body this request means; parse_chat_request checks the shared fields.
  json chat = json::object();
  const json* messages = field(body, "messages");
  if (!messages) throw_bad_request("'messages' is required", "messages");
  if (!messages->is_array() || messages->empty()) throw_bad_request("'messages' must be a non-empty list", "messages");
  std::string system;
  if (const json* s = field(body, "system")) system = text_of(*s, "system", /*drop_billing_header=*/true);
  chat["messages"] = chat_messages(std::move(system), *messages);

  if (const json* model = field(body, "model"); model && !model->is_string())
    throw_bad_request("'model' must be a string", "model");
  if (!count_only && !field(body, "max_tokens")) throw_bad_request("'max_tokens' is required", "max_tokens");
  if (!count_only)
    for (const char* name : {"max_tokens", "temperature", "top_p", "top_k", "stream"})
      if (const json* v = field(body, name)) chat[name] = *v;
  // ellm's extensions of chat completions, accepted here too.
  for (const char* name : {"seed", "min_p", "session_cache", "speculative", "num_speculative_tokens"})
    if (const json* v = field(body, name)) chat[name] = *v;
  if (const json* stops = field(body, "stop_sequences")) {
    if (!stops->is_array()) throw_bad_request("'stop_sequences' must be a list of strings", "stop_sequences");
    for (const json& s : *stops)
      if (!s.is_string() || s.get<std::string>().empty())
        throw_bad_request("'stop_sequences' must be a list of non-empty strings", "stop_sequences");
    if (!count_only) chat["stop"] = *stops;
  }
  if (const json* metadata = field(body, "metadata"); metadata && !metadata->is_object())
    throw_bad_request("'metadata' must be an object", "metadata");
  if (const json* tools = field(body, "tools")) chat["tools"] = chat_tools(*tools, loaded_tools(*messages));
  if (const json* choice = field(body, "tool_choice")) add_tool_choice(*choice, chat);

  MessagesRequest r;
  json kwargs = json::object();
  if (const json* thinking = field(body, "thinking")) {
    const json* type = thinking->is_object() ? field(*thinking, "type") : nullptr;
    const std::string t = type && type->is_string() ? type->get<std::string>() : "";
    if (t != "enabled" && t != "disabled" && t != "adaptive")
      throw_bad_request("'thinking.type' must be enabled, disabled or adaptive", "thinking");
    kwargs["enable_thinking"] = t != "disabled";  // the template's switch; a budget is not enforced
    const json* display = field(*thinking, "display");
    r.show_thinking = !(display && display->is_string() && display->get<std::string>() == "omitted");
  }
  if (const json* extra = field(body, "chat_template_kwargs")) {
    if (!extra->is_object()) throw_bad_request("'chat_template_kwargs' must be an object", "chat_template_kwargs");
    for (const auto& [k, v] : extra->items()) kwargs[k] = v;
  }
  if (!kwargs.empty()) chat["chat_template_kwargs"] = std::move(kwargs);
  r.chat = parse_chat_request(chat, defaults);
  return r;
}

}  // namespace ellm
