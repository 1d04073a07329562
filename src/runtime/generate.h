// The speculative round loop (docs/spec/speculative.md section 3): prefill, then rounds of
// draft -> verify (one multi-row target pass) -> accept -> commit (rollback, the draft source
// observes the committed rows) -> emit. With no draft source every round is a 1-row verify,
// i.e. plain decoding through the same kernels.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "model/target_model.h"
#include "runtime/depth_controller.h"
#include "runtime/draft_source.h"
#include "runtime/prefix_cache.h"
#include "runtime/sampling.h"
#include "runtime/stats.h"

namespace qf {

// ---- the accept step (sections 3 and 5): how many of the k drafts the target keeps, and its
// own token after them (the bonus, the next anchor)
struct Verdict {
  int accepted = 0;    // a: drafts kept, 0..k
  int32_t bonus = -1;  // the target's token at slot a
};

// Greedy: a = the longest prefix with d_j == the target's argmax at slot j-1; the bonus is the
// argmax at slot a. drafts [k], target_ids [k+1].
Verdict accept_greedy(const int32_t* drafts, const int32_t* target_ids, int k);

// Sampled (T > 0), lossless in distribution: accept draft j while u * q_j(d_j) < p_j(d_j), u
// uniform; at the first rejection the bonus is drawn from normalize(max(p_j - q_j, 0)); when
// all k are kept, from p_k. logits: the target's rows of the verify block [k+1, V]; p_j is
// target_probs of row j. `p` and `res` are work space.
Verdict accept_sampled(const int32_t* drafts, const std::vector<DraftDist>& q, const float* logits, int k, int V,
                       const SamplingParams& sampling, Rng& rng, std::vector<float>& p, std::vector<float>& res);

// Benchmarks on random weights replace the verdict (forced acceptance: keep n drafts whatever
// the target says, so the real draft and verify run at a chosen acceptance). Gets the round's
// k and the target's argmax per slot [k+1]; returns the verdict to commit. Greedy only; breaks
// identity by design, so nothing but `qflash bench` sets one.
using AcceptOverride = std::function<Verdict(int k, const int32_t* target_ids)>;

// Keep min(n, k) drafts; the bonus is the target's token after them.
AcceptOverride forced_acceptance(int n);

// What a round of depth k (0 = plain step) at anchor position `pos` costs, in ms, as the depth
// controller should see it instead of the measured wall time: tests and benches inject one so
// that the controller's decisions are reproducible.
using RoundCostModel = std::function<double(int k, int pos)>;

inline constexpr int kDraftKAuto = -1;

struct GenerateOptions {
  int max_new_tokens = 128;
  std::vector<int32_t> stop_ids;  // generation ends when one is produced (it is not emitted)
  // Drafts per round: 1.. (clamped to the source's max on this target), or kDraftKAuto (any
  // value < 1): the depth controller picks k in 0..max each round (runtime/depth_controller.h).
  int draft_k = kDraftKAuto;
  // Temperature 0 (default): greedy, byte-identical across draft sources. T > 0: sampled, and
  // lossless in distribution through the speculative acceptance rule.
  SamplingParams sampling;
  // Benchmarks only (forced acceptance on random weights): replaces each round's verdict.
  AcceptOverride accept_override;
  // Tests and benches: the round costs the depth controller sees (unset: measured wall time).
  RoundCostModel round_cost;
};

// Called for every emitted token, in order. Return false to stop early.
using TokenCallback = std::function<bool(int32_t token)>;
// Called once per round (for --trace): position, drafts (their count is the round's k, 0 for a
// plain step), accepted count, bonus token.
using RoundCallback = std::function<void(int pos, const std::vector<int32_t>& drafts, int accepted, int32_t bonus)>;

class Generator {
 public:
  // `source` may be null (plain decoding). max_pos bounds prompt + generated tokens.
  Generator(TargetModel& target, DraftSource* source, int max_pos);
  GenStats generate(const std::vector<int32_t>& prompt, const GenerateOptions& opt, const TokenCallback& on_token,
                    const RoundCallback& on_round = nullptr);
  TargetState& state() { return *state_; }
  TargetModel& target() { return target_; }
  // Prefix reuse (runtime/prefix_cache.h): with a cache, generate() resumes from the longest
  // cached prefix of the prompt and stores snapshots of this prompt for later requests. Null
  // (the default) turns it off; so does a draft source that is not resumable().
  void set_prefix_cache(PrefixCache* cache) { cache_ = cache; }
  // Runs every round shape this pair can take on `prompt` until its graphs are recorded (a
  // graph key records on its second run, graph_runner.h): the plain step, draft + verify at each
  // depth 1..max, the source's observe of 1..max+1 rows, and the catch-up of the longest plain
  // run the controller makes (which sizes backend scratch). A long-running engine is in that
  // state after its first requests; `qflash bench` calls this before timing, so that no
  // configuration is charged for recordings inside its timed run (the depth controller tries
  // several depths early, a fixed depth one). Output is discarded; no-op without graphs.
  void warm_up(const std::vector<int32_t>& prompt);
  PrefixCache* prefix_cache() const { return cache_; }

 private:
  struct Run;  // one generate() call: options, stats, position, per-round buffers (generate.cpp)
  void begin(Run& run, const std::vector<int32_t>& prompt);
  void round(Run& run);
  void resume(Run& run, const std::vector<int32_t>& prompt);
  std::vector<StateRegion> regions(int n, bool for_resume);
  int32_t prefill(Run& run, const std::vector<int32_t>& prompt);  // returns the first token
  int32_t sample_last_row(Run& run);
  int round_depth(Run& run) const;
  void draft(Run& run, int k);
  void verify(Run& run, int k);
  ForwardOpts verify_opts(int k) const;  // the target forward of a round of depth k (0: a plain step)
  Verdict accept(Run& run, int k);
  void record_round(Run& run, int k, const Verdict& v);
  void commit(Run& run, int k, const Verdict& v);
  void emit(Run& run, int32_t token);

  TargetModel& target_;
  DraftSource* source_;
  std::unique_ptr<TargetState> state_;
  int max_k_ = 0;
  PrefixCache* cache_ = nullptr;
  // --draft-k auto, kept across requests: one for greedy and one for sampled requests, whose
  // rounds cost differently (a sampled verify downloads its logits rows; drafts are sampled).
  std::unique_ptr<DepthController> depth_, depth_sampled_;
};

}  // namespace qf
