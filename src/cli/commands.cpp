// The qflash command line: subcommands, the flags shared with the other front ends, and the
// parse + validate step that main() and the tests share.
#include "cli/commands.h"

#include <algorithm>

#include "core/error.h"
#include "io/quantize.h"

namespace qf::cli {

void add_engine_flags(CLI::App* c, EngineOptions& o) {
  c->add_option("--model", o.model_dir, "model folder (default: the demo pair; env QFLASH_MODEL)");
  c->add_option("--draft", o.draft, "auto | none | mtp | PATH to a DFlash2 drafter (env QFLASH_DRAFT)");
  c->add_option("--device", o.device, "auto | cpu | cuda");
  c->add_option("--max-context", o.max_context, "positions allocated for prompt + new tokens");
  c->add_option_function<std::string>(
      "--prefill-chunk", [&o](const std::string& r) { o.prefill_rows = parse_prefill_rows(r); },
      "prompt rows per prefill forward: auto (default: on a GPU the largest of 8192/4096/2048/1024 that fits, "
      "4096 at most with int4 weights; 4096 on the CPU) or a multiple of 64; 0 = the decode forward");
  c->add_option("--weights", o.weights, "bf16 (as stored) | int4 (quantize at load, cached beside the checkpoint)");
  c->add_option("--lm-head", o.lm_head, "with --weights int4: int4 (default) | bf16 lm_head");
}

void add_prefix_cache_flag(CLI::App* c, EngineOptions& o) {
  o.prefix_cache_mb = kDefaultPrefixCacheMb;
  c->add_option("--prefix-cache-mb", o.prefix_cache_mb,
                "MiB of device memory for prompt-prefix snapshots reused by later requests (default " +
                    std::to_string(kDefaultPrefixCacheMb) + "; 0 = off)");
}

void add_generation_flags(CLI::App* c, GenerationOptions& o) {
  c->add_option("--max-tokens", o.max_tokens, "new tokens to generate");
  c->add_option("--temperature", o.temperature, "0 = greedy (default); > 0 samples, lossless in distribution");
  c->add_option("--top-k", o.top_k, "keep the k most likely tokens (0 = off); shapes the target's p only");
  c->add_option("--top-p", o.top_p, "nucleus sampling threshold (1 = off)");
  // As text: a negative or oversized seed gets the shared message, not CLI11's.
  c->add_option_function<std::string>(
      "--seed", [&o](const std::string& s) { o.seed = parse_seed(s); }, "random seed for sampling");
  c->add_option_function<std::string>(
      "--draft-k", [&o](const std::string& k) { o.draft_k = parse_draft_k(k); },
      "auto (default: picked each round, 0 = a plain step) or drafts per round (MTP up to 8, DFlash2 up to block-1)");
  c->add_flag("--ignore-eos", o.ignore_eos, "do not stop at end-of-sequence tokens");
  c->add_option("--stop-id", o.stop_ids, "extra token id that ends generation (repeatable)");
}

CommandLine::CommandLine() {
  app.name("qflash");
  app.require_subcommand(1);
  app.add_flag("-v,--verbose", verbose, "debug logging on stderr");
  app.add_flag("-q,--quiet", quiet, "no logging on stderr");

  run_cmd = app.add_subcommand("run", "generate text from a prompt (greedy unless --temperature > 0)");
  add_run_options(run_cmd, run);

  chat_cmd = app.add_subcommand("chat", "interactive ChatML conversation on stdin/stdout");
  add_chat_options(chat_cmd, chat);

  tok_cmd = app.add_subcommand("tokenize", "print the token ids of a text as a JSON array");
  tok_cmd->add_option("--tokenizer", tokenize.tokenizer, "tokenizer.json or a model folder")->required();
  auto* tg = tok_cmd->add_option_group("input");
  tg->add_option("--text", tokenize.text, "text to encode");
  tg->add_option("--file", tokenize.file, "file to encode");
  tg->require_option(1);
  tok_cmd->add_flag("--no-special", tokenize.no_special, "treat special-token strings as plain text");

  bench_cmd = app.add_subcommand("bench", "measure decode / verify / draft speed (plain, MTP, DFlash2)");
  add_bench_options(bench_cmd, bench);

  quant_cmd = app.add_subcommand("quantize", "write an int4 (group-affine, mlx layout) copy of a checkpoint");
  quant_cmd->add_option("--model", quantize.model, "source checkpoint folder")->required();
  quant_cmd->add_option("--out", quantize.out, "new output folder (must not exist or be empty)")->required();
  quant_cmd->add_option("--group", quantize.group, "group size: 32, 64 (default) or 128");
  quant_cmd->add_flag("--keep-head", quantize.keep_head, "keep embed_tokens and lm_head in bf16");

  insp_cmd = app.add_subcommand("inspect", "print a checkpoint's config summary, tensors and guard results");
  insp_cmd->add_option("dir", inspect_dir, "model (or drafter) folder")->required();
}

void parse_command_line(CommandLine& cl, std::vector<std::string> args) {
  std::reverse(args.begin(), args.end());  // CLI11 consumes the vector from its back
  cl.app.parse(args);
  if (cl.run_cmd->parsed()) {
    validate_engine_options(cl.run.engine);
    validate_generation_options(cl.run.gen);
  }
  if (cl.chat_cmd->parsed()) {
    validate_engine_options(cl.chat.engine);
    validate_generation_options(cl.chat.gen);
  }
  if (cl.bench_cmd->parsed()) validate_bench_args(cl.bench);
  if (cl.quant_cmd->parsed()) {
    QuantizeOptions q;
    q.group = cl.quantize.group;
    validate_quantize_options(q);
  }
}

}  // namespace qf::cli
