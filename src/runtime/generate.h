// The speculative round loop (spec/speculative.md section 3): prefill, then rounds of draft ->
// verify (one multi-row target pass) -> accept -> commit/rollback. With no draft source every
// round is a 1-row verify, i.e. plain decoding through the same kernels.
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "model/qwen38.h"
#include "runtime/draft_source.h"
#include "runtime/sampling.h"
#include "runtime/stats.h"

namespace qf {

struct GenerateOptions {
  int max_new_tokens = 128;
  std::vector<int32_t> stop_ids;  // generation ends when one is produced (it is not emitted)
  int draft_k = -1;               // -1 = the source's default; clamped to 1..source max
  // Forced acceptance for benchmarks on random weights: accept exactly min(force_accept, k)
  // drafts each round whatever the target says. Breaks identity by design; never used by run.
  int force_accept = -1;
  // Temperature 0 (default): greedy, byte-identical across draft sources. T > 0: sampled, and
  // lossless in distribution through the speculative acceptance rule.
  SamplingParams sampling;
};

// Called for every emitted token, in order. Return false to stop early.
using TokenCallback = std::function<bool(int32_t token)>;
// Called once per round (for --trace): position, drafts, accepted count, bonus token.
using RoundCallback = std::function<void(int pos, const std::vector<int32_t>& drafts, int accepted, int32_t bonus)>;

class Generator {
 public:
  // `source` may be null (plain decoding). max_pos bounds prompt + generated tokens.
  Generator(Qwen38Model& target, DraftSource* source, int max_pos);
  GenStats generate(const std::vector<int32_t>& prompt, const GenerateOptions& opt, const TokenCallback& on_token,
                    const RoundCallback& on_round = nullptr);
  TargetState& state() { return *state_; }
  Qwen38Model& target() { return target_; }

 private:
  Qwen38Model& target_;
  DraftSource* source_;
  std::unique_ptr<TargetState> state_;
  int max_k_ = 0;
};

}  // namespace qf
