// Fuzz-style robustness of tokenizer.json loading (Tokenizer::from_json): a small byte-level BPE
// with added tokens, a Split pre-tokenizer and a Sequence normalizer, mutated by a seeded generator
// (tests/support/json_mutator.h). Each mutant must load or throw qf::Error naming the file; a
// tokenizer that loads must encode text and decode its own ids (decode may refuse an id only with
// qf::Error). Never a crash, another exception type or an allocation sized by a hostile number.
#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "support/json_mutator.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer.h"

namespace qf::test {
namespace {

using ojson = nlohmann::ordered_json;

ojson small_tokenizer(bool split) {
  ojson vocab = ojson::object();
  for (int b = 0; b < 256; ++b) {
    std::string s;
    const char c = static_cast<char>(b);
    byte_level::encode(std::string_view(&c, 1), s);
    vocab[s] = b;
  }
  int next = 256;
  for (const char* t : {"ab", "bc", "abc", "Ġa", "Ġab"}) vocab[t] = next++;
  ojson j;
  j["version"] = "1.0";
  j["added_tokens"] = ojson::array({{{"id", 300}, {"content", "<|end|>"}, {"special", true}},
                                    {{"id", 301}, {"content", "<think>"}, {"special", false}}});
  if (split)
    j["normalizer"] = {{"type", "Sequence"}, {"normalizers", ojson::array({{{"type", "NFC"}}})}};
  else
    j["normalizer"] = {{"type", "NFC"}};
  if (split)
    j["pre_tokenizer"] = {{"type", "Sequence"},
                          {"pretokenizers", ojson::array({{{"type", "Split"}, {"pattern", {{"Regex", "\\s+|\\w+|[^\\s\\w]+"}}},
                                                           {"behavior", "Isolated"}, {"invert", false}},
                                                          {{"type", "ByteLevel"}, {"add_prefix_space", false},
                                                           {"trim_offsets", false}, {"use_regex", false}}})}};
  else
    j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  j["decoder"] = {{"type", "ByteLevel"}};
  j["model"] = {{"type", "BPE"}, {"vocab", vocab}, {"merges", ojson::array({"a b", "b c", "ab c", "Ġ a", "Ġa b"})}};
  return j;
}

TEST(TokenizerFuzz, MutatedTokenizerJsonLoadsAndWorksOrNamesTheFile) {
  const std::vector<ojson> base = {small_tokenizer(false), small_tokenizer(true)};
  JsonMutator mut;
  mut.strings = {"", "BPE", "WordPiece", "NFC", "NFKC", "Sequence", "ByteLevel", "Split", "Regex", "Isolated",
                 "Removed", "(", "[", "\\p{L}+", "a b", "ab", "a b c", "Ġ", "<|end|>", "\xc3\xa9", "\xff"};
  mut.keys = {"type", "id", "content", "special", "pattern", "Regex", "String", "behavior", "vocab", "merges",
              "normalizers", "pretokenizers", "use_regex", "x"};
  mut.top = {"added_tokens", "normalizer", "pre_tokenizer", "decoder", "model", "post_processor", "truncation"};
  std::mt19937_64 rng(120426);
  int loaded = 0, refused = 0, bad = 0;
  for (int i = 0; i < 12000; i++) {
    // Mutations aimed past the 261-entry vocab too: half of them at a random top-level branch.
    ojson m = base[static_cast<size_t>(i) % base.size()];
    if (i % 2) {
      const std::vector<std::string> branches = {"added_tokens", "normalizer", "pre_tokenizer", "decoder"};
      const std::string& b = branches[rng() % branches.size()];
      m[b] = mut.mutate(m[b], rng);
    } else {
      m = mut.mutate(m, rng);
    }
    std::string err;
    try {
      const Tokenizer t = Tokenizer::from_json(m.dump(-1, ' ', false, ojson::error_handler_t::replace), "fuzz/tokenizer.json");
      for (const char* text : {"abc ab", "<|end|> a<think>b", "\xc3\xa9t\xc3\xa9 \xff", ""}) {
        const std::vector<int32_t> ids = t.encode(text);
        try {
          (void)t.decode(ids);
        } catch (const Error&) {
        }
      }
      loaded++;
    } catch (const Error& e) {
      if (std::string(e.what()).find("fuzz/tokenizer.json") == std::string::npos)
        err = std::string("an error that does not name the file: ") + e.what();
      else
        refused++;
    } catch (const std::exception& e) {
      err = std::string("a ") + typeid(e).name() + ": " + e.what();
    }
    if (!err.empty() && ++bad <= 8) ADD_FAILURE() << err << "\n  tokenizer: " << m.dump(-1, ' ', false, ojson::error_handler_t::replace).substr(0, 400);
  }
  EXPECT_EQ(bad, 0);
  EXPECT_GT(loaded, 1000);
  EXPECT_GT(refused, 1000);
}

// Text a client sends: random byte strings (invalid UTF-8, control bytes, markers, long runs of
// one character, mixed scripts) through the real Qwen3 tokenizer and the demo pair's. Every id
// is in range, decoding gives bytes back, ASCII text round-trips exactly (it is NFC already),
// user text with parse_special=false never yields a special token, and a 64 KB string encodes in
// well under a second (no regex blow-up).
TEST(TokenizerFuzz, RandomTextEncodesDecodesAndStaysPlain) {
  const std::vector<Tokenizer> toks = {Tokenizer::load(QFLASH_QWEN3_TOKENIZER_DIR),
                                       Tokenizer::load(std::string(QFLASH_SOURCE_DIR) + "/models/demo")};
  const std::vector<std::string> parts = {"<|im_start|>", "<|im_end|>", "<think>", "<tool_call>", "<|endoftext|>",
                                          " ", "\n", "\t", "\r\n", "def ", "x = 1", "\xc3\xa9", "\xe4\xb8\xad",
                                          "\xf0\x9f\x98\x80", "\xff", "\xc3", "\xed\xa0\x80", "\0", "'s", "123456",
                                          "....", "\xcc\x81"};
  std::mt19937_64 rng(7);
  for (const Tokenizer& t : toks) {
    for (int i = 0; i < 1500; i++) {
      std::string s;
      const bool ascii = i % 3 == 0;
      for (int k = static_cast<int>(rng() % 40); k > 0; k--) {
        if (ascii) s += static_cast<char>(32 + rng() % 95);
        else if (rng() % 2) s += parts[rng() % parts.size()];
        else s += static_cast<char>(rng());
      }
      const std::vector<int32_t> ids = t.encode(s, /*parse_special=*/false);
      for (int32_t id : ids) {
        ASSERT_TRUE(id >= 0 && id < t.vocab_size()) << "id " << id;
        ASSERT_FALSE(t.is_special(id)) << "user text became special token " << id;
      }
      const std::string back = t.decode(ids);
      if (ascii) {
        ASSERT_EQ(back, s);
      }
    }
    std::string big;
    while (big.size() < 65536) big += static_cast<char>(rng() % 3 == 0 ? ' ' : 'a' + rng() % 3);
    big += std::string(8192, '!') + std::string(8192, ' ');
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<int32_t> ids = t.encode(big, false);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(t.decode(ids), big);
    EXPECT_LT(secs, 2.0) << "encoding 80 KB took " << secs << " s";
  }
}

}  // namespace
}  // namespace qf::test
