// What the CLI, the server and the public API drive: a backend, the target, its tokenizer, an
// optional draft source, and the round loop, selected from validated options (runtime/options.h).
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "model/qwen38.h"
#include "runtime/draft_source.h"
#include "runtime/generate.h"
#include "runtime/options.h"
#include "tokenizer/tokenizer.h"

namespace qf {

// The folder `qflash run` uses when --model is absent.
std::string default_model_dir();
// Resolves --draft auto: QFLASH_DFLASH2_DIR, else <model>/drafter, else "mtp" when the
// checkpoint has an MTP head, else "none". QFLASH_DRAFT overrides the default "auto".
std::string resolve_draft(const std::string& requested, const std::string& model_dir, bool has_mtp);

struct MemoryEstimate;

// What a GPU load checks before any weight is uploaded, in this order: the drafter's pairing
// guards (config.json alone: a mismatched drafter gets the mismatch message, not a file or
// memory error), then `fit` with the estimate from the safetensors headers of the target and,
// only once its guards passed, of the drafter. `opt` must be validated.
void check_before_upload(const std::string& model_dir, const EngineOptions& opt,
                         const std::function<void(const MemoryEstimate&)>& fit);

class Engine {
 public:
  // Validates `opt` (validate_engine_options) before anything is opened.
  static std::unique_ptr<Engine> create(const EngineOptions& opt);
  const Tokenizer& tokenizer() const { return *tok_; }
  Qwen38Model& target() { return *target_; }
  Backend& backend() { return *be_; }
  DraftSource* source() { return source_.get(); }
  // The prefix cache (EngineOptions::prefix_cache_mb > 0), else null.
  PrefixCache* prefix_cache() { return cache_.get(); }
  const std::string& draft_name() const { return draft_; }
  const std::string& model_dir() const { return model_dir_; }
  GenStats generate(const std::vector<int32_t>& prompt, const GenerateOptions& g, const TokenCallback& cb,
                    const RoundCallback& rc = nullptr) {
    return gen_->generate(prompt, g, cb, rc);
  }
  // Validates `o` against this engine (validate_generation_options with limits() and the prompt
  // length) and maps it onto the round loop's options, stop ids included.
  GenerateOptions generate_options(const GenerationOptions& o, int64_t prompt_tokens) const;
  GenerationLimits limits() const;
  // generate() with validated options and the tokens decoded to text: `on_text` gets each piece
  // (never a broken UTF-8 sequence; ids without text, i.e. padded vocabulary rows, are skipped
  // with one warning).
  GenStats generate_text(const std::vector<int32_t>& prompt, const GenerationOptions& o,
                         const std::function<bool(const std::string&)>& on_text, const RoundCallback& rc = nullptr);
  // The stop ids of this model: the tokenizer's eos ids plus the config's eos_token_id.
  std::vector<int32_t> stop_ids() const;
  // Before the first request (the server calls it): records the graphs of every round shape
  // (Generator::warm_up) on a short prompt, so that no request pays for them. Returns the
  // milliseconds taken; 0 on a backend without graphs (nothing runs).
  double warm_up();

 private:
  std::unique_ptr<Backend> be_;
  std::unique_ptr<Tokenizer> tok_;
  std::unique_ptr<Qwen38Model> target_;
  std::unique_ptr<DraftSource> source_;
  std::unique_ptr<PrefixCache> cache_;  // before gen_: the generator points at it
  std::unique_ptr<Generator> gen_;
  std::string draft_, model_dir_;
  EngineOptions opt_;
};

std::unique_ptr<Backend> make_backend(const std::string& device);
// --weights / --lm-head as the loaders take them.
WeightOptions weight_options(const EngineOptions& opt);

}  // namespace qf
