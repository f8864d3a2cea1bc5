#include "text/chat_template.h"

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include <utf8proc.h>

#include "base/error.h"
#include "text/jinja/jinja.h"

namespace ellm {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot read file");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// tokenizer_config.json writes special tokens as a string or as an AddedToken object.
const ojson* token_text(const ojson& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end()) return nullptr;
  if (it->is_string()) return &*it;
  if (it->is_object()) {
    auto content = it->find("content");
    if (content != it->end() && content->is_string()) return &*content;
  }
  return nullptr;
}

std::shared_ptr<const jinja::Template> compile(const std::string& source, const std::string& name) {
  check_utf8(source, name);
  return std::make_shared<const jinja::Template>(jinja::Template::parse(source, name));
}

// "a\nb" from [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], as vLLM does for
// templates that expect string content. Anything else is left as it is.
void flatten_text_parts(ojson& message) {
  auto content = message.find("content");
  if (content == message.end() || !content->is_array()) return;
  std::string text;
  for (size_t i = 0; i < content->size(); ++i) {
    const ojson& part = (*content)[i];
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
      return;
    if (i) text += "\n";
    text += part["text"].get<std::string>();
  }
  *content = text;
}

// Whether a template handles list content itself, as vLLM detects it: a test of content being
// iterable, or a loop over it (Qwen3.5's render_content macro; Qwen3's templates have neither).
bool reads_content_parts(const std::string& source) {
  static const std::regex loop(R"((content\s+is\s+iterable)|(for\s+\w+\s+in\s+[\w.\['"\]]*content\b))");
  return std::regex_search(source, loop);
}

}  // namespace

void check_utf8(const std::string& text, const std::string& where) {
  size_t pos = 0;
  while (pos < text.size()) {
    utf8proc_int32_t cp;
    utf8proc_ssize_t n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(text.data() + pos),
                                          utf8proc_ssize_t(text.size() - pos), &cp);
    if (n <= 0) throw Error(where + ": invalid UTF-8 at byte " + std::to_string(pos));
    pos += size_t(n);
  }
}

ojson normalize_chat_messages(const ojson& messages, bool flatten_parts) {
  if (!messages.is_array()) throw Error("messages: expected a JSON array");
  ojson out = messages;
  for (size_t i = 0; i < out.size(); ++i) {
    ojson& m = out[i];
    if (!m.is_object()) throw Error("messages[" + std::to_string(i) + "]: expected a JSON object");
    if (flatten_parts) flatten_text_parts(m);
    bool assistant = m.value("role", "") == "assistant";
    auto content = m.find("content");
    if (assistant && content != m.end() && content->is_null()) *content = "";
    auto calls = m.find("tool_calls");
    if (calls == m.end() || !calls->is_array()) continue;
    for (ojson& call : *calls) {
      if (!call.is_object()) continue;
      auto function = call.find("function");
      if (function == call.end() || !function->is_object()) continue;
      auto arguments = function->find("arguments");
      if (arguments == function->end() || !arguments->is_string()) continue;
      ojson parsed = ojson::parse(arguments->get<std::string>(), nullptr, false);
      if (!parsed.is_discarded()) *arguments = std::move(parsed);
    }
  }
  return out;
}

nlohmann::json normalize_chat_messages(const nlohmann::json& messages, bool flatten_parts) {
  return nlohmann::json(normalize_chat_messages(ojson(messages), flatten_parts));
}

ChatTemplate ChatTemplate::from_source(const std::string& source, const std::string& name,
                                       const nlohmann::ordered_json& special_tokens) {
  ChatTemplate t;
  t.source_ = source;
  t.default_ = compile(source, name);
  t.reads_content_parts_ = reads_content_parts(source);
  t.special_tokens_ = special_tokens;
  return t;
}

ChatTemplate ChatTemplate::load(const std::string& model_dir, const std::string& override_file) {
  const std::string config_path = (fs::path(model_dir) / "tokenizer_config.json").string();
  ojson config = ojson::object();
  if (fs::exists(config_path)) {
    std::string text = read_file(config_path);
    config = ojson::parse(text, nullptr, false);
    if (config.is_discarded() || !config.is_object()) throw Error(config_path + ": not a valid JSON object");
  }
  ojson special = ojson::object();
  for (const char* key : {"bos_token", "eos_token", "pad_token", "unk_token"})
    if (const ojson* text = token_text(config, key)) special[key] = *text;

  if (!override_file.empty()) return from_source(read_file(override_file), override_file, special);
  const std::string jinja_path = (fs::path(model_dir) / "chat_template.jinja").string();
  if (fs::exists(jinja_path)) return from_source(read_file(jinja_path), jinja_path, special);

  auto it = config.find("chat_template");
  if (it == config.end() || it->is_null())
    throw Error(model_dir + ": no chat template (neither chat_template.jinja nor tokenizer_config.json "
                "\"chat_template\"); pass --chat-template FILE");
  const std::string where = config_path + " chat_template";
  if (it->is_string()) return from_source(it->get<std::string>(), where, special);
  if (!it->is_array()) throw Error(where + ": expected a string or a list of {name, template}");
  ChatTemplate t;
  t.special_tokens_ = special;
  for (const ojson& entry : *it) {
    if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() || !entry.contains("template") ||
        !entry["template"].is_string())
      throw Error(where + ": each entry needs a string \"name\" and \"template\"");
    const std::string name = entry["name"].get<std::string>();
    const std::string source = entry["template"].get<std::string>();
    if (name == "default") {
      t.default_ = compile(source, where + " '" + name + "'");
      t.source_ = source;
    } else if (name == "tool_use") {
      t.tool_use_ = compile(source, where + " '" + name + "'");
    } else {
      continue;
    }
    t.reads_content_parts_ = t.reads_content_parts_ || reads_content_parts(source);
  }
  if (!t.default_) throw Error(where + ": no template named \"default\"");
  return t;
}

const std::string& ChatTemplate::source() const { return source_; }

std::string ChatTemplate::render(const ojson& messages, const ojson& tools, bool add_generation_prompt,
                                 const ojson& extra) const {
  if (!extra.is_null() && !extra.is_object()) throw Error("chat_template_kwargs: expected a JSON object");
  ojson context = ojson::object();
  context["messages"] = normalize_chat_messages(messages, !reads_content_parts_);
  context["tools"] = tools;
  context["add_generation_prompt"] = add_generation_prompt;
  for (const auto& [k, v] : special_tokens_.items()) context[k] = v;
  if (extra.is_object())
    for (const auto& [k, v] : extra.items())
      if (k != "messages" && k != "tools" && k != "add_generation_prompt") context[k] = v;
  bool has_tools = tools.is_array() && !tools.empty();
  const jinja::Template& t = has_tools && tool_use_ ? *tool_use_ : *default_;
  return t.render(context);
}

std::string ChatTemplate::render(const nlohmann::json& messages, const nlohmann::json& tools,
                                 bool add_generation_prompt, const nlohmann::json& extra) const {
  return render(ojson(messages), ojson(tools), add_generation_prompt, ojson(extra));
}

}  // namespace ellm
