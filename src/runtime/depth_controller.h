// Adaptive draft depth (--draft-k auto, docs/DESIGN.md "Adaptive draft depth"): before each round
// the controller picks k, the drafts to propose (0 = a plain decode step), to maximise expected
// tokens per second under a running model of acceptance and of the round's cost:
//
//   E[k]    = sum_{j=1..k} prod_{i=1..j} p_i     p_i ~ P(draft i accepted | draft i-1 accepted)
//   rate(k) = (E[k] + 1) / cost(k)               the +1 is the target's own token (the bonus)
//
// cost(k) is the measured wall time of a round that drafted k (draft pass, the source's catch-up
// and observe, verify of k+1 rows, accept and rollback), k = 0 being a plain step: the lower
// median of that depth's last `cost_window` rounds, so that a one-off (a CUDA graph being recorded,
// the previous round's observe finishing inside this one) does not move it and it follows the
// context length as it grows; a depth not yet run is interpolated between its measured
// neighbours. A depth never run owes its warm-up one-off (learned from the warm-up rounds of the
// depths measured): it is run only once the gain the controller forwent by not running it adds
// up to that one-off (rent or buy), so that bursts of marginal gains and a token budget's short
// last rounds do not send it through every depth. p_i is a short running average of the
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
    int cost_window = 8;        // rounds of one depth whose median is its cost
    // The first rounds of each depth are its warm-up and are not costed: on a GPU a depth's
    // first round runs its ops directly and its second records their CUDA graphs, each several
    // times a replayed round on a small model (graph_runner.h); a depth still warming up is
    // priced from its measured neighbours.
    int cost_warmup = 2;
    // A depth never run owes `cost_warmup` one-offs, learned (warmup_one_off()); choose() runs it
    // only once the gain forgone by not running it (forgone()) reaches them. Off: every depth is
    // open as before (a depth no one has run is priced from its neighbours and tried at once).
    bool warmup_rent_or_buy = true;
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
  // Every round shape has now been run outside the controller's view (Generator::warm_up records
  // each depth's graphs with fixed-k rounds it does not see): the warm-up rounds it has seen no
  // longer describe the machine, so they are forgotten and the learned one-off is 0 until a depth
  // measured later shows another.
  void forget_warmup();

  // ---- the model as it stands (tests, docs)
  int max_k() const { return max_k_; }
  double accept_estimate(int i) const { return accept_[i].value; }  // p_i, i in 1..max_k
  bool cost_measured(int k) const { return !cost_[k].recent.empty(); }
  // What a plain step leaves for later (the source's deferred rows, run by the next drafting
  // round's catch-up), per plain step, in ms: rate(0) charges it (docs/DESIGN.md).
  double deferred_cost() const { return deferred_.value; }
  double cost_estimate(int k) const;                                 // measured or interpolated
  double expected_accepted(int k) const;                             // E[k]
  double rate(int k) const {
    return (expected_accepted(k) + 1.0) / (cost_estimate(k) + (k == 0 ? std::max(deferred_.value, 0.0) : 0.0));
  }
  // The one-off of a warm-up round (ms): the lower median of what the warm-up rounds of the last
  // two depths measured cost above their depth's cost, at least 0; 0 before any depth is measured.
  double warmup_one_off() const;
  // What depth k would still pay for its warm-up: cost_warmup one-offs if it never ran, else 0.
  double warmup_owed(int k) const;
  // The gain forgone so far by not running depth k (never run), in ms: each choose() where k's rate,
  // k priced from the drafting depths measured, beat the best open choice's adds what that
  // choice's round cost above making its tokens at k's rate.
  double forgone(int k) const { return forgone_[k]; }
  bool open(int k) const;  // may choose() run depth k (plain, run before, or its one-off earned)
  bool probing() const { return probing_; }  // the last choose() was a probe
  int probe_wait() const { return wait_; }
  int plain_run() const { return plain_run_; }  // plain steps since the last drafting round (this request)

 private:
  struct Mean {
    double value = 0;
    int n = 0;  // samples so far (the prior counts as one)
    void add(double x, int window);
  };
  struct Costs {
    int seen = 0;                // rounds of this depth so far, warm-up included
    std::vector<double> warm;    // the costs of its warm-up rounds
    std::vector<double> recent;  // [<= window] the last rounds' costs, oldest first
    double median = 0;           // their lower median
    void add(double ms, int window);
  };
  int best_drafting_k(int K) const;  // argmax of rate over the open depths 1..K (ties: the smaller k); 0 if none
  // The cost of depth k from the measured depths lowest..max_k other than k (interpolated, flat
  // beyond them); 0 if none.
  double cost_from_others(int k, int lowest = 0) const;

  int max_k_;
  Params p_;
  std::vector<Mean> accept_;  // [max_k+1]: index i = draft position i (index 0 unused)
  std::vector<Costs> cost_;   // [max_k+1]: index k = round depth
  std::vector<int> measured_;  // depths in the order they got their first cost
  std::vector<double> forgone_;  // [max_k+1]: forgone(k)
  Mean deferred_;              // deferred cost per plain step (an EWMA over drafting rounds after plain steps)
  int plain_run_ = 0;         // plain steps since the last drafting round
  int wait_;                  // plain steps before the next probe
  bool probing_ = false;
};

}  // namespace qf
