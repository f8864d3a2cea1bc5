#pragma once
// OpenAI Responses API request bodies (POST /v1/responses) -> the ChatRequest that chat
// completions serves. Responses is a rendering of the same request: `instructions` and `input`
// items become chat messages, tools become functions, and everything else maps onto the chat
// fields, so the same template, engine, constraints and tool parser run. Pure: a bad request
// throws ApiError naming the Responses field.
#include <map>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "server/api_request.h"

namespace ellm {

struct ResponsesRequest {
  ChatRequest chat;
  // Tools whose calls go back as custom_tool_call items (their raw text is the function's one
  // argument, kCustomToolArgument), and the namespace of tools that came inside one.
  std::set<std::string> custom_tools;
  std::map<std::string, std::string> tool_namespaces;
  // The request fields the response object repeats (instructions, tools, text, reasoning, ...).
  nlohmann::ordered_json echo = nlohmann::ordered_json::object();
};

// The single argument a custom (freeform) tool is declared with as a function.
inline constexpr const char* kCustomToolArgument = "input";

// `template_source` tells whether the chat template takes a reasoning_effort switch.
ResponsesRequest parse_responses_request(const nlohmann::ordered_json& body, const SamplingParams& defaults,
                                         const std::string& template_source);

}  // namespace ellm
