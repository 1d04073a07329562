// qflash public C++ API: load a model pair, generate, read statistics. Nothing here throws:
// every call that can fail returns a Status (the library's typed errors become its message).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace qflash {

struct Status {
  bool ok = true;
  std::string kind;     // "io", "format", "config", "tensor", "tokenizer", "usage", "backend", "internal"
  std::string message;  // names the file / tensor / field, expected and found
  explicit operator bool() const { return ok; }
};

// The ranges are the CLI's and the server's (docs/CLI.md); a bad value gives the same message
// through every front end: "<parameter>: expected <range>, found <value>" (kind "usage").
struct LoadOptions {
  std::string model_dir;       // empty: the demo pair (QFLASH_MODEL, else the source tree's models/demo)
  std::string draft = "auto";  // auto | none | mtp | path to a DFlash2 / DFlash drafter
  std::string device = "auto";  // auto | cpu | cuda
  int max_context = 4096;      // positions for prompt + generated tokens, 2..1048576
  std::string weights = "bf16";  // bf16 (as stored) | int4 (quantized at load, cached beside the checkpoint)
  std::string lm_head = "int4";  // with weights int4: int4 | bf16
};

struct GenerateRequest {
  std::string prompt;
  bool chat = false;           // wrap as a ChatML user turn with the generation prompt
  bool thinking = true;        // with chat: open a <think> block (false: empty think block)
  int max_tokens = 128;        // 1..1048576, and prompt + max_tokens <= max_context
  float temperature = 0.0f;    // 0 = greedy; 0..100
  float top_p = 1.0f;          // (0, 1]
  int top_k = 0;               // 0 = off
  uint64_t seed = 0;
  std::optional<int> draft_k;  // drafts per round; unset = auto (picked each round, 0 = plain step)
  bool ignore_eos = false;     // do not stop at the model's end tokens
  std::vector<int> stop_ids;   // extra token ids that end generation
};

// The checks load() and generate() run first, without a model (generate() also checks draft_k,
// stop_ids and the prompt length against the loaded model).
Status validate(const LoadOptions& opt);
Status validate(const GenerateRequest& req);

struct GenerateResult {
  std::string text;
  std::string stats_json;  // the --stats-json object: draft, rounds, tau, accept_profile, ...
};

class Model {
 public:
  static Status load(const LoadOptions& opt, std::unique_ptr<Model>* out);
  ~Model();
  // Streams decoded text pieces (never a broken UTF-8 sequence); return false to stop early.
  Status generate(const GenerateRequest& req, GenerateResult* out,
                  const std::function<bool(std::string_view)>& on_text = nullptr);
  std::string draft_source() const;  // "none", "mtp", "dflash2", "dflash"
  std::string backend() const;       // "cpu", "cuda"

 private:
  Model();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace qflash
