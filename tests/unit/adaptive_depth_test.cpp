// --draft-k auto in the round loop: the controller leaves drafting when drafts fail and comes back
// when they are good again, with greedy output equal to plain decoding throughout; forced
// acceptance steers it (the bench's targets); decisions are reproducible under an injected cost
// model; and a source that deferred its plain-step rows drafts exactly as one that observed
// every row as it came (the realignment when drafting resumes).
#include <gtest/gtest.h>

#include <random>

#include "backend/backend.h"
#include "model/qwen38.h"
#include "runtime/draft_source.h"
#include "runtime/generate.h"
#include "support/backends.h"
#include "support/test_models.h"

namespace qf {
namespace {

// Drafts from the plain greedy continuation: right, except for anchors at positions in
// [wrong_from, wrong_to), where every draft is wrong.
class PhasedOracle final : public DraftSource {
 public:
  PhasedOracle(std::vector<int32_t> ref, int prompt_len, int vocab, int wrong_from, int wrong_to)
      : ref_(std::move(ref)), n_(prompt_len), vocab_(vocab), from_(wrong_from), to_(wrong_to) {}
  std::string name() const override { return "phased"; }
  int max_k() const override { return 7; }
  int default_k() const override { return 7; }
  void begin(int) override {}
  void observe(const TargetModel&, int, int, const int32_t*) override {}
  void draft(int32_t, int pos, int k, int32_t* out) override {
    const bool wrong = pos >= from_ && pos < to_;
    for (int i = 0; i < k; i++) {
      const size_t idx = static_cast<size_t>(pos - n_ + 1 + i);
      const int32_t truth = idx < ref_.size() ? ref_[idx] : 0;
      out[i] = wrong ? (truth + 1 + i) % vocab_ : truth;
    }
  }

 private:
  std::vector<int32_t> ref_;
  int n_, vocab_, from_, to_;
};

struct Model {
  test::TinyTarget t;
  std::string dir, drafter;
};

const Model& tiny() {
  static Model m;
  if (m.dir.empty()) {
    m.t.layers = 4;
    m.t.intermediate = 384;
    m.dir = test::write_tiny_target(test::temp_dir("adaptive"), m.t);
    test::TinyDrafter d;
    d.taps = {0, 2, 3};
    m.drafter = test::write_tiny_drafter(test::temp_dir("adaptive_drafter"), d, m.t);
  }
  return m;
}

std::vector<int32_t> random_prompt(int n, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> p(n);
  for (auto& t : p) t = static_cast<int32_t>(rng() % (vocab - 2));
  return p;
}

struct Out {
  std::vector<int32_t> tokens;
  std::vector<int> ks;  // per round
  GenStats stats;
};

Out generate(Qwen38Model& m, DraftSource* src, const std::vector<int32_t>& prompt, const GenerateOptions& o) {
  Generator g(m, src, 1024);
  Out r;
  r.stats = g.generate(
      prompt, o, [&](int32_t t) { r.tokens.push_back(t); return true; },
      [&](int, const std::vector<int32_t>& d, int, int32_t) { r.ks.push_back(static_cast<int>(d.size())); });
  return r;
}

// A plain step costs 10; a round of depth k 11.3 + 0.2 k (the draft pass ~0.13 of a step).
double fake_cost(int k, int) { return k == 0 ? 10.0 : 11.3 + 0.2 * k; }

class AdaptiveDepth : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string why;
    be_ = test::shared_backend(GetParam(), &why);
    ASSERT_TRUE(be_) << why;
    m_ = Qwen38Model::load(tiny().dir, be_, 16);
  }
  Backend* be_ = nullptr;
  std::unique_ptr<Qwen38Model> m_;
};

TEST_P(AdaptiveDepth, LeavesDraftingWhenDraftsFailAndComesBackKeepingIdentity) {
  const int n = 400;
  const auto prompt = random_prompt(9, tiny().t.vocab, 3);
  const int P = static_cast<int>(prompt.size());
  GenerateOptions o;
  o.max_new_tokens = n;
  const Out plain = generate(*m_, nullptr, prompt, o);
  ASSERT_EQ(plain.tokens.size(), static_cast<size_t>(n));
  // Drafts are right, then wrong for anchors at P+100 .. P+250, then right again.
  const int from = P + 100, to = P + 250;
  PhasedOracle src(plain.tokens, P, tiny().t.vocab, from, to);
  o.round_cost = fake_cost;
  const Out a = generate(*m_, &src, prompt, o);
  EXPECT_EQ(a.tokens, plain.tokens);
  EXPECT_TRUE(a.stats.k_auto);
  EXPECT_EQ(a.stats.k, 7);
  // Replay the rounds' positions: what the controller chose in each phase.
  int pos = P, plain_in_wrong = 0, rounds_in_wrong = 0, deep_after = 0, rounds_after = 0;
  std::vector<int> pos_of(a.ks.size());
  for (size_t r = 0; r < a.ks.size(); r++) {
    pos_of[r] = pos;
    const int k = a.ks[r];
    const bool wrong = pos >= from && pos < to;
    if (pos >= from + 20 && pos < to) {
      rounds_in_wrong++;
      plain_in_wrong += k == 0;
    }
    if (pos >= to + 80 && pos + 9 <= P + n) {  // (the last rounds are cut by the token budget)
      rounds_after++;
      deep_after += k == 7;
    }
    pos += (wrong ? 0 : k) + 1;
  }
  ASSERT_GT(rounds_in_wrong, 100);
  EXPECT_GT(plain_in_wrong, rounds_in_wrong * 9 / 10) << "plain steps once the drafts fail";
  ASSERT_GT(rounds_after, 3);
  EXPECT_EQ(deep_after, rounds_after) << "back to k = 7 once the drafts are right again";
  EXPECT_EQ(a.stats.k_rounds[0], std::count(a.ks.begin(), a.ks.end(), 0));
  // Every round's time as the controller was told it, with the plain steps before it.
  ASSERT_EQ(a.stats.round_times.size(), a.ks.size());
  int plain_before = 0;
  for (size_t r = 0; r < a.ks.size(); r++) {
    const GenStats::RoundTime& t = a.stats.round_times[r];
    EXPECT_EQ(t.k, a.ks[r]) << "round " << r;
    EXPECT_EQ(t.deferred, plain_before) << "round " << r;
    EXPECT_DOUBLE_EQ(t.ms, fake_cost(a.ks[r], pos_of[r])) << "round " << r;
    plain_before = a.ks[r] == 0 ? plain_before + 1 : 0;
  }
  EXPECT_TRUE(plain.stats.round_times.empty()) << "no controller, no round times";
  // The same costs give the same decisions.
  PhasedOracle src2(plain.tokens, P, tiny().t.vocab, from, to);
  EXPECT_EQ(generate(*m_, &src2, prompt, o).ks, a.ks);
}

// The bench's targets: forced 0 accepted -> plain steps; forced 4 of 7 -> k = 4.
TEST_P(AdaptiveDepth, ForcedAcceptanceSteersTheDepth) {
  const auto prompt = random_prompt(7, tiny().t.vocab, 4);
  DFlashDraftSource dfl(DFlash2Drafter::load(tiny().drafter, *m_));
  GenerateOptions o;
  o.max_new_tokens = 300;
  o.round_cost = fake_cost;
  o.accept_override = forced_acceptance(0);
  const GenStats zero = generate(*m_, &dfl, prompt, o).stats;
  EXPECT_GT(zero.k_rounds[0], zero.rounds * 9 / 10) << zero.to_table();
  EXPECT_EQ(zero.accepted, 0);
  o.accept_override = forced_acceptance(4);
  const Out four = generate(*m_, &dfl, prompt, o);
  ASSERT_GT(four.ks.size(), 40u);
  for (size_t r = 30; r + 3 < four.ks.size(); r++) EXPECT_EQ(four.ks[r], 4) << "round " << r;
}

// Generator::warm_up: afterwards a run under the controller (which tries several depths and plain
// steps) records no new target graph on a backend with graphs, and its bytes are plain decoding's
// (the warm-up's own runs leave nothing behind in the state or the source).
TEST_P(AdaptiveDepth, WarmUpRecordsEveryRoundShapeAndChangesNothing) {
  const auto prompt = random_prompt(19, tiny().t.vocab, 12);
  GenerateOptions o;
  o.max_new_tokens = 120;
  const Out plain = generate(*m_, nullptr, prompt, o);
  DFlashDraftSource dfl(DFlash2Drafter::load(tiny().drafter, *m_));
  MtpDraftSource mtp(*m_, 1024);
  for (DraftSource* s : std::vector<DraftSource*>{&dfl, &mtp}) {
    Generator g(*m_, s, 1024);
    g.warm_up(prompt);
    const uint64_t rec = m_->graph_recordings();
    if (be_->graphs_enabled()) EXPECT_GT(rec, 0u) << s->name();
    // Forced 0 then real acceptance: plain steps, probes and deep rounds under the controller.
    o.accept_override = forced_acceptance(0);
    g.generate(prompt, o, nullptr);
    o.accept_override = nullptr;
    Out a;
    a.stats = g.generate(prompt, o, [&](int32_t t) { a.tokens.push_back(t); return true; });
    EXPECT_EQ(a.tokens, plain.tokens) << s->name();
    EXPECT_EQ(m_->graph_recordings(), rec) << s->name() << ": a target graph was recorded after the warm-up";
  }
}

// Organic drafters under measured (not injected) costs: whatever the controller picks, the
// bytes are plain decoding's; MTP's seed check and DFlash2's context check would throw if a
// catch-up left a source misaligned.
TEST_P(AdaptiveDepth, OrganicSourcesWithMeasuredCostsMatchPlain) {
  const auto prompt = random_prompt(21, tiny().t.vocab, 8);
  GenerateOptions o;
  o.max_new_tokens = 160;
  const Out plain = generate(*m_, nullptr, prompt, o);
  MtpDraftSource mtp(*m_, 1024);
  DFlashDraftSource dfl(DFlash2Drafter::load(tiny().drafter, *m_));
  for (DraftSource* s : std::vector<DraftSource*>{&mtp, &dfl}) {
    const Out a = generate(*m_, s, prompt, o);
    EXPECT_EQ(a.tokens, plain.tokens) << s->name();
    int64_t rounds = 0;
    for (int64_t c : a.stats.k_rounds) rounds += c;
    EXPECT_EQ(rounds, a.stats.rounds);
  }
}

// Plain steps defer the source's rows; after catch_up() the source drafts exactly what it would
// have drafted had it observed every row as it came, and stays aligned through the next round.
TEST_P(AdaptiveDepth, DeferredRowsRealignTheSourceExactly) {
  const auto prompt = random_prompt(13, tiny().t.vocab, 5);
  const int P = static_cast<int>(prompt.size());
  for (const std::string kind : {"mtp", "dflash2"}) {
    std::unique_ptr<DraftSource> now, later;
    if (kind == "mtp") {
      now = std::make_unique<MtpDraftSource>(*m_, 256);
      later = std::make_unique<MtpDraftSource>(*m_, 256);
    } else {
      now = std::make_unique<DFlashDraftSource>(DFlash2Drafter::load(tiny().drafter, *m_));
      later = std::make_unique<DFlashDraftSource>(DFlash2Drafter::load(tiny().drafter, *m_));
    }
    m_->set_taps(now->tap_layers());
    auto st = m_->new_state(256, 8);
    ForwardOpts fo;
    fo.taps = now->needs_taps();
    m_->forward(*st, prompt.data(), P, fo);
    std::vector<int32_t> ids(P);
    be_->download(ids.data(), m_->argmax_ids(), P * sizeof(int32_t));
    std::vector<int32_t> next(prompt.begin() + 1, prompt.end());
    next.push_back(ids[P - 1]);
    for (DraftSource* s : {now.get(), later.get()}) {
      s->begin(P);
      s->observe(*m_, 0, P, next.data());
    }
    // 20 plain steps: the target's greedy token each time.
    int32_t tok = ids[P - 1];
    int pos = P;
    for (int i = 0; i < 20; i++, pos++) {
      m_->forward(*st, &tok, 1, fo);
      int32_t nt;
      be_->download(&nt, m_->argmax_ids(), sizeof(int32_t));
      now->observe(*m_, pos, 1, &nt);
      later->observe_deferred(*m_, pos, 1, &nt);
      tok = nt;
    }
    EXPECT_EQ(now->pending_rows(), 0) << kind;
    EXPECT_EQ(later->pending_rows(), 20) << kind << ": plain steps must defer, not observe";
    later->catch_up();
    EXPECT_EQ(later->pending_rows(), 0);
    std::vector<int32_t> d_now(7), d_later(7);
    now->draft(tok, pos, 7, d_now.data());
    later->draft(tok, pos, 7, d_later.data());
    EXPECT_EQ(d_later, d_now) << kind;
    // A verify round after it: two rows committed, both observe, and the next drafts agree too.
    std::vector<int32_t> block = {tok, d_now[0]};
    m_->forward(*st, block.data(), 2, fo);
    std::vector<int32_t> v(2);
    be_->download(v.data(), m_->argmax_ids(), 2 * sizeof(int32_t));
    const std::vector<int32_t> committed = {d_now[0], v[1]};
    now->observe(*m_, pos, 2, committed.data());
    later->observe(*m_, pos, 2, committed.data());
    now->draft(v[1], pos + 2, 5, d_now.data());
    later->draft(v[1], pos + 2, 5, d_later.data());
    EXPECT_EQ(d_later, d_now) << kind << " after the next round";
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, AdaptiveDepth, ::testing::ValuesIn(test::test_backends()),
                         test::backend_param_name);

}  // namespace
}  // namespace qf
