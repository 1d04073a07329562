#include "runtime/options.h"

#include <cmath>
#include <filesystem>

#include "core/error.h"

namespace qf {

namespace {

std::string num(int64_t v) { return std::to_string(v); }
std::string num(double v) { return strf("%g", v); }

std::string int_range(int64_t lo, int64_t hi) { return "an integer in [" + num(lo) + ", " + num(hi) + "]"; }

void check_int(const char* name, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi) fail_option(name, expected_range(name), num(v));
}

}  // namespace

void fail_option(const std::string& name, const std::string& expected, const std::string& found) {
  fail(ErrorKind::Usage, "%s: expected %s, found %s", name.c_str(), expected.c_str(), found.c_str());
}

std::string expected_range(const std::string& n) {
  if (n == "max_tokens") return int_range(1, kMaxContextLimit);
  if (n == "temperature") return "a number in [0, " + num(kMaxTemperature) + "] (0 = greedy)";
  if (n == "top_k") return int_range(0, kMaxTopK) + " (0 = off)";
  if (n == "top_p") return "a number in (0, 1] (1 = off)";
  if (n == "seed") return "an integer in [0, 18446744073709551615]";
  if (n == "draft_k") return int_range(1, kMaxDraftK);
  if (n == "stop_ids") return "token ids, integers in [0, 2147483647]";
  if (n == "max_context") return int_range(2, kMaxContextLimit);
  if (n == "max_rows") return int_range(1, kMaxRowsLimit);
  if (n == "prefill_rows")
    return "auto, 0 (the decode forward) or a multiple of 64 in [64, " + num(kMaxPrefillRows) + "]";
  if (n == "prefix_cache_mb") return int_range(0, kMaxPrefixCacheMb) + " (MiB; 0 = off)";
  if (n == "device") return "auto, cpu or cuda";
  if (n == "draft") return "auto, none, mtp or a drafter folder holding config.json";
  if (n == "weights") return "bf16 or int4";
  if (n == "lm_head") return "int4 or bf16";
  fail(ErrorKind::Internal, "expected_range: '%s' is not an option", n.c_str());
}

void validate_engine_options(const EngineOptions& o) {
  if (o.device != "auto" && o.device != "cpu" && o.device != "cuda")
    fail_option("device", expected_range("device"), "'" + o.device + "'");
  if (o.draft != "auto" && o.draft != "none" && o.draft != "mtp") {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (o.draft.empty() || !fs::is_regular_file(fs::path(o.draft) / "config.json", ec))
      fail_option("draft", expected_range("draft"), "'" + o.draft + "'");
  }
  check_int("max_context", o.max_context, 2, kMaxContextLimit);
  check_int("max_rows", o.max_rows, 1, kMaxRowsLimit);
  if (o.prefill_rows != kPrefillRowsAuto) {
    check_int("prefill_rows", o.prefill_rows, 0, kMaxPrefillRows);
    if (o.prefill_rows % 64 != 0) fail_option("prefill_rows", expected_range("prefill_rows"), num(o.prefill_rows));
  }
  check_int("prefix_cache_mb", o.prefix_cache_mb, 0, kMaxPrefixCacheMb);
  if (o.weights != "bf16" && o.weights != "int4") fail_option("weights", expected_range("weights"), "'" + o.weights + "'");
  if (o.lm_head != "int4" && o.lm_head != "bf16") fail_option("lm_head", expected_range("lm_head"), "'" + o.lm_head + "'");
}

void validate_generation_options(const GenerationOptions& o) {
  check_int("max_tokens", o.max_tokens, 1, kMaxContextLimit);
  // Written so that NaN fails too.
  if (!(o.temperature >= 0.0 && o.temperature <= kMaxTemperature))
    fail_option("temperature", expected_range("temperature"), num(o.temperature));
  check_int("top_k", o.top_k, 0, kMaxTopK);
  if (!(o.top_p > 0.0 && o.top_p <= 1.0)) fail_option("top_p", expected_range("top_p"), num(o.top_p));
  if (o.draft_k) check_int("draft_k", *o.draft_k, 1, kMaxDraftK);
  for (int64_t id : o.stop_ids) check_int("stop_ids", id, 0, INT32_MAX);
}

void validate_generation_options(const GenerationOptions& o, const GenerationLimits& lim, int64_t prompt_tokens) {
  validate_generation_options(o);
  if (o.draft_k) {
    if (lim.max_draft_k <= 0)
      fail_option("draft_k", "no value with draft source " + lim.draft_source + " (plain decoding)", num(*o.draft_k));
    if (*o.draft_k > lim.max_draft_k)
      fail_option("draft_k",
                  int_range(1, lim.max_draft_k) + " (the most draft source " + lim.draft_source + " proposes here)",
                  num(*o.draft_k));
  }
  for (int64_t id : o.stop_ids)
    if (id >= lim.vocab_size)
      fail_option("stop_ids", "token ids in [0, " + num(lim.vocab_size - 1) + "] (the model's vocabulary)", num(id));
  if (prompt_tokens < 0) return;
  if (prompt_tokens >= lim.max_context)
    fail(ErrorKind::Usage, "prompt: expected fewer than max_context %lld tokens, found %lld (raise max_context)",
         (long long)lim.max_context, (long long)prompt_tokens);
  if (prompt_tokens + o.max_tokens > lim.max_context)
    fail_option("max_tokens",
                "at most " + num(lim.max_context - prompt_tokens) + " (max_context " + num(lim.max_context) +
                    " minus the prompt's " + num(prompt_tokens) + " tokens)",
                num(o.max_tokens));
}

uint64_t parse_seed(const std::string& text) {
  bool ok = !text.empty() && text.size() <= 20;
  for (char c : text) ok = ok && c >= '0' && c <= '9';
  // 20 digits may still exceed 2^64-1: stoull reports that as out_of_range.
  if (ok) {
    try {
      return std::stoull(text);
    } catch (const std::out_of_range&) {
    }
  }
  fail_option("seed", expected_range("seed"), text);
}

namespace {
// The whole text as one integer, else the shared message for `name` with `expected`.
int64_t parse_whole_int(const std::string& text, const char* name, const std::string& expected) {
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size()) fail_option(name, expected, "'" + text + "'");
  return v;
}
}  // namespace

std::optional<int64_t> parse_draft_k(const std::string& text) {
  if (text == "auto") return std::nullopt;
  return parse_whole_int(text, "draft_k", "auto or " + expected_range("draft_k"));
}

int64_t parse_prefill_rows(const std::string& text) {
  if (text == "auto") return kPrefillRowsAuto;
  return parse_whole_int(text, "prefill_rows", expected_range("prefill_rows"));
}

}  // namespace qf
