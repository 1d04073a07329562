// Tokenizer parity against Hugging Face `tokenizers` (fixtures from
// tools/reference/tokenizer_fixtures.py), round trip, streaming detokenizer, API and speed.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <map>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace {

using json = nlohmann::json;
using qf::Tokenizer;

const std::string kFixtures = std::string(QFLASH_SOURCE_DIR) + "/tests/fixtures/tokenizer/";
// The real Qwen3 tokenizer: tests/fixtures/tokenizer/qwen3/qwen3-tokenizer.tar.xz, extracted into
// the build folder by CMake before this binary is built.
const std::string kQwen3Dir = QFLASH_QWEN3_TOKENIZER_DIR;
const std::string kQwen3Json = kQwen3Dir + "/tokenizer.json";

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

const json& fixture(const std::string& name) {
  static std::map<std::string, json> cache;
  auto it = cache.find(name);
  if (it == cache.end()) it = cache.emplace(name, json::parse(slurp(kFixtures + name))).first;
  return it->second;
}

std::vector<int32_t> ids_of(const json& j) { return j.get<std::vector<int32_t>>(); }

// The Qwen3 tokenizer, loaded once for the whole suite (null when the extracted fixture is missing,
// which fails every test that needs it: the archive is part of the repository).
const Tokenizer* qwen3() {
  static std::unique_ptr<Tokenizer> tok = [] {
    if (!std::filesystem::exists(kQwen3Json)) return std::unique_ptr<Tokenizer>();
    return std::make_unique<Tokenizer>(Tokenizer::load(kQwen3Json));
  }();
  return tok.get();
}

#define REQUIRE_QWEN3_FILE()                                                                       \
  ASSERT_TRUE(std::filesystem::exists(kQwen3Json))                                                 \
      << "Qwen3 tokenizer fixture missing: " << kQwen3Json                                         \
      << " (CMake extracts it from tests/fixtures/tokenizer/qwen3/qwen3-tokenizer.tar.xz)"
#define REQUIRE_QWEN3()                                                                            \
  REQUIRE_QWEN3_FILE();                                                                            \
  const Tokenizer* tok = qwen3();                                                                  \
  ASSERT_NE(tok, nullptr)

// Seconds of CPU time used by this process. The speed limits below are checked on CPU time, not
// wall time: the build machines are shared, and the test is about qflash's work, not the load of
// its neighbours (loading and encoding are single-threaded).
double cpu_seconds() { return static_cast<double>(std::clock()) / CLOCKS_PER_SEC; }

// Every chunk a streaming decoder returns must be complete UTF-8.
std::string stream_all(const Tokenizer& tok, const std::vector<int32_t>& ids, bool* all_valid) {
  qf::StreamDecoder sd(tok);
  std::string out;
  *all_valid = true;
  for (int32_t id : ids) {
    std::string piece = sd.push(id);
    *all_valid &= qf::utf8::is_valid(piece);
    out += piece;
  }
  std::string tail = sd.flush();
  *all_valid &= qf::utf8::is_valid(tail);
  return out + tail;
}

TEST(TokenizerQwen3, ParityWithHfTokenizers) {
  REQUIRE_QWEN3();
  const json& items = fixture("qwen3_corpus.json")["items"];
  ASSERT_GE(items.size(), 25u);
  for (const json& it : items)
    EXPECT_EQ(tok->encode(it["text"].get<std::string>()), ids_of(it["ids"])) << it["name"];
}

TEST(TokenizerQwen3, ParityWithoutSpecialParsing) {
  REQUIRE_QWEN3();
  int differing = 0;
  for (const json& it : fixture("qwen3_corpus.json")["items"]) {
    std::string text = it["text"];
    auto ids = tok->encode(text, /*parse_special=*/false);
    EXPECT_EQ(ids, ids_of(it["ids_plain"])) << it["name"];
    differing += ids != tok->encode(text, true);
    for (int32_t id : ids) EXPECT_FALSE(tok->is_added(id)) << it["name"];
  }
  EXPECT_GE(differing, 2);  // the items with <|im_start|> etc. must actually change
}

TEST(TokenizerQwen3, RoundTripIsNfc) {
  REQUIRE_QWEN3();
  for (const json& it : fixture("qwen3_corpus.json")["items"]) {
    std::string expect = it.contains("nfc") ? it["nfc"] : it["text"];
    EXPECT_EQ(tok->decode(ids_of(it["ids"])), expect) << it["name"];
    EXPECT_EQ(tok->decode(tok->encode(it["text"].get<std::string>(), false)), expect) << it["name"];
  }
}

TEST(TokenizerQwen3, StreamingEqualsFullDecode) {
  REQUIRE_QWEN3();
  for (const json& it : fixture("qwen3_corpus.json")["items"]) {
    auto ids = ids_of(it["ids"]);
    bool valid = false;
    EXPECT_EQ(stream_all(*tok, ids, &valid), tok->decode(ids)) << it["name"];
    EXPECT_TRUE(valid) << it["name"];
  }
}

TEST(TokenizerQwen3, StreamingRandomIdsNeverEmitsBrokenUtf8) {
  REQUIRE_QWEN3();
  // Random byte-level tokens produce plenty of split and invalid sequences.
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> pick(0, 151642);
  for (int round = 0; round < 200; ++round) {
    std::vector<int32_t> ids(1 + rng() % 20);
    for (auto& id : ids) id = pick(rng);
    bool valid = false;
    EXPECT_EQ(stream_all(*tok, ids, &valid), qf::utf8::sanitize(tok->decode(ids)));
    EXPECT_TRUE(valid);
  }
}

TEST(TokenizerQwen3, StreamingHoldsSplitCharacter) {
  REQUIRE_QWEN3();
  // U+1F600 as four single-byte tokens: nothing may come out until the last byte arrives.
  const std::string emoji = "\xF0\x9F\x98\x80";
  std::vector<int32_t> byte_ids;
  for (char c : emoji) {
    std::string spelled;
    qf::byte_level::encode(std::string_view(&c, 1), spelled);
    auto id = tok->token_to_id(spelled);
    ASSERT_TRUE(id.has_value());
    byte_ids.push_back(*id);
  }
  qf::StreamDecoder sd(*tok);
  EXPECT_EQ(sd.push(*tok->token_to_id("a")), "a");
  EXPECT_EQ(sd.push(byte_ids[0]), "");
  EXPECT_EQ(sd.push(byte_ids[1]), "");
  EXPECT_EQ(sd.push(byte_ids[2]), "");
  EXPECT_EQ(sd.push(byte_ids[3]), emoji);
  EXPECT_EQ(sd.flush(), "");
  // An unfinished character at the end becomes one U+FFFD; a character cut by a new
  // lead byte is replaced at once and the new one kept pending.
  EXPECT_EQ(sd.push(byte_ids[0]), "");
  EXPECT_EQ(sd.push(byte_ids[1]), "");
  EXPECT_EQ(sd.push(byte_ids[0]), "\xEF\xBF\xBD");
  EXPECT_EQ(sd.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(sd.push(*tok->token_to_id("<|im_end|>")), "<|im_end|>");
}

TEST(TokenizerQwen3, SpecialTokensAndIds) {
  REQUIRE_QWEN3();
  EXPECT_EQ(tok->vocab_size(), 151669);
  EXPECT_EQ(tok->token_to_id("<|endoftext|>"), 151643);
  EXPECT_EQ(tok->token_to_id("<|im_start|>"), 151644);
  EXPECT_EQ(tok->token_to_id("<|im_end|>"), 151645);
  EXPECT_EQ(tok->token_to_id("<think>"), 151667);
  EXPECT_EQ(tok->token_to_id("Ġthe"), 279);
  EXPECT_FALSE(tok->token_to_id("no such token").has_value());
  EXPECT_TRUE(tok->is_special(151645));
  EXPECT_FALSE(tok->is_special(151667));  // <think> is added but not special
  EXPECT_TRUE(tok->is_added(151667));
  EXPECT_FALSE(tok->is_special(279));
  EXPECT_EQ(tok->eos_ids(), (std::vector<int32_t>{151645, 151643}));
  EXPECT_EQ(tok->token_bytes(151645), "<|im_end|>");
  EXPECT_EQ(tok->token_bytes(279), " the");
  EXPECT_EQ(tok->token_bytes(198), "\n");
  auto ids = tok->encode("<|im_start|>user\nhi<|im_end|><think>");
  EXPECT_EQ(ids.front(), 151644);
  EXPECT_EQ(tok->decode(ids, /*skip_special=*/true), "user\nhi<think>");
  EXPECT_EQ(tok->decode(ids), "<|im_start|>user\nhi<|im_end|><think>");
  EXPECT_THROW(tok->token_bytes(151669), qf::Error);
  EXPECT_THROW(tok->token_bytes(-1), qf::Error);
}

TEST(TokenizerQwen3, EncodeNeverAddsBos) {
  REQUIRE_QWEN3();
  EXPECT_TRUE(tok->encode("").empty());
  EXPECT_EQ(tok->encode("hello"), (std::vector<int32_t>{14990}));
}

TEST(TokenizerQwen3, InvalidUtf8InputIsReplaced) {
  REQUIRE_QWEN3();
  EXPECT_EQ(tok->encode("a\xFF b\xE4\xBD"), tok->encode("a\xEF\xBF\xBD b\xEF\xBF\xBD"));
}

TEST(TokenizerQwen3, LoadFromFolderReadsConfig) {
  REQUIRE_QWEN3();
  Tokenizer t = Tokenizer::load(kQwen3Dir);
  EXPECT_EQ(t.vocab_size(), tok->vocab_size());
  EXPECT_EQ(t.eos_ids(), tok->eos_ids());
  EXPECT_EQ(t.encode("same text, same ids"), tok->encode("same text, same ids"));
}

TEST(TokenizerQwen3, ChatPromptEndsLikeSpec) {
  REQUIRE_QWEN3();
  // docs/spec/qwen38.md 5.1 prompt dump: ... <|im_end|> \n <|im_start|> assistant \n <think> \n
  std::string prompt = qf::chat_render({{"user", "Hello", ""}}, true, true);
  auto ids = tok->encode(prompt);
  int32_t nl = *tok->token_to_id("Ċ"), assistant = *tok->token_to_id("assistant");
  std::vector<int32_t> head = {151644, *tok->token_to_id("user"), nl};
  std::vector<int32_t> tail = {151645, nl, 151644, assistant, nl, 151667, nl};
  ASSERT_GE(ids.size(), head.size() + tail.size());
  EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.begin() + 3), head);
  EXPECT_EQ(std::vector<int32_t>(ids.end() - 7, ids.end()), tail);
}

TEST(TokenizerQwen3, ThreadedEncodeAgrees) {
  REQUIRE_QWEN3();
  const json& items = fixture("qwen3_corpus.json")["items"];
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int rep = 0; rep < 5; ++rep)
        for (const json& it : items)
          if (tok->encode(it["text"].get<std::string>()) != ids_of(it["ids"])) ++mismatches;
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST(TokenizerQwen3, LoadAndEncodeAreFast) {
  REQUIRE_QWEN3_FILE();
  auto t0 = std::chrono::steady_clock::now();
  double c0 = cpu_seconds();
  Tokenizer t = Tokenizer::load(kQwen3Json);
  double load_cpu = cpu_seconds() - c0;
  double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::string text;
  for (const json& it : fixture("qwen3_corpus.json")["items"]) text += it["text"].get<std::string>() + "\n";
  while (text.size() < 100000) text += text;
  t0 = std::chrono::steady_clock::now();
  c0 = cpu_seconds();
  auto ids = t.encode(text);  // fresh tokenizer: the word cache starts empty
  double enc_cpu = cpu_seconds() - c0;
  double enc_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[tokenizer] load %.3f s (cpu %.3f s), encode %zu bytes -> %zu ids in %.3f s (cpu %.3f s)\n",
              load_s, load_cpu, text.size(), ids.size(), enc_s, enc_cpu);
  EXPECT_EQ(t.decode(ids).size(), qf::normalize(text, {qf::NormForm::NFC}).size());
#if defined(NDEBUG) && !defined(__SANITIZE_ADDRESS__)
  EXPECT_LT(load_cpu, 2.0);
  EXPECT_LT(enc_cpu, 1.0);
#endif
}

// ---- Qwen3.5-family split regex (\p{M} inside letter runs, docs/spec/qwen38.md 5.1) -------------

TEST(TokenizerQwen35Regex, ParityWithHfTokenizers) {
  REQUIRE_QWEN3();
  const json& fx = fixture("qwen3_corpus.json");
  json j = json::parse(slurp(kQwen3Json));
  auto& pattern = j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"];
  ASSERT_EQ(pattern, fx["qwen3_regex"]);
  pattern = fx["qwen35_regex"];
  Tokenizer t35 = Tokenizer::from_json(j.dump(), "qwen35-regex tokenizer.json");
  int differing = 0;
  for (const json& it : fx["items"]) {
    auto ids = t35.encode(it["text"].get<std::string>());
    EXPECT_EQ(ids, ids_of(it["ids_qwen35"])) << it["name"];
    differing += ids != ids_of(it["ids"]);
  }
  EXPECT_GE(differing, 1);  // the patched regex really is in effect
}

TEST(TokenizerQwen35Regex, PreTokensMatchHf) {
  const json& fx = fixture("qwen3_corpus.json");
  qf::PreTokenizer pt;
  qf::PreTokStep split;
  split.regex = std::make_shared<const qf::Regex>(fx["qwen35_regex"].get<std::string>(), "test");
  pt.add_step(split);
  qf::PreTokStep bl;
  bl.kind = qf::PreTokStep::Kind::ByteLevel;
  pt.add_step(bl);
  for (const json& it : fx["items"]) {
    std::string nfc = it.contains("nfc") ? it["nfc"] : it["text"];
    std::vector<std::string> pieces, spelled;
    pt.split(nfc, pieces);
    for (const auto& p : pieces) qf::byte_level::encode(p, spelled.emplace_back());
    EXPECT_EQ(spelled, it["pieces_qwen35"].get<std::vector<std::string>>()) << it["name"];
  }
}

// ---- small trained tokenizers: GPT-2 regex ByteLevel, both merge spellings, token flags ----

TEST(TokenizerTiny, ParityAllVariants) {
  Tokenizer pairs = Tokenizer::load(kFixtures + "tiny_bpe_pairs.json");
  Tokenizer strings = Tokenizer::load(kFixtures + "tiny_bpe_strings.json");
  Tokenizer prefix = Tokenizer::load(kFixtures + "tiny_bpe_prefix.json");
  const json& items = fixture("tiny_corpus.json")["items"];
  ASSERT_GE(items.size(), 20u);
  for (const json& it : items) {
    std::string text = it["text"];
    EXPECT_EQ(pairs.encode(text), ids_of(it["ids"])) << it["name"];
    EXPECT_EQ(strings.encode(text), ids_of(it["ids"])) << it["name"];
    EXPECT_EQ(prefix.encode(text), ids_of(it["ids_prefix"])) << it["name"];
  }
}

TEST(TokenizerTiny, SplitBehaviorsMatchHf) {
  // Removed / MergedWithPrevious / MergedWithNext / Contiguous / invert / String patterns and
  // a regex-free ByteLevel with prefix space, each patched into the tiny model.
  const json& fx = fixture("tiny_corpus.json");
  json base = json::parse(slurp(kFixtures + "tiny_bpe_pairs.json"));
  auto texts = fx["split_texts"].get<std::vector<std::string>>();
  ASSERT_GE(fx["split_variants"].size(), 6u);
  for (const json& v : fx["split_variants"]) {
    json j = base;
    j["pre_tokenizer"] = v["pre_tokenizer"];
    Tokenizer t = Tokenizer::from_json(j.dump(), v["name"]);
    for (size_t i = 0; i < texts.size(); ++i)
      EXPECT_EQ(t.encode(texts[i]), ids_of(v["ids"][i])) << v["name"] << " on " << json(texts[i]).dump();
  }
}

TEST(TokenizerTiny, AddedTokenFlags) {
  Tokenizer t = Tokenizer::load(kFixtures + "tiny_bpe_pairs.json");
  int32_t ls = *t.token_to_id("[LS]"), rs = *t.token_to_id("[RS]"), w = *t.token_to_id("<w>");
  int32_t cafe = *t.token_to_id("café");
  auto has = [](const std::vector<int32_t>& v, int32_t id) { return std::find(v.begin(), v.end(), id) != v.end(); };
  // lstrip swallows the spaces before [LS]; rstrip those after [RS].
  EXPECT_EQ(t.decode(t.encode("x   [LS] y")), "x[LS] y");
  EXPECT_EQ(t.decode(t.encode("x [RS]   y")), "x [RS]y");
  EXPECT_TRUE(has(t.encode("a <w> b"), w));
  EXPECT_FALSE(has(t.encode("a<w> b"), w));
  EXPECT_FALSE(has(t.encode("a <w>_"), w));
  // normalized=true: the decomposed spelling matches after NFC.
  EXPECT_TRUE(has(t.encode("cafe\xCC\x81"), cafe));
  EXPECT_FALSE(has(t.encode("[LS]", false), ls));
  EXPECT_FALSE(has(t.encode("[RS]", false), rs));
}

// ---- UTF-8 helpers: maximal-subpart replacement as Python's errors="replace" does ----------

// clip: untrusted text cut to a byte budget at a character boundary, never invalid.
TEST(TokenizerUtf8, ClipCutsAtACharacterAndSanitizes) {
  const std::string e = "\xC3\xA9", snow = "\xE2\x98\x83";  // 2 and 3 bytes
  EXPECT_EQ(qf::utf8::clip("short", 10), "short");
  EXPECT_EQ(qf::utf8::clip("abcdef", 3), "abc...");
  for (size_t budget = 0; budget < 12; budget++) {
    const std::string in = "a" + e + snow + e + snow + "z";
    const std::string out = qf::utf8::clip(in, budget);
    EXPECT_TRUE(qf::utf8::is_valid(out)) << budget;
    ASSERT_GE(out.size(), 3u);
    const std::string kept = out.substr(0, out.size() - 3);
    EXPECT_LE(kept.size(), budget);
    EXPECT_EQ(in.compare(0, kept.size(), kept), 0) << budget;  // a prefix of the input
    EXPECT_GT(kept.size() + 3, budget) << "cut more than one character short: " << budget;
  }
  EXPECT_EQ(qf::utf8::clip("a\xFF" "b", 10), "a\xEF\xBF\xBD" "b");
}

TEST(TokenizerUtf8, SanitizeMaximalSubparts) {
  const std::string R = "\xEF\xBF\xBD";
  EXPECT_EQ(qf::utf8::sanitize("ok"), "ok");
  EXPECT_EQ(qf::utf8::sanitize("\xE4\xBD" "A"), R + "A");       // truncated 3-byte sequence
  EXPECT_EQ(qf::utf8::sanitize("\xF0\x80\x80"), R + R + R);      // F0 needs 90..BF next
  EXPECT_EQ(qf::utf8::sanitize("\xED\xA0\x80"), R + R + R);      // surrogate
  EXPECT_EQ(qf::utf8::sanitize("\xC0\xAF"), R + R);              // overlong
  EXPECT_EQ(qf::utf8::sanitize("\xF4\x90\x80\x80"), R + R + R + R);  // > U+10FFFF
  EXPECT_EQ(qf::utf8::sanitize("\xF0\x9F\x98"), R);              // one subpart
  EXPECT_TRUE(qf::utf8::is_incomplete_prefix("\xF0\x9F\x98", 0));
  EXPECT_FALSE(qf::utf8::is_incomplete_prefix("\xF0\x80", 0));
  EXPECT_FALSE(qf::utf8::is_valid("\x80"));
  EXPECT_TRUE(qf::utf8::is_valid("\xF0\x9F\x98\x80 \xC3\xA9"));
}

}  // namespace
