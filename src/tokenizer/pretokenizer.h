// Normalizer and pre-tokenizer of a tokenizer.json: NFC (or another Unicode form), then
// Split(regex) / ByteLevel steps that cut normalized text into the words BPE merges within.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace qf {

// A compiled PCRE2 pattern (UTF + UCP), JIT-compiled when the library supports it.
class Regex {
 public:
  // `where` names the file and field for the error message (which includes PCRE2's message
  // and the offset of the problem in the pattern).
  Regex(const std::string& pattern, const std::string& where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Appends [start, end) byte ranges of successive non-overlapping, non-empty matches in a
  // valid UTF-8 text.
  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;
  bool jit() const { return jit_; }
  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8*; kept opaque so pcre2.h stays out of this header
  bool jit_ = false;
};

enum class NormForm { None, NFC, NFD, NFKC, NFKD };

// Applies the normalization forms in order. Input must be valid UTF-8.
std::string normalize(std::string_view text, const std::vector<NormForm>& forms);

enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

struct PreTokStep {
  enum class Kind { Split, ByteLevel } kind = Kind::Split;
  // Split: a regex, or a literal string when `regex` is null.
  std::shared_ptr<const Regex> regex;
  std::string literal;
  SplitBehavior behavior = SplitBehavior::Isolated;
  bool invert = false;
  // ByteLevel: the byte mapping itself happens in BPE (which works on raw bytes); this step
  // only adds the prefix space and the optional GPT-2 split.
  bool add_prefix_space = false;
  bool use_regex = false;
};

class PreTokenizer {
 public:
  void add_step(PreTokStep step) { steps_.push_back(std::move(step)); }
  bool empty() const { return steps_.empty(); }

  // Cuts one normalized segment into pre-tokens (raw UTF-8, not yet byte-mapped).
  void split(std::string_view text, std::vector<std::string>& pieces) const;

  // The regex HF's ByteLevel pre-tokenizer uses when use_regex is true (GPT-2's).
  static std::shared_ptr<const Regex> gpt2_regex();

 private:
  std::vector<PreTokStep> steps_;
};

}  // namespace qf
