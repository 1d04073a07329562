// qflash command line: run, tokenize, inspect. Generated text (and only that) goes to stdout;
// logs, progress and statistics go to stderr.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "core/error.h"
#include "core/log.h"

int main(int argc, char** argv) {
  CLI::App app{"qflash: Qwen 3.8 inference with lossless DFlash2 / MTP speculative decoding"};
  app.require_subcommand(1);
  bool verbose = false, quiet = false;
  app.add_flag("-v,--verbose", verbose, "debug logging on stderr");
  app.add_flag("-q,--quiet", quiet, "no logging on stderr");

  qf::cli::RunArgs run;
  CLI::App* run_cmd = app.add_subcommand("run", "generate text from a prompt (greedy)");
  qf::cli::add_run_options(run_cmd, run);

  qf::cli::ChatArgs chat;
  CLI::App* chat_cmd = app.add_subcommand("chat", "interactive ChatML conversation on stdin/stdout");
  qf::cli::add_chat_options(chat_cmd, chat);

  qf::cli::TokenizeArgs tk;
  CLI::App* tok_cmd = app.add_subcommand("tokenize", "print the token ids of a text as a JSON array");
  tok_cmd->add_option("--tokenizer", tk.tokenizer, "tokenizer.json or a model folder")->required();
  auto* tg = tok_cmd->add_option_group("input");
  tg->add_option("--text", tk.text, "text to encode");
  tg->add_option("--file", tk.file, "file to encode");
  tg->require_option(1);
  tok_cmd->add_flag("--no-special", tk.no_special, "treat special-token strings as plain text");

  qf::cli::BenchArgs bench;
  CLI::App* bench_cmd = app.add_subcommand("bench", "measure decode / verify / draft speed (plain, MTP, DFlash2)");
  qf::cli::add_bench_options(bench_cmd, bench);

  qf::cli::QuantizeArgs qa;
  CLI::App* quant_cmd = app.add_subcommand("quantize", "write an int4 (group-affine, mlx layout) copy of a checkpoint");
  quant_cmd->add_option("--model", qa.model, "source checkpoint folder")->required();
  quant_cmd->add_option("--out", qa.out, "new output folder (must not exist or be empty)")->required();
  quant_cmd->add_option("--group", qa.group, "group size: 32, 64 (default) or 128");
  quant_cmd->add_flag("--keep-head", qa.keep_head, "keep embed_tokens and lm_head in bf16");

  std::string inspect_dir;
  CLI::App* insp_cmd = app.add_subcommand("inspect", "print a checkpoint's config summary, tensors and guard results");
  insp_cmd->add_option("dir", inspect_dir, "model (or drafter) folder")->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  qf::set_log_level(quiet ? qf::LogLevel::Quiet : verbose ? qf::LogLevel::Debug : qf::LogLevel::Info);
  try {
    if (run_cmd->parsed()) return qf::cli::cmd_run(run);
    if (tok_cmd->parsed()) return qf::cli::cmd_tokenize(tk);
    if (chat_cmd->parsed()) return qf::cli::cmd_chat(chat);
    if (insp_cmd->parsed()) return qf::cli::cmd_inspect(inspect_dir);
    if (bench_cmd->parsed()) return qf::cli::cmd_bench(bench);
    if (quant_cmd->parsed()) return qf::cli::cmd_quantize(qa);
  } catch (const qf::Error& e) {
    std::fprintf(stderr, "qflash: error (%s): %s\n", qf::error_kind_name(e.kind()), e.what());
    return e.kind() == qf::ErrorKind::Usage ? 2 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "qflash: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
