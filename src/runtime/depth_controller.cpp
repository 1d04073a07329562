#include "runtime/depth_controller.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace qf {

void DepthController::Mean::add(double x, int window) {
  n++;
  value += (x - value) / std::min(n, window);
}

DepthController::DepthController(int max_k, const Params& p)
    : max_k_(max_k), p_(p), accept_(max_k + 1), seen_(max_k + 1, 0), costed_(max_k + 1, 0), wait_(p.probe_first) {
  QF_CHECK(max_k >= 0 && p.accept_window >= 1 && p.cost_window >= 1 && p.cost_warmup >= 0 && p.probe_first >= 1 &&
               p.probe_max >= p.probe_first,
           "depth controller: max_k %d, windows %d/%d, probes %d..%d", max_k, p.accept_window, p.cost_window,
           p.probe_first, p.probe_max);
  for (Mean& m : accept_) m = {p.prior_accept, 1};
}

namespace {

// A round's cost against the fit: outside [1/kTrim, kTrim] it is not counted (a one-off, a spike).
constexpr double kTrim = 1.33;
// Ridge weight (in rounds) pulling the catch-up terms to 0 and the slope to kSlopePrior where the rounds do not
// determine them (one depth run so far, no drafting round after plain steps yet).
constexpr double kRidge = 0.05;
// ... the slope towards this (a fraction of a plain step per draft row: a verify row is never
// free), so that with one depth costed a deeper round is not taken to cost the same.
constexpr double kSlopePrior = 0.02;
// An untried depth's warm-up is charged as if spread over this many of its rounds.
constexpr double kWarmupRounds = 64.0;

// Solves the n x n system A x = y in place (x into y); false if singular.
bool solve(std::vector<std::vector<double>>& A, std::vector<double>& y, int n) {
  for (int c = 0; c < n; c++) {
    int piv = c;
    for (int r = c + 1; r < n; r++)
      if (std::abs(A[r][c]) > std::abs(A[piv][c])) piv = r;
    if (std::abs(A[piv][c]) < 1e-12) return false;
    std::swap(A[c], A[piv]);
    std::swap(y[c], y[piv]);
    for (int r = 0; r < n; r++) {
      if (r == c) continue;
      const double f = A[r][c] / A[c][c];
      for (int j = c; j < n; j++) A[r][j] -= f * A[c][j];
      y[r] -= f * y[c];
    }
  }
  for (int c = 0; c < n; c++) y[c] /= A[c][c];
  return true;
}

}  // namespace

// Plain: a weighted mean of its rounds, trimmed about itself (started from the weighted median).
// Drafting: weighted ridge least squares of ms ~ a + b k + c0 s + c1 s j (s: the round followed
// j > 0 plain steps) with b, c0, c1 >= 0 (a negative one is fixed at 0 and the rest refitted),
// trimmed about the fit: each pass drops the rounds outside [1/kTrim, kTrim] of the last fit.
void DepthController::refit() {
  if (!plain_rounds_.empty()) {
    std::vector<std::pair<double, double>> s;
    double wsum = 0;
    for (const Round& r : plain_rounds_) s.push_back({r.ms, r.w}), wsum += r.w;
    std::sort(s.begin(), s.end());
    double acc = 0, est = s.back().first;
    for (auto& [ms, w] : s)
      if ((acc += w) >= 0.5 * wsum) {
        est = ms;
        break;
      }
    for (int pass = 0; pass < 3; pass++) {
      double sw = 0, sx = 0;
      for (auto& [ms, w] : s)
        if (ms <= kTrim * est && ms * kTrim >= est) sw += w, sx += w * ms;
      if (sw <= 0) break;
      est = sx / sw;
    }
    fit_.plain = est;
  }
  if (draft_rounds_.empty()) return;
  const double scale = fit_.plain > 0 ? fit_.plain : draft_rounds_.back().ms;
  auto features = [](const Round& r, double* f) {
    const double s = r.after > 0 ? 1.0 : 0.0;
    f[0] = 1.0, f[1] = r.k, f[2] = s, f[3] = s * r.after;
  };
  // The rounds within [1/kTrim, kTrim] of the fit theta; false if that leaves under half the weight.
  auto trim = [&](const double* theta, std::vector<char>& in) {
    double kept = 0, all = 0;
    for (size_t i = 0; i < draft_rounds_.size(); i++) {
      const Round& r = draft_rounds_[i];
      double f[4];
      features(r, f);
      const double pred = theta[0] + theta[1] * f[1] + theta[2] * f[2] + theta[3] * f[3];
      in[i] = pred > 0 && r.ms <= kTrim * pred && r.ms * kTrim >= pred;
      all += r.w;
      if (in[i]) kept += r.w;
    }
    return kept >= 0.5 * all;
  };
  // The first pass trims about the last fit (a new spike would drag a fit that includes it).
  double theta[4] = {fit_.a, fit_.b, fit_.c0, fit_.c1};
  std::vector<char> inlier(draft_rounds_.size(), 1);
  if (draft_rounds_.size() == 1 || !trim(theta, inlier)) inlier.assign(draft_rounds_.size(), 1);
  for (int pass = 0; pass < 4; pass++) {
    bool active[4] = {true, true, true, true};
    for (int tries = 0; tries < 4; tries++) {
      std::vector<int> idx;
      for (int j = 0; j < 4; j++)
        if (active[j]) idx.push_back(j);
      const int n = static_cast<int>(idx.size());
      std::vector<std::vector<double>> A(n, std::vector<double>(n, 0.0));
      std::vector<double> y(n, 0.0);
      for (size_t i = 0; i < draft_rounds_.size(); i++) {
        if (!inlier[i]) continue;
        const Round& r = draft_rounds_[i];
        double f[4];
        features(r, f);
        for (int u = 0; u < n; u++) {
          y[u] += r.w * f[idx[u]] * (r.ms / scale);
          for (int v = 0; v < n; v++) A[u][v] += r.w * f[idx[u]] * f[idx[v]];
        }
      }
      for (int u = 1; u < n; u++) {  // idx[0] is a: never pulled or fixed
        A[u][u] += kRidge;
        if (idx[u] == 1) y[u] += kRidge * kSlopePrior;
      }
      if (!solve(A, y, n)) break;
      for (int j = 0; j < 4; j++) theta[j] = 0;
      for (int u = 0; u < n; u++) theta[idx[u]] = y[u] * scale;
      int worst = -1;
      for (int j = 1; j < 4; j++)
        if (theta[j] < 0 && (worst < 0 || theta[j] < theta[worst])) worst = j;
      if (worst < 0) break;
      active[worst] = false;
      theta[worst] = 0;
    }
    // Trim about this fit for the next pass (unless that would leave too little).
    std::vector<char> next(draft_rounds_.size(), 0);
    if (!trim(theta, next) || next == inlier) break;
    inlier = next;
  }
  fit_.a = theta[0], fit_.b = theta[1], fit_.c0 = theta[2], fit_.c1 = theta[3];
}

double DepthController::cost_estimate(int k) const {
  if (k == 0 || draft_rounds_.empty()) return fit_.plain;  // drafting not costed yet: priced as plain
  return std::max(fit_.a + fit_.b * k, 1e-9);
}

double DepthController::rate(int k) const {
  if (k > 0) return (expected_accepted(k) + 1.0) / cost_estimate(k);
  // A plain step: its own cost, the catch-up it leaves (c1), and, when it would end a drafting
  // run, the switch back (c0) spread over the plain steps to the next probe.
  return 1.0 / (fit_.plain + fit_.c1 + (plain_run_ == 0 ? fit_.c0 / wait_ : 0.0));
}

double DepthController::expected_accepted(int k) const {
  double e = 0, run = 1;
  for (int i = 1; i <= k; i++) {
    run *= accept_[i].value;
    e += run;
  }
  return e;
}

// An untried depth pays its warm-up (the measured one-off of the depths warmed so far) spread
// over kWarmupRounds rounds, so that a small gain does not buy a new depth's warm-up.
double DepthController::choice_rate(int k) const {
  if (seen_[k] > 0 || warmup_.n == 0) return rate(k);
  return (expected_accepted(k) + 1.0) / (cost_estimate(k) + warmup_.value / kWarmupRounds);
}

int DepthController::best_drafting_k(int K) const {
  int best = 1;
  for (int k = 2; k <= K; k++)
    if (choice_rate(k) > choice_rate(best)) best = k;
  return best;
}

int DepthController::choose(int limit) {
  probing_ = false;
  const int K = std::min(max_k_, limit);
  if (K <= 0 || !cost_measured(0)) return 0;
  const int best = best_drafting_k(K);
  if (choice_rate(best) > rate(0)) return best;
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

void DepthController::record(int k, int accepted, double cost_ms) {
  QF_CHECK(k >= 0 && k <= max_k_ && accepted >= 0 && accepted <= k, "depth controller: round k %d, accepted %d",
           k, accepted);
  const double ms = std::max(cost_ms, 1e-9);
  if (k > 0 && seen_[k] < p_.cost_warmup && !draft_rounds_.empty()) {
    // A warm-up round: what it cost beyond the line is this depth's one-off (the whole warm-up
    // of a depth, summed over its rounds, is what an untried depth is charged in choose()).
    warm_part_ += std::max(ms - cost_estimate(k), 0.0);
    if (seen_[k] + 1 == p_.cost_warmup) warmup_.add(warm_part_, 4), warm_part_ = 0;
  } else if (seen_[k] < p_.cost_warmup) {
    warm_part_ = 0;
  }
  if (++seen_[k] > p_.cost_warmup) {
    // Costed: into the plain mean or the drafting fit (with the plain steps before it, whose
    // deferred rows it ran), every older round of its kind decaying by (1 - 1/cost_window).
    std::vector<Round>& rounds = k == 0 ? plain_rounds_ : draft_rounds_;
    const double keep = 1.0 - 1.0 / p_.cost_window;
    for (Round& r : rounds) r.w *= keep;
    rounds.push_back({k, k == 0 ? 0 : plain_run_, ms, 1.0});
    if (static_cast<int>(rounds.size()) > 4 * p_.cost_window) rounds.erase(rounds.begin());
    costed_[k]++;
    refit();
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
  const bool drafting_wins = choice_rate(best) > rate(0);
  wait_ = probing_ && !drafting_wins ? std::min(2 * wait_, p_.probe_max) : p_.probe_first;
  probing_ = false;
}

}  // namespace qf
