// Sampling at temperature > 0 (docs/spec/speculative.md section 5): the target's distribution p
// (temperature, then top-k and top-p shape p only), draws from a seeded generator, and the
// lossless speculative acceptance rule with residual resampling.
#pragma once
#include <cstdint>
#include <random>
#include <vector>

namespace qf {

struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy (argmax, lowest id on ties)
  int top_k = 0;             // 0 = off
  float top_p = 1.0f;        // 1 = off
  uint64_t seed = 0;
  bool greedy() const { return temperature <= 0.0f; }
};

using Rng = std::mt19937_64;

// A draft distribution q: sparse (ids + probs, ids distinct) or dense (ids empty, probs [V]).
struct DraftDist {
  std::vector<int32_t> ids;
  std::vector<float> probs;
  float prob_of(int32_t token) const;
};

// p = softmax(logits / T) restricted by top-k / top-p, renormalised; dense [V].
void target_probs(const float* logits, int V, const SamplingParams& s, std::vector<float>& p);
// q for a draft head: softmax(logits / T), dense, temperature only (no top-k/top-p on q).
void softmax_t(const float* x, int n, float temperature, std::vector<float>& out);
// A draw from a (not necessarily normalised) non-negative weight vector.
int32_t sample_from(const std::vector<float>& w, Rng& rng);
float uniform01(Rng& rng);
// The residual after rejecting a draft: normalize(max(p - q, 0)), or p when that is all zero.
void residual(const std::vector<float>& p, const DraftDist& q, std::vector<float>& out);

}  // namespace qf
