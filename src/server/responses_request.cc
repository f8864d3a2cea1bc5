#include "server/responses_request.h"

#include <algorithm>
#include <cmath>
#include <mutex>

#include "base/log.h"

namespace ellm {

using json = nlohmann::ordered_json;

namespace {

[[noreturn]] void bad(const std::string& message, const std::string& param = "input") {
  throw_bad_request(message, param);
}

const json* field(const json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

// A string field, or `fallback` when it is absent or not a string.
std::string string_or(const json& object, const char* name, const std::string& fallback) {
  const json* v = field(object, name);
  return v && v->is_string() ? v->get<std::string>() : fallback;
}

std::string string_of(const json& object, const char* name, const std::string& where, const std::string& param) {
  const json* v = field(object, name);
  if (!v || !v->is_string()) bad(where + " needs a string '" + name + "'", param);
  return v->get<std::string>();
}

// Hosted tools OpenAI runs itself have nothing to declare to a local model: they are left out,
// and each kind is logged once per process.
bool is_hosted_tool(const std::string& type) {
  static const std::set<std::string> hosted = {"web_search", "web_search_preview", "web_search_2025_08_26",
                                               "web_search_preview_2025_03_11", "image_generation", "local_shell",
                                               "file_search", "code_interpreter", "computer_use_preview",
                                               "computer_use", "mcp", "tool_search", "namespace"};
  return hosted.contains(type);
}

void log_skipped_once(const std::string& what) {
  static std::mutex mutex;
  static std::set<std::string> logged;
  std::lock_guard lock(mutex);
  if (logged.insert(what).second)
    log_info("responses: " + what + " is skipped: it has no definition a local model could call");
}

// input_image: its image_url (a data: URI) as a chat image_url part; a file_id needs the Files
// API, which this server does not keep.
json image_part(const json& part, const std::string& at) {
  const json* url = field(part, "image_url");
  if (!url || !url->is_string()) {
    if (field(part, "file_id")) bad(at + ": input_image by file_id needs stored files; send 'image_url' as a data: URI");
    bad(at + ": input_image needs a string 'image_url'");
  }
  json image_url = json::object();
  image_url["url"] = *url;
  return {{"type", "image_url"}, {"image_url", std::move(image_url)}};
}

// A message's content (a string or parts) as chat parts: text, and images as image_url parts
// (the server reads them when the model has a vision tower, and refuses them otherwise).
json text_parts(const json& content, const std::string& where) {
  json parts = json::array();
  if (content.is_string()) {
    parts.push_back({{"type", "text"}, {"text", content}});
    return parts;
  }
  if (!content.is_array()) bad(where + ".content must be a string or a list of content parts");
  for (size_t j = 0; j < content.size(); ++j) {
    const json& part = content[j];
    const std::string at = where + ".content[" + std::to_string(j) + "]";
    if (!part.is_object()) bad(at + " must be an object");
    const std::string type = string_of(part, "type", at, "input");
    if (type == "input_text" || type == "output_text" || type == "text" || type == "summary_text" ||
        type == "reasoning_text")
      parts.push_back({{"type", "text"}, {"text", string_of(part, "text", at, "input")}});
    else if (type == "refusal")
      parts.push_back({{"type", "text"}, {"text", string_of(part, "refusal", at, "input")}});
    else if (type == "input_image")
      parts.push_back(image_part(part, at));
    else if (type == "input_file" || type == "input_audio")
      bad(at + ": '" + type + "' parts are not supported: this server takes text and images");
    else
      bad(at + ": unknown content part type '" + type + "'");
  }
  return parts;
}

bool has_image(const json& parts) {
  return std::any_of(parts.begin(), parts.end(), [](const json& p) { return p["type"] == "image_url"; });
}

std::string joined_text(const json& parts) {
  std::string text;
  for (const json& p : parts)
    if (p["type"] == "text") text += p["text"].get<std::string>();
  return text;
}

// Builds chat messages from `instructions` and `input`. System and developer messages before
// the conversation join the one system message templates allow; later ones are kept in place
// as user turns, so the prompt's prefix stays what earlier turns rendered.
class MessageBuilder {
 public:
  void system(const std::string& text) {
    if (text.empty()) return;
    system_ += (system_.empty() ? "" : "\n\n") + text;
  }

  void item(const json& it, const std::string& where) {
    if (!it.is_object()) bad(where + " must be an object");
    const json* type_field = field(it, "type");
    if (type_field && !type_field->is_string()) bad(where + ".type must be a string");
    const std::string type = type_field ? type_field->get<std::string>() : "message";
    if (type == "message") message(it, where);
    else if (type == "reasoning") reasoning(it, where);
    else if (type == "function_call") call(it, where, string_of(it, "arguments", where, "input"));
    else if (type == "custom_tool_call") call(it, where, json{{kCustomToolArgument, string_of(it, "input", where, "input")}}.dump());
    else if (type == "function_call_output" || type == "custom_tool_call_output") output(it, where);
    else if (type == "item_reference") bad(where + ": item_reference needs stored responses; this server keeps none (send the items themselves)");
    else bad(where + ": input items of type '" + type + "' are not supported");
  }

  json finish() {
    json all = json::array();
    if (!system_.empty()) all.push_back({{"role", "system"}, {"content", system_}});
    for (json& m : messages_) all.push_back(std::move(m));
    if (all.empty() || (all.size() == 1 && !system_.empty())) bad("'input' holds no message", "input");
    return all;
  }

 private:
  void message(const json& it, const std::string& where) {
    const std::string role = string_of(it, "role", where, "input");
    const json* content = field(it, "content");
    if (!content) bad(where + " needs 'content'");
    json parts = text_parts(*content, where);
    if (role == "system" || role == "developer") {
      if (messages_.empty()) system(joined_text(parts));
      else messages_.push_back({{"role", "user"}, {"content", std::move(parts)}});
    } else if (role == "user") {
      messages_.push_back({{"role", "user"}, {"content", std::move(parts)}});
    } else if (role == "assistant") {
      json m = {{"role", "assistant"}, {"content", std::move(parts)}};
      take_reasoning(m);
      messages_.push_back(std::move(m));
    } else {
      bad(where + ".role must be user, assistant, system or developer, not '" + role + "'");
    }
  }

  void reasoning(const json& it, const std::string& where) {
    const json* content = field(it, "content");
    const json* summary = field(it, "summary");
    if (content && content->is_array() && !content->empty()) reasoning_ += joined_text(text_parts(*content, where));
    else if (summary && summary->is_array()) reasoning_ += joined_text(text_parts(*summary, where));
  }

  void take_reasoning(json& assistant) {
    if (!reasoning_.empty()) assistant["reasoning_content"] = std::move(reasoning_);
    reasoning_.clear();
  }

  // A call joins the assistant message of its turn (the text and calls of one reply).
  void call(const json& it, const std::string& where, const std::string& arguments) {
    const std::string call_id = string_of(it, "call_id", where, "input");
    const std::string name = string_of(it, "name", where, "input");
    if (messages_.empty() || messages_.back()["role"] != "assistant" || !reasoning_.empty()) {
      json m = {{"role", "assistant"}, {"content", ""}};
      take_reasoning(m);
      messages_.push_back(std::move(m));
    }
    json& assistant = messages_.back();
    if (!assistant.contains("tool_calls")) assistant["tool_calls"] = json::array();
    assistant["tool_calls"].push_back(
        {{"id", call_id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", arguments}}}});
    calls_.insert(call_id);
  }

  void output(const json& it, const std::string& where) {
    const std::string call_id = string_of(it, "call_id", where, "input");
    if (!calls_.contains(call_id))
      bad(where + ": no function_call or custom_tool_call with call_id '" + call_id + "' comes before this output");
    const json* out = field(it, "output");
    if (!out) bad(where + " needs 'output'");
    json parts = text_parts(*out, where + ".output");
    json content = has_image(parts) ? std::move(parts) : json(joined_text(parts));
    messages_.push_back({{"role", "tool"}, {"tool_call_id", call_id}, {"content", std::move(content)}});
  }

  std::string system_, reasoning_;
  json messages_ = json::array();
  std::set<std::string> calls_;
};

json function_tool(const std::string& name, const json* description, json parameters) {
  json fn = {{"name", name}};
  if (description && description->is_string()) fn["description"] = *description;
  fn["parameters"] = std::move(parameters);
  return {{"type", "function"}, {"function", std::move(fn)}};
}

void add_tool(const json& tool, const std::string& where, ResponsesRequest& r, json& tools, const std::string& ns) {
  if (!tool.is_object()) bad(where + " must be an object", "tools");
  const std::string type = string_of(tool, "type", where, "tools");
  if (type == "function") {
    const json* parameters = field(tool, "parameters");
    if (parameters && !parameters->is_object()) bad(where + ".parameters must be an object", "tools");
    const std::string name = string_of(tool, "name", where, "tools");
    tools.push_back(function_tool(name, field(tool, "description"),
                                  parameters ? *parameters : json{{"type", "object"}, {"properties", json::object()}}));
    if (!ns.empty()) r.tool_namespaces[name] = ns;
  } else if (type == "custom") {
    const std::string name = string_of(tool, "name", where, "tools");
    std::string about = "The raw text input, not JSON.";
    if (const json* format = field(tool, "format"); format && format->is_object())
      if (const json* definition = field(*format, "definition"); definition && definition->is_string())
        about += " It follows this " + string_or(*format, "syntax", "grammar") + " grammar:\n" + definition->get<std::string>();
    json parameters = {{"type", "object"},
                       {"properties", {{kCustomToolArgument, {{"type", "string"}, {"description", about}}}}},
                       {"required", {kCustomToolArgument}}};
    tools.push_back(function_tool(name, field(tool, "description"), std::move(parameters)));
    r.custom_tools.insert(name);
    if (!ns.empty()) r.tool_namespaces[name] = ns;
  } else if (type == "namespace" && ns.empty() && field(tool, "tools") && (*field(tool, "tools")).is_array() &&
             !(*field(tool, "tools")).empty()) {
    const std::string name = string_of(tool, "name", where, "tools");
    const json& inner = tool["tools"];
    for (size_t i = 0; i < inner.size(); ++i) add_tool(inner[i], where + ".tools[" + std::to_string(i) + "]", r, tools, name);
  } else if (is_hosted_tool(type)) {
    log_skipped_once("a '" + type + "' tool");
  } else {
    bad(where + ": unknown tool type '" + type + "' (function, custom, namespace, or a hosted tool)", "tools");
  }
}

json chat_tool_choice(const json& choice) {
  if (choice.is_string()) return choice;
  if (choice.is_object() && choice.contains("name") && choice["name"].is_string() &&
      (string_or(choice, "type", "") == "function" || string_or(choice, "type", "") == "custom"))
    return {{"type", "function"}, {"function", {{"name", choice["name"]}}}};
  bad("'tool_choice' must be auto, none, required, or {\"type\": \"function\" or \"custom\", \"name\": ...}", "tool_choice");
}

json response_format(const json& text) {
  if (!text.is_object()) bad("'text' must be an object", "text");
  const json* format = field(text, "format");
  if (!format) return nullptr;
  if (!format->is_object()) bad("'text.format' must be an object", "text.format");
  const std::string type = string_or(*format, "type", "");
  if (type != "text" && type != "json_object" && type != "json_schema")
    bad("'text.format.type' must be text, json_object or json_schema", "text.format");
  if (type != "json_schema") return {{"type", type}};
  json spec = {{"name", string_or(*format, "name", "response")}, {"schema", format->contains("schema") ? (*format)["schema"] : json(nullptr)}};
  if (format->contains("strict")) spec["strict"] = (*format)["strict"];
  return {{"type", "json_schema"}, {"json_schema", std::move(spec)}};
}

// reasoning.effort -> the template's thinking switch (and its effort where it has one).
void reasoning_switch(const json& reasoning, const std::string& template_source, json& kwargs, json& echo) {
  if (!reasoning.is_object()) bad("'reasoning' must be an object", "reasoning");
  echo = {{"effort", nullptr}, {"summary", nullptr}};
  if (const json* summary = field(reasoning, "summary")) echo["summary"] = *summary;
  const json* effort = field(reasoning, "effort");
  if (!effort) return;
  const std::string e = effort->is_string() ? effort->get<std::string>() : "";
  static const std::set<std::string> known = {"none", "minimal", "low", "medium", "high", "xhigh"};
  if (!known.contains(e)) bad("'reasoning.effort' must be none, minimal, low, medium, high or xhigh", "reasoning.effort");
  echo["effort"] = e;
  kwargs["enable_thinking"] = e != "none" && e != "minimal";
  if (e != "none" && e != "minimal" && template_source.find("reasoning_effort") != std::string::npos)
    kwargs["reasoning_effort"] = e == "low" ? "low" : e == "medium" ? "medium" : "xhigh";
}

// Chat fields named in an error -> the Responses field the user sent.
std::string responses_param(const std::string& chat_param) {
  if (chat_param == "max_tokens") return "max_output_tokens";
  if (chat_param == "messages") return "input";
  if (chat_param == "response_format") return "text.format";
  return chat_param;
}

}  // namespace

ResponsesRequest parse_responses_request(const json& body, const SamplingParams& defaults, const std::string& template_source) {
  ResponsesRequest r;
  if (field(body, "previous_response_id"))
    bad("'previous_response_id' is not supported: this server stores no responses; send the whole conversation in "
        "'input' (with store: false)", "previous_response_id");
  if (field(body, "conversation"))
    bad("'conversation' is not supported: this server stores no conversations", "conversation");

  json chat = json::object();
  // seed, top_k, min_p, ignore_eos: as chat completions takes them (not Responses fields; vLLM
  // takes them too).
  for (const char* name : {"model", "stream", "temperature", "top_p", "parallel_tool_calls", "seed", "top_k", "min_p",
                           "ignore_eos"})
    if (const json* v = field(body, name)) chat[name] = *v;
  if (const json* v = field(body, "max_output_tokens")) {
    if (!v->is_number_integer() || v->get<int64_t>() < 1) bad("'max_output_tokens' must be an integer of at least 1", "max_output_tokens");
    chat["max_tokens"] = *v;
  }

  MessageBuilder messages;
  if (const json* instructions = field(body, "instructions")) {
    if (!instructions->is_string()) bad("'instructions' must be a string", "instructions");
    messages.system(instructions->get<std::string>());
  }
  const json* input = field(body, "input");
  if (!input) bad("'input' is required");
  if (input->is_string()) {
    messages.item({{"role", "user"}, {"content", *input}}, "input");
  } else if (input->is_array()) {
    for (size_t i = 0; i < input->size(); ++i) messages.item((*input)[i], "input[" + std::to_string(i) + "]");
  } else {
    bad("'input' must be a string or a list of items");
  }
  chat["messages"] = messages.finish();

  json tools = json::array();
  if (const json* list = field(body, "tools")) {
    if (!list->is_array()) bad("'tools' must be a list", "tools");
    for (size_t i = 0; i < list->size(); ++i) add_tool((*list)[i], "tools[" + std::to_string(i) + "]", r, tools, "");
  }
  if (!tools.empty()) chat["tools"] = tools;
  if (const json* choice = field(body, "tool_choice")) chat["tool_choice"] = chat_tool_choice(*choice);
  if (const json* text = field(body, "text"))
    if (json format = response_format(*text); !format.is_null()) chat["response_format"] = std::move(format);
  // Logprobs of the message text: top_logprobs alternatives, or include's output_text logprobs.
  if (const json* include = field(body, "include")) {
    if (!include->is_array() || !std::all_of(include->begin(), include->end(), [](const json& x) { return x.is_string(); }))
      bad("'include' must be a list of strings", "include");
    for (const json& x : *include)
      if (x == "message.output_text.logprobs") chat["logprobs"] = true;
  }
  if (const json* top = field(body, "top_logprobs")) {
    chat["logprobs"] = true;
    chat["top_logprobs"] = *top;
  }
  json kwargs = json::object(), reasoning_echo = nullptr;
  if (const json* reasoning = field(body, "reasoning")) reasoning_switch(*reasoning, template_source, kwargs, reasoning_echo);
  if (!kwargs.empty()) chat["chat_template_kwargs"] = kwargs;

  try {
    r.chat = parse_chat_request(chat, defaults);
  } catch (const ApiError& e) {
    throw ApiError(e.status, e.type, e.what(), responses_param(e.param));
  }
  if (r.chat.tool_choice != "auto" && r.chat.tool_choice != "none" && tools.empty() && field(body, "tools"))
    bad("'tool_choice' names a tool, but every tool given is a hosted one this server skips", "tool_choice");

  json& echo = r.echo;
  echo["instructions"] = body.value("instructions", json(nullptr));
  echo["max_output_tokens"] = body.value("max_output_tokens", json(nullptr));
  echo["parallel_tool_calls"] = r.chat.parallel_tool_calls;
  echo["previous_response_id"] = nullptr;
  echo["prompt_cache_key"] = body.value("prompt_cache_key", json(nullptr));
  echo["reasoning"] = reasoning_echo.is_null() ? json{{"effort", nullptr}, {"summary", nullptr}} : reasoning_echo;
  echo["store"] = body.value("store", json(false));
  auto rounded = [](float x) { return std::round(double(x) * 1e6) / 1e6; };  // 0.6, not 0.6000000238
  echo["temperature"] = body.value("temperature", json(rounded(r.chat.generate.sampling.temperature)));
  echo["text"] = body.contains("text") && body["text"].is_object() ? body["text"] : json{{"format", {{"type", "text"}}}};
  echo["tool_choice"] = body.value("tool_choice", json("auto"));
  echo["tools"] = body.value("tools", json::array());
  echo["top_p"] = body.value("top_p", json(rounded(r.chat.generate.sampling.top_p)));
  echo["truncation"] = "disabled";
  echo["metadata"] = body.contains("metadata") && body["metadata"].is_object() ? body["metadata"] : json::object();
  echo["user"] = body.value("user", json(nullptr));
  return r;
}

}  // namespace ellm
