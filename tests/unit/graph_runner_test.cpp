// GraphRunner: checked keys, direct -> record -> replay, the LRU bound on recordings, and
// recordings of a destroyed state dropped (forget_owner). Runs on the CPU through a backend that
// records ops the way CUDA graphs do (tests/support/recording_backend.h); the last tests run the
// whole round loop through recordings and compare with direct CPU decoding.
#include <gtest/gtest.h>

#include <random>

#include "model/graph_runner.h"
#include "model/qwen38.h"
#include "runtime/draft_source.h"
#include "runtime/generate.h"
#include "support/oracle_source.h"
#include "support/recording_backend.h"
#include "support/test_models.h"

namespace qf {
namespace {

std::unique_ptr<test::RecordingBackend> recording_cpu() {
  return std::make_unique<test::RecordingBackend>(make_cpu_backend());
}

TEST(GraphKey, FieldsPackInOrderAndRefuseValuesThatDoNotFit) {
  const GraphKey k = GraphKey(7).field("rows", 5, 4).flag("a", true).field("b", 2, 2);
  EXPECT_EQ(k.owner(), 7u);
  EXPECT_EQ(k.packed(), 5u | (1u << 4) | (2u << 5));
  EXPECT_NE(GraphKey(0).field("rows", 3, 8).packed(), GraphKey(0).field("rows", 4, 8).packed());
  EXPECT_THROW(GraphKey(0).field("rows", 256, 8), Error);  // the old 8-bit row field's overflow
  EXPECT_NO_THROW(GraphKey(0).field("rows", 255, 8));
  EXPECT_THROW(GraphKey(0).field("a", 0, 40).field("b", 0, 25), Error);  // 65 bits
  EXPECT_NO_THROW(GraphKey(0).field("a", 0, 40).field("b", ~0ull >> 40, 24));
  EXPECT_THROW(GraphKey(0).field("a", 0, 0), Error);
}

// A body with a host-side count: direct runs and recordings call it, replays do not.
struct Body {
  int calls = 0;
  std::function<void()> fn() {
    return [this] { calls++; };
  }
};

TEST(GraphRunner, RunsDirectThenRecordsThenReplays) {
  auto be = recording_cpu();
  GraphRunner g(be.get());
  Body b;
  for (int i = 0; i < 5; i++) g.run(GraphKey(1).field("x", 0, 1), b.fn());
  EXPECT_EQ(b.calls, 2);  // direct, then recorded
  EXPECT_EQ(be->graphs_made, 1);
  EXPECT_EQ(g.recordings(), 1u);
  EXPECT_EQ(g.replays(), 4u);  // the recording's first launch and three more
  EXPECT_EQ(be->launches, 4);
}

TEST(GraphRunner, EvictsTheLeastRecentlyRunKeyAtTheCap) {
  auto be = recording_cpu();
  GraphRunner g(be.get(), 3);
  Body b[4];
  auto key = [](int i) { return GraphKey(1).field("i", static_cast<uint64_t>(i), 8); };
  for (int i = 0; i < 3; i++)
    for (int r = 0; r < 2; r++) g.run(key(i), b[i].fn());  // three recorded keys: the cap
  EXPECT_EQ(g.entries(), 3u);
  EXPECT_EQ(be->live_graphs(), 3);
  g.run(key(0), b[0].fn());  // key 0 is now more recent than key 1
  g.run(key(3), b[3].fn());  // a fourth key evicts key 1
  EXPECT_EQ(g.entries(), 3u);
  EXPECT_EQ(be->graphs_destroyed, 1);
  const int before0 = b[0].calls, before2 = b[2].calls;
  g.run(key(0), b[0].fn());
  g.run(key(2), b[2].fn());
  EXPECT_EQ(b[0].calls, before0);  // still replayed
  EXPECT_EQ(b[2].calls, before2);
  // key 1 was dropped: it starts over with a direct run (evicting the least recent, key 3)
  const int before1 = b[1].calls;
  g.run(key(1), b[1].fn());
  EXPECT_EQ(b[1].calls, before1 + 1);
  EXPECT_EQ(g.entries(), 3u);
  g.clear();
  EXPECT_EQ(be->live_graphs(), 0);
}

TEST(GraphRunner, ForgetOwnerDropsOnlyThatOwnersRecordings) {
  auto be = recording_cpu();
  GraphRunner g(be.get());
  Body b;
  for (uint64_t owner : {5u, 6u})
    for (int i = 0; i < 3; i++)
      for (int r = 0; r < 2; r++) g.run(GraphKey(owner).field("i", static_cast<uint64_t>(i), 8), b.fn());
  EXPECT_EQ(be->live_graphs(), 6);
  g.forget_owner(5);
  EXPECT_EQ(be->graphs_destroyed, 3);
  EXPECT_EQ(g.entries(), 3u);
  const int calls = b.calls;
  g.run(GraphKey(6).field("i", 1, 8), b.fn());
  EXPECT_EQ(b.calls, calls);  // owner 6 still replays
  g.forget_owner(42);         // unknown owner: nothing
  EXPECT_EQ(g.entries(), 3u);
}

TEST(GraphRunner, GraphOwnerForgetsOnDestructionAndOutlivesItsRunner) {
  auto be = recording_cpu();
  auto g = std::make_shared<GraphRunner>(be.get());
  Body b;
  {
    GraphOwner owner(g);
    GraphOwner other(g);
    EXPECT_NE(owner.id(), other.id());
    for (int r = 0; r < 2; r++) g->run(GraphKey(owner.id()).field("i", 0, 1), b.fn());
    for (int r = 0; r < 2; r++) g->run(GraphKey(other.id()).field("i", 0, 1), b.fn());
    GraphOwner moved = std::move(owner);
    EXPECT_EQ(owner.id(), 0u);
    EXPECT_EQ(be->live_graphs(), 2);
  }
  EXPECT_EQ(be->live_graphs(), 0);
  EXPECT_EQ(g->entries(), 0u);
  GraphOwner late(g);
  g.reset();  // the runner goes first: the owner's destructor must not touch it
}

// ---- the model path through recordings -------------------------------------------------------

struct TinyPair {
  test::TinyTarget t;
  std::string target, drafter, drafter_v1;
};

const TinyPair& tiny_pair() {
  static TinyPair p;
  static bool made = false;
  if (!made) {
    p.t.layers = 4;
    p.t.intermediate = 384;
    p.target = test::write_tiny_target(test::temp_dir("graph_t"), p.t);
    test::TinyDrafter d;
    d.taps = {0, 2, 3};
    p.drafter = test::write_tiny_drafter(test::temp_dir("graph_d"), d, p.t);
    d.v2 = false;
    p.drafter_v1 = test::write_tiny_drafter(test::temp_dir("graph_d1"), d, p.t);
    made = true;
  }
  return p;
}

struct Trace {
  std::vector<int32_t> tokens;
  std::vector<std::vector<int32_t>> drafts;  // per round
};

Trace generate(Generator& g, const std::vector<int32_t>& prompt, int n, int k) {
  GenerateOptions o;
  o.max_new_tokens = n;
  o.draft_k = k;
  Trace t;
  g.generate(
      prompt, o,
      [&](int32_t x) {
        t.tokens.push_back(x);
        return true;
      },
      [&](int, const std::vector<int32_t>& d, int, int32_t) { t.drafts.push_back(d); });
  return t;
}

Trace generate(TargetModel& m, DraftSource* src, const std::vector<int32_t>& prompt, int n, int k) {
  Generator g(m, src, 256);
  return generate(g, prompt, n, k);
}

// Every recorded pass (target decode/verify, MTP head, DFlash2 and v1 context and draft passes)
// replays the op sequence its key names: through recordings, each draft source proposes the
// drafts it proposes when run directly (a key naming the wrong sequence would change them), and
// the tokens are plain decoding's.
TEST(GraphPath, SpeculativeThroughRecordingsMatchesDirect) {
  const TinyPair& p = tiny_pair();
  std::mt19937_64 rng(4);
  std::vector<int32_t> prompt(23);
  for (auto& x : prompt) x = static_cast<int32_t>(rng() % (p.t.vocab - 2));
  auto cpu = make_cpu_backend();
  auto direct = Qwen38Model::load(p.target, cpu.get(), 16);
  const std::vector<int32_t> plain = generate(*direct, nullptr, prompt, 60, 0).tokens;
  ASSERT_EQ(plain.size(), 60u);
  MtpDraftSource mtp_d(*direct, 256);
  DFlashDraftSource dfl_d(DFlash2Drafter::load(p.drafter, *direct));
  DFlashDraftSource dfl1_d(DFlash2Drafter::load(p.drafter_v1, *direct));

  auto be = recording_cpu();
  auto m = Qwen38Model::load(p.target, be.get(), 16);
  EXPECT_EQ(generate(*m, nullptr, prompt, 60, 0).tokens, plain) << "plain";
  MtpDraftSource mtp(*m, 256);
  DFlashDraftSource dfl(DFlash2Drafter::load(p.drafter, *m));
  DFlashDraftSource dfl1(DFlash2Drafter::load(p.drafter_v1, *m));
  const std::vector<std::pair<DraftSource*, DraftSource*>> sources = {{&mtp, &mtp_d}, {&dfl, &dfl_d}, {&dfl1, &dfl1_d}};
  for (auto [rec, dir] : sources) {
    // One state for both depths: the deeper verify must not replay the shallower one's recording.
    Generator g_dir(*direct, dir, 256), g_rec(*m, rec, 256);
    for (int k : {2, 7}) {
      const Trace want = generate(g_dir, prompt, 60, k);
      const Trace got = generate(g_rec, prompt, 60, k);
      EXPECT_EQ(want.tokens, plain) << dir->name() << " k=" << k;
      EXPECT_EQ(got.tokens, plain) << rec->name() << " k=" << k;
      EXPECT_EQ(got.drafts, want.drafts) << rec->name() << " k=" << k;
    }
  }
  // Injected drafts accept deep, so every verify row's output counts (organic drafts on random
  // weights rarely get past the first few).
  for (auto mode : {test::OracleMode::AllRight, test::OracleMode::RandomPrefix}) {
    test::OracleSource src(plain, static_cast<int>(prompt.size()), p.t.vocab, mode, 7, 9);
    Generator g(*m, &src, 256);
    for (int k : {2, 7}) EXPECT_EQ(generate(g, prompt, 60, k).tokens, plain) << static_cast<int>(mode) << " k=" << k;
  }
  EXPECT_GT(m->graph_replays(), 100u);
  EXPECT_GT(be->launches, 300);  // the draft sources' passes replay too
}

// A Generator's state names its recordings; destroying it (a new request, a bench config) drops
// them instead of keeping every old state's graphs.
TEST(GraphPath, DestroyedStateDropsItsRecordings) {
  const TinyPair& p = tiny_pair();
  auto be = recording_cpu();
  auto m = Qwen38Model::load(p.target, be.get(), 16);
  const std::vector<int32_t> prompt = {5, 9, 14, 3, 77, 12};
  for (int i = 0; i < 3; i++) {
    generate(*m, nullptr, prompt, 8, 0);  // its Generator and state are gone on return
    EXPECT_GT(be->graphs_made, 0);
    EXPECT_EQ(be->live_graphs(), 0) << "round " << i;
  }
  Generator g(*m, nullptr, 64);
  GenerateOptions o;
  o.max_new_tokens = 8;
  g.generate(prompt, o, nullptr);
  EXPECT_GT(be->live_graphs(), 0);  // a live state keeps its recordings
}

}  // namespace
}  // namespace qf
