// Malformed tokenizer files must fail at load with a qf::Error (kind Tokenizer) that names the
// file and the field; plus hand-checked BPE merges on a minimal handmade tokenizer.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer.h"

namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// A minimal byte-level BPE: all 256 byte tokens plus a few merges over "a", "b", "c".
json minimal_tokenizer(const std::vector<std::string>& merges) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) {
    std::string s;
    char c = static_cast<char>(b);
    qf::byte_level::encode(std::string_view(&c, 1), s);
    vocab[s] = b;
  }
  int next = 256;
  for (const char* t : {"ab", "bc", "abc", "Ġa"}) vocab[t] = next++;
  json j;
  j["version"] = "1.0";
  j["added_tokens"] = json::array({{{"id", 300}, {"content", "<|end|>"}, {"special", true}}});
  j["normalizer"] = {{"type", "NFC"}};
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  j["decoder"] = {{"type", "ByteLevel"}};
  j["model"] = {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}};
  return j;
}

class TokenizerErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("qflash_tok_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& text) {
    std::string p = (dir_ / name).string();
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }

  // Loads and returns the error message; fails the test when loading succeeds.
  std::string load_error(const std::string& path) {
    try {
      qf::Tokenizer::load(path);
    } catch (const qf::Error& e) {
      EXPECT_EQ(e.kind(), qf::ErrorKind::Tokenizer) << e.what();
      return e.what();
    }
    ADD_FAILURE() << "loading " << path << " did not throw";
    return {};
  }

  fs::path dir_;
};

TEST_F(TokenizerErrors, MinimalTokenizerMergesByRank) {
  // Rank decides: with "b c" first, "abc" = a + bc -> abc; with "a b" first, ab + c -> abc.
  qf::Tokenizer t1 = qf::Tokenizer::load(write("t1.json", minimal_tokenizer({"b c", "a bc"}).dump()));
  EXPECT_EQ(t1.encode("abc"), (std::vector<int32_t>{258}));
  EXPECT_EQ(t1.encode("ab"), (std::vector<int32_t>{'a', 'b'}));  // no "a b" merge
  qf::Tokenizer t2 = qf::Tokenizer::load(write("t2.json", minimal_tokenizer({"a b", "b c"}).dump()));
  EXPECT_EQ(t2.encode("abc"), (std::vector<int32_t>{256, 'c'}));  // "ab c" is not a merge
  EXPECT_EQ(t2.encode("bc"), (std::vector<int32_t>{257}));
  EXPECT_EQ(t2.encode("ab<|end|>"), (std::vector<int32_t>{256, 300}));
  EXPECT_EQ(t2.vocab_size(), 301);
  EXPECT_EQ(t2.token_bytes(280), "");  // an unused id inside the range decodes to nothing
  EXPECT_EQ(t2.eos_ids(), std::vector<int32_t>{});
}

TEST_F(TokenizerErrors, MissingFile) {
  std::string msg = load_error((dir_ / "nope.json").string());
  EXPECT_NE(msg.find("nope.json"), std::string::npos) << msg;
  msg = load_error(dir_.string());  // a folder without tokenizer.json
  EXPECT_NE(msg.find("tokenizer.json"), std::string::npos) << msg;
}

TEST_F(TokenizerErrors, BadJson) {
  std::string msg = load_error(write("bad.json", "{\"model\": {\"type\": \"BPE\", "));
  EXPECT_NE(msg.find("bad.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("bad JSON"), std::string::npos) << msg;
}

TEST_F(TokenizerErrors, UnsupportedModelType) {
  json j = minimal_tokenizer({});
  j["model"]["type"] = "Unigram";
  std::string msg = load_error(write("uni.json", j.dump()));
  EXPECT_NE(msg.find("uni.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model.type"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Unigram"), std::string::npos) << msg;
}

TEST_F(TokenizerErrors, MergeWithUnknownToken) {
  std::string msg = load_error(write("m.json", minimal_tokenizer({"a b", "x yz"}).dump()));
  EXPECT_NE(msg.find("model.merges[1]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("\"yz\""), std::string::npos) << msg;
  // The merged result must exist too: "c a" -> "ca" is not in the vocabulary.
  msg = load_error(write("m2.json", minimal_tokenizer({"c a"}).dump()));
  EXPECT_NE(msg.find("\"ca\""), std::string::npos) << msg;
}

// Ids size the id tables, so a huge id is refused by name instead of allocating (or overflowing:
// an added token with id 2^31 - 1 crashed the loader before the bound; found by TokenizerFuzz).
TEST_F(TokenizerErrors, HugeOrSparseIdsAreRefused) {
  json j = minimal_tokenizer({"a b"});
  j["added_tokens"][0]["id"] = 2147483647;
  std::string msg = load_error(write("a.json", j.dump()));
  EXPECT_NE(msg.find("added_tokens[0].id"), std::string::npos) << msg;
  EXPECT_NE(msg.find("2147483647"), std::string::npos) << msg;
  j = minimal_tokenizer({"a b"});
  j["model"]["vocab"]["abc"] = 1 << 28;
  msg = load_error(write("v.json", j.dump()));
  EXPECT_NE(msg.find("model.vocab[\"abc\"]"), std::string::npos) << msg;
  // Below the id bound but with more than 65,536 unused ids under the largest one.
  j = minimal_tokenizer({"a b"});
  j["added_tokens"][0]["id"] = 300000;
  msg = load_error(write("g.json", j.dump()));
  EXPECT_NE(msg.find("unused ids"), std::string::npos) << msg;
  // A few gaps are fine (the minimal tokenizer's added id 300 leaves 40 unused).
  j = minimal_tokenizer({"a b"});
  EXPECT_NO_THROW(qf::Tokenizer::load(write("ok.json", j.dump())));
}

TEST_F(TokenizerErrors, MalformedMergeEntries) {
  json j = minimal_tokenizer({"ab"});
  EXPECT_NE(load_error(write("m.json", j.dump())).find("model.merges[0]"), std::string::npos);
  j["model"]["merges"] = json::array({json::array({"a", "b"}), json::array({"a"})});
  EXPECT_NE(load_error(write("m2.json", j.dump())).find("model.merges[1]"), std::string::npos);
  j["model"].erase("merges");
  EXPECT_NE(load_error(write("m3.json", j.dump())).find("model.merges"), std::string::npos);
}

TEST_F(TokenizerErrors, BadRegexNamesPcre2ErrorAndOffset) {
  json j = minimal_tokenizer({});
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers",
                         json::array({{{"type", "Split"}, {"pattern", {{"Regex", "abc(\\p{L}+"}}}, {"behavior", "Isolated"}},
                                      {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}};
  std::string msg = load_error(write("re.json", j.dump()));
  EXPECT_NE(msg.find("re.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("pre_tokenizer.pretokenizers[0].pattern.Regex"), std::string::npos) << msg;
  EXPECT_NE(msg.find("offset 10"), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing closing parenthesis"), std::string::npos) << msg;
}

TEST_F(TokenizerErrors, UnsupportedPipelinePieces) {
  json j = minimal_tokenizer({});
  j["normalizer"] = {{"type", "Lowercase"}};
  EXPECT_NE(load_error(write("n.json", j.dump())).find("normalizer.type"), std::string::npos);
  j = minimal_tokenizer({});
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  EXPECT_NE(load_error(write("p.json", j.dump())).find("pre_tokenizer.type"), std::string::npos);
  j["pre_tokenizer"] = nullptr;  // no ByteLevel step: not a byte-level BPE
  EXPECT_NE(load_error(write("p2.json", j.dump())).find("ByteLevel"), std::string::npos);
  j = minimal_tokenizer({});
  j["decoder"] = {{"type", "WordPiece"}};
  EXPECT_NE(load_error(write("d.json", j.dump())).find("decoder.type"), std::string::npos);
  j = minimal_tokenizer({});
  j["added_tokens"][0]["id"] = -5;
  EXPECT_NE(load_error(write("a.json", j.dump())).find("added_tokens[0].id"), std::string::npos);
  j = minimal_tokenizer({});
  j["model"]["vocab"]["zz"] = "seven";
  EXPECT_NE(load_error(write("v.json", j.dump())).find("model.vocab[\"zz\"]"), std::string::npos);
}

TEST_F(TokenizerErrors, AcceptsNullAndSequenceNormalizer) {
  json j = minimal_tokenizer({"a b"});
  j["normalizer"] = nullptr;
  EXPECT_EQ(qf::Tokenizer::load(write("n.json", j.dump())).encode("ab"), std::vector<int32_t>{256});
  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", json::array({{{"type", "NFC"}}})}};
  qf::Tokenizer t = qf::Tokenizer::load(write("s.json", j.dump()));
  EXPECT_EQ(t.decode(t.encode("e\xCC\x81")), "\xC3\xA9");  // NFC composes e + U+0301
}

TEST_F(TokenizerErrors, DecodeOutOfRange) {
  qf::Tokenizer t = qf::Tokenizer::load(write("t.json", minimal_tokenizer({}).dump()));
  try {
    t.decode({97, 301});
    ADD_FAILURE() << "no throw";
  } catch (const qf::Error& e) {
    EXPECT_EQ(e.kind(), qf::ErrorKind::Tokenizer);
    EXPECT_NE(std::string(e.what()).find("301"), std::string::npos) << e.what();
  }
  EXPECT_THROW(t.decode({-1}), qf::Error);
  qf::StreamDecoder sd(t);
  EXPECT_THROW(sd.push(1000), qf::Error);
}

TEST_F(TokenizerErrors, ConfigEosToken) {
  json j = minimal_tokenizer({});
  write("tokenizer.json", j.dump());
  write("tokenizer_config.json", R"({"eos_token": {"content": "<|end|>"}})");
  EXPECT_EQ(qf::Tokenizer::load(dir_.string()).eos_ids(), std::vector<int32_t>{300});
  write("tokenizer_config.json", R"({"eos_token": 5})");
  EXPECT_NE(load_error(dir_.string()).find("eos_token"), std::string::npos);
  write("tokenizer_config.json", "{oops");
  EXPECT_NE(load_error(dir_.string()).find("tokenizer_config.json"), std::string::npos);
}

}  // namespace
