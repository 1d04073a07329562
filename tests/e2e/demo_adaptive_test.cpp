// The depth controller (--draft-k auto) on the demo pair at real acceptance: the drafts, the
// verdicts and the k-dependence of a block drafter's drafts are the real ones (CPU), the round
// costs are injected (GenerateOptions::round_cost) in the shapes of the H200, where a decode step
// of this tiny model is 0.31 ms and host-side work and timing noise are large against it. The
// controller sees noisy costs with one-off slow rounds (a graph key's direct run and recording);
// the rates compared are tokens per unit of the true mean cost, fixed runs paying their own
// one-offs. Target (issue 15): auto never slower than plain and within 3% of the best fixed k,
// code and prose prompts, T = 0 and T = 0.8; met here for DFlash2 on code at T = 0 (the case below).
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "model/qwen38.h"
#include "runtime/draft_source.h"
#include "runtime/generate.h"
#include "support/backends.h"
#include "tokenizer/tokenizer.h"

namespace qf {
namespace {

std::string src_dir() { return std::string(QFLASH_SOURCE_DIR); }

// JSONL prompts: token ids ("ids") or text ("text"), the first n.
std::vector<std::vector<int32_t>> load_prompts(const std::string& path, const Tokenizer& tok, int n) {
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

// The demo pair's measured H200 shape (docs/BENCHMARKS.md runs 22-23: DFlash2 k = 7 at 2.09x
// plain with tau 5.24 -> a k = 7 round costs ~2.5 steps), where the round's fixed host-side work
// dominates. The other shapes and cases measured with this harness (the 27B-like 'brief' shape
// 1.13 + 0.02 k, MTP 1.25 + 0.37 k, T = 0.8, prose) do not meet the target yet and are not tests:
// their numbers and why are in docs/experiments/adaptive_depth.md.
const Machine kDflashDemo{"dflash2 demo shape", 2.2, 0.04, 0.0, 4.0, 0.5};

struct Result {
  double rate = 0;  // tokens per decode step of true cost
  double k_mean = 0;
  std::vector<int> ks;
};

class DemoAdaptive : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string why;
    be_ = test::make_test_backend("cpu", &why).release();
    m_ = Qwen38Model::load(src_dir() + "/models/demo", be_, 16).release();
    tok_ = new Tokenizer(Tokenizer::load(src_dir() + "/models/demo"));
    dfl_ = new DFlashDraftSource(DFlash2Drafter::load(src_dir() + "/models/demo/drafter", *m_));
  }
  static void TearDownTestSuite() {
    delete dfl_;
    delete tok_;
    delete m_;
    delete be_;
  }

  // One Generator over all prompts (as the bench and a server hold it): fixed k, or auto (k < 0).
  static Result run(DraftSource* src, int k, const Machine& mc, const std::vector<std::vector<int32_t>>& prompts,
                    float temperature, int gen, uint64_t noise_seed) {
    Generator g(*m_, src, 1024);
    std::mt19937_64 noise(noise_seed);
    std::lognormal_distribution<double> jitter(0.0, 0.15);
    std::bernoulli_distribution spike(0.03);
    std::map<int, int> runs;  // rounds per depth so far: the first two pay the one-off
    int plain_run = 0;        // plain steps since the last drafting round (catch-up rows)
    double extra = 0;         // this round's one-off and catch-up, in decode steps
    double cost = 0, tokens = 0, ksum = 0;
    Result r;
    for (size_t i = 0; i < prompts.size(); i++) {
      GenerateOptions o;
      o.max_new_tokens = gen;
      o.draft_k = src ? k : 0;
      o.sampling.temperature = temperature;
      o.sampling.seed = 1000 + i;
      // What the controller sees: the true cost with jitter and rare spikes (a host hiccup).
      o.round_cost = [&](int kk, int) {
        double c = mc.cost(kk) * jitter(noise);
        if (spike(noise)) c *= 3.0;
        return (c + extra) * 0.31;
      };
      auto on_round = [&](int, const std::vector<int32_t>& drafts, int, int32_t) {
        const int kk = static_cast<int>(drafts.size());
        extra = runs[kk]++ < 2 ? mc.one_off : 0.0;
        if (kk > 0 && plain_run > 0) extra += mc.catch_up * (1.0 + plain_run / 8.0);
        plain_run = kk == 0 ? plain_run + 1 : 0;
        cost += mc.cost(kk) + extra;
        ksum += kk;
        r.ks.push_back(kk);
      };
      const GenStats st = g.generate(prompts[i], o, nullptr, on_round);
      tokens += st.generated_tokens;
    }
    r.rate = tokens / cost;
    r.k_mean = ksum / std::max<size_t>(r.ks.size(), 1);
    return r;
  }

  static void check(DraftSource* src, const Machine& mc, const std::string& prompt_file, int n, float temperature) {
    const auto prompts = load_prompts(prompt_file, *tok_, n);
    ASSERT_EQ(static_cast<int>(prompts.size()), n) << prompt_file;
    const int gen = 128;
    const double plain = run(nullptr, 0, mc, prompts, temperature, gen, 1).rate;
    double best = plain;
    int best_k = 0;
    std::string fixed_line;
    for (int k = 1; k <= src->max_k(); k++) {
      const double r = run(src, k, mc, prompts, temperature, gen, 1).rate;
      fixed_line += " k" + std::to_string(k) + " " + std::to_string(r / plain).substr(0, 5);
      if (r > best) best = r, best_k = k;
    }
    for (uint64_t seed : {1u, 2u}) {
      const Result a = run(src, kDraftKAuto, mc, prompts, temperature, gen, seed);
      std::string head;
      for (size_t i = 0; i < a.ks.size() && i < 60; i++) head += std::to_string(a.ks[i]);
      std::printf("%s, %s, T %.1f, noise %d: vs plain:%s | best k %d; auto %.3f of plain, %.3f of best, k mean %.2f\n  k: %s\n",
                  mc.name, prompt_file.substr(prompt_file.rfind('/') + 1).c_str(), temperature, (int)seed,
                  fixed_line.c_str(), best_k, a.rate / plain, a.rate / best, a.k_mean, head.c_str());
      EXPECT_GE(a.rate, plain) << mc.name << " T " << temperature << " seed " << seed;
      EXPECT_GE(a.rate, 0.97 * best) << mc.name << " T " << temperature << " seed " << seed << " best k " << best_k;
    }
  }

  static Backend* be_;
  static Qwen38Model* m_;
  static Tokenizer* tok_;
  static DFlashDraftSource* dfl_;
};
Backend* DemoAdaptive::be_ = nullptr;
Qwen38Model* DemoAdaptive::m_ = nullptr;
Tokenizer* DemoAdaptive::tok_ = nullptr;
DFlashDraftSource* DemoAdaptive::dfl_ = nullptr;

std::string code() { return src_dir() + "/models/demo/validation_prompts.jsonl"; }

// Auto 1.001 / 0.999 of fixed k = 7 (seeds 1, 2); 0.857 / 0.914 before the cost warm-up and the
// deferred-cost charge (docs/experiments/adaptive_depth.md).
TEST_F(DemoAdaptive, DFlash2CodeGreedy) { check(dfl_, kDflashDemo, code(), 8, 0.0f); }

}  // namespace
}  // namespace qf
