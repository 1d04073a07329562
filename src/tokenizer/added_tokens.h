// Added tokens (special and not): found in the text before BPE, leftmost-longest, and emitted
// as single ids. Tokens with normalized=false are matched in the raw text; normalized=true
// ones in the normalized text, as HF tokenizers does.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace qf {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false;
  bool lstrip = false;       // also swallow whitespace to the left of the match
  bool rstrip = false;       // ... and to the right
  bool normalized = false;   // match against normalized text instead of raw text
  bool single_word = false;  // only match when not glued to word characters
};

// One piece of text after added-token matching: either an added token or plain text.
struct TextSegment {
  size_t begin, end;  // byte range in the text that was split
  int32_t token_id;   // -1 for plain text
};

class AddedTokenMatcher {
 public:
  // `patterns` are the strings to look for (the content, normalized for the normalized pass),
  // parallel to `tokens`.
  void build(std::vector<AddedToken> tokens, std::vector<std::string> patterns);
  bool empty() const { return tokens_.empty(); }

  // Cuts text into alternating plain and token segments (empty plain segments dropped).
  void split(std::string_view text, std::vector<TextSegment>& out) const;

 private:
  std::vector<AddedToken> tokens_;
  std::vector<std::string> patterns_;
  // Candidates by first byte, longest first, so the first hit at a position is the longest.
  std::vector<uint32_t> by_first_byte_[256];
};

}  // namespace qf
