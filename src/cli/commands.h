#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/options.h"

namespace qf::cli {

// The flags every front end shares, bound to the shared option structs (runtime/options.h):
// --model --draft --device --max-context --weights --lm-head, and --max-tokens --temperature --top-k --top-p
// --seed --draft-k --ignore-eos --stop-id. No range checks here: validate_*_options does them,
// so the CLI's messages are the API's and the server's. qflash-server uses add_engine_flags too.
void add_engine_flags(CLI::App* c, EngineOptions& o);
// --prefix-cache-mb, defaulting to kDefaultPrefixCacheMb (qflash chat, qflash-server).
void add_prefix_cache_flag(CLI::App* c, EngineOptions& o);
void add_generation_flags(CLI::App* c, GenerationOptions& o);

struct RunArgs {
  EngineOptions engine;
  GenerationOptions gen;
  std::string prompt, prompt_file, stats_json, trace;
  bool chat = false, no_think = false, stats = false;
};
void add_run_options(CLI::App* cmd, RunArgs& a);
int cmd_run(const RunArgs& a);

struct TokenizeArgs {
  std::string tokenizer, text, file;
  bool no_special = false;
};
int cmd_tokenize(const TokenizeArgs& a);
int cmd_inspect(const std::string& dir);

struct BenchArgs {
  std::string model, synthetic, synthetic_drafter, drafter, device = "auto", force_accept = "0,2,4,7", prompts, json;
  std::string weights = "bf16", lm_head = "int4";  // as EngineOptions
  int prompt_len = 64, reps = 20, n_prompts = 64;
  int64_t gen = 128, mtp_k = 3, max_context = 4096;  // validated as max_tokens, draft_k, max_context
  int64_t prefill_chunk = kPrefillRowsAuto;                      // validated as prefill_rows
  // --prefix-turn2 N > 0: time a second turn of N new tokens with and without prefix reuse
  // (bench_prefix.cpp) instead of the op and decode timings.
  int64_t prefix_turn2 = 0, prefix_cache_mb = kDefaultPrefixCacheMb;
  // Sampling of the end-to-end runs (validated as temperature and seed): 0 = greedy. Prompt i of
  // a run is sampled with seed + i, the same in every run, so plain, fixed k and auto see the same
  // draws' seeds. T > 0 needs real acceptance (--prompts or --real): forcing is greedy-only.
  double temperature = 0.0;
  uint64_t seed = 0;
  bool real = false, mtp = true, profile = false, ops_only = false, adaptive = false, warmup = true;
};
void add_bench_options(CLI::App* cmd, BenchArgs& a);
// Throws qf::Error(Usage) for a bad value (through the shared validators where a flag is one).
void validate_bench_args(const BenchArgs& a);
int cmd_bench(const BenchArgs& a);

struct ChatArgs {
  ChatArgs() {
    engine.max_context = 8192;
    gen.max_tokens = 512;
  }
  EngineOptions engine;
  GenerationOptions gen;
  std::string system;
  bool no_think = false, stats = false;
};
void add_chat_options(CLI::App* cmd, ChatArgs& a);
int cmd_chat(const ChatArgs& a);

struct QuantizeArgs {
  std::string model, out;
  int64_t group = 64;
  bool keep_head = false;
};
int cmd_quantize(const QuantizeArgs& a);

// The whole command line: every subcommand and its arguments.
struct CommandLine {
  CommandLine();
  CommandLine(const CommandLine&) = delete;
  CommandLine& operator=(const CommandLine&) = delete;
  CLI::App app{"qflash: Qwen 3.8 inference with lossless DFlash2 / MTP speculative decoding"};
  bool verbose = false, quiet = false;
  RunArgs run;
  ChatArgs chat;
  TokenizeArgs tokenize;
  BenchArgs bench;
  QuantizeArgs quantize;
  std::string inspect_dir;
  CLI::App *run_cmd, *chat_cmd, *tok_cmd, *bench_cmd, *quant_cmd, *insp_cmd;
};

// Parses the arguments (without the program name) and validates the chosen subcommand's
// options. Throws CLI::ParseError for what CLI11 rejects (unknown flag, missing or malformed
// value, --help) and qf::Error(Usage) for what the shared validators reject.
void parse_command_line(CommandLine& cl, std::vector<std::string> args);

std::string read_file_or_throw(const std::string& path);

}  // namespace qf::cli
