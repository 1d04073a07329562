// The round loop's hooks and telemetry: forced acceptance through an AcceptOverride (the bench's
// only way to set acceptance on random weights), its refusal at T > 0, and phase times that do
// not overlap.
#include <gtest/gtest.h>

#include <random>

#include "backend/backend.h"
#include "core/error.h"
#include "model/qwen38.h"
#include "runtime/generate.h"
#include "support/oracle_source.h"
#include "support/test_models.h"

namespace qf {
namespace {

struct Fixture {
  test::TinyTarget t;
  std::string dir;
  std::unique_ptr<Backend> be;
  std::unique_ptr<Qwen38Model> m;
  std::vector<int32_t> prompt = {11, 250, 3, 4097, 18, 600, 7};
};

Fixture& fixture() {
  static Fixture f;
  if (!f.m) {
    f.t.layers = 4;
    f.t.intermediate = 384;
    f.t.mtp = false;
    f.dir = test::write_tiny_target(test::temp_dir("gen"), f.t);
    f.be = make_cpu_backend();
    f.m = Qwen38Model::load(f.dir, f.be.get(), 16);
  }
  return f;
}

struct Round {
  int pos, k, accepted;
  int32_t bonus;
  std::vector<int32_t> drafts;
};

TEST(Generate, ForcedAcceptanceKeepsExactlyNDraftsWhateverTheTargetSays) {
  Fixture& f = fixture();
  const int n = 40, k = 5, forced = 3;
  // All-wrong drafts: the real verdict would keep none of them.
  test::OracleSource src(std::vector<int32_t>(n + 16, 0), static_cast<int>(f.prompt.size()), f.t.vocab,
                         test::OracleMode::AllWrong, 7, 1);
  Generator g(*f.m, &src, 128);
  GenerateOptions o;
  o.max_new_tokens = n;
  o.draft_k = k;
  o.accept_override = forced_acceptance(forced);
  std::vector<int32_t> out;
  std::vector<Round> rounds;
  const GenStats st = g.generate(
      f.prompt, o,
      [&](int32_t t) {
        out.push_back(t);
        return true;
      },
      [&](int pos, const std::vector<int32_t>& d, int a, int32_t bonus) {
        rounds.push_back({pos, static_cast<int>(d.size()), a, bonus, d});
      });
  ASSERT_EQ(static_cast<int>(out.size()), n);
  ASSERT_FALSE(rounds.empty());
  int64_t accepted = 0;
  size_t emitted = 1;  // the first token comes from prefill
  for (const Round& r : rounds) {
    EXPECT_EQ(r.accepted, std::min(forced, r.k)) << "round at " << r.pos;
    accepted += r.accepted;
    // The forced drafts are emitted as if accepted, then the target's token after them.
    for (int i = 0; i < r.accepted && emitted < out.size(); i++) EXPECT_EQ(out[emitted++], r.drafts[i]);
    if (emitted < out.size()) {
      EXPECT_EQ(out[emitted++], r.bonus);
    }
  }
  EXPECT_EQ(st.accepted, accepted);
  EXPECT_GT(st.tau(), forced + 0.5);  // 4 tokens a round but for the last, shorter ones
  // Without the override the same drafts are all rejected.
  GenerateOptions plain_o = o;
  plain_o.accept_override = nullptr;
  EXPECT_EQ(g.generate(f.prompt, plain_o, nullptr).accepted, 0);
}

TEST(Generate, AcceptOverrideRefusesSampling) {
  Fixture& f = fixture();
  test::OracleSource src(std::vector<int32_t>(64, 0), static_cast<int>(f.prompt.size()), f.t.vocab,
                         test::OracleMode::AllWrong, 7, 1);
  Generator g(*f.m, &src, 128);
  GenerateOptions o;
  o.max_new_tokens = 4;
  o.sampling.temperature = 1.0f;
  o.accept_override = forced_acceptance(2);
  try {
    g.generate(f.prompt, o, nullptr);
    FAIL() << "an accept override at T > 0 must be refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Usage);
    EXPECT_NE(std::string(e.what()).find("greedy"), std::string::npos) << e.what();
  }
}

// Each step's timer covers its own work: the phases add up to no more than decoding took, and
// every phase a speculative run goes through is counted.
TEST(Generate, PhaseTimesAreDisjointAndCovered) {
  Fixture& f = fixture();
  test::OracleSource src(std::vector<int32_t>(64, 0), static_cast<int>(f.prompt.size()), f.t.vocab,
                         test::OracleMode::AllWrong, 7, 1);
  Generator g(*f.m, &src, 128);
  GenerateOptions o;
  o.max_new_tokens = 24;
  o.draft_k = 4;
  const GenStats st = g.generate(f.prompt, o, nullptr);
  EXPECT_GT(st.prefill_ms, 0);
  EXPECT_GT(st.draft_ms, 0);
  EXPECT_GT(st.verify_ms, 0);
  EXPECT_GT(st.accept_ms, 0);
  EXPECT_LE(st.draft_ms + st.verify_ms + st.accept_ms, st.total_decode_ms);
  // The verify passes (k+1 target rows each) dominate this CPU run; a timer that nested another
  // phase or covered the whole round would break one of these.
  EXPECT_GT(st.verify_ms, st.accept_ms);
  EXPECT_GT(st.verify_ms, st.draft_ms);
}

}  // namespace
}  // namespace qf
