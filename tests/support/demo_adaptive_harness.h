// The depth controller (--draft-k auto) on the demo pair at real acceptance, with injected round
// costs (docs/experiments/adaptive_depth.md): the drafts, the verdicts and the k-dependence of a
// block drafter's drafts are the real ones (CPU); the costs the controller sees are a machine
// shape's true mean cost per depth with lognormal jitter, rare spikes, two slow warm-up rounds per
// depth (a GPU's direct run and graph recording) and catch-up after plain steps. Rates are tokens
// per unit of true cost; fixed runs pay their own one-offs. Shared by tests/e2e/demo_adaptive_test.cpp
// (the cases that meet issue 15's target) and bench/adaptive_sweep.cpp (every case, as a table).
#pragma once
#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "runtime/depth_controller.h"
#include "runtime/generate.h"
#include "tokenizer/tokenizer.h"

namespace qf::harness {

// JSONL prompts: token ids ("ids") or text ("text"), the first n.
inline std::vector<std::vector<int32_t>> load_prompts(const std::string& path, const Tokenizer& tok, int n) {
  std::ifstream f(path);
  std::vector<std::vector<int32_t>> out;
  std::string line;
  while (std::getline(f, line) && static_cast<int>(out.size()) < n) {
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line);
    out.push_back(j.contains("ids") ? j["ids"].get<std::vector<int32_t>>() : tok.encode(j["text"].get<std::string>()));
  }
  return out;
}

// A machine: the true mean cost of a round of depth k (in decode steps), and what a depth's first
// two rounds cost on top (the graph key's direct run, then its recording).
struct Machine {
  const char* name;
  double fixed, per_k, draft_fixed;  // round k > 0: fixed + draft_fixed + per_k * k; plain: 1
  double one_off;                    // extra, in decode steps, of the first two rounds of a depth
  double catch_up;                   // a drafting round after j plain steps: + catch_up * (1 + j / 8)
  double cost(int k) const { return k == 0 ? 1.0 : fixed + draft_fixed + per_k * k; }
};

// The demo pair's measured H200 shapes (docs/BENCHMARKS.md runs 22-23): DFlash2 k = 7 at 2.09x
// plain with tau 5.24 -> a k = 7 round costs ~2.5 steps; MTP k = 3 at 1.24x with tau 2.93 ->
// ~2.36 steps. The 27B-like 'brief' shape: a draft pass of 0.13 steps, verify +2% per row.
inline const Machine kDflashDemo{"dflash2 demo", 2.2, 0.04, 0.0, 4.0, 0.5};
inline const Machine kDflashBrief{"dflash2 brief", 1.0, 0.02, 0.13, 4.0, 0.5};
inline const Machine kMtpDemo{"mtp demo", 1.25, 0.37, 0.0, 4.0, 0.5};

struct Result {
  double rate = 0;  // tokens per decode step of true cost
  double k_mean = 0;
  std::vector<int> ks;
  // Where the true cost went (decode steps): plain rounds, drafting rounds without their
  // one-offs, the warm-up one-offs, the catch-up; the tokens of the drafting rounds; the drafting
  // rounds that follow plain steps (switches into drafting).
  double plain_cost = 0, draft_cost = 0, warmup_cost = 0, catchup_cost = 0, draft_tokens = 0;
  int switches = 0;
};

// One Generator over all prompts (as the bench and a server hold it): fixed k, or auto (k < 0),
// or plain (src null). force >= 0: forced acceptance of that many drafts (greedy only).
// warm: the state `qflash bench` times on a GPU after Generator::warm_up (a no-op on the CPU, which
// has no graphs): no round pays a one-off (every depth's graphs are recorded), and an auto run's
// greedy controller has first been through warm_up's controller run (plain steps at forced 0 acceptance
// until its probes caught up a 64-row batch, uncounted; its warm-up rounds cost what a recorded
// round costs, which is what forget_warmup() leaves the controller believing).
inline Result run(TargetModel& m, DraftSource* src, int k, const Machine& mc,
                  const std::vector<std::vector<int32_t>>& prompts, float temperature, int gen, uint64_t noise_seed,
                  int force = -1, bool warm = false) {
  Generator g(m, src, 1024);
  std::mt19937_64 noise(noise_seed);
  std::lognormal_distribution<double> jitter(0.0, 0.15);
  std::bernoulli_distribution spike(0.03);
  std::map<int, int> runs;  // rounds per depth so far: the first two pay the one-off
  int plain_run = 0;        // plain steps since the last drafting round (catch-up rows)
  double extra = 0;         // this round's one-off and catch-up, in decode steps
  double cost = 0, tokens = 0, ksum = 0;
  Result r;
  bool counting = true;  // false during the warm-up run
  auto cost_fn = [&](int kk, int) {
    // What the controller sees: the true cost with jitter and rare spikes (a host hiccup).
    double c = mc.cost(kk) * jitter(noise);
    if (spike(noise)) c *= 3.0;
    return (c + extra) * 0.31;
  };
  auto on_round = [&](int, const std::vector<int32_t>& drafts, int accepted, int32_t) {
    const int kk = static_cast<int>(drafts.size());
    extra = !warm && runs[kk]++ < 2 ? mc.one_off : 0.0;
    if (counting) r.warmup_cost += extra;
    if (kk > 0 && plain_run > 0) {
      const double cu = mc.catch_up * (1.0 + plain_run / 8.0);
      extra += cu;
      if (counting) {
        r.catchup_cost += cu;
        r.switches++;
      }
    }
    plain_run = kk == 0 ? plain_run + 1 : 0;
    if (!counting) return;
    (kk == 0 ? r.plain_cost : r.draft_cost) += mc.cost(kk);
    if (kk > 0) r.draft_tokens += accepted + 1;
    cost += mc.cost(kk) + extra;
    ksum += kk;
    r.ks.push_back(kk);
  };
  if (warm && src && k < 0 && !prompts.empty()) {
    const int probe_max = DepthController::Params{}.probe_max;
    GenerateOptions w;
    w.max_new_tokens = 3 * probe_max;
    w.draft_k = kDraftKAuto;
    w.accept_override = forced_acceptance(0);
    w.round_cost = cost_fn;
    counting = false;
    g.generate(prompts[0], w, nullptr, on_round);
    counting = true;
  }
  for (size_t i = 0; i < prompts.size(); i++) {
    // A request starts the source over (DraftSource::begin drops the rows the last request's
    // plain steps deferred): its first drafting round has nothing to catch up.
    plain_run = 0;
    GenerateOptions o;
    o.max_new_tokens = gen;
    o.draft_k = src ? k : 0;
    o.sampling.temperature = temperature;
    o.sampling.seed = 1000 + i;
    if (force >= 0) o.accept_override = forced_acceptance(force);
    o.round_cost = cost_fn;
    const GenStats st = g.generate(prompts[i], o, nullptr, on_round);
    tokens += st.generated_tokens;
  }
  r.rate = tokens / cost;
  r.k_mean = ksum / std::max<size_t>(r.ks.size(), 1);
  return r;
}

// Plain and every fixed depth of one case (they do not depend on the controller).
struct Baseline {
  double plain = 0;
  std::vector<double> fixed;  // [k], index 0 unused
  double best = 0;
  int best_k = 0;
};

inline Baseline baseline(TargetModel& m, DraftSource* src, const Machine& mc,
                         const std::vector<std::vector<int32_t>>& prompts, float temperature, int gen, int force = -1,
                         bool warm = false) {
  Baseline b;
  b.plain = run(m, nullptr, 0, mc, prompts, temperature, gen, 1, force, warm).rate;
  b.best = b.plain;
  b.fixed.assign(src->max_k() + 1, 0.0);
  for (int k = 1; k <= src->max_k(); k++) {
    b.fixed[k] = run(m, src, k, mc, prompts, temperature, gen, 1, force, warm).rate;
    if (b.fixed[k] > b.best) b.best = b.fixed[k], b.best_k = k;
  }
  return b;
}

}  // namespace qf::harness
