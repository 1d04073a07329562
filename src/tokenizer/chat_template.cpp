// ChatML rendering for the Qwen3.8 family (docs/spec/qwen38.md 5.2). The exact 3.8 template text
// is not published; this follows the documented grammar and the 3.8 changes: reasoning comes
// only from ChatMessage::reasoning and is kept on every assistant turn, empty system messages
// are dropped, and a conversation without a user message is rejected. Tools and tool calls are
// written as the Qwen3 template writes them (JSON inside <tools> and <tool_call>).
//
// The output is kept in pieces so that message text is never parsed for special tokens: a user
// who writes "<|im_end|>\n<|im_start|>system" gets those characters as text, not a forged turn.
#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace qf {
namespace {

// The template's own markers, the only text that may become control tokens.
constexpr std::string_view kMarkers[] = {"<|im_start|>", "<|im_end|>",      "<think>",          "</think>",
                                         "<tool_call>",  "</tool_call>",    "<tool_response>", "</tool_response>",
                                         "<tools>",      "</tools>"};

std::string_view strip_newlines(std::string_view s, bool left, bool right) {
  while (left && !s.empty() && s.front() == '\n') s.remove_prefix(1);
  while (right && !s.empty() && s.back() == '\n') s.remove_suffix(1);
  return s;
}

class Pieces {
 public:
  void lit(std::string_view s) { add(s, true); }
  void text(std::string_view s) { add(s, false); }
  std::vector<ChatPiece> take() { return std::move(out_); }

 private:
  void add(std::string_view s, bool trusted) {
    if (s.empty()) return;
    if (!out_.empty() && out_.back().trusted == trusted)
      out_.back().text += s;
    else
      out_.push_back({std::string(s), trusted});
  }
  std::vector<ChatPiece> out_;
};

const char* kToolsIntro =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
const char* kToolsOutro =
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call><|im_end|>\n";

}  // namespace

std::vector<ChatPiece> chat_render_pieces(const std::vector<ChatMessage>& msgs, const ChatRenderOptions& opt) {
  bool has_user = false;
  for (const ChatMessage& m : msgs) has_user |= m.role == "user";
  if (!has_user) fail(ErrorKind::Usage, "chat_render: no user message (the Qwen3.8 template requires one)");

  Pieces out;
  if (!opt.tools.empty()) {
    out.lit("<|im_start|>system\n");
    if (msgs[0].role == "system") {
      out.text(msgs[0].content);
      out.lit("\n\n");
    }
    out.lit(kToolsIntro);
    for (const std::string& t : opt.tools) {
      out.lit("\n");
      out.text(t);
    }
    out.lit(kToolsOutro);
  }
  for (size_t i = 0; i < msgs.size(); ++i) {
    const ChatMessage& m = msgs[i];
    if (m.role == "system") {
      if (i != 0) fail(ErrorKind::Usage, "chat_render: message %zu is a system message; only the first may be", i);
      if (m.content.empty() || !opt.tools.empty()) continue;  // with tools it opened the tools turn
      out.lit("<|im_start|>system\n");
      out.text(m.content);
      out.lit("<|im_end|>\n");
    } else if (m.role == "user") {
      out.lit("<|im_start|>user\n");
      out.text(m.content);
      out.lit("<|im_end|>\n");
    } else if (m.role == "assistant") {
      // Same newline trimming as the Qwen templates, so a re-rendered history tokenizes the
      // way the model produced it: "<think>\n" ... "\n</think>\n\n" then the answer.
      out.lit("<|im_start|>assistant\n<think>\n");
      out.text(strip_newlines(m.reasoning, true, true));
      out.lit("\n</think>\n\n");
      out.text(strip_newlines(m.content, true, false));
      for (size_t j = 0; j < m.tool_calls.size(); ++j) {
        if (j > 0 || !m.content.empty()) out.lit("\n");
        out.lit("<tool_call>\n{\"name\": \"");
        out.text(m.tool_calls[j].name);
        out.lit("\", \"arguments\": ");
        out.text(m.tool_calls[j].arguments);
        out.lit("}\n</tool_call>");
      }
      out.lit("<|im_end|>\n");
    } else if (m.role == "tool") {
      // Consecutive tool results share one user turn.
      bool first = i == 0 || msgs[i - 1].role != "tool";
      bool last = i + 1 == msgs.size() || msgs[i + 1].role != "tool";
      if (first) out.lit("<|im_start|>user");
      out.lit("\n<tool_response>\n");
      out.text(m.content);
      out.lit("\n</tool_response>");
      if (last) out.lit("<|im_end|>\n");
    } else {
      fail(ErrorKind::Usage, "chat_render: message %zu has unknown role \"%s\" (system, user, assistant, tool)",
           i, m.role.c_str());
    }
  }
  if (opt.add_generation_prompt) {
    out.lit("<|im_start|>assistant\n<think>\n");
    if (!opt.enable_thinking) out.lit("\n</think>\n\n");
    out.lit(opt.answer_prefix);
  }
  return out.take();
}

std::string chat_render(const std::vector<ChatMessage>& msgs, const ChatRenderOptions& opt) {
  std::string s;
  for (const ChatPiece& p : chat_render_pieces(msgs, opt)) s += p.text;
  return s;
}

std::string chat_render(const std::vector<ChatMessage>& msgs, bool add_generation_prompt, bool enable_thinking) {
  ChatRenderOptions o;
  o.add_generation_prompt = add_generation_prompt;
  o.enable_thinking = enable_thinking;
  return chat_render(msgs, o);
}

std::vector<int32_t> chat_encode(const Tokenizer& tok, const std::vector<ChatPiece>& pieces) {
  std::vector<int32_t> ids;
  std::string run;  // plain text not yet encoded
  auto flush = [&] {
    const std::vector<int32_t> r = tok.encode(run, /*parse_special=*/false);
    ids.insert(ids.end(), r.begin(), r.end());
    run.clear();
  };
  for (const ChatPiece& p : pieces) {
    if (!p.trusted) {
      run += p.text;
      continue;
    }
    std::string_view s = p.text;
    while (!s.empty()) {
      // Leftmost marker that this tokenizer has as an added token.
      size_t best = std::string_view::npos, len = 0;
      int32_t id = -1;
      for (std::string_view m : kMarkers) {
        const size_t at = s.find(m);
        if (at == std::string_view::npos || at > best || (at == best && m.size() <= len)) continue;
        const std::optional<int32_t> t = tok.token_to_id(m);
        if (!t || !tok.is_added(*t)) continue;
        best = at, len = m.size(), id = *t;
      }
      if (best == std::string_view::npos) {
        run += s;
        break;
      }
      run += s.substr(0, best);
      flush();
      ids.push_back(id);
      s.remove_prefix(best + len);
    }
  }
  flush();
  return ids;
}

}  // namespace qf
