#include "tokenizer/pretokenizer.h"

#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>

#include "core/error.h"

namespace qf {
namespace {

pcre2_code* as_code(void* p) { return static_cast<pcre2_code*>(p); }

bool is_ascii(std::string_view s) {
  for (char c : s)
    if (static_cast<uint8_t>(c) >= 0x80) return false;
  return true;
}

struct Span {
  size_t begin, end;
  bool delim;
};

// Applies HF's SplitDelimiterBehavior to spans that tile the text in order.
void emit_with_behavior(std::string_view text, const std::vector<Span>& spans, SplitBehavior behavior,
                        std::vector<std::string>& out) {
  std::vector<std::pair<size_t, size_t>> pieces;
  switch (behavior) {
    case SplitBehavior::Removed:
      for (const Span& s : spans)
        if (!s.delim) pieces.emplace_back(s.begin, s.end);
      break;
    case SplitBehavior::Isolated:
      for (const Span& s : spans) pieces.emplace_back(s.begin, s.end);
      break;
    case SplitBehavior::MergedWithPrevious: {
      bool prev_delim = false;
      for (const Span& s : spans) {
        if (s.delim && !prev_delim && !pieces.empty()) pieces.back().second = s.end;
        else pieces.emplace_back(s.begin, s.end);
        prev_delim = s.delim;
      }
      break;
    }
    case SplitBehavior::MergedWithNext: {
      bool prev_delim = false;  // walking backwards: "previous" is the span to the right
      for (size_t k = spans.size(); k-- > 0;) {
        const Span& s = spans[k];
        if (s.delim && !prev_delim && !pieces.empty()) pieces.back().first = s.begin;
        else pieces.emplace_back(s.begin, s.end);
        prev_delim = s.delim;
      }
      std::reverse(pieces.begin(), pieces.end());
      break;
    }
    case SplitBehavior::Contiguous: {
      bool have_prev = false, prev_delim = false;
      for (const Span& s : spans) {
        if (have_prev && s.delim == prev_delim) pieces.back().second = s.end;
        else pieces.emplace_back(s.begin, s.end);
        have_prev = true;
        prev_delim = s.delim;
      }
      break;
    }
  }
  for (auto [b, e] : pieces)
    if (e > b) out.emplace_back(text.substr(b, e - b));
}

// Match ranges -> spans tiling the whole text, each marked as delimiter or not.
std::vector<Span> tile(size_t n, const std::vector<std::pair<size_t, size_t>>& matches, bool invert) {
  std::vector<Span> spans;
  size_t prev = 0;
  for (auto [b, e] : matches) {
    if (b > prev) spans.push_back({prev, b, invert});
    spans.push_back({b, e, !invert});
    prev = e;
  }
  if (prev < n) spans.push_back({prev, n, invert});
  return spans;
}

}  // namespace

Regex::Regex(const std::string& pattern, const std::string& where) : pattern_(pattern) {
  int err = 0;
  PCRE2_SIZE err_off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &err, &err_off, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    fail(ErrorKind::Tokenizer, "%s: bad regex \"%s\": PCRE2 error at offset %zu: %s", where.c_str(),
         pattern.c_str(), static_cast<size_t>(err_off), reinterpret_cast<const char*>(msg));
  }
  code_ = code;
  // JIT is several times faster; when the library was built without it, the interpreter works.
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() { pcre2_code_free(as_code(code_)); }

void Regex::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const {
  pcre2_code* code = as_code(code_);
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
  if (!md) fail(ErrorKind::Internal, "pcre2_match_data_create failed");
  auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  // The text was validated once by the caller; re-checking UTF-8 on every call from a new
  // offset would make the scan quadratic.
  uint32_t opts = PCRE2_NO_UTF_CHECK;
  while (pos <= text.size()) {
    int rc = pcre2_match(code, subject, text.size(), pos, opts, md, nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !(opts & PCRE2_NO_JIT)) {
      opts |= PCRE2_NO_JIT;  // pathological input for the JIT stack: the interpreter uses the heap
      continue;
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      pcre2_match_data_free(md);
      fail(ErrorKind::Tokenizer, "regex \"%s\" failed on input at byte %zu: %s", pattern_.c_str(), pos,
           reinterpret_cast<const char*>(msg));
    }
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    size_t b = ov[0], e = ov[1];
    if (e > b) {
      out.emplace_back(b, e);
      pos = e;
    } else {
      // Empty match: step over one whole character so we never stop inside a sequence.
      if (b >= text.size()) break;
      pos = b + 1;
      while (pos < text.size() && (static_cast<uint8_t>(text[pos]) & 0xC0) == 0x80) ++pos;
    }
  }
  pcre2_match_data_free(md);
}

std::string normalize(std::string_view text, const std::vector<NormForm>& forms) {
  std::string cur(text);
  for (NormForm f : forms) {
    // Every normalization form leaves ASCII unchanged; most prompts are mostly ASCII.
    if (f == NormForm::None || is_ascii(cur)) continue;
    int opts = UTF8PROC_STABLE;
    switch (f) {
      case NormForm::NFC: opts |= UTF8PROC_COMPOSE; break;
      case NormForm::NFD: opts |= UTF8PROC_DECOMPOSE; break;
      case NormForm::NFKC: opts |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
      case NormForm::NFKD: opts |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
      case NormForm::None: break;
    }
    utf8proc_uint8_t* dst = nullptr;
    utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(cur.data()),
                                      static_cast<utf8proc_ssize_t>(cur.size()), &dst,
                                      static_cast<utf8proc_option_t>(opts));
    if (n < 0) fail(ErrorKind::Tokenizer, "normalization failed: %s", utf8proc_errmsg(n));
    cur.assign(reinterpret_cast<const char*>(dst), static_cast<size_t>(n));
    std::free(dst);
  }
  return cur;
}

std::shared_ptr<const Regex> PreTokenizer::gpt2_regex() {
  static const auto re = std::make_shared<const Regex>(
      R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)",
      "ByteLevel pre-tokenizer");
  return re;
}

void PreTokenizer::split(std::string_view text, std::vector<std::string>& pieces) const {
  std::vector<std::string> cur{std::string(text)}, next;
  std::vector<std::pair<size_t, size_t>> matches;
  for (const PreTokStep& step : steps_) {
    next.clear();
    for (std::string& piece : cur) {
      if (step.kind == PreTokStep::Kind::ByteLevel) {
        if (step.add_prefix_space && (piece.empty() || piece[0] != ' ')) piece.insert(0, 1, ' ');
        if (!step.use_regex) {
          next.push_back(std::move(piece));
          continue;
        }
      }
      matches.clear();
      const Regex* re = step.kind == PreTokStep::Kind::ByteLevel ? gpt2_regex().get() : step.regex.get();
      if (re) {
        re->find_all(piece, matches);
      } else if (!step.literal.empty()) {
        for (size_t at = piece.find(step.literal); at != std::string::npos;
             at = piece.find(step.literal, at + step.literal.size()))
          matches.emplace_back(at, at + step.literal.size());
      }
      SplitBehavior behavior =
          step.kind == PreTokStep::Kind::ByteLevel ? SplitBehavior::Isolated : step.behavior;
      bool invert = step.kind == PreTokStep::Kind::Split && step.invert;
      emit_with_behavior(piece, tile(piece.size(), matches, invert), behavior, next);
    }
    cur.swap(next);
  }
  for (std::string& p : cur)
    if (!p.empty()) pieces.push_back(std::move(p));
}

}  // namespace qf
