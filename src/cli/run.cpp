#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "core/log.h"
#include "io/safetensors.h"
#include "runtime/engine.h"

namespace qf::cli {

std::string read_file_or_throw(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(ErrorKind::Io, "cannot open '%s'", path.c_str());
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

void add_run_options(CLI::App* c, RunArgs& a) {
  c->add_option("--model", a.model, "model folder (default: the demo pair; env QFLASH_MODEL)");
  auto* g = c->add_option_group("prompt");
  g->add_option("--prompt", a.prompt, "prompt text");
  g->add_option("--prompt-file", a.prompt_file, "file holding the prompt");
  g->require_option(1);
  c->add_option("--max-tokens", a.max_tokens, "new tokens to generate (default 128)")->check(CLI::Range(0, 1 << 24));
  c->add_flag("--chat", a.chat, "wrap the prompt in the ChatML template as a user turn");
  c->add_flag("--no-think", a.no_think, "with --chat: thinking off (empty <think></think> block)");
  c->add_option("--draft", a.draft, "auto | none | mtp | PATH to a DFlash2 drafter (env QFLASH_DRAFT)");
  c->add_option("--draft-k", a.draft_k, "drafts per round (MTP 1..8, default 3; DFlash2 up to block-1)")
      ->check(CLI::Range(1, 16));
  c->add_option("--device", a.device, "auto | cpu | cuda");
  c->add_option("--max-context", a.max_context, "positions to allocate (prompt + new tokens)")
      ->check(CLI::Range(2, 1 << 20));
  c->add_flag("--stats", a.stats, "print acceptance and speed statistics to stderr (env QFLASH_STATS=1)");
  c->add_option("--stats-json", a.stats_json, "write the statistics as one JSON object to this file");
  c->add_option("--trace", a.trace, "write one JSON line per round (pos, drafts, accepted, bonus)");
  c->add_flag("--ignore-eos", a.no_stop, "do not stop at end-of-sequence tokens");
  c->add_option("--temperature", a.temperature, "0 = greedy (default); > 0 samples, lossless in distribution")
      ->check(CLI::Range(0.0f, 100.0f));
  c->add_option("--top-k", a.top_k, "keep the k most likely tokens (0 = off); shapes the target's p only")
      ->check(CLI::Range(0, 1 << 24));
  c->add_option("--top-p", a.top_p, "nucleus sampling threshold (1 = off)")->check(CLI::Range(0.0f, 1.0f));
  c->add_option("--seed", a.seed, "random seed for sampling");
}

int cmd_run(const RunArgs& a) {
  EngineOptions eo;
  eo.model_dir = a.model;
  eo.draft = a.draft;
  eo.device = a.device;
  eo.max_context = a.max_context;
  std::string prompt = a.prompt_file.empty() ? a.prompt : read_file_or_throw(a.prompt_file);
  auto engine = Engine::create(eo);
  if (a.chat) prompt = chat_render({{"user", prompt, ""}}, true, !a.no_think);
  std::vector<int32_t> ids = engine->tokenizer().encode(prompt);
  if (static_cast<int>(ids.size()) + a.max_tokens > a.max_context)
    fail(ErrorKind::Usage, "prompt (%zu tokens) + --max-tokens %d exceed --max-context %d", ids.size(),
         a.max_tokens, a.max_context);
  GenerateOptions go;
  go.max_new_tokens = a.max_tokens;
  go.draft_k = a.draft_k;
  go.sampling.temperature = a.temperature;
  go.sampling.top_k = a.top_k;
  go.sampling.top_p = a.top_p;
  go.sampling.seed = a.seed;
  if (!a.no_stop) go.stop_ids = engine->stop_ids();

  FILE* trace = nullptr;
  if (!a.trace.empty()) {
    trace = std::fopen(a.trace.c_str(), "w");
    if (!trace) fail(ErrorKind::Io, "cannot write --trace file '%s'", a.trace.c_str());
  }
  RoundCallback on_round = nullptr;
  if (trace)
    on_round = [&](int pos, const std::vector<int32_t>& drafts, int acc, int32_t bonus) {
      nlohmann::json j = {{"pos", pos}, {"drafts", drafts}, {"accepted", acc}, {"bonus", bonus}};
      std::fprintf(trace, "%s\n", j.dump().c_str());
    };
  GenStats st = engine->generate_text(ids, go, [](const std::string& s) {
    std::fwrite(s.data(), 1, s.size(), stdout);
    std::fflush(stdout);
    return true;
  }, on_round);
  if (trace) std::fclose(trace);
  const char* env_stats = std::getenv("QFLASH_STATS");
  if (a.stats || (env_stats && env_stats[0] == '1')) std::fprintf(stderr, "\n%s", st.to_table().c_str());
  if (!a.stats_json.empty()) write_file_atomic(a.stats_json, st.to_json() + "\n");
  return 0;
}

int cmd_tokenize(const TokenizeArgs& a) {
  Tokenizer tok = Tokenizer::load(a.tokenizer);
  std::string text = a.file.empty() ? a.text : read_file_or_throw(a.file);
  std::vector<int32_t> ids = tok.encode(text, !a.no_special);
  std::printf("%s\n", nlohmann::json(ids).dump().c_str());
  return 0;
}

}  // namespace qf::cli
