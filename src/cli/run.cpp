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
  add_engine_flags(c, a.engine);
  add_generation_flags(c, a.gen);
  auto* g = c->add_option_group("prompt");
  g->add_option("--prompt", a.prompt, "prompt text");
  g->add_option("--prompt-file", a.prompt_file, "file holding the prompt");
  g->require_option(1);
  c->add_flag("--chat", a.chat, "wrap the prompt in the ChatML template as a user turn");
  c->add_flag("--no-think", a.no_think, "with --chat: thinking off (empty <think></think> block)");
  c->add_flag("--stats", a.stats, "print acceptance and speed statistics to stderr (env QFLASH_STATS=1)");
  c->add_option("--stats-json", a.stats_json, "write the statistics as one JSON object to this file");
  c->add_option("--trace", a.trace, "write one JSON line per round (pos, k, drafts, accepted, bonus)");
}

int cmd_run(const RunArgs& a) {
  std::string prompt = a.prompt_file.empty() ? a.prompt : read_file_or_throw(a.prompt_file);
  auto engine = Engine::create(a.engine);
  // --chat: the prompt is message text, never parsed for special tokens.
  std::vector<int32_t> ids = a.chat ? chat_encode(engine->tokenizer(), chat_render_pieces({{"user", prompt, ""}}, {true, !a.no_think, {}, {}}))
                                    : engine->tokenizer().encode(prompt);
  engine->generate_options(a.gen, static_cast<int64_t>(ids.size()));  // usage errors before --trace is created

  FILE* trace = nullptr;
  if (!a.trace.empty()) {
    trace = std::fopen(a.trace.c_str(), "w");
    if (!trace) fail(ErrorKind::Io, "cannot write --trace file '%s'", a.trace.c_str());
  }
  RoundCallback on_round = nullptr;
  if (trace)
    on_round = [&](int pos, const std::vector<int32_t>& drafts, int acc, int32_t bonus) {
      nlohmann::json j = {{"pos", pos}, {"k", drafts.size()}, {"drafts", drafts}, {"accepted", acc}, {"bonus", bonus}};
      std::fprintf(trace, "%s\n", j.dump().c_str());
    };
  GenStats st = engine->generate_text(ids, a.gen, [](const std::string& s) {
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
