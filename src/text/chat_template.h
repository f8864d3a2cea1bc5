#pragma once
// The model's chat template: loads it from a Hugging Face model folder and renders OpenAI
// chat messages into the prompt text exactly as transformers' apply_chat_template does
// (with vLLM's message normalisation).
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

namespace ellm {

namespace jinja {
class Template;
}

class ChatTemplate {
 public:
  // Source: <dir>/chat_template.jinja if present, else tokenizer_config.json's "chat_template"
  // (a string, or a list of {name, template}: "default", and "tool_use" when tools are given);
  // override_file wins if non-empty. Also reads the special tokens (bos_token, eos_token,
  // pad_token, unk_token) from tokenizer_config.json for the template context.
  static ChatTemplate load(const std::string& model_dir, const std::string& override_file = "");
  // A template from text, for tests and tools. `special_tokens` holds e.g. {"eos_token": ...}.
  static ChatTemplate from_source(const std::string& source, const std::string& name = "chat_template",
                                  const nlohmann::ordered_json& special_tokens = nlohmann::ordered_json::object());

  // messages/tools: OpenAI JSON (tools may be null or empty); extra: chat_template_kwargs such
  // as enable_thinking. Messages go through normalize_chat_messages first. Pass ordered_json
  // when you can: dict key order reaches the prompt through tojson and `|items`, and
  // nlohmann::json has already sorted the keys.
  std::string render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                     bool add_generation_prompt,
                     const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;
  std::string render(const nlohmann::json& messages, const nlohmann::json& tools, bool add_generation_prompt,
                     const nlohmann::json& extra = nlohmann::json::object()) const;

  const std::string& source() const;

 private:
  std::shared_ptr<const jinja::Template> default_;
  std::shared_ptr<const jinja::Template> tool_use_;  // optional
  std::string source_;
  // The template iterates over a message's content itself (vLLM's "openai" content format), so
  // a list of parts reaches it as a list instead of joined text.
  bool reads_content_parts_ = false;
  nlohmann::ordered_json special_tokens_ = nlohmann::ordered_json::object();
};

// vLLM's normalisation before rendering: assistant `content: null` becomes "", content given
// as a list of text parts becomes their texts joined by "\n" (unless flatten_text_parts is
// false: for a template that reads the parts itself, as Qwen3.5's does), and tool-call
// function.arguments given as a JSON string are parsed (kept as the string if not valid JSON).
// Throws Error if `messages` is not an array of objects.
nlohmann::ordered_json normalize_chat_messages(const nlohmann::ordered_json& messages, bool flatten_text_parts = true);
nlohmann::json normalize_chat_messages(const nlohmann::json& messages, bool flatten_text_parts = true);

// Throws Error("<where>: invalid UTF-8 at byte N") unless `text` is well-formed UTF-8.
void check_utf8(const std::string& text, const std::string& where);

}  // namespace ellm
