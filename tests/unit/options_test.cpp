// One validator behind every front end: each bad value, given to the CLI's parser (run and
// chat), the public API and the server (request bodies and command-line flags), is rejected with
// the same message naming the parameter, its range and the value found. No model is loaded.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/commands.h"
#include "core/error.h"
#include "qflash/qflash.h"
#include "runtime/options.h"
#include "server/request.h"

namespace qf {
namespace {

using json = nlohmann::json;

// The message a front end gives for these arguments, or "" when it accepts them.
std::string cli_error(const std::vector<std::string>& args) {
  cli::CommandLine cl;
  try {
    cli::parse_command_line(cl, args);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Usage);
    return e.what();
  } catch (const CLI::ParseError& e) {
    return std::string("CLI11 rejected it: ") + e.what();
  }
  return "";
}

std::string server_request_error(const json& body) {
  try {
    parse_completion_request(body, false, 256, 0);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Usage);
    return e.what();
  }
  return "";
}

// qflash-server's flags: the shared engine flags, then the shared validator (src/server/main.cpp).
std::string server_flags_error(const std::vector<std::string>& args) {
  CLI::App app;
  EngineOptions eo;
  cli::add_engine_flags(&app, eo);
  std::vector<std::string> rev(args.rbegin(), args.rend());
  try {
    app.parse(rev);
    validate_engine_options(eo);
  } catch (const Error& e) {
    return e.what();
  } catch (const CLI::ParseError& e) {
    return std::string("CLI11 rejected it: ") + e.what();
  }
  return "";
}

std::string api_error(const qflash::Status& s) {
  if (s) return "";
  EXPECT_EQ(s.kind, "usage") << s.message;
  return s.message;
}

struct GenCase {
  std::string flag, text;                                  // CLI flag and value
  std::optional<json> body_value;                          // the same value in a request body
  std::string body_key;                                    // its field there
  std::function<void(qflash::GenerateRequest&)> api;       // null: the API type cannot hold it
  std::string want;
};

std::vector<GenCase> generation_cases() {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::string mt = "max_tokens: expected an integer in [1, 1048576], found ";
  const std::string temp = "temperature: expected a number in [0, 100] (0 = greedy), found ";
  const std::string tk = "top_k: expected an integer in [0, 16777216] (0 = off), found ";
  const std::string tp = "top_p: expected a number in (0, 1] (1 = off), found ";
  const std::string seed = "seed: expected an integer in [0, 18446744073709551615], found ";
  const std::string dk = "draft_k: expected an integer in [1, 16], found ";
  const std::string stop = "stop_ids: expected token ids, integers in [0, 2147483647], found ";
  return {
      {"--max-tokens", "0", json(0), "max_tokens", [](auto& r) { r.max_tokens = 0; }, mt + "0"},
      {"--max-tokens", "-5", json(-5), "max_tokens", [](auto& r) { r.max_tokens = -5; }, mt + "-5"},
      {"--max-tokens", "1048577", json(1048577), "max_tokens", [](auto& r) { r.max_tokens = 1048577; }, mt + "1048577"},
      // 2^32 + 1 must not wrap to 1.
      {"--max-tokens", "4294967297", json(4294967297LL), "max_tokens", nullptr, mt + "4294967297"},
      {"--max-tokens", "4294967297", json(4294967297LL), "max_completion_tokens", nullptr, mt + "4294967297"},
      {"--temperature", "-0.5", json(-0.5), "temperature", [](auto& r) { r.temperature = -0.5f; }, temp + "-0.5"},
      {"--temperature", "101", json(101), "temperature", [](auto& r) { r.temperature = 101; }, temp + "101"},
      {"--temperature", "nan", std::nullopt, "", [nan](auto& r) { r.temperature = static_cast<float>(nan); },
       temp + "nan"},
      {"--top-k", "-1", json(-1), "top_k", [](auto& r) { r.top_k = -1; }, tk + "-1"},
      {"--top-k", "16777217", json(16777217), "top_k", [](auto& r) { r.top_k = 16777217; }, tk + "16777217"},
      {"--top-p", "0", json(0), "top_p", [](auto& r) { r.top_p = 0; }, tp + "0"},
      {"--top-p", "1.5", json(1.5), "top_p", [](auto& r) { r.top_p = 1.5f; }, tp + "1.5"},
      {"--top-p", "-0.25", json(-0.25), "top_p", [](auto& r) { r.top_p = -0.25f; }, tp + "-0.25"},
      {"--seed", "-1", json(-1), "seed", nullptr, seed + "-1"},
      {"--seed", "18446744073709551616", std::nullopt, "", nullptr, seed + "18446744073709551616"},
      {"--draft-k", "0", json(0), "draft_k", [](auto& r) { r.draft_k = 0; }, dk + "0"},
      {"--draft-k", "17", json(17), "draft_k", [](auto& r) { r.draft_k = 17; }, dk + "17"},
      {"--draft-k", "-3", json(-3), "draft_k", [](auto& r) { r.draft_k = -3; }, dk + "-3"},
      {"--stop-id", "-1", json::array({-1}), "stop_token_ids", [](auto& r) { r.stop_ids = {-1}; }, stop + "-1"},
      {"--stop-id", "2147483648", json::array({2147483648LL}), "stop_token_ids", nullptr, stop + "2147483648"},
  };
}

TEST(Options, BadGenerationValuesGetOneMessageThroughEveryFrontEnd) {
  for (const GenCase& c : generation_cases()) {
    SCOPED_TRACE(c.flag + " " + c.text);
    EXPECT_EQ(cli_error({"run", "--prompt", "x", c.flag, c.text}), c.want);
    EXPECT_EQ(cli_error({"chat", c.flag, c.text}), c.want);
    // qflash bench samples too (with real acceptance: --prompts).
    if (c.flag == "--temperature" || c.flag == "--seed")
      EXPECT_EQ(cli_error({"bench", "--prompts", "p.jsonl", c.flag, c.text}), c.want);
    if (c.body_value) {
      EXPECT_EQ(server_request_error(json{{"prompt", "x"}, {c.body_key, *c.body_value}}), c.want);
    }
    if (c.api) {
      qflash::GenerateRequest req;
      req.prompt = "x";
      c.api(req);
      EXPECT_EQ(api_error(qflash::validate(req)), c.want);
    }
  }
}

TEST(Options, BadEngineValuesGetOneMessageThroughEveryFrontEnd) {
  const std::string mc = "max_context: expected an integer in [2, 1048576], found ";
  struct Case {
    std::string flag, text;
    std::function<void(qflash::LoadOptions&)> api;
    std::string want;
  };
  const std::vector<Case> cases = {
      {"--max-context", "1", [](auto& o) { o.max_context = 1; }, mc + "1"},
      {"--max-context", "-4096", [](auto& o) { o.max_context = -4096; }, mc + "-4096"},
      {"--max-context", "1048577", [](auto& o) { o.max_context = 1048577; }, mc + "1048577"},
      {"--max-context", "4294967297", nullptr, mc + "4294967297"},
      {"--device", "gpu", [](auto& o) { o.device = "gpu"; }, "device: expected auto, cpu or cuda, found 'gpu'"},
      {"--draft", "/nonexistent/drafter", [](auto& o) { o.draft = "/nonexistent/drafter"; },
       "draft: expected auto, none, mtp or a drafter folder holding config.json, found '/nonexistent/drafter'"},
      {"--draft", "", [](auto& o) { o.draft = ""; },
       "draft: expected auto, none, mtp or a drafter folder holding config.json, found ''"},
      {"--weights", "fp8", [](auto& o) { o.weights = "fp8"; }, "weights: expected bf16 or int4, found 'fp8'"},
      {"--weights", "INT4", [](auto& o) { o.weights = "INT4"; }, "weights: expected bf16 or int4, found 'INT4'"},
      {"--lm-head", "f16", [](auto& o) { o.lm_head = "f16"; }, "lm_head: expected int4 or bf16, found 'f16'"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.flag + " " + c.text);
    EXPECT_EQ(cli_error({"run", "--prompt", "x", c.flag, c.text}), c.want);
    EXPECT_EQ(cli_error({"chat", c.flag, c.text}), c.want);
    EXPECT_EQ(server_flags_error({c.flag, c.text}), c.want);
    if (c.api) {
      qflash::LoadOptions lo;
      c.api(lo);
      EXPECT_EQ(api_error(qflash::validate(lo)), c.want);
      // load() runs the same check before it opens anything.
      std::unique_ptr<qflash::Model> m;
      EXPECT_EQ(api_error(qflash::Model::load(lo, &m)), c.want);
      EXPECT_EQ(m, nullptr);
    }
  }
}

TEST(Options, GoodValuesPassEveryFrontEnd) {
  const std::string drafter = std::string(QFLASH_SOURCE_DIR) + "/models/demo/drafter";
  EXPECT_EQ(cli_error({"run", "--prompt", "x", "--max-tokens", "1048576", "--temperature", "0.7", "--top-k", "40",
                       "--top-p", "1", "--seed", "18446744073709551615", "--draft-k", "16", "--stop-id", "0",
                       "--stop-id", "2147483647", "--max-context", "2", "--device", "cpu", "--draft", drafter}),
            "");
  EXPECT_EQ(cli_error({"chat", "--draft", "none", "--device", "cuda", "--max-context", "1048576"}), "");
  EXPECT_EQ(cli_error({"run", "--prompt", "x", "--weights", "int4", "--lm-head", "bf16"}), "");
  EXPECT_EQ(cli_error({"bench", "--weights", "int4", "--lm-head", "int4"}), "");
  EXPECT_EQ(cli_error({"bench", "--weights", "int3"}), "weights: expected bf16 or int4, found 'int3'");
  EXPECT_EQ(server_flags_error({"--weights", "int4", "--lm-head", "bf16"}), "");
  const json body = {{"prompt", "x"},  {"max_tokens", 1},    {"temperature", 100}, {"top_p", 0.01},
                     {"top_k", 0},     {"seed", 18446744073709551615ULL}, {"draft_k", 1},
                     {"ignore_eos", true}, {"stop_token_ids", {5, 6}}, {"stream", false}};
  EXPECT_EQ(server_request_error(body), "");
  const CompletionRequest r = parse_completion_request(body, false, 256, 0);
  EXPECT_EQ(r.gen.seed, 18446744073709551615ULL);
  EXPECT_EQ(r.gen.stop_ids, (std::vector<int64_t>{5, 6}));
  EXPECT_TRUE(r.gen.ignore_eos);
  // Absent and null fields take the defaults.
  const CompletionRequest d = parse_completion_request(json{{"prompt", "x"}, {"temperature", nullptr}}, false, 77, 9);
  EXPECT_EQ(d.gen.max_tokens, 77);
  EXPECT_EQ(d.gen.seed, 9u);
  EXPECT_EQ(d.gen.temperature, 0.0);
  EXPECT_FALSE(d.gen.draft_k.has_value());
  qflash::GenerateRequest req;
  req.draft_k = 16;
  EXPECT_TRUE(qflash::validate(req));
  EXPECT_TRUE(qflash::validate(qflash::LoadOptions{}));
}

// qflash bench --temperature / --seed: parsed into BenchArgs, checked by the shared validator,
// and refused with forced acceptance (which replaces the verdicts: greedy only).
TEST(Options, BenchTakesATemperatureAndASeed) {
  {
    cli::CommandLine cl;
    cli::parse_command_line(cl, {"bench", "--prompts", "p.jsonl", "--temperature", "0.8", "--seed", "18446744073709551615"});
    EXPECT_DOUBLE_EQ(cl.bench.temperature, 0.8);
    EXPECT_EQ(cl.bench.seed, 18446744073709551615ULL);
  }
  {
    cli::CommandLine cl;
    cli::parse_command_line(cl, {"bench"});
    EXPECT_EQ(cl.bench.temperature, 0.0);  // greedy unless asked
    EXPECT_EQ(cl.bench.seed, 0u);
  }
  EXPECT_EQ(cli_error({"bench", "--synthetic", "c.json", "--real", "--temperature", "1"}), "");
  const std::string forced =
      "temperature: expected 0 with forced acceptance (sampling needs real acceptance: --prompts with a model that "
      "has a tokenizer, or --real), found ";
  EXPECT_EQ(cli_error({"bench", "--temperature", "0.8"}), forced + "0.8");
  EXPECT_EQ(cli_error({"bench", "--synthetic", "c.json", "--prompts", "p.jsonl", "--temperature", "0.5"}), forced + "0.5");
  EXPECT_EQ(cli_error({"bench", "--prompts", "p.jsonl", "--temperature", "101"}),
            "temperature: expected a number in [0, 100] (0 = greedy), found 101");
  EXPECT_EQ(cli_error({"bench", "--seed", "-3"}), "seed: expected an integer in [0, 18446744073709551615], found -3");
  EXPECT_EQ(cli_error({"bench", "--prompts", "p.jsonl", "--temperature", "abc"}).rfind("CLI11 rejected it: ", 0), 0u);
}

// What only a request body can get wrong: types. The message keeps the validator's range.
TEST(Options, ServerRejectsWrongTypesWithTheSameRanges) {
  auto err = [](const json& body) { return server_request_error(body); };
  EXPECT_EQ(err({{"prompt", "x"}, {"max_tokens", 5.5}}), "max_tokens: expected an integer in [1, 1048576], found 5.5");
  EXPECT_EQ(err({{"prompt", "x"}, {"max_tokens", "5"}}), "max_tokens: expected an integer in [1, 1048576], found \"5\"");
  EXPECT_EQ(err({{"prompt", "x"}, {"max_tokens", 18446744073709551615ULL}}),
            "max_tokens: expected an integer in [1, 1048576], found 18446744073709551615");
  EXPECT_EQ(err({{"prompt", "x"}, {"top_p", "high"}}), "top_p: expected a number in (0, 1] (1 = off), found \"high\"");
  EXPECT_EQ(err({{"prompt", "x"}, {"seed", 1.5}}), "seed: expected an integer in [0, 18446744073709551615], found 1.5");
  EXPECT_EQ(err({{"prompt", "x"}, {"stream", "yes"}}), "stream: expected true or false, found \"yes\"");
  EXPECT_EQ(err({{"prompt", "x"}, {"stop_token_ids", 5}}),
            "stop_ids: expected token ids, integers in [0, 2147483647], found 5");
  EXPECT_EQ(err({{"prompt", 3}}), "prompt: expected a string, found 3");
  EXPECT_EQ(err(json::array()), "request body: expected a JSON object, found []");
  try {
    parse_completion_request(json{{"messages", json::array()}}, true, 16, 0);
    FAIL() << "empty messages accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("messages: expected a non-empty array"), std::string::npos) << e.what();
  }
}

// The checks that need a loaded model, on the limits an engine reports.
TEST(Options, LimitsOfALoadedModel) {
  GenerationLimits lim{"dflash2", 7, 8192, 4096};
  auto err = [&](const GenerationOptions& o, int64_t prompt) -> std::string {
    try {
      validate_generation_options(o, lim, prompt);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Usage);
      return e.what();
    }
    return "";
  };
  GenerationOptions o;
  o.draft_k = 7;
  EXPECT_EQ(err(o, 10), "");
  o.draft_k = 8;
  EXPECT_EQ(err(o, 10), "draft_k: expected an integer in [1, 7] (the most draft source dflash2 proposes here), found 8");
  o.draft_k = 17;  // the static range comes first
  EXPECT_EQ(err(o, 10), "draft_k: expected an integer in [1, 16], found 17");
  o.draft_k = 1;
  EXPECT_EQ(err(o, -1), "");
  lim = {"none", 0, 8192, 4096};
  EXPECT_EQ(err(o, 10), "draft_k: expected no value with draft source none (plain decoding), found 1");
  o.draft_k.reset();
  o.stop_ids = {8191};
  EXPECT_EQ(err(o, 10), "");
  o.stop_ids = {8192};
  EXPECT_EQ(err(o, 10), "stop_ids: expected token ids in [0, 8191] (the model's vocabulary), found 8192");
  o.stop_ids.clear();
  o.max_tokens = 4086;
  EXPECT_EQ(err(o, 10), "");
  o.max_tokens = 4087;
  EXPECT_EQ(err(o, 10), "max_tokens: expected at most 4086 (max_context 4096 minus the prompt's 10 tokens), found 4087");
  o.max_tokens = 1;
  EXPECT_EQ(err(o, 4096), "prompt: expected fewer than max_context 4096 tokens, found 4096 (raise max_context)");
}

TEST(Options, MaxRowsIsChecked) {
  EngineOptions e;
  e.max_rows = 0;
  EXPECT_THROW(validate_engine_options(e), Error);
  e.max_rows = 1025;
  try {
    validate_engine_options(e);
    FAIL();
  } catch (const Error& err) {
    EXPECT_STREQ(err.what(), "max_rows: expected an integer in [1, 1024], found 1025");
  }
  e.max_rows = 1;
  EXPECT_NO_THROW(validate_engine_options(e));
}

TEST(Options, PrefillRowsParsesAutoAndIntegers) {
  EXPECT_EQ(parse_prefill_rows("auto"), kPrefillRowsAuto);
  EXPECT_EQ(parse_prefill_rows("8192"), 8192);
  EXPECT_EQ(parse_prefill_rows("0"), 0);
  for (const char* bad : {"", "Auto", "8k", "4096 ", "x"}) {
    try {
      parse_prefill_rows(bad);
      ADD_FAILURE() << "'" << bad << "' accepted";
    } catch (const Error& err) {
      EXPECT_EQ(std::string(err.what()), std::string("prefill_rows: expected auto, 0 (the decode forward) or a multiple "
                                                     "of 64 in [64, 65536], found '") + bad + "'");
    }
  }
}

TEST(Options, PrefillRowsIsChecked) {
  EngineOptions e;
  EXPECT_EQ(e.prefill_rows, kPrefillRowsAuto);  // the default: chosen at load (fit.h)
  for (int64_t ok : {kPrefillRowsAuto, int64_t(0), int64_t(64), int64_t(4096), int64_t(65536)}) {
    e.prefill_rows = ok;
    EXPECT_NO_THROW(validate_engine_options(e)) << ok;
  }
  for (int64_t bad : {int64_t(-64), int64_t(-2), int64_t(100), int64_t(63), int64_t(65600)}) {
    e.prefill_rows = bad;
    try {
      validate_engine_options(e);
      ADD_FAILURE() << bad << " accepted";
    } catch (const Error& err) {
      EXPECT_EQ(std::string(err.what()),
                "prefill_rows: expected auto, 0 (the decode forward) or a multiple of 64 in [64, 65536], found " +
                    std::to_string(bad));
    }
  }
}

TEST(Options, PrefixCacheBudget) {
  EngineOptions e;
  EXPECT_EQ(e.prefix_cache_mb, 0) << "off unless a front end turns it on";
  for (int64_t ok : {int64_t(0), int64_t(1), kDefaultPrefixCacheMb, kMaxPrefixCacheMb}) {
    e.prefix_cache_mb = ok;
    EXPECT_NO_THROW(validate_engine_options(e)) << ok;
  }
  for (int64_t bad : {int64_t(-1), kMaxPrefixCacheMb + 1}) {
    e.prefix_cache_mb = bad;
    try {
      validate_engine_options(e);
      ADD_FAILURE() << bad << " accepted";
    } catch (const Error& err) {
      EXPECT_EQ(std::string(err.what()), "prefix_cache_mb: expected an integer in [0, 1048576] (MiB; 0 = off), found " +
                                             std::to_string(bad));
    }
  }
}

}  // namespace
}  // namespace qf
