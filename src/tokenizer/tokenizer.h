// Byte-level BPE tokenizer read from a Hugging Face tokenizer.json (docs/spec/qwen38.md section 5),
// a UTF-8-safe streaming detokenizer, and the ChatML chat template.
//
// encode(): added tokens are cut out of the raw text first (leftmost-longest); each remaining
// segment is NFC-normalized, split by the pre-tokenizer regex (PCRE2, UTF + UCP) and merged by
// rank within each piece. No BOS or other post-processing token is ever added.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace qf {

class Tokenizer {
 public:
  // path: a tokenizer.json file, or a folder holding tokenizer.json. A tokenizer_config.json
  // beside it, when present, contributes its eos_token. Throws qf::Error (kind Tokenizer or
  // Io) naming the file and the field at fault.
  static Tokenizer load(const std::string& path);
  // Same, from tokenizer.json text already in memory (`name` is used in error messages) and
  // optional tokenizer_config.json text.
  static Tokenizer from_json(const std::string& json_text, const std::string& name,
                             const std::string& config_text = {});

  // parse_special=false treats every added token (special or not) as plain text, so user text
  // can never inject control tokens. Invalid UTF-8 in `text` is replaced by U+FFFD first.
  std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const;

  // Concatenated raw bytes of the tokens (may end in a partial UTF-8 sequence). skip_special
  // drops tokens flagged special (not the non-special added ones such as <think>). Throws on
  // ids outside [0, vocab_size()).
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const;

  // Decoded bytes of one token; empty for an unused id below vocab_size(). Throws when out of range.
  const std::string& token_bytes(int32_t id) const;
  int32_t vocab_size() const;  // max id + 1 over vocab and added tokens
  std::optional<int32_t> token_to_id(std::string_view token) const;  // exact token string
  // The token's string as written in tokenizer.json (byte-level spelling for vocab entries).
  const std::string& id_to_token(int32_t id) const;
  bool is_special(int32_t id) const;
  bool is_added(int32_t id) const;
  // <|im_end|> and <|endoftext|> when present, then tokenizer_config's eos_token; no repeats.
  std::vector<int32_t> eos_ids() const;
  const std::string& source() const;  // the file it was loaded from

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  // Shared and immutable (the word cache inside is internally synchronized), so copies are
  // cheap and one Tokenizer can serve many threads.
  std::shared_ptr<const Impl> impl_;
};

// Streaming detokenizer: push ids one by one and get back only complete UTF-8 text. Bytes of a
// character split across tokens are held until it completes; bytes that can never form a valid
// character are emitted as U+FFFD. Concatenating every push() and flush() equals the full
// decode() of the same ids whenever that decode is valid UTF-8.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok, bool skip_special = false);
  std::string push(int32_t id);  // newly completed text, possibly empty
  std::string flush();           // what is left, incomplete tail rendered as U+FFFD; resets

 private:
  const Tokenizer* tok_;
  bool skip_special_;
  std::string pending_;  // at most a few bytes of an unfinished character
};

// An assistant turn's tool call, as the client sends it back: `arguments` is JSON text and is
// rendered exactly as given.
struct ChatToolCall {
  std::string name;
  std::string arguments;
};

struct ChatMessage {
  std::string role;       // "system", "user", "assistant" or "tool"
  std::string content;
  std::string reasoning;  // assistant only: the thinking text, rendered inside <think>
  std::vector<ChatToolCall> tool_calls = {};  // assistant only
};

struct ChatRenderOptions {
  bool add_generation_prompt = true;
  bool enable_thinking = true;
  std::vector<std::string> tools;  // each tool's JSON text, rendered as given inside <tools>
  std::string answer_prefix;       // template text after the generation prompt (a forced tool call's start)
};

// A rendered conversation in pieces: `trusted` pieces are the template's own text, whose
// markers (<|im_start|>, <|im_end|>, <think>, </think>, <tool_call>, ...) become their tokens;
// every other piece is message text, never parsed for special tokens.
struct ChatPiece {
  std::string text;
  bool trusted;
};

// ChatML as in docs/spec/qwen38.md 5.2: "<|im_start|>{role}\n{content}<|im_end|>\n" per message;
// assistant turns as "<|im_start|>assistant\n<think>\n{reasoning}\n</think>\n\n{content}"
// (Qwen3.8 keeps reasoning on every past turn) followed by their tool calls; consecutive tool
// results folded into one user turn of <tool_response> blocks. Tools (when given) open a system
// turn (the system message's text, then the tool list and calling instructions) as the Qwen3
// template writes it. Generation prompt "<|im_start|>assistant\n<think>\n" (thinking on) or
// "<|im_start|>assistant\n<think>\n\n</think>\n\n" (off). Throws qf::Error (kind Usage) for
// a system message that is not first, an unknown role, or no user message.
std::vector<ChatPiece> chat_render_pieces(const std::vector<ChatMessage>& msgs, const ChatRenderOptions& opt);
std::string chat_render(const std::vector<ChatMessage>& msgs, const ChatRenderOptions& opt);
std::string chat_render(const std::vector<ChatMessage>& msgs, bool add_generation_prompt,
                        bool enable_thinking = true);
// Token ids of rendered pieces: the template's markers become their added tokens (when the
// tokenizer has them) and all other text, message text included, is encoded as plain text in
// runs that span piece boundaries (so the ids equal encode() of the joined text whenever the
// message text holds no marker).
std::vector<int32_t> chat_encode(const Tokenizer& tok, const std::vector<ChatPiece>& pieces);

}  // namespace qf
