#pragma once
// Anthropic Messages API request bodies (POST /v1/messages, /v1/messages/count_tokens) -> the
// internal chat request (api_request.h) that chat completions also parses: the Messages body is
// translated into an OpenAI chat body, then parse_chat_request checks it. So both APIs render,
// constrain, sample and stream through one path. Pure functions: every check throws ApiError.
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "server/api_request.h"

namespace ellm {

struct MessagesRequest {
  ChatRequest chat;
  // thinking.display "omitted": thinking blocks carry only their signature (which holds the
  // reasoning, so a client that sends the block back gives the model its reasoning again).
  bool show_thinking = true;
};

// count_only: /v1/messages/count_tokens, where max_tokens is not required.
MessagesRequest parse_messages_request(const nlohmann::ordered_json& body, const SamplingParams& defaults,
                                       bool count_only = false);

// A thinking block's signature: the reasoning itself, base64, behind a marker. A client sends
// it back unchanged, so the reasoning can be rendered again even when the block's text was
// omitted. reasoning_from_signature gives nullopt for a signature that is not one of these.
std::string thinking_signature(std::string_view reasoning);
std::optional<std::string> reasoning_from_signature(std::string_view signature);

}  // namespace ellm
