// ChatML rendering for the Qwen3.8 family (spec/qwen38.md 5.2). The exact 3.8 template text
// is not published; this follows the documented grammar and the 3.8 changes: reasoning comes
// only from ChatMessage::reasoning and is kept on every assistant turn, empty system messages
// are dropped, and a conversation without a user message is rejected.
#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace qf {
namespace {

std::string_view strip_newlines(std::string_view s, bool left, bool right) {
  while (left && !s.empty() && s.front() == '\n') s.remove_prefix(1);
  while (right && !s.empty() && s.back() == '\n') s.remove_suffix(1);
  return s;
}

}  // namespace

std::string chat_render(const std::vector<ChatMessage>& msgs, bool add_generation_prompt,
                        bool enable_thinking) {
  bool has_user = false;
  for (const ChatMessage& m : msgs) has_user |= m.role == "user";
  if (!has_user) fail(ErrorKind::Usage, "chat_render: no user message (the Qwen3.8 template requires one)");

  std::string out;
  for (size_t i = 0; i < msgs.size(); ++i) {
    const ChatMessage& m = msgs[i];
    if (m.role == "system") {
      if (i != 0) fail(ErrorKind::Usage, "chat_render: message %zu is a system message; only the first may be", i);
      if (m.content.empty()) continue;
      out += "<|im_start|>system\n" + m.content + "<|im_end|>\n";
    } else if (m.role == "user") {
      out += "<|im_start|>user\n" + m.content + "<|im_end|>\n";
    } else if (m.role == "assistant") {
      // Same newline trimming as the Qwen templates, so a re-rendered history tokenizes the
      // way the model produced it: "<think>\n" ... "\n</think>\n\n" then the answer.
      out += "<|im_start|>assistant\n<think>\n";
      out += strip_newlines(m.reasoning, true, true);
      out += "\n</think>\n\n";
      out += strip_newlines(m.content, true, false);
      out += "<|im_end|>\n";
    } else if (m.role == "tool") {
      // Consecutive tool results share one user turn.
      bool first = i == 0 || msgs[i - 1].role != "tool";
      bool last = i + 1 == msgs.size() || msgs[i + 1].role != "tool";
      if (first) out += "<|im_start|>user";
      out += "\n<tool_response>\n" + m.content + "\n</tool_response>";
      if (last) out += "<|im_end|>\n";
    } else {
      fail(ErrorKind::Usage, "chat_render: message %zu has unknown role \"%s\" (system, user, assistant, tool)",
           i, m.role.c_str());
    }
  }
  if (add_generation_prompt) {
    out += "<|im_start|>assistant\n<think>\n";
    if (!enable_thinking) out += "\n</think>\n\n";
  }
  return out;
}

}  // namespace qf
