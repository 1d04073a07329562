// An OpenAI-style completion request body -> the prompt and the shared generation options
// (runtime/options.h). No HTTP here, so the parsing is tested on its own; bad fields get the
// validators' message ("<parameter>: expected <range>, found <value>"), which the server returns
// with HTTP 400 and the parameter's name in "param".
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/options.h"
#include "tokenizer/tokenizer.h"

namespace qf {

inline constexpr size_t kMaxStopStrings = 4;       // as OpenAI
inline constexpr size_t kMaxStopBytes = 256;       // per stop string
inline constexpr int kMaxJsonDepth = 64;           // nesting of a request body

struct CompletionRequest {
  std::string prompt;            // completions: the text to encode (special tokens parsed)
  std::vector<ChatPiece> chat;   // chat: the rendered conversation (message text never parsed)
  GenerationOptions gen;         // validated against the static ranges; the engine checks the rest
  bool stream = false;
  bool max_tokens_given = false;  // false: gen.max_tokens is the default, which the server fits to the context
  std::string model;              // as sent; empty when absent
  std::vector<std::string> stop;  // stop strings: the answer ends before the first one
  // Chat only: how to read the answer.
  bool thinking = false;           // it starts inside <think> (thinking on): reasoning, then content
  bool tools = false;              // <tool_call> blocks become tool_calls (tools given, tool_choice not "none")
  std::string tool_call_prefix;    // a forced call's opening, already in the prompt (tool_choice required / named)
};

// Fields: "prompt" (completions) or "messages" + "tools", "tool_choice",
// "chat_template_kwargs.enable_thinking" (chat); "model", "max_tokens" (alias
// "max_completion_tokens"), "temperature", "top_p", "top_k", "seed", "stop", "n" (1 only),
// "stream", and the vLLM-style extensions "draft_k", "ignore_eos", "stop_token_ids". A field
// that is absent or null takes its default (max_tokens: `default_max_tokens`, seed:
// `default_seed`). Throws qf::Error(Usage) naming the field.
CompletionRequest parse_completion_request(const nlohmann::ordered_json& body, bool chat, int64_t default_max_tokens,
                                           uint64_t default_seed);
CompletionRequest parse_completion_request(const nlohmann::json& body, bool chat, int64_t default_max_tokens,
                                           uint64_t default_seed);

// Deepest nesting of arrays and objects in JSON text (strings skipped), counted without parsing,
// so a hostile body is refused before a recursive step can touch it.
int json_depth(std::string_view text);

// JSON written as Python's json.dumps (", " and ": " separators, keys in the order given,
// non-ASCII kept): the form in which the Qwen3 template's `tojson` shows tools to the model.
std::string json_dump_python(const nlohmann::ordered_json& v);

// The name of the parameter a validator message is about ("max_tokens: expected ..." ->
// "max_tokens"), or "" when the message does not start with one.
std::string param_of_message(const std::string& message);

}  // namespace qf
