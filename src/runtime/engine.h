// What the CLI (and later the server) drives: a backend, the target, its tokenizer, an
// optional draft source, and the round loop, selected from user options.
#pragma once
#include <memory>
#include <string>

#include "backend/backend.h"
#include "model/qwen38.h"
#include "runtime/draft_source.h"
#include "runtime/generate.h"
#include "tokenizer/tokenizer.h"

namespace qf {

struct EngineOptions {
  std::string model_dir;      // empty = the demo pair (QFLASH_MODEL, else the source tree's models/demo)
  std::string draft = "auto";  // auto | none | mtp | PATH to a DFlash2/DFlash drafter folder
  std::string device = "auto";  // auto | cpu | cuda
  int max_context = 4096;       // positions allocated (prompt + generated)
  int max_rows = 64;            // rows per target forward (prefill chunk)
};

// The folder `qflash run` uses when --model is absent.
std::string default_model_dir();
// Resolves --draft auto: QFLASH_DFLASH2_DIR, else <model>/drafter, else "mtp" when the
// checkpoint has an MTP head, else "none". QFLASH_DRAFT overrides the default "auto".
std::string resolve_draft(const std::string& requested, const std::string& model_dir, bool has_mtp);

class Engine {
 public:
  static std::unique_ptr<Engine> create(const EngineOptions& opt);
  const Tokenizer& tokenizer() const { return *tok_; }
  Qwen38Model& target() { return *target_; }
  Backend& backend() { return *be_; }
  DraftSource* source() { return source_.get(); }
  const std::string& draft_name() const { return draft_; }
  const std::string& model_dir() const { return model_dir_; }
  GenStats generate(const std::vector<int32_t>& prompt, const GenerateOptions& g, const TokenCallback& cb,
                    const RoundCallback& rc = nullptr) {
    return gen_->generate(prompt, g, cb, rc);
  }
  // generate() with the tokens decoded to text: `on_text` gets each piece (never a broken UTF-8
  // sequence; ids without text, i.e. padded vocabulary rows, are skipped with one warning).
  GenStats generate_text(const std::vector<int32_t>& prompt, const GenerateOptions& g,
                         const std::function<bool(const std::string&)>& on_text, const RoundCallback& rc = nullptr);
  // The stop ids of this model: the tokenizer's eos ids plus the config's eos_token_id.
  std::vector<int32_t> stop_ids() const;

 private:
  std::unique_ptr<Backend> be_;
  std::unique_ptr<Tokenizer> tok_;
  std::unique_ptr<Qwen38Model> target_;
  std::unique_ptr<DraftSource> source_;
  std::unique_ptr<Generator> gen_;
  std::string draft_, model_dir_;
};

std::unique_ptr<Backend> make_backend(const std::string& device);

}  // namespace qf
