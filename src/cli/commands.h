#pragma once
#include <cstdint>
#include <string>

namespace CLI {
class App;
}

namespace qf::cli {

struct RunArgs {
  std::string model, prompt, prompt_file, draft = "auto", device = "auto", stats_json, trace;
  int max_tokens = 128, draft_k = -1, max_context = 4096, top_k = 0;
  float temperature = 0.0f, top_p = 1.0f;
  uint64_t seed = 0;
  bool chat = false, no_think = false, stats = false, no_stop = false;
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
  int prompt_len = 64, gen = 128, reps = 20, mtp_k = 3, n_prompts = 64, max_context = 4096;
  bool real = false, mtp = true, profile = false, ops_only = false;
};
void add_bench_options(CLI::App* cmd, BenchArgs& a);
int cmd_bench(const BenchArgs& a);

struct ChatArgs {
  std::string model, draft = "auto", device = "auto", system;
  int max_tokens = 512, max_context = 8192;
  float temperature = 0.0f;
  uint64_t seed = 0;
  bool no_think = false, stats = false;
};
void add_chat_options(CLI::App* cmd, ChatArgs& a);
int cmd_chat(const ChatArgs& a);

struct QuantizeArgs {
  std::string model, out;
  int group = 64;
  bool keep_head = false;
};
int cmd_quantize(const QuantizeArgs& a);

std::string read_file_or_throw(const std::string& path);

}  // namespace qf::cli
