// Adaptive draft depth (--draft-k auto, docs/DESIGN.md "Adaptive draft depth"): before each round
// the controller picks k, the drafts to propose (0 = a plain decode step), to maximise expected
// tokens per second under a running model of acceptance and of the round's cost:
//
//   E[k]    = sum_{j=1..k} prod_{i=1..j} p_i     p_i ~ P(draft i accepted | draft i-1 accepted)
//   rate(k) = (E[k] + 1) / cost(k)               the +1 is the target's own token (the bonus)
//
// cost(k) is the wall time of a round that drafted k (draft pass, the source's catch-up and
// observe, verify of k+1 rows, accept and rollback), k = 0 being a plain step. The drafting depths
// share ONE model, a line fitted over the recent costed rounds of every depth,
//
//   cost(k) = a + b k,   and a drafting round after j plain steps costs c0 + c1 j on top
//
// (the catch-up of the rows those plain steps deferred: c0 per switch, c1 per plain step), a
// weighted least-squares fit of (a, b, c0, c1 >= 0 but a) with older rounds decayed and rounds
// far off the fit (a CUDA graph being recorded, a host hiccup) trimmed. So every costed round of
// any depth moves every depth's estimate: a depth's cost cannot freeze at its first slow rounds,
// and the catch-up after plain steps is not taken for the cost of the depth that paid it. A plain
// step's cost is a decayed, trimmed mean of its own rounds. p_i is a short running average of the
// verdicts of draft i. A controller that stopped drafting would never see
// acceptance again, so while plain steps win it probes: after `probe_first` plain steps it
// drafts once at the best k > 0, and each probe that leaves plain ahead doubles the wait (up
// to `probe_max`).
//
// Decisions are a pure function of the recorded (k, accepted, cost) triples: with the costs
// injected (GenerateOptions::round_cost) a run's k sequence is reproducible.
#pragma once
#include <algorithm>
#include <vector>

namespace qf {

class DepthController {
 public:
  struct Params {
    double prior_accept = 0.5;  // p_i before draft i was ever judged (one pseudo-sample)
    // p_i: a running mean up to accept_window samples, then an EWMA(1/accept_window). Short, so
    // that a change of text (or of forced acceptance) is followed within ~10 rounds.
    int accept_window = 4;
    // Cost fits: a round's weight decays by (1 - 1/cost_window) with every later round of its kind
    // (plain, or drafting at any depth), so the fit follows the context length as it grows.
    int cost_window = 32;
    // The first rounds of each depth are its warm-up and are not costed: on a GPU a depth's
    // first round runs its ops directly and its second records their CUDA graphs, each several
    // times a replayed round on a small model (graph_runner.h); a depth still warming up is
    // priced from its measured neighbours.
    int cost_warmup = 2;
    int probe_first = 4;        // plain steps before the first probe
    int probe_max = 64;         // longest wait between probes (~1% of plain speed at 27B, see DESIGN)
  };
  explicit DepthController(int max_k) : DepthController(max_k, Params{}) {}
  DepthController(int max_k, const Params& p);

  // The depth of the next round, 0..min(max_k, limit). The first round is a plain step (its cost
  // anchors every comparison).
  int choose(int limit);
  // What the round chose by choose() gave: its depth, the drafts kept, and its cost (ms).
  void record(int k, int accepted, double cost_ms);
  // A new request on the same machine and pair: the round costs stay (they are the machine's);
  // each p_i restarts from max(its value, prior_accept) as a one-verdict prior (a good profile
  // carries over, a depth the last request had stopped judging is opened again); the probe
  // schedule starts over (no inherited long wait at plain).
  void new_request();

  // ---- the model as it stands (tests, docs)
  int max_k() const { return max_k_; }
  double accept_estimate(int i) const { return accept_[i].value; }  // p_i, i in 1..max_k
  bool cost_measured(int k) const { return costed_[k] > 0; }  // a round of depth k was costed
  // What a plain step leaves for later (the source's deferred rows, run by the next drafting
  // round's catch-up), in ms: c1 per plain step, and c0 once per switch back to drafting. rate(0)
  // charges c1, and c0 spread over the plain steps to the next probe when the last round drafted
  // (once plain steps have run, c0 is owed whatever comes next) (docs/DESIGN.md).
  double deferred_cost() const { return fit_.c1; }
  double switch_cost() const { return fit_.c0; }
  double cost_estimate(int k) const;  // plain: its own mean; k > 0: the line a + b k
  double expected_accepted(int k) const;  // E[k]
  double rate(int k) const;
  bool probing() const { return probing_; }  // the last choose() was a probe
  int probe_wait() const { return wait_; }

 private:
  struct Mean {
    double value = 0;
    int n = 0;  // samples so far (the prior counts as one)
    void add(double x, int window);
  };
  struct Round {
    int k;           // depth (0: plain)
    int after;       // plain steps just before it (drafting rounds: its catch-up rows)
    double ms;
    double w;        // decay weight
  };
  struct Fit {
    double a = 0, b = 0, c0 = 0, c1 = 0;  // drafting rounds: a + b k (+ c0 + c1 j after j plain steps)
    double plain = 0;                     // a plain step
  };
  int best_drafting_k(int K) const;  // argmax of rate over 1..K (ties: the smaller k)
  void refit();
  double choice_rate(int k) const;

  int max_k_;
  Params p_;
  std::vector<Mean> accept_;  // [max_k+1]: index i = draft position i (index 0 unused)
  std::vector<int> seen_;     // [max_k+1]: rounds of depth k so far, warm-up included
  std::vector<int> costed_;   // [max_k+1]: of them, costed (past the warm-up)
  std::vector<Round> plain_rounds_, draft_rounds_;  // costed rounds, oldest first
  Fit fit_;
  Mean warmup_;             // a depth's warm-up one-off, ms (running mean over depths)
  double warm_part_ = 0;    // the current depth's warm-up so far
  int plain_run_ = 0;         // plain steps since the last drafting round
  int wait_;                  // plain steps before the next probe
  bool probing_ = false;
};

}  // namespace qf
