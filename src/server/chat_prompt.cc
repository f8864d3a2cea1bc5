// The shared start of every chat request (chat completions, the Messages and Responses APIs):
// the prompt rendered and tokenized, where a hybrid model snapshots its state in it, the output
// constraint of tool_choice and response_format, and the parser of the reply.
#include <algorithm>

#include "grammar/token_mask.h"
#include "server/api_response.h"
#include "server/server_impl.h"
#include "text/chat_template.h"

namespace ellm {
namespace {

using json = nlohmann::json;

constexpr int kMaxParallelCalls = 8;  // tool_choice "required" with parallel_tool_calls

// response_format and tool_choice -> what the output must follow; null when it is free.
// A forced tool call wins over response_format. Thinking stays free: the grammar starts after
// </think> when the template lets the model think.
std::shared_ptr<const OutputConstraint> chat_constraint(const ChatRequest& r, ToolCallFormat format,
                                                        bool parse_reasoning, const std::string& prompt) {
  auto constraint = std::make_shared<OutputConstraint>();
  if (r.tool_choice != "auto" && r.tool_choice != "none") {
    if (r.tools.empty()) throw_bad_request("'tool_choice' " + r.tool_choice + " needs 'tools'", "tool_choice");
    if (format == ToolCallFormat::none)
      throw_bad_request("the chat template has no tool-call format, so a tool call cannot be forced", "tool_choice");
    const bool named = r.tool_choice == "function";
    const auto style = format == ToolCallFormat::qwen3_coder_xml ? ToolCallStyle::qwen3_coder : ToolCallStyle::hermes;
    try {
      constraint->grammar = compile_tool_calls(nlohmann::json(r.tools), style, r.forced_function,
                                               named || !r.parallel_tool_calls ? 1 : kMaxParallelCalls);
    } catch (const SchemaError& e) {
      throw_bad_request("tools: " + schema_error_text(e, "the function's 'strict': false"),
                        e.keyword == "tool_choice" ? "tool_choice" : "tools");
    }
  } else {
    constraint->grammar = r.json_grammar;
  }
  if (r.tool_choice == "none" && format != ToolCallFormat::none) constraint->banned_tokens.push_back("<tool_call>");
  if (!constraint->grammar && constraint->banned_tokens.empty()) return nullptr;
  constraint->in_thinking = parse_reasoning && prompt_opens_reasoning(prompt);
  constraint->may_think = parse_reasoning && !constraint->in_thinking && !prompt.ends_with("</think>\n\n");
  return constraint;
}

}  // namespace

int64_t Server::Impl::prefix_end(const std::vector<int32_t>& ids, const std::string& prompt,
                                 const std::string& prefix) const {
  if (prefix.empty() || prompt.size() <= prefix.size() || prompt.compare(0, prefix.size(), prefix) != 0) return 0;
  const std::vector<int32_t> head = engine.encode(prefix);
  const size_t same = size_t(std::mismatch(head.begin(), head.end(), ids.begin(), ids.end()).first - head.begin());
  // The prefix's last token may merge with what follows it in one prompt and not in another:
  // every prompt that starts with the prefix agrees on the tokens before it.
  return int64_t(std::min(same, head.empty() ? 0 : head.size() - 1));
}

namespace {

// What every conversation with these leading system messages (Anthropic's system field
// arrives as one) and tools starts with, whatever its first user turn: the common start of two
// renders with different first user turns (templates refuse system messages alone). Empty when
// there are none or the template refuses.
std::string system_prefix(const ChatTemplate& chat_template, const nlohmann::ordered_json& messages,
                          const nlohmann::ordered_json& tools, const nlohmann::ordered_json& kwargs) {
  nlohmann::ordered_json leading = nlohmann::ordered_json::array();
  for (const auto& m : messages) {
    if (!m.is_object() || m.value("role", "") != "system") break;
    leading.push_back(m);
  }
  if (leading.empty() || leading.size() == messages.size()) return "";
  std::string renders[2];
  try {
    for (int i = 0; i < 2; ++i) {
      nlohmann::ordered_json with_user = leading;
      with_user.push_back({{"role", "user"}, {"content", i ? "b" : "a"}});
      renders[i] = chat_template.render(with_user, tools, /*add_generation_prompt=*/false, kwargs);
    }
  } catch (const std::exception&) {
    return "";
  }
  const size_t same = size_t(std::mismatch(renders[0].begin(), renders[0].end(), renders[1].begin(), renders[1].end()).first -
                             renders[0].begin());
  return renders[0].substr(0, same);
}

}  // namespace

// As vLLM: the template always sees the tools. tool_choice "none" turns off parsing and bans
// the tool-call token; "required" and a named function are enforced by the grammar.
std::string Server::Impl::prepare_chat(ChatRequest& request) const {
  std::vector<PreparedImage> images = chat_images(request.messages);
  nlohmann::ordered_json tools = request.tools.empty() ? nlohmann::ordered_json(nullptr) : request.tools;
  std::string prompt = chat_template.render(request.messages, tools,
                                            /*add_generation_prompt=*/true, request.template_kwargs);
  request.generate.prompt = engine.encode(prompt);
  // Where a hybrid model snapshots its state beside the prompt's end: where the conversation so
  // far ends, before the generation prompt, which the next turn's history replaces with the reply
  // as rendered (templates drop earlier turns' reasoning); and where the system messages end.
  if (engine.resumes_at_snapshots()) {
    const std::vector<int32_t>& ids = request.generate.prompt;
    const std::string history = chat_template.render(request.messages, tools, false, request.template_kwargs);
    if (!history.empty() && prompt.size() > history.size() && prompt.compare(0, history.size(), history) == 0) {
      const std::vector<int32_t> tail = engine.encode(prompt.substr(history.size()));
      if (!tail.empty() && tail.size() < ids.size() && std::equal(tail.rbegin(), tail.rend(), ids.rbegin()))
        request.generate.history_end = int64_t(ids.size() - tail.size());
    }
    request.generate.system_end =
        prefix_end(ids, prompt, system_prefix(chat_template, request.messages, tools, request.template_kwargs));
  }
  place_images(std::move(images), request.generate);
  request.generate.constraint = chat_constraint(request, options.tool_call_format, options.parse_reasoning, prompt);
  return prompt;
}

std::unique_ptr<OutputParser> Server::Impl::chat_parser(const ChatRequest& request, const std::string& prompt) const {
  const bool parse_tools = !request.tools.empty() && request.tool_choice != "none";
  auto parser = std::make_unique<OutputParser>(parse_tools ? options.tool_call_format : ToolCallFormat::none,
                                               options.parse_reasoning, prompt_opens_reasoning(prompt),
                                               json(request.tools.empty() ? nlohmann::ordered_json(nullptr) : request.tools));
  // Forced calls stream in the whole reply too: the grammar keeps them valid, and one cut by
  // max_tokens stays a call. Free output streams only for a stream, where a call that then
  // goes wrong keeps what went out; a whole reply keeps such text as content.
  const bool forced_calls = request.tool_choice != "auto" && request.tool_choice != "none";
  if (forced_calls || request.stream) parser->stream_tool_calls();
  return parser;
}

}  // namespace ellm
