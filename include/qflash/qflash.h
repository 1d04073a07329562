// qflash public C++ API: load a model pair, generate, read statistics. Nothing here throws:
// every call that can fail returns a Status (the library's typed errors become its message).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace qflash {

struct Status {
  bool ok = true;
  std::string kind;     // "io", "format", "config", "tensor", "tokenizer", "usage", "backend", "internal"
  std::string message;  // names the file / tensor / field, expected and found
  explicit operator bool() const { return ok; }
};

struct LoadOptions {
  std::string model_dir;       // empty: the demo pair (QFLASH_MODEL, else the source tree's models/demo)
  std::string draft = "auto";  // auto | none | mtp | path to a DFlash2 / DFlash drafter
  std::string device = "auto";  // auto | cpu | cuda
  int max_context = 4096;
};

struct GenerateRequest {
  std::string prompt;
  bool chat = false;           // wrap as a ChatML user turn with the generation prompt
  bool thinking = true;        // with chat: open a <think> block (false: empty think block)
  int max_tokens = 128;
  float temperature = 0.0f;    // 0 = greedy
  float top_p = 1.0f;
  int top_k = 0;
  uint64_t seed = 0;
};

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
