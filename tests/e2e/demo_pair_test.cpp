// End-to-end tests on the shipped demo pair (models/demo): identity with real drafts, a floor
// on real acceptance (so a regression in the drafter path fails CI), and the CLI contract.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <regex>
#include <nlohmann/json.hpp>

#include "model/qwen38.h"
#include "runtime/draft_source.h"
#include "runtime/generate.h"
#include "support/backends.h"
#include "tokenizer/tokenizer.h"

namespace qf {
namespace {

std::string demo_dir() { return std::string(QFLASH_SOURCE_DIR) + "/models/demo"; }

std::vector<std::vector<int32_t>> validation_prompts(int n) {
  std::ifstream f(demo_dir() + "/validation_prompts.jsonl");
  std::vector<std::vector<int32_t>> out;
  std::string line;
  while (std::getline(f, line) && static_cast<int>(out.size()) < n)
    out.push_back(nlohmann::json::parse(line)["ids"].get<std::vector<int32_t>>());
  return out;
}

struct Out {
  std::vector<int32_t> tokens;
  GenStats stats;
};

Out generate(Qwen38Model& m, DraftSource* s, const std::vector<int32_t>& prompt, int k, const std::vector<int32_t>& stops) {
  Generator g(m, s, 1024);
  GenerateOptions o;
  o.max_new_tokens = 128;
  o.draft_k = k;
  o.stop_ids = stops;
  Out r;
  r.stats = g.generate(prompt, o, [&](int32_t t) {
    r.tokens.push_back(t);
    return true;
  });
  return r;
}

// The demo target, its tokenizer and both draft sources on the backend of the test parameter.
class DemoPair : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string why;
    be = test::make_test_backend(GetParam(), &why);
    ASSERT_TRUE(be) << why;
    m = Qwen38Model::load(demo_dir(), be.get(), 16);
    tok = std::make_unique<Tokenizer>(Tokenizer::load(demo_dir()));
    mtp = std::make_unique<MtpDraftSource>(*m, 1024);
    dfl = std::make_unique<DFlashDraftSource>(DFlash2Drafter::load(demo_dir() + "/drafter", *m));
  }
  std::unique_ptr<Backend> be;
  std::unique_ptr<Qwen38Model> m;
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<MtpDraftSource> mtp;
  std::unique_ptr<DFlashDraftSource> dfl;
};

TEST_P(DemoPair, SpeculativeEqualsPlainOnValidationPrompts) {
  const auto stops = tok->eos_ids();
  for (const auto& p : validation_prompts(6)) {
    Out plain = generate(*m, nullptr, p, 0, stops);
    // kDraftKAuto: the depth controller at real acceptance, on measured costs.
    for (int k : {kDraftKAuto, 1, 3})
      EXPECT_EQ(generate(*m, mtp.get(), p, k, stops).tokens, plain.tokens) << "mtp k=" << k;
    for (int k : {kDraftKAuto, 3, 7})
      EXPECT_EQ(generate(*m, dfl.get(), p, k, stops).tokens, plain.tokens) << "dflash2 k=" << k;
  }
}

// A regression guard for the shipped pair: the floors sit ~10% below its measured values, so only
// a real regression in the drafter path trips them. v10 (MODEL_CARD.md; non-looping output): on
// these 8 prompts DFlash2 k = 7 tau 3.364, MTP k = 3 1.927 (ratio 1.75); on 16 prompts 3.591 and
// 1.896. Issue 16's own target for DFlash2 is 4.0, which v10 does not reach (the looping pairs
// before it did, 5.75 here, because a loop is easy to draft); the ratio floor is the 1.3.
TEST_P(DemoPair, AcceptanceStaysAboveFloor) {
  double tau_d = 0, tau_m = 0;
  const auto prompts = validation_prompts(8);
  for (const auto& p : prompts) {
    tau_d += generate(*m, dfl.get(), p, 7, tok->eos_ids()).stats.tau();
    tau_m += generate(*m, mtp.get(), p, 3, tok->eos_ids()).stats.tau();
  }
  tau_d /= prompts.size();
  tau_m /= prompts.size();
  std::printf("demo pair, 8 validation prompts: tau dflash2 %.3f, tau mtp %.3f\n", tau_d, tau_m);
  EXPECT_GE(tau_d, 3.0);
  EXPECT_GE(tau_d, 1.3 * tau_m);
}

INSTANTIATE_TEST_SUITE_P(Backends, DemoPair, ::testing::ValuesIn(test::test_backends()), test::backend_param_name);

// The CLI: stdout carries only the generated text, identical with and without drafting;
// --stats-json writes the documented keys.
// Runs a shell command; returns its stdout (and stderr when the command redirects it).
std::string shell(const std::string& cmd, int* status) {
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  *status = pclose(p);
  return out;
}

std::string qflash_bin() { return std::string(QFLASH_BINARY_DIR) + "/qflash"; }

std::string run_cli(const std::string& args, int* status) {
  return shell(qflash_bin() + " run --device cpu " + args + " 2>/dev/null", status);
}

TEST(DemoCli, DefaultModelAndDraftSourcesGiveIdenticalStdout) {
  int s1, s2, s3;
  const std::string prompt = "--prompt 'import os\nimport sys\n' --max-tokens 48";
  const std::string plain = run_cli(prompt + " --draft none", &s1);
  const std::string dfl = run_cli(prompt, &s2);  // default: models/demo with its drafter
  const std::string json = ::testing::TempDir() + "/qflash_stats.json";
  const std::string mtp = run_cli(prompt + " --draft mtp --stats-json " + json, &s3);
  EXPECT_EQ(s1, 0);
  EXPECT_EQ(s2, 0);
  EXPECT_EQ(s3, 0);
  EXPECT_FALSE(plain.empty());
  EXPECT_EQ(dfl, plain);
  EXPECT_EQ(mtp, plain);
  std::ifstream f(json);
  auto j = nlohmann::json::parse(f);
  for (const char* key : {"draft", "rounds", "drafted", "accepted", "tau", "accept_profile", "generated_tokens",
                          "tokens_per_second", "phases_ms", "accept_lengths"})
    EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_EQ(j["draft"], "mtp");
  EXPECT_EQ(j["accept_lengths"].size(), j["rounds"].get<size_t>());
}

TEST(DemoCli, BadModelFolderIsAClearError) {
  int s;
  const std::string out = shell(qflash_bin() + " run --model /nonexistent --prompt x 2>&1", &s);
  EXPECT_NE(s, 0);
  EXPECT_NE(out.find("/nonexistent"), std::string::npos) << out;
}

}  // namespace
}  // namespace qf

namespace qf {
namespace {

// Drafter guards fire from config.json alone: these folders hold no weights, so reaching the
// weights would give a different (file) error. Each mismatch is paired with the demo target.
TEST(DemoCli, DrafterGuardsFireBeforeAnyWeightsAreOpened) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"mismatch_vocab", "vocab_size 4096"},         {"mismatch_hidden", "hidden_size 512"},
      {"mismatch_num_target_layers", "12"},          {"mismatch_mask_id", "8192"},
      {"mismatch_tap_id", "target_layer_ids"},       {"mismatch_architecture", "Qwen3ForCausalLM"},
      {"mismatch_block_size", "block_size"}};
  for (const auto& [dir, needle] : cases) {
    int status;
    const std::string out = shell(qflash_bin() + " run --device cpu --max-tokens 1 --prompt x --draft " +
                                      QFLASH_SOURCE_DIR + "/tests/fixtures/configs/" + dir + " 2>&1",
                                  &status);
    EXPECT_NE(status, 0) << dir;
    EXPECT_NE(out.find("error (config)"), std::string::npos) << dir << ": " << out;
    EXPECT_NE(out.find(needle), std::string::npos) << dir << ": " << out;
    EXPECT_EQ(out.find("safetensors"), std::string::npos) << dir << ": weights were looked for: " << out;
  }
}

}  // namespace
}  // namespace qf

namespace qf {
namespace {

// The demo tokenizer (trained with the HF `tokenizers` library) encodes the validation prompts
// exactly as that library did when tools/train wrote validation_prompts.jsonl.
TEST(DemoTokenizer, MatchesTheTrainingLibraryOnValidationPrompts) {
  Tokenizer tok = Tokenizer::load(std::string(QFLASH_SOURCE_DIR) + "/models/demo");
  EXPECT_EQ(tok.vocab_size(), 8192);
  std::ifstream f(std::string(QFLASH_SOURCE_DIR) + "/models/demo/validation_prompts.jsonl");
  std::string line;
  int n = 0;
  while (std::getline(f, line)) {
    auto j = nlohmann::json::parse(line);
    const std::string text = j["text"].get<std::string>();
    EXPECT_EQ(tok.encode(text), j["ids"].get<std::vector<int32_t>>()) << text;
    EXPECT_EQ(tok.decode(tok.encode(text)), text);
    n++;
  }
  EXPECT_EQ(n, 64);
}

}  // namespace
}  // namespace qf

namespace qf {
namespace {

// Whole validation-split files (tools/reference/demo_tokenizer_fixture.py): id for id with HF.
TEST(DemoTokenizer, MatchesHfTokenizersOnValidationSplitFiles) {
  Tokenizer tok = Tokenizer::load(std::string(QFLASH_SOURCE_DIR) + "/models/demo");
  std::ifstream f(std::string(QFLASH_SOURCE_DIR) + "/tests/fixtures/tokenizer/demo_validation.json");
  auto j = nlohmann::json::parse(f);
  ASSERT_GT(j["files"].size(), 0u);
  for (const auto& file : j["files"]) {
    const std::string text = file["text"].get<std::string>();
    EXPECT_EQ(tok.encode(text), file["ids"].get<std::vector<int32_t>>()) << file["path"];
  }
}

}  // namespace
}  // namespace qf

namespace qf {
namespace {

// On the trained weights, qflash's greedy continuation equals transformers' (fp32, uncached) —
// tools/reference/demo_greedy_fixture.py; the smallest top-1/top-2 margin is recorded per case.
TEST(DemoParity, GreedyMatchesTransformers) {
  std::ifstream f(std::string(QFLASH_SOURCE_DIR) + "/tests/fixtures/target/demo_greedy.json");
  auto j = nlohmann::json::parse(f);
  auto be = make_cpu_backend();
  auto m = Qwen38Model::load(demo_dir(), be.get(), 16);
  for (const auto& c : j["cases"]) {
    const auto want = c["greedy"].get<std::vector<int32_t>>();
    Generator g(*m, nullptr, 512);
    GenerateOptions o;
    o.max_new_tokens = static_cast<int>(want.size());
    std::vector<int32_t> got;
    g.generate(c["prompt_ids"].get<std::vector<int32_t>>(), o, [&](int32_t t) {
      got.push_back(t);
      return true;
    });
    EXPECT_EQ(got, want) << "min margin " << c["min_margin"];
  }
}

}  // namespace
}  // namespace qf

namespace qf {
namespace {

// `qflash bench` runs end to end (real acceptance on two prompts, and forced acceptance on a
// synthetic model) and writes the documented JSON.
TEST(DemoCli, BenchWritesItsReport) {
  int s;
  const std::string json = ::testing::TempDir() + "/qflash_bench.json";
  shell(qflash_bin() + " bench --device cpu --prompts " + demo_dir() + "/validation_prompts.jsonl --n-prompts 2 --gen 8 --reps 2 --json " +
            json + " >/dev/null 2>&1",
        &s);
  ASSERT_EQ(s, 0);
  std::ifstream f(json);
  auto j = nlohmann::json::parse(f);
  EXPECT_GT(j["copy_ceiling_gbps"].get<double>(), 0);
  EXPECT_GT(j["ops"]["decode_ms"].get<double>(), 0);
  EXPECT_TRUE(j["ops"].contains("verify8_over_decode"));
  EXPECT_TRUE(j["ops"].contains("dflash2_draft_over_decode"));
  ASSERT_EQ(j["runs"].size(), 3u);  // plain, mtp, dflash2
  for (const auto& r : j["runs"]) EXPECT_GE(r["tau"].get<double>(), 1.0);
  // The bench's real-acceptance tau is the round loop's on those very prompts (their `ids`).
  {
    auto be = make_cpu_backend();
    auto m = Qwen38Model::load(demo_dir(), be.get(), 16);
    DFlashDraftSource dfl(DFlash2Drafter::load(demo_dir() + "/drafter", *m));
    double tau = 0;
    for (const auto& p : validation_prompts(2)) {
      Generator g(*m, &dfl, 4096);
      GenerateOptions o;
      o.max_new_tokens = 8;
      o.draft_k = dfl.default_k();  // the bench's fixed-k run (without --adaptive)
      tau += g.generate(p, o, nullptr).tau();
    }
    EXPECT_DOUBLE_EQ(j["runs"][2]["tau"].get<double>(), tau / 2);
  }

  const std::string cfg = std::string(QFLASH_SOURCE_DIR) + "/tests/fixtures/configs/";
  shell(qflash_bin() + " bench --device cpu --synthetic " + cfg + "qwen38_tiny_text/config.json --synthetic-drafter " + cfg +
            "dflash2_tiny/config.json --force-accept 0,7 --gen 24 --reps 2 --no-mtp --json " + json + " >/dev/null 2>&1",
        &s);
  ASSERT_EQ(s, 0);
  std::ifstream f2(json);
  auto k = nlohmann::json::parse(f2);
  ASSERT_EQ(k["runs"].size(), 3u);  // plain, dflash2 forced 0, dflash2 forced 7
  EXPECT_EQ(k["runs"][1]["tau"].get<double>(), 1.0);
  EXPECT_GT(k["runs"][2]["tau"].get<double>(), 6.0);  // 7 forced + bonus, last rounds shorter
}

}  // namespace
}  // namespace qf

namespace qf {
namespace {

// --trace writes one JSON line per round; QFLASH_STATS=1 prints the table to stderr.
TEST(DemoCli, TraceAndStatsFromTheEnvironment) {
  int s;
  const std::string trace = ::testing::TempDir() + "/qflash_trace.jsonl";
  const std::string json = ::testing::TempDir() + "/qflash_trace_stats.json";
  const std::string err = shell("QFLASH_STATS=1 " + qflash_bin() + " run --device cpu --prompt 'import re\n' --max-tokens 40 --trace " +
                                    trace + " --stats-json " + json + " 2>&1 >/dev/null",
                                &s);
  ASSERT_EQ(s, 0) << err;
  EXPECT_NE(err.find("tau"), std::string::npos) << err;
  EXPECT_NE(err.find("accept profile"), std::string::npos) << err;
  std::ifstream st(json);
  auto stats = nlohmann::json::parse(st);
  std::ifstream f(trace);
  std::string line;
  int rounds = 0, emitted = 1;  // the first token comes from prefill
  while (std::getline(f, line)) {
    auto j = nlohmann::json::parse(line);
    for (const char* k : {"pos", "drafts", "accepted", "bonus"}) EXPECT_TRUE(j.contains(k)) << line;
    EXPECT_LE(j["accepted"].get<int>(), static_cast<int>(j["drafts"].size()));
    emitted += j["accepted"].get<int>() + 1;
    rounds++;
  }
  EXPECT_EQ(rounds, stats["rounds"].get<int>());
  EXPECT_GE(emitted, stats["generated_tokens"].get<int>());  // the last round may be cut by max-tokens
}

}  // namespace
}  // namespace qf

namespace qf {
namespace {

// qflash chat reads turns from stdin until an empty line, answers each, and exits 0.
TEST(DemoCli, ChatAnswersEachTurn) {
  int s;
  const std::string out = shell("printf 'hello\\nmore\\n\\n' | " + qflash_bin() +
                                    " chat --device cpu --max-tokens 8 --no-think --stats 2>&1",
                                &s);
  EXPECT_EQ(s, 0) << out;
  size_t n = 0;
  for (size_t pos = out.find(" tokens, tau"); pos != std::string::npos; pos = out.find(" tokens, tau", pos + 1)) n++;
  EXPECT_EQ(n, 2u) << out;  // one stats line per answered turn
}

// qflash chat continues each turn from the previous turn's prompt state (the prefix cache): the
// second turn prefills only what is new, and its reply is byte for byte the reply of a session
// without the cache, which prefills the whole conversation every turn.
TEST(DemoCli, ChatSecondTurnResumesAndEqualsAFullPrefill) {
  std::string system;
  for (int i = 0; i < 10; i++) system += "Answer in Python. Rule " + std::to_string(i) + ": keep functions short. ";
  const std::string input = "printf 'def add(a, b):\\nwrite a test for it\\n\\n' | ";
  const std::string chat = qflash_bin() + " chat --device cpu --max-tokens 16 --no-think --stats --system '" + system + "'";
  const std::string err_cached = ::testing::TempDir() + "/chat_cached.err";
  int s1, s2;
  const std::string cached = shell(input + chat + " 2>" + err_cached, &s1);
  const std::string fresh = shell(input + chat + " --prefix-cache-mb 0 2>/dev/null", &s2);
  EXPECT_EQ(s1, 0);
  EXPECT_EQ(s2, 0);
  EXPECT_FALSE(cached.empty());
  EXPECT_EQ(cached, fresh) << "the replies with and without prefix reuse differ";
  int s3;
  const std::string err = shell("cat " + err_cached, &s3);
  // Turn 1 reuses nothing; turn 2 at least the system prompt's first 64 tokens, in whole blocks.
  std::vector<int> reused;
  const std::regex re("prompt ([0-9]+) tokens, ([0-9]+) reused");
  for (std::sregex_iterator it(err.begin(), err.end(), re), end; it != end; ++it) reused.push_back(std::stoi((*it)[2]));
  ASSERT_EQ(reused.size(), 2u) << err;
  EXPECT_EQ(reused[0], 0) << err;
  EXPECT_GE(reused[1], 64) << err;
  EXPECT_EQ(reused[1] % 64, 0) << err;
}

}  // namespace
}  // namespace qf
