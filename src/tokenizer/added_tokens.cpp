#include "tokenizer/added_tokens.h"

#include <utf8proc.h>

#include <algorithm>


namespace qf {
namespace {

// Decodes the code point at s[i] (valid UTF-8 assumed) and its length.
uint32_t cp_at(std::string_view s, size_t i, size_t* len) {
  utf8proc_int32_t cp = 0;
  utf8proc_ssize_t n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i),
                                        static_cast<utf8proc_ssize_t>(s.size() - i), &cp);
  if (n <= 0) {
    *len = 1;
    return 0xFFFD;
  }
  *len = static_cast<size_t>(n);
  return static_cast<uint32_t>(cp);
}

// Start of the code point that ends at s[end) (valid UTF-8 assumed).
size_t prev_cp_start(std::string_view s, size_t end) {
  size_t i = end - 1;
  while (i > 0 && (static_cast<uint8_t>(s[i]) & 0xC0) == 0x80) --i;
  return i;
}

// Unicode White_Space, the set Rust's char::is_whitespace (and so HF's lstrip/rstrip) uses.
bool is_white_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

// Letters, digits, marks and '_' glue a single_word token to its neighbours.
bool is_word_char(uint32_t c) {
  if (c == '_') return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_NO:
      return true;
    default:
      return false;
  }
}

}  // namespace

void AddedTokenMatcher::build(std::vector<AddedToken> tokens, std::vector<std::string> patterns) {
  tokens_ = std::move(tokens);
  patterns_ = std::move(patterns);
  for (auto& v : by_first_byte_) v.clear();
  for (uint32_t k = 0; k < patterns_.size(); ++k)
    if (!patterns_[k].empty()) by_first_byte_[static_cast<uint8_t>(patterns_[k][0])].push_back(k);
  for (auto& v : by_first_byte_)
    std::stable_sort(v.begin(), v.end(),
                     [&](uint32_t a, uint32_t b) { return patterns_[a].size() > patterns_[b].size(); });
}

void AddedTokenMatcher::split(std::string_view text, std::vector<TextSegment>& out) const {
  // Pass 1: leftmost-longest, non-overlapping matches, before any flag is considered, so a
  // rejected single_word match still hides the shorter matches it overlaps (as the reference's
  // Aho-Corasick pass does).
  struct Match {
    size_t begin, end;
    uint32_t k;
  };
  std::vector<Match> matches;
  for (size_t i = 0; i < text.size();) {
    const auto& cands = by_first_byte_[static_cast<uint8_t>(text[i])];
    bool hit = false;
    for (uint32_t k : cands) {
      const std::string& p = patterns_[k];
      if (text.compare(i, p.size(), p) == 0) {
        matches.push_back({i, i + p.size(), k});
        i += p.size();
        hit = true;
        break;
      }
    }
    if (!hit) ++i;
  }

  // Pass 2: apply single_word / lstrip / rstrip and emit segments.
  size_t start_offset = 0;
  for (const Match& m : matches) {
    const AddedToken& t = tokens_[m.k];
    size_t begin = m.begin, end = m.end, len = 0;
    if (begin < start_offset) continue;  // swallowed by the previous token's rstrip
    if (t.single_word) {
      bool glued_left = begin > 0 && is_word_char(cp_at(text, prev_cp_start(text, begin), &len));
      bool glued_right = end < text.size() && is_word_char(cp_at(text, end, &len));
      if (glued_left || glued_right) continue;
    }
    if (t.lstrip) {
      while (begin > start_offset) {
        size_t p = prev_cp_start(text, begin);
        if (!is_white_space(cp_at(text, p, &len))) break;
        begin = p;
      }
    }
    if (t.rstrip) {
      while (end < text.size()) {
        uint32_t c = cp_at(text, end, &len);
        if (!is_white_space(c)) break;
        end += len;
      }
    }
    if (begin > start_offset) out.push_back({start_offset, begin, -1});
    out.push_back({begin, end, t.id});
    start_offset = end;
  }
  if (start_offset < text.size()) out.push_back({start_offset, text.size(), -1});
}

}  // namespace qf
