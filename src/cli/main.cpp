// qflash command line: run, chat, tokenize, inspect, bench, quantize. Generated text (and only
// that) goes to stdout; logs, progress and statistics go to stderr. Exit status: 0, 1 (error),
// 2 (usage error: anything CLI11 or the option validators reject), as docs/CLI.md says.
#include <cstdio>

#include "cli/commands.h"
#include "core/error.h"
#include "core/log.h"

int main(int argc, char** argv) {
  qf::cli::CommandLine cl;
  try {
    qf::cli::parse_command_line(cl, std::vector<std::string>(argv + 1, argv + argc));
  } catch (const CLI::ParseError& e) {
    // --help prints and exits 0; CLI11's own codes for the rest are 100+: a usage error is 2.
    if (e.get_exit_code() == 0) return cl.app.exit(e);
    std::fprintf(stderr, "qflash: error (usage): %s\nRun 'qflash --help' or 'qflash <command> --help' for the options.\n",
                 e.what());
    return 2;
  } catch (const qf::Error& e) {
    std::fprintf(stderr, "qflash: error (%s): %s\n", qf::error_kind_name(e.kind()), e.what());
    return e.kind() == qf::ErrorKind::Usage ? 2 : 1;
  }
  qf::set_log_level(cl.quiet ? qf::LogLevel::Quiet : cl.verbose ? qf::LogLevel::Debug : qf::LogLevel::Info);
  try {
    if (cl.run_cmd->parsed()) return qf::cli::cmd_run(cl.run);
    if (cl.tok_cmd->parsed()) return qf::cli::cmd_tokenize(cl.tokenize);
    if (cl.chat_cmd->parsed()) return qf::cli::cmd_chat(cl.chat);
    if (cl.insp_cmd->parsed()) return qf::cli::cmd_inspect(cl.inspect_dir);
    if (cl.bench_cmd->parsed()) return qf::cli::cmd_bench(cl.bench);
    if (cl.quant_cmd->parsed()) return qf::cli::cmd_quantize(cl.quantize);
  } catch (const qf::Error& e) {
    std::fprintf(stderr, "qflash: error (%s): %s\n", qf::error_kind_name(e.kind()), e.what());
    return e.kind() == qf::ErrorKind::Usage ? 2 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "qflash: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
