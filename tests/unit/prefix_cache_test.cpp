// Prefix reuse (runtime/prefix_cache.h, docs/DESIGN.md "Prefix reuse"): a generator that resumes
// from a cached prefix snapshot must produce what a fresh generator (no cache) produces for the
// same prompt, byte for byte: the tokens, and with a draft source every round's drafts (so the
// source resumed with the right context), greedy and sampled. Covered: prompts that extend,
// repeat and branch off earlier ones; lengths around the 64-token boundaries; a key that differs
// only in the token after the snapshot; eviction under a budget that holds one snapshot; a budget
// too small for any. Expected reuse counts follow from the policy (snapshots at the last multiple
// of 64 below each prompt's length and where it leaves a cached prefix), worked out per case.
// Parameterized over the backends present; CudaPrefixCache runs the same on the GPU (skipped
// without one).
#include <gtest/gtest.h>

#include <random>

#include "backend/backend.h"
#include "model/qwen38.h"
#include "runtime/draft_source.h"
#include "runtime/generate.h"
#include "runtime/prefix_cache.h"
#include "support/backends.h"
#include "support/test_models.h"

namespace qf {
namespace {

// 4 layers (3 DeltaNet + 1 attention) with an MTP head; a DFlash2 drafter with a 64-token window
// and a v1 drafter with a 100-token one (a window that does not end on a block boundary).
struct Models {
  test::TinyTarget t;
  std::string target, drafter, drafter_v1;
};
const Models& models() {
  static Models m = [] {
    Models s;
    s.t.hidden = 128; s.t.layers = 4; s.t.heads = 2; s.t.kv_heads = 1; s.t.head_dim = 64;
    s.t.gdn_k_heads = 1; s.t.gdn_v_heads = 2; s.t.gdn_dk = 64; s.t.gdn_dv = 64;
    s.t.intermediate = 256; s.t.vocab = 1024; s.t.seed = 31;
    s.target = test::write_tiny_target(test::temp_dir("prefix_target"), s.t);
    test::TinyDrafter d;
    d.taps = {0, 2, 3}; d.heads = 2; d.kv_heads = 1; d.intermediate = 256; d.mask_id = 1023; d.rank = 16;
    s.drafter = test::write_tiny_drafter(test::temp_dir("prefix_drafter"), d, s.t);
    d.v2 = false;
    d.window = 100;
    s.drafter_v1 = test::write_tiny_drafter(test::temp_dir("prefix_drafter_v1"), d, s.t);
    return s;
  }();
  return m;
}

std::vector<int32_t> random_tokens(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> p(n);
  for (auto& t : p) t = static_cast<int32_t>(rng() % 1000);
  return p;
}
std::vector<int32_t> cat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}
std::vector<int32_t> head(const std::vector<int32_t>& a, int n) { return {a.begin(), a.begin() + n}; }

struct Out {
  std::vector<int32_t> tokens;
  std::vector<std::vector<int32_t>> drafts;
  GenStats stats;
};
Out run(Generator& g, const std::vector<int32_t>& prompt, int n, int k, float temperature = 0) {
  GenerateOptions o;
  o.max_new_tokens = n;
  o.draft_k = k;
  o.sampling.temperature = temperature;
  o.sampling.seed = 7;
  Out r;
  r.stats = g.generate(
      prompt, o, [&](int32_t t) { r.tokens.push_back(t); return true; },
      [&](int, const std::vector<int32_t>& d, int, int32_t) { r.drafts.push_back(d); });
  return r;
}

constexpr int kMaxPos = 640, kGen = 16;

// One draft source setup: the target, the source (null = plain), its k.
struct Rig {
  std::unique_ptr<Qwen38Model> m;
  std::unique_ptr<DraftSource> src;
  int k = 0;
};
Rig make_setup(Backend* be, const std::string& source) {
  const Models& p = models();
  Rig s;
  s.m = Qwen38Model::load(p.target, be, 16);
  s.m->set_prefill_rows(128);
  if (source == "mtp") {
    s.src = std::make_unique<MtpDraftSource>(*s.m, kMaxPos);
    s.k = 3;
  } else if (source == "dflash2") {
    s.src = std::make_unique<DFlashDraftSource>(DFlash2Drafter::load(p.drafter, *s.m));
    s.k = 7;
  } else if (source == "dflash") {
    s.src = std::make_unique<DFlashDraftSource>(DFlash2Drafter::load(p.drafter_v1, *s.m));
    s.k = 4;
  }
  return s;
}

// The requests in order with the reuse each must get (see the comment of each).
struct Request {
  std::vector<int32_t> prompt;
  int cached;
  const char* why;
};
std::vector<Request> requests() {
  const auto a = random_tokens(400, 1), b = random_tokens(200, 2), c = random_tokens(200, 3),
             d = random_tokens(200, 4);
  std::vector<Request> r;
  r.push_back({head(a, 300), 0, "first: snapshot at 256"});
  r.push_back({cat(head(a, 300), head(b, 40)), 256, "extends the first (next turn): resumes at 256, stores 320"});
  r.push_back({cat(head(a, 150), head(c, 100)), 0, "branches off at 150: no hit, stores 128 (branch) and 192"});
  r.push_back({cat(head(a, 150), head(d, 80)), 128, "shares the 150-token branch: resumes at 128"});
  r.push_back({head(a, 300), 256, "repeats the first: resumes at 256"});
  r.push_back({cat(head(a, 256), cat({static_cast<int32_t>(a[256] ^ 1)}, head(b, 20))), 128,
               "equals the first up to 256 but not at token 256 (the 256 key's last): resumes at 128"});
  // around the block boundaries, on a fresh stem
  const auto e = random_tokens(200, 5);
  r.push_back({head(e, 64), 0, "64 tokens: nothing below 64 to store"});
  r.push_back({head(e, 65), 0, "65: stores 64"});
  r.push_back({head(e, 63), 0, "63: shorter than any snapshot"});
  r.push_back({head(e, 127), 64, "127: resumes at 64"});
  r.push_back({head(e, 128), 64, "128: resumes at 64 (a snapshot at 128 needs 129 tokens)"});
  r.push_back({head(e, 129), 64, "129: resumes at 64, stores 128"});
  r.push_back({head(e, 130), 128, "130: resumes at 128"});
  r.push_back({head(e, 65), 64, "65 again: resumes at 64, one token prefilled"});
  return r;
}

void expect_same(const Out& got, const Out& want, const std::string& what) {
  EXPECT_EQ(got.tokens, want.tokens) << what;
  EXPECT_EQ(got.drafts, want.drafts) << what << ": drafts differ from a fresh run";
  EXPECT_EQ(static_cast<int>(got.tokens.size()), kGen) << what;
}

// Every request on a cached generator against a fresh generator of the same source.
void check_identity(Backend* be, const std::string& source, float temperature) {
  Rig s = make_setup(be, source);
  PrefixCache cache(*be, size_t(64) << 20);
  Generator cached(*s.m, s.src.get(), kMaxPos);
  cached.set_prefix_cache(&cache);
  int i = 0;
  for (const Request& r : requests()) {
    const std::string what = source + " T=" + std::to_string(temperature) + " request " + std::to_string(i++) +
                             " (" + std::to_string(r.prompt.size()) + " tokens, " + r.why + ")";
    const Out got = run(cached, r.prompt, kGen, s.k, temperature);
    EXPECT_EQ(got.stats.cached_tokens, r.cached) << what;
    Generator fresh(*s.m, s.src.get(), kMaxPos);
    expect_same(got, run(fresh, r.prompt, kGen, s.k, temperature), what);
  }
  EXPECT_GT(cache.entries(), 0);
}

template <class T>
std::vector<T> down(Backend& be, const void* p, size_t bytes) {
  std::vector<T> h(bytes / sizeof(T));
  be.download(h.data(), p, bytes);
  return h;
}

class PrefixCacheTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string why;
    be_ = test::shared_backend(GetParam(), &why);
    ASSERT_TRUE(be_) << why;
  }
  Backend* be_ = nullptr;
};

TEST_P(PrefixCacheTest, PlainOutputEqualsAFreshEngine) { check_identity(be_, "none", 0); }
TEST_P(PrefixCacheTest, MtpOutputAndDraftsEqualAFreshEngine) { check_identity(be_, "mtp", 0); }
TEST_P(PrefixCacheTest, DFlash2OutputAndDraftsEqualAFreshEngine) { check_identity(be_, "dflash2", 0); }
TEST_P(PrefixCacheTest, DFlashV1OutputAndDraftsEqualAFreshEngine) { check_identity(be_, "dflash", 0); }
TEST_P(PrefixCacheTest, SampledOutputEqualsAFreshEngine) { check_identity(be_, "dflash2", 0.8f); }

// The state itself: after a resumed prefill the K/V rows and GDN blobs are a fresh prefill's.
TEST_P(PrefixCacheTest, ResumedPrefillLeavesTheFreshState) {
  Rig s = make_setup(be_, "none");
  PrefixCache cache(*be_, size_t(64) << 20);
  Generator cached(*s.m, nullptr, kMaxPos), fresh(*s.m, nullptr, kMaxPos);
  cached.set_prefix_cache(&cache);
  const auto a = random_tokens(400, 11);
  run(cached, head(a, 200), 0, 0);
  const auto prompt = head(a, 390);
  EXPECT_EQ(run(cached, prompt, 0, 0).stats.cached_tokens, 192);
  run(fresh, prompt, 0, 0);
  const auto rc = state_regions(cached.state(), 390), rf = state_regions(fresh.state(), 390);
  ASSERT_EQ(rc.size(), rf.size());
  for (size_t i = 0; i < rc.size(); i++)
    EXPECT_EQ(down<uint8_t>(*be_, rc[i].ptr, rc[i].bytes), down<uint8_t>(*be_, rf[i].ptr, rf[i].bytes)) << "region " << i;
  EXPECT_EQ(cached.state().pos, 390);
}

// A budget that holds one snapshot of the first prompt but not two: older entries go first, the
// cache never exceeds its budget, and what was evicted is a miss (still the fresh output).
TEST_P(PrefixCacheTest, EvictsLeastRecentlyUsedWithinTheBudget) {
  Rig s = make_setup(be_, "mtp");
  const auto reqs = requests();
  size_t one = 0;
  {
    PrefixCache big(*be_, size_t(64) << 20);
    Generator g(*s.m, s.src.get(), kMaxPos);
    g.set_prefix_cache(&big);
    run(g, reqs[0].prompt, 1, s.k);
    ASSERT_EQ(big.entries(), 1);
    one = big.used();
  }
  PrefixCache cache(*be_, one + one / 2);
  Generator cached(*s.m, s.src.get(), kMaxPos);
  cached.set_prefix_cache(&cache);
  // 0: stores 256 (one). 2: branch, stores 128 and 192, each evicting what came before. 1 extends
  // 0, whose snapshot is gone: a miss; it stores 320 (bigger than `one`, within the budget).
  const int order[] = {0, 2, 1};
  const int want_cached[] = {0, 0, 0};
  const int want_entries[] = {1, 1, 1};
  for (int j = 0; j < 3; j++) {
    const Request& r = reqs[order[j]];
    const Out got = run(cached, r.prompt, kGen, s.k);
    EXPECT_EQ(got.stats.cached_tokens, want_cached[j]) << "request " << order[j];
    EXPECT_EQ(cache.entries(), want_entries[j]) << "request " << order[j];
    EXPECT_LE(cache.used(), cache.budget());
    Generator fresh(*s.m, s.src.get(), kMaxPos);
    expect_same(got, run(fresh, r.prompt, kGen, s.k), "request " + std::to_string(order[j]));
  }
  // Request 1's snapshot (320) is the one left: an extension of request 1 resumes there;
  // request 0 repeated (300 tokens) is shorter than it: a miss.
  EXPECT_EQ(run(cached, cat(reqs[1].prompt, random_tokens(30, 9)), 1, s.k).stats.cached_tokens, 320);
  EXPECT_EQ(run(cached, reqs[0].prompt, 1, s.k).stats.cached_tokens, 0);
}

TEST_P(PrefixCacheTest, BudgetTooSmallForAnySnapshotStoresNothing) {
  Rig s = make_setup(be_, "dflash2");
  PrefixCache cache(*be_, 4096);
  Generator cached(*s.m, s.src.get(), kMaxPos);
  cached.set_prefix_cache(&cache);
  const auto reqs = requests();
  for (int j : {0, 1, 4}) {
    const Out got = run(cached, reqs[j].prompt, kGen, s.k);
    EXPECT_EQ(got.stats.cached_tokens, 0);
    Generator fresh(*s.m, s.src.get(), kMaxPos);
    expect_same(got, run(fresh, reqs[j].prompt, kGen, s.k), "request " + std::to_string(j));
  }
  EXPECT_EQ(cache.entries(), 0);
  EXPECT_EQ(cache.used(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Backends, PrefixCacheTest, ::testing::ValuesIn(test::test_backends()),
                         test::backend_param_name);

// The GPU run for tools/device's 'Cuda*' step: snapshots taken and restored in device memory.
TEST(CudaPrefixCache, OutputAndDraftsEqualAFreshEngine) {
  std::string why;
  Backend* be = find_backend("cuda") ? test::shared_backend("cuda", &why) : nullptr;
  if (!be) GTEST_SKIP() << "no CUDA device: " << (why.empty() ? "not built with CUDA" : why);
  check_identity(be, "none", 0);
  check_identity(be, "mtp", 0);
  check_identity(be, "dflash2", 0);
  check_identity(be, "dflash2", 0.8f);
}

}  // namespace
}  // namespace qf
