// Sampling at T > 0 is lossless in distribution (docs/spec/speculative.md section 5): with MTP or
// DFlash2 drafting, the emitted tokens follow the target's own distribution. Checked with a
// chi-square goodness-of-fit test against exact marginals computed from the model itself, on a
// tiny random pair with a 48-token vocabulary. Seeds are fixed, so the test is deterministic.
#include <gtest/gtest.h>

#include <cmath>

#include "backend/backend.h"
#include "model/qwen38.h"
#include "runtime/draft_source.h"
#include "runtime/generate.h"
#include "runtime/sampling.h"
#include "support/test_models.h"

namespace qf {
namespace {

constexpr int kV = 48;

TEST(Sampling, TargetProbsTopKTopP) {
  std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f};
  SamplingParams s;
  s.temperature = 1.0f;
  std::vector<float> p;
  target_probs(logits.data(), 5, s, p);
  double sum = 0;
  for (float x : p) sum += x;
  EXPECT_NEAR(sum, 1.0, 1e-6);
  s.top_k = 2;  // ids 1 and 3 (equal logits) survive
  target_probs(logits.data(), 5, s, p);
  EXPECT_NEAR(p[1], 0.5f, 1e-6);
  EXPECT_NEAR(p[3], 0.5f, 1e-6);
  EXPECT_EQ(p[0] + p[2] + p[4], 0.0f);
  s.top_k = 0;
  s.top_p = 0.5f;  // p(1) = p(3) = 0.40: both are needed to reach 0.5, nothing else
  target_probs(logits.data(), 5, s, p);
  EXPECT_NEAR(p[1], 0.5f, 1e-6);
  EXPECT_NEAR(p[3], 0.5f, 1e-6);
  EXPECT_EQ(p[0] + p[2] + p[4], 0.0f);
}

TEST(Sampling, ResidualIsPMinusQClamped) {
  std::vector<float> p = {0.5f, 0.3f, 0.2f}, out;
  DraftDist q;
  q.ids = {0, 2};
  q.probs = {0.7f, 0.1f};
  residual(p, q, out);
  EXPECT_FLOAT_EQ(out[0], 0.0f);
  EXPECT_FLOAT_EQ(out[1], 0.3f);
  EXPECT_FLOAT_EQ(out[2], 0.1f);
}

struct Pair {
  std::string target, drafter, drafter_v1;
};

const Pair& pair() {
  static Pair p;
  static bool made = false;
  if (!made) {
    test::TinyTarget t;
    t.hidden = 128; t.layers = 4; t.heads = 2; t.kv_heads = 1; t.head_dim = 64;
    t.gdn_k_heads = 1; t.gdn_v_heads = 2; t.gdn_dk = 64; t.gdn_dv = 64; t.intermediate = 256;
    t.vocab = kV; t.weight_std = 0.15f; t.seed = 21;
    p.target = test::write_tiny_target(test::temp_dir("samp_t"), t);
    test::TinyDrafter d;
    d.taps = {0, 2, 3}; d.heads = 2; d.kv_heads = 1; d.intermediate = 256; d.mask_id = kV - 1; d.window = 16; d.rank = 16;
    p.drafter = test::write_tiny_drafter(test::temp_dir("samp_d"), d, t);
    d.v2 = false;
    p.drafter_v1 = test::write_tiny_drafter(test::temp_dir("samp_d1"), d, t);
    made = true;
  }
  return p;
}

// Next-token distribution of the target after `ctx` at temperature 1.
std::vector<double> next_probs(Qwen38Model& m, Backend& be, const std::vector<int32_t>& ctx) {
  auto st = m.new_state(64, 0);
  ForwardOpts fo;
  fo.logits_last_only = true;
  m.forward(*st, ctx.data(), static_cast<int>(ctx.size()), fo);
  std::vector<float> l(kV), p;
  be.download(l.data(), m.logits(), kV * 4);
  softmax_t(l.data(), kV, 1.0f, p);
  return std::vector<double>(p.begin(), p.end());
}

// Pearson chi-square of observed counts against expected probabilities; cells expecting fewer
// than 5 draws are pooled. Returns (statistic, degrees of freedom).
std::pair<double, int> chi_square(const std::vector<int>& obs, const std::vector<double>& prob, int n) {
  double stat = 0, pool_e = 0;
  int pool_o = 0, cells = 0;
  for (size_t i = 0; i < obs.size(); i++) {
    const double e = prob[i] * n;
    if (e < 5) {
      pool_e += e;
      pool_o += obs[i];
      continue;
    }
    stat += (obs[i] - e) * (obs[i] - e) / e;
    cells++;
  }
  if (pool_e >= 5) {
    stat += (pool_o - pool_e) * (pool_o - pool_e) / pool_e;
    cells++;
  }
  return {stat, cells - 1};
}

// A critical value far in the tail (about p = 1e-4 for df 20-50): only a real bias trips it.
double critical(int df) { return df + 4.5 * std::sqrt(2.0 * df); }

TEST(Sampling, SpeculativeSamplingMatchesTargetDistribution) {
  const Pair& pr = pair();
  auto be = make_cpu_backend();
  auto m = Qwen38Model::load(pr.target, be.get(), 16);
  const std::vector<int32_t> prompt = {3, 17, 29, 8, 40};
  // Exact marginals of the 2nd and 3rd sampled tokens.
  const std::vector<double> p1 = next_probs(*m, *be, prompt);
  std::vector<double> p2(kV, 0.0), p3(kV, 0.0);
  for (int a = 0; a < kV; a++) {
    if (p1[a] < 1e-6) continue;
    std::vector<int32_t> c = prompt;
    c.push_back(a);
    const auto pa = next_probs(*m, *be, c);
    for (int b = 0; b < kV; b++) {
      p2[b] += p1[a] * pa[b];
      if (p1[a] * pa[b] < 1e-5) continue;
      std::vector<int32_t> cb = c;
      cb.push_back(b);
      const auto pb = next_probs(*m, *be, cb);
      for (int x = 0; x < kV; x++) p3[x] += p1[a] * pa[b] * pb[x];
    }
  }
  MtpDraftSource mtp(*m, 64);
  DFlashDraftSource dfl(DFlash2Drafter::load(pr.drafter, *m));
  DFlashDraftSource dfl1(DFlash2Drafter::load(pr.drafter_v1, *m));
  const int N = 3000;
  struct Case {
    DraftSource* src;
    int k;
    float temperature;
    bool expect_fit;
  };
  const std::vector<Case> cases = {{nullptr, 0, 1.0f, true}, {&mtp, 2, 1.0f, true}, {&dfl, 3, 1.0f, true},
                                   {&dfl1, 3, 1.0f, true},
                                   // negative control: the wrong temperature must be detected
                                   {nullptr, 0, 1.4f, false}};
  for (const Case& c : cases) {
    Generator g(*m, c.src, 64);
    std::vector<int> c2(kV, 0), c3(kV, 0);
    int64_t accepted = 0;
    for (int i = 0; i < N; i++) {
      GenerateOptions o;
      o.max_new_tokens = 3;
      o.draft_k = c.k;
      o.sampling.temperature = c.temperature;
      o.sampling.seed = 1000 + i;
      std::vector<int32_t> t;
      GenStats st = g.generate(prompt, o, [&](int32_t x) {
        t.push_back(x);
        return true;
      });
      accepted += st.accepted;
      ASSERT_EQ(t.size(), 3u);
      c2[t[1]]++;
      c3[t[2]]++;
    }
    const auto [s2, df2] = chi_square(c2, p2, N);
    const auto [s3, df3] = chi_square(c3, p3, N);
    const std::string name = c.src ? c.src->name() : "plain";
    std::printf("%s T=%.1f: chi2 token2 %.1f (df %d, crit %.1f), token3 %.1f (df %d, crit %.1f), accepted %lld\n",
                name.c_str(), c.temperature, s2, df2, critical(df2), s3, df3, critical(df3), (long long)accepted);
    if (c.expect_fit) {
      EXPECT_LT(s2, critical(df2)) << name;
      EXPECT_LT(s3, critical(df3)) << name;
      if (c.src) EXPECT_GT(accepted, N / 10) << name << ": drafts should be accepted sometimes";
    } else {
      EXPECT_GT(std::max(s2 - critical(df2), s3 - critical(df3)), 0.0) << "the test cannot detect a wrong temperature";
    }
  }
}

}  // namespace
}  // namespace qf
