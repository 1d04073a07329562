// The identity contract (docs/spec/speculative.md section 2): greedy output with any draft source,
// at any depth, with any draft quality equals plain decoding's, stops included.
#include <gtest/gtest.h>

#include <random>

#include "backend/backend.h"
#include "model/qwen38.h"
#include "runtime/draft_source.h"
#include "runtime/generate.h"
#include "support/backends.h"
#include "support/oracle_source.h"
#include "support/test_models.h"

namespace qf {
namespace {

struct Pair {
  std::string target, drafter, drafter_v1;
  test::TinyTarget t;
};

// Two tiny random pairs: the spec's tiny shape and an odd one (3 heads, ratio-2 GDN, 4 layers).
const Pair& pair(int which) {
  static Pair pairs[2];
  static bool made[2] = {false, false};
  if (!made[which]) {
    Pair& p = pairs[which];
    if (which == 1) {
      p.t.hidden = 192; p.t.layers = 4; p.t.heads = 3; p.t.kv_heads = 1; p.t.head_dim = 64;
      p.t.gdn_k_heads = 1; p.t.gdn_v_heads = 2; p.t.gdn_dk = 32; p.t.gdn_dv = 64;
      p.t.intermediate = 320; p.t.vocab = 1000; p.t.seed = 11;
    }
    p.target = test::write_tiny_target(test::temp_dir("target"), p.t);
    test::TinyDrafter d;
    if (which == 1) { d.taps = {0, 2, 3}; d.heads = 2; d.kv_heads = 1; d.mask_id = 999; d.window = 16; d.rank = 16; d.intermediate = 256; }
    p.drafter = test::write_tiny_drafter(test::temp_dir("drafter"), d, p.t);
    d.v2 = false;
    p.drafter_v1 = test::write_tiny_drafter(test::temp_dir("drafter_v1"), d, p.t);
    made[which] = true;
  }
  return pairs[which];
}

std::vector<int32_t> random_prompt(int n, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> p(n);
  for (auto& t : p) t = static_cast<int32_t>(rng() % (vocab - 2));
  return p;
}

struct GenRun {
  std::vector<int32_t> tokens;
  GenStats stats;
};

GenRun gen(Qwen38Model& m, DraftSource* src, const std::vector<int32_t>& prompt, int n, int k,
        std::vector<int32_t> stops = {}) {
  Generator g(m, src, 512);
  GenerateOptions o;
  o.max_new_tokens = n;
  o.draft_k = k;
  o.stop_ids = stops;
  GenRun r;
  r.stats = g.generate(prompt, o, [&](int32_t t) { r.tokens.push_back(t); return true; });
  return r;
}

// (pair, backend): identity is per backend, so it is checked on every backend present.
using Param = std::tuple<int, std::string>;
class SpecIdentity : public ::testing::TestWithParam<Param> {
 protected:
  std::unique_ptr<Backend> backend() {
    std::string why;
    auto be = test::make_test_backend(std::get<1>(GetParam()), &why);
    EXPECT_TRUE(be) << why;
    return be;
  }
  const Pair& the_pair() { return pair(std::get<0>(GetParam())); }
};

TEST_P(SpecIdentity, OrganicDraftsMatchPlain) {
  const Pair& p = the_pair();
  auto be = backend();
  if (!be) return;
  auto m = Qwen38Model::load(p.target, be.get(), 16);
  for (uint64_t seed : {1u, 2u}) {
    auto prompt = random_prompt(seed == 1 ? 7 : 37, p.t.vocab, seed);
    GenRun plain = gen(*m, nullptr, prompt, 200, 0);
    ASSERT_EQ(plain.tokens.size(), 200u);
    MtpDraftSource mtp(*m, 512);
    DFlashDraftSource dfl(DFlash2Drafter::load(p.drafter, *m));
    DFlashDraftSource dfl1(DFlash2Drafter::load(p.drafter_v1, *m));
    // kDraftKAuto: the depth controller picks k per round (plain steps included), on measured costs.
    for (int k : {kDraftKAuto, 1, 3, 7}) {
      for (DraftSource* s : std::vector<DraftSource*>{&mtp, &dfl, &dfl1}) {
        GenRun r = gen(*m, s, prompt, 200, k);
        EXPECT_EQ(r.tokens, plain.tokens) << s->name() << " k=" << k << " seed=" << seed;
        EXPECT_EQ(r.stats.k_auto, k == kDraftKAuto);
        EXPECT_EQ(r.stats.k, k == kDraftKAuto ? s->max_k() : k);
        EXPECT_LT(r.stats.rounds, 201);
      }
    }
  }
  // On a GPU with graphs on, the decode and verify forwards above were replays of recordings
  // (so the identity just checked covers the graph path); QFLASH_CUDA_GRAPHS=0 runs them direct.
  if (be->graphs_enabled())
    EXPECT_GT(m->graph_replays(), 100u);
  else
    EXPECT_EQ(m->graph_replays(), 0u);
}

TEST_P(SpecIdentity, InjectedDraftsMatchPlain) {
  const Pair& p = the_pair();
  auto be = backend();
  if (!be) return;
  auto m = Qwen38Model::load(p.target, be.get(), 16);
  auto prompt = random_prompt(11, p.t.vocab, 5);
  GenRun plain = gen(*m, nullptr, prompt, 220, 0);
  for (int k : {kDraftKAuto, 1, 3, 7}) {
    for (auto mode : {test::OracleMode::AllRight, test::OracleMode::AllWrong, test::OracleMode::RandomPrefix}) {
      test::OracleSource src(plain.tokens, static_cast<int>(prompt.size()), p.t.vocab, mode, 7, 100 + k);
      GenRun r = gen(*m, &src, prompt, 220, k);
      EXPECT_EQ(r.tokens, plain.tokens) << "k=" << k << " mode=" << static_cast<int>(mode);
      if (mode == test::OracleMode::AllRight && k != kDraftKAuto) {
        EXPECT_EQ(r.stats.accepted, r.stats.drafted);
        EXPECT_GT(r.stats.tau(), k + 0.5);  // k+1 per round; the last rounds may draft fewer
      }
      if (mode == test::OracleMode::AllWrong) {
        EXPECT_EQ(r.stats.accepted, 0);
        EXPECT_EQ(r.stats.rounds, 219);
      }
    }
  }
}

TEST_P(SpecIdentity, StopInsideRoundIsHonoured) {
  const Pair& p = the_pair();
  auto be = backend();
  if (!be) return;
  auto m = Qwen38Model::load(p.target, be.get(), 16);
  auto prompt = random_prompt(9, p.t.vocab, 9);
  GenRun plain = gen(*m, nullptr, prompt, 120, 0);
  // Stop on a token that plain decoding produces somewhere after the first few tokens.
  const int32_t stop = plain.tokens[45];
  size_t first = 0;
  while (plain.tokens[first] != stop) first++;
  GenRun plain_stop = gen(*m, nullptr, prompt, 120, 0, {stop});
  ASSERT_EQ(plain_stop.tokens.size(), first);
  ASSERT_EQ(plain_stop.stats.stop_reason, "stop_token");
  for (int k : {kDraftKAuto, 3, 7}) {
    test::OracleSource src(plain.tokens, static_cast<int>(prompt.size()), p.t.vocab, test::OracleMode::AllRight, 7, 3);
    GenRun r = gen(*m, &src, prompt, 120, k, {stop});
    EXPECT_EQ(r.tokens, plain_stop.tokens) << "k=" << k;
    EXPECT_EQ(r.stats.stop_reason, "stop_token");
  }
  // max_tokens inside a round
  test::OracleSource src(plain.tokens, static_cast<int>(prompt.size()), p.t.vocab, test::OracleMode::AllRight, 7, 3);
  GenRun r = gen(*m, &src, prompt, 10, 7);
  EXPECT_EQ(r.tokens, std::vector<int32_t>(plain.tokens.begin(), plain.tokens.begin() + 10));
}

INSTANTIATE_TEST_SUITE_P(Pairs, SpecIdentity, ::testing::Combine(::testing::Values(0, 1), ::testing::ValuesIn(test::test_backends())),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) == 0 ? "tiny" : "odd") + "_" + std::get<1>(info.param);
                         });

}  // namespace
}  // namespace qf
