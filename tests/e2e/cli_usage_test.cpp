// The binaries' usage contract (docs/CLI.md): every usage error, whether CLI11 or the shared
// option validators reject it, exits with status 2 and a message on stderr naming the
// parameter; --help exits 0; other errors exit 1. Also the checks that need the loaded demo
// model (draft_k against the draft source, stop ids, prompt + max_tokens against the context).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "support/backends.h"

namespace qf {
namespace {

struct Result {
  int status = -1;  // the exit status, or -1 when the process did not exit normally
  std::string out;  // stdout and stderr
};

Result run(const std::string& cmd) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  Result r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int w = pclose(p);
  if (WIFEXITED(w)) r.status = WEXITSTATUS(w);
  return r;
}

std::string qflash() { return std::string(QFLASH_BINARY_DIR) + "/qflash"; }

TEST(CliUsage, EveryUsageErrorExitsTwo) {
  struct Case {
    std::string args, needle;  // needle: part of the message (empty: any)
  };
  const std::vector<Case> cases = {
      {"", "error (usage): A subcommand is required"},       // no subcommand
      {"frobnicate", ""},                                     // unknown subcommand
      {"run", "prompt"},                                      // neither --prompt nor --prompt-file
      {"run --prompt x --prompt-file y", "prompt"},           // both
      {"run --prompt x --bogus", "--bogus"},                  // unknown flag
      {"run --prompt x --max-tokens", "max-tokens"},          // missing value
      {"run --prompt x --max-tokens abc", "abc"},             // not a number
      {"run --prompt x --max-tokens 4294967297", "max_tokens: expected an integer in [1, 1048576], found 4294967297"},
      {"run --prompt x --max-tokens 0", "max_tokens: expected an integer in [1, 1048576], found 0"},
      {"run --prompt x --draft-k 99", "draft_k: expected an integer in [1, 16], found 99"},
      {"run --prompt x --top-p 2", "top_p: expected a number in (0, 1] (1 = off), found 2"},
      {"run --prompt x --temperature -1", "temperature: expected"},
      {"run --prompt x --seed -1", "seed: expected"},
      {"run --prompt x --device gpu", "device: expected auto, cpu or cuda, found 'gpu'"},
      {"run --prompt x --max-context 1", "max_context: expected"},
      {"chat --max-tokens -1", "max_tokens: expected"},
      {"chat --device cpu --prefix-cache-mb -1", "prefix_cache_mb: expected an integer in [0, 1048576]"},
      {"bench --prefix-cache-mb 2000000", "prefix_cache_mb: expected"},
      {"bench --prefix-turn2 -5", "prefix_turn2: expected an integer in [0, 4095] (0 = off), found -5"},
      {"bench --prompt-len 4096", "prompt_len: expected an integer in [1, 4095] (below max_context), found 4096"},
      {"tokenize --tokenizer x", "text"},                     // no input
      {"inspect", "dir"},                                     // missing positional
      {"quantize --model a --out b --group 48", "group: expected 32, 64 or 128, found 48"},
      {"quantize --model a --out b --group 4294967328", "group: expected 32, 64 or 128, found 4294967328"},
      {"quantize --out b", "model"},                          // missing required flag
      {"bench --mtp-k 0", "draft_k: expected"},
      {"bench --force-accept 1,x", "force_accept: expected"},
      {"bench --temperature 0.8", "temperature: expected 0 with forced acceptance"},
      {"bench --prompts p.jsonl --temperature -1", "temperature: expected a number in [0, 100] (0 = greedy), found -1"},
      {"bench --seed 18446744073709551616", "seed: expected an integer in [0, 18446744073709551615]"},
  };
  for (const Case& c : cases) {
    const Result r = run(qflash() + " " + c.args);
    EXPECT_EQ(r.status, 2) << "qflash " << c.args << ":\n" << r.out;
    EXPECT_NE(r.out.find(c.needle), std::string::npos) << "qflash " << c.args << ":\n" << r.out;
  }
}

TEST(CliUsage, HelpExitsZeroAndOtherErrorsExitOne) {
  for (const char* args : {"--help", "run --help", "quantize --help"}) {
    const Result r = run(qflash() + " " + args);
    EXPECT_EQ(r.status, 0) << args << ":\n" << r.out;
    EXPECT_NE(r.out.find("Usage"), std::string::npos) << args << ":\n" << r.out;
  }
  const Result io = run(qflash() + " run --device cpu --model /nonexistent --prompt x");
  EXPECT_EQ(io.status, 1) << io.out;
  EXPECT_NE(io.out.find("error (io)"), std::string::npos) << io.out;
}

// What only the loaded demo pair can tell (DFlash2 with block 8: at most 7 drafts; vocab 8192).
TEST(CliUsage, LimitsOfTheLoadedModelAreUsageErrors) {
  const std::string run_cpu = qflash() + " run --device cpu --prompt 'import os' ";
  struct Case {
    std::string args, message;
  };
  const std::vector<Case> cases = {
      {"--draft-k 8", "draft_k: expected an integer in [1, 7] (the most draft source dflash2 proposes here), found 8"},
      {"--draft none --draft-k 3", "draft_k: expected no value with draft source none (plain decoding), found 3"},
      {"--draft mtp --draft-k 9", "draft_k: expected an integer in [1, 8] (the most draft source mtp proposes here), found 9"},
      {"--stop-id 8192", "stop_ids: expected token ids in [0, 8191] (the model's vocabulary), found 8192"},
      {"--max-context 16 --max-tokens 64", "max_tokens: expected at most "},
  };
  for (const Case& c : cases) {
    const Result r = run(run_cpu + c.args);
    EXPECT_EQ(r.status, 2) << c.args << ":\n" << r.out;
    EXPECT_NE(r.out.find("error (usage): " + c.message), std::string::npos) << c.args << ":\n" << r.out;
  }
  // In range: generates.
  const Result ok = run(run_cpu + "--draft-k 7 --max-tokens 4 --stop-id 8191 --max-context 64");
  EXPECT_EQ(ok.status, 0) << ok.out;
}

// Compiled only where CMake builds qflash-server.
#if defined(QFLASH_SERVER_BUILT)
TEST(CliUsage, ServerUsageErrorsExitTwo) {
  const std::string server = std::string(QFLASH_BINARY_DIR) + "/qflash-server";
  ASSERT_TRUE(std::filesystem::exists(server)) << server << " was configured but is missing";
  for (const auto& [args, needle] : std::vector<std::pair<std::string, std::string>>{
           {"--max-context 1", "max_context: expected an integer in [2, 1048576], found 1"},
           {"--device gpu", "device: expected auto, cpu or cuda, found 'gpu'"},
           {"--port 70000", "port: expected an integer in [0, 65535], found 70000"},
           {"--prefix-cache-mb -1", "prefix_cache_mb: expected an integer in [0, 1048576] (MiB; 0 = off), found -1"},
           {"--send-timeout 0", "send_timeout: expected a number of seconds in [0.1, 3600], found 0"},
           {"--bogus", "--bogus"}}) {
    const Result r = run(server + " " + args);
    EXPECT_EQ(r.status, 2) << args << ":\n" << r.out;
    EXPECT_NE(r.out.find(needle), std::string::npos) << args << ":\n" << r.out;
  }
  EXPECT_EQ(run(server + " --help").status, 0);
}
#endif

// On the GPU the memory-fit check reads the drafter's safetensors headers; the pairing guard
// must run first, so a mismatched drafter (a config.json without weights) gets the mismatch
// message on every device (the CPU has no fit check; it is here as the control).
class DrafterGuardOrder : public ::testing::TestWithParam<std::string> {};

TEST_P(DrafterGuardOrder, GuardFiresBeforeTheFitCheckOpensTheDrafter) {
  if (!test::make_test_backend(GetParam())) GTEST_SKIP() << "no CUDA device";
  const Result r = run(qflash() + " run --device " + GetParam() + " --max-tokens 1 --prompt x --draft " +
                       QFLASH_SOURCE_DIR + "/tests/fixtures/configs/mismatch_vocab");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("error (config)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("vocab_size 4096"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("safetensors"), std::string::npos) << "weights were looked for: " << r.out;
}

INSTANTIATE_TEST_SUITE_P(Backends, DrafterGuardOrder, ::testing::Values("cpu", "cuda"));

}  // namespace
}  // namespace qf
