#include "runtime/depth_controller.h"

#include <algorithm>

#include "core/error.h"

namespace qf {

void DepthController::Mean::add(double x, int window) {
  n++;
  value += (x - value) / std::min(n, window);
}

void DepthController::Costs::add(double ms, int window) {
  recent.push_back(ms);
  if (static_cast<int>(recent.size()) > window) recent.erase(recent.begin());
  std::vector<double> s = recent;
  std::sort(s.begin(), s.end());
  median = s[(s.size() - 1) / 2];
}

DepthController::DepthController(int max_k, const Params& p)
    : max_k_(max_k), p_(p), accept_(max_k + 1), cost_(max_k + 1), forgone_(max_k + 1, 0.0), wait_(p.probe_first) {
  QF_CHECK(max_k >= 0 && p.accept_window >= 1 && p.cost_window >= 1 && p.cost_warmup >= 0 && p.probe_first >= 1 &&
               p.probe_max >= p.probe_first,
           "depth controller: max_k %d, windows %d/%d, probes %d..%d", max_k, p.accept_window, p.cost_window,
           p.probe_first, p.probe_max);
  for (Mean& m : accept_) m = {p.prior_accept, 1};
}

// The cost of depth k from the measured depths other than k: interpolated between the nearest
// measured on each side, flat beyond them; 0 if none.
double DepthController::cost_from_others(int k, int lowest) const {
  int lo = k - 1, hi = k + 1;
  while (lo >= lowest && !cost_measured(lo)) lo--;
  while (hi <= max_k_ && !cost_measured(hi)) hi++;
  const bool has_lo = lo >= lowest, has_hi = hi <= max_k_;
  if (has_lo && has_hi)
    return cost_[lo].median + (cost_[hi].median - cost_[lo].median) * (k - lo) / static_cast<double>(hi - lo);
  if (has_lo) return cost_[lo].median;
  if (has_hi) return cost_[hi].median;
  return 0;  // nothing measured: choose() runs a plain step first, so rate() never sees this
}

double DepthController::cost_estimate(int k) const {
  if (!cost_measured(k)) return cost_from_others(k);
  // A depth run once whose round cost more than 1.5x what its measured neighbours say is taken
  // as a one-off (its CUDA graphs being recorded, a long catch-up) and priced from them, so one
  // slow first round does not keep the controller from running that depth again; the second
  // round gives the lower median its real value.
  if (k > 0 && cost_[k].recent.size() == 1) {
    const double others = cost_from_others(k);
    if (others > 0 && cost_[k].median > 1.5 * others) return others;
  }
  return cost_[k].median;
}

double DepthController::warmup_one_off() const {
  // The last two depths measured (the one-off is the machine's state: after Generator::warm_up
  // the graphs are recorded and a depth's first rounds are not slow, so recent evidence counts),
  // each warm-up round against its depth's cost; the lower median resists a spike or a catch-up
  // inside a warm-up round.
  std::vector<double> x;
  for (size_t i = measured_.size() > 2 ? measured_.size() - 2 : 0; i < measured_.size(); i++) {
    const Costs& c = cost_[measured_[i]];
    for (double w : c.warm) x.push_back(w - c.median);
  }
  if (x.empty()) return 0;
  std::sort(x.begin(), x.end());
  return std::max(x[(x.size() - 1) / 2], 0.0);
}

double DepthController::warmup_owed(int k) const {
  return cost_[k].seen > 0 ? 0.0 : p_.cost_warmup * warmup_one_off();
}

bool DepthController::open(int k) const {
  if (k == 0 || !p_.warmup_rent_or_buy || cost_[k].seen > 0) return true;
  // Until a first drafting depth has run there is nothing to compare it with: the first is free
  // (as before the rule: the deepest, priced at plain's cost).
  bool drafted = false;
  for (int j = 1; j <= max_k_; j++) drafted = drafted || cost_[j].seen > 0;
  return !drafted || forgone_[k] >= warmup_owed(k);
}

double DepthController::expected_accepted(int k) const {
  double e = 0, run = 1;
  for (int i = 1; i <= k; i++) {
    run *= accept_[i].value;
    e += run;
  }
  return e;
}

int DepthController::best_drafting_k(int K) const {
  int best = 0;
  for (int k = 1; k <= K; k++)
    if (open(k) && (best == 0 || rate(k) > rate(best))) best = k;
  return best;
}

int DepthController::choose(int limit) {
  probing_ = false;
  const int K = std::min(max_k_, limit);
  if (K <= 0 || !cost_measured(0)) return 0;
  int best = best_drafting_k(K);
  // Rent or buy: a depth never run is opened once what running it would have saved adds up to its
  // warm-up. This round's choice (the better of plain and `best`) is what it is measured against.
  const int now = best > 0 && rate(best) > rate(0) ? best : 0;
  const double r_now = rate(now);
  // The depth's gain is taken at its price from the drafting depths measured (plain's step has no
  // draft pass and no verify rows: priced towards it, a shallow depth of a block drafter looks
  // half its cost, and a one-off would be paid for a gain that is not there).
  for (int k = 1; k <= K; k++) {
    if (open(k)) continue;
    const double from_drafting = cost_from_others(k, 1);
    const double r_k = (expected_accepted(k) + 1.0) / (from_drafting > 0 ? from_drafting : cost_estimate(k));
    if (r_k > r_now) forgone_[k] += cost_estimate(now) * (1.0 - r_now / r_k);
  }
  // A depth opened by this round's gain competes in it.
  best = best_drafting_k(K);
  if (best == 0) return 0;
  if (rate(best) > rate(0)) return best;
  if (plain_run_ < wait_) return 0;
  probing_ = true;
  return best;
}

void DepthController::new_request() {
  for (Mean& m : accept_) m = {std::max(m.value, p_.prior_accept), 1};
  plain_run_ = 0;
  wait_ = p_.probe_first;
  probing_ = false;
}

void DepthController::forget_warmup() {
  for (Costs& c : cost_) c.warm.clear();
}

void DepthController::record(int k, int accepted, double cost_ms) {
  QF_CHECK(k >= 0 && k <= max_k_ && accepted >= 0 && accepted <= k, "depth controller: round k %d, accepted %d",
           k, accepted);
  Costs& c = cost_[k];
  const double ms = std::max(cost_ms, 1e-9);
  if (++c.seen <= p_.cost_warmup) {
    c.warm.push_back(ms);
  } else {
    if (k > 0 && plain_run_ > 0 && cost_measured(k) && cost_measured(0)) {
      // This round ran the rows the last plain steps deferred (catch-up): what it cost beyond
      // the depth's own cost is theirs, charged per plain step to rate(0), and the depth's
      // window keeps rounds without it (a fixed k never pays it).
      deferred_.add((ms - c.median) / plain_run_, p_.cost_window);
    } else {
      if (!cost_measured(k)) measured_.push_back(k);
      c.add(ms, p_.cost_window);
    }
  }
  if (k == 0) {
    plain_run_++;
    return;
  }
  // Draft i was judged only if drafts 1..i-1 were kept: positions 1..a were accepted, a+1 was not.
  const int judged = std::min(accepted + 1, k);
  for (int i = 1; i <= judged; i++) accept_[i].add(i <= accepted ? 1.0 : 0.0, p_.accept_window);
  plain_run_ = 0;
  // A probe that leaves plain steps ahead doubles the wait before the next one.
  const int best = best_drafting_k(max_k_);
  const bool drafting_wins = best > 0 && rate(best) > rate(0);
  wait_ = probing_ && !drafting_wins ? std::min(2 * wait_, p_.probe_max) : p_.probe_first;
  probing_ = false;
}

}  // namespace qf
