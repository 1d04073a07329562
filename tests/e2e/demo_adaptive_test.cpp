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

#include "model/qwen38.h"
#include "runtime/draft_source.h"
#include "runtime/generate.h"
#include "support/backends.h"
#include "support/demo_adaptive_harness.h"
#include "tokenizer/tokenizer.h"

namespace qf {
namespace {

std::string src_dir() { return std::string(QFLASH_SOURCE_DIR); }

using harness::kDflashDemo;
using harness::Machine;
using harness::Result;

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

  static Result run(DraftSource* src, int k, const Machine& mc, const std::vector<std::vector<int32_t>>& prompts,
                    float temperature, int gen, uint64_t noise_seed) {
    return harness::run(*m_, src, k, mc, prompts, temperature, gen, noise_seed);
  }

  static void check(DraftSource* src, const Machine& mc, const std::string& prompt_file, int n, float temperature) {
    const auto prompts = harness::load_prompts(prompt_file, *tok_, n);
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
