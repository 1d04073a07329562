#include "runtime/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace qf {

float DraftDist::prob_of(int32_t token) const {
  if (ids.empty()) return token >= 0 && token < static_cast<int32_t>(probs.size()) ? probs[token] : 0.0f;
  for (size_t i = 0; i < ids.size(); i++)
    if (ids[i] == token) return probs[i];
  return 0.0f;
}

void softmax_t(const float* x, int n, float temperature, std::vector<float>& out) {
  out.resize(n);
  float mx = -INFINITY;
  for (int i = 0; i < n; i++) mx = std::max(mx, x[i] / temperature);
  double sum = 0;
  for (int i = 0; i < n; i++) sum += (out[i] = std::exp(x[i] / temperature - mx));
  for (int i = 0; i < n; i++) out[i] = static_cast<float>(out[i] / sum);
}

void target_probs(const float* logits, int V, const SamplingParams& s, std::vector<float>& p) {
  softmax_t(logits, V, s.temperature, p);
  const bool use_k = s.top_k > 0 && s.top_k < V, use_p = s.top_p < 1.0f;
  if (!use_k && !use_p) return;
  // Order by probability (desc), ties by id (asc): the kept set is deterministic.
  std::vector<int32_t> idx(V);
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
  size_t keep = use_k ? static_cast<size_t>(s.top_k) : idx.size();
  if (use_p) {
    double cum = 0;
    size_t n = 0;
    while (n < keep) {
      cum += p[idx[n++]];
      if (cum >= s.top_p) break;
    }
    keep = n;
  }
  double sum = 0;
  for (size_t i = 0; i < keep; i++) sum += p[idx[i]];
  std::vector<float> q(V, 0.0f);
  for (size_t i = 0; i < keep; i++) q[idx[i]] = static_cast<float>(p[idx[i]] / sum);
  p.swap(q);
}

float uniform01(Rng& rng) { return static_cast<float>((rng() >> 40) * (1.0 / 16777216.0)); }

int32_t sample_from(const std::vector<float>& w, Rng& rng) {
  double total = 0;
  for (float x : w) total += x;
  const double u = (static_cast<double>(rng() >> 11) * (1.0 / 9007199254740992.0)) * total;
  double cum = 0;
  int32_t last = 0;
  for (size_t i = 0; i < w.size(); i++) {
    if (w[i] <= 0) continue;
    cum += w[i];
    last = static_cast<int32_t>(i);
    if (u < cum) return last;
  }
  return last;  // rounding at the top end
}

void residual(const std::vector<float>& p, const DraftDist& q, std::vector<float>& out) {
  out = p;
  if (q.ids.empty()) {
    for (size_t i = 0; i < out.size(); i++) out[i] = std::max(0.0f, p[i] - q.probs[i]);
  } else {
    for (size_t i = 0; i < q.ids.size(); i++) out[q.ids[i]] = std::max(0.0f, p[q.ids[i]] - q.probs[i]);
  }
  double sum = 0;
  for (float x : out) sum += x;
  if (sum <= 0) out = p;
}

}  // namespace qf
