// The options a user can set, in one place: what to load (EngineOptions) and how to generate
// (GenerationOptions). Every front end (the CLI, the public C++ API, the server's flags and
// request bodies) fills these structs and calls these validators, so a bad value gets the same
// message whichever way it came in: "<parameter>: expected <range>, found <value>".
//
// Integer fields are 64-bit so that a front end can store what the user wrote without wrapping
// (max_tokens 4294967297 is reported as such, never read as 1); the engine narrows them after
// validation.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace qf {

// Bounds shared by the validators and the docs (docs/CLI.md).
inline constexpr int64_t kMaxContextLimit = int64_t(1) << 20;  // positions (the KV cache grows with it)
inline constexpr int64_t kMaxRowsLimit = 1024;                  // rows per target forward
inline constexpr int64_t kMaxPrefillRows = 65536;               // rows per prefill forward (~0.6 MB each at 27B)
inline constexpr int64_t kPrefillRowsAuto = -1;                 // EngineOptions::prefill_rows: chosen at load (fit.h)
inline constexpr int64_t kMaxDraftK = 16;                       // no supported drafter proposes more
inline constexpr int64_t kMaxTopK = int64_t(1) << 24;           // above every vocabulary
inline constexpr double kMaxTemperature = 100.0;
inline constexpr int64_t kMaxPrefixCacheMb = int64_t(1) << 20;  // 1 TiB: above any device
// A 27B snapshot holds ~150 MB of DeltaNet states plus 64 KB of K/V per token: 4 GiB keeps a
// 30k-token conversation, or a dozen of a few thousand tokens.
inline constexpr int64_t kDefaultPrefixCacheMb = 4096;

struct EngineOptions {
  std::string model_dir;         // empty = the demo pair (QFLASH_MODEL, else the source tree's models/demo)
  std::string draft = "auto";    // auto | none | mtp | PATH to a DFlash2/DFlash drafter folder
  std::string device = "auto";   // auto | cpu | cuda
  int64_t max_context = 4096;    // positions allocated (prompt + generated), 2..kMaxContextLimit
  int64_t max_rows = 64;         // rows per decode/verify forward (widest verify), 1..kMaxRowsLimit
  // Rows per prefill forward: kPrefillRowsAuto (the default: the largest chunk whose buffers fit
  // beside the weights and the cache, auto_prefill_rows in fit.h), or a multiple of 64 up to
  // kMaxPrefillRows; larger chunks run the GEMMs nearer peak and cost ~0.6 MB of buffers per row
  // at 27B (docs/DESIGN.md, "Prefill path"). 0: the prompt runs through the decode forward,
  // max_rows at a time (the fp32 function). The chunk never changes the result (prefill is
  // invariant to splits at multiples of 64).
  int64_t prefill_rows = kPrefillRowsAuto;
  // Budget of the prefix cache in MiB (runtime/prefix_cache.h), 0..kMaxPrefixCacheMb; 0 = off.
  // Off here (one-shot runs gain nothing); `qflash chat` and qflash-server default to
  // kDefaultPrefixCacheMb.
  int64_t prefix_cache_mb = 0;
  // bf16: the checkpoint's matrices as stored (an int4 checkpoint stays int4); int4: float
  // matrices quantized at load through a cache file (io/int4_cache.h), target and drafter.
  std::string weights = "bf16";
  // With weights int4: lm_head (and an embedding tied to it) in int4 too, or kept in bf16.
  // Default int4: at 27B a bf16 head is 1.8 GB more and ~12% more bytes per decode step, which
  // the 24 GB budget and the int4 speed target do not have room for (docs/DESIGN.md, "int4 at
  // load", has the effect on the demo pair's tau).
  std::string lm_head = "int4";
};

struct GenerationOptions {
  int64_t max_tokens = 128;         // new tokens, 1..kMaxContextLimit (and prompt + this <= max_context)
  double temperature = 0.0;         // 0 = greedy; 0..kMaxTemperature
  int64_t top_k = 0;                // 0 = off
  double top_p = 1.0;               // (0, 1]; 1 = off
  uint64_t seed = 0;
  std::optional<int64_t> draft_k;   // unset = auto (the depth controller picks k each round); else 1..the source's max
  bool ignore_eos = false;          // do not stop at the model's end tokens
  std::vector<int64_t> stop_ids;    // extra stop ids, each in [0, vocab)
};

// Throw qf::Error(Usage) naming the first bad field: "<name>: expected <range>, found <value>".
void validate_engine_options(const EngineOptions& o);
void validate_generation_options(const GenerationOptions& o);

// What a loaded engine adds to the static ranges above.
struct GenerationLimits {
  std::string draft_source;  // "none", "mtp", "dflash2", ...
  int64_t max_draft_k = 0;   // deepest draft of the source on this target (0 without a source)
  int64_t vocab_size = 0;
  int64_t max_context = 0;
};
// validate_generation_options, then draft_k against the source, stop ids against the
// vocabulary and, when prompt_tokens >= 0, prompt + max_tokens against max_context.
void validate_generation_options(const GenerationOptions& o, const GenerationLimits& lim, int64_t prompt_tokens = -1);

// The one message format, for front ends that reject a value before it reaches a struct (a JSON
// string where a number belongs, a seed with a sign): "<name>: expected <expected>, found <found>".
[[noreturn]] void fail_option(const std::string& name, const std::string& expected, const std::string& found);

// The range text the validators use for a parameter ("max_tokens", "top_p", ...), for front
// ends' own type checks; Internal error for a name that is not an option.
std::string expected_range(const std::string& name);

// A seed written as text (the CLI): decimal digits only, 0..2^64-1.
uint64_t parse_seed(const std::string& text);

// --draft-k as text (the CLI): "auto" (unset) or an integer, range-checked by the validators.
std::optional<int64_t> parse_draft_k(const std::string& text);
// "auto" -> kPrefillRowsAuto, else the integer as written (validated by validate_engine_options);
// anything else fails with the prefill_rows message.
int64_t parse_prefill_rows(const std::string& text);

}  // namespace qf
