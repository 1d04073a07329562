// The prefill path (docs/DESIGN.md, "Prefill path"): the prompt through Backend::gemm,
// gdn_chunked and attention_prefill in chunks of Qwen38Model::prefill_rows().
//  - split invariance: running the prompt as [0, A) then [A, N) leaves the same target state (KV
//    rows, GDN blobs) and logits, bit for bit, whenever A is a multiple of 64;
//  - identity: plain == MTP == DFlash2 == DFlash v1 with prompts of over 4,000 tokens, and the
//    draft sources see the same history whatever the chunk (same drafts, round by round);
//  - the prefill logits against token-by-token decoding (tolerances derived at each test);
//  - a prompt longer than the context fails before any work; the statistics report prefill.
// Parameterized over the backends present ("cpu" always, "cuda" with a GPU).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "backend/backend.h"
#include "core/error.h"
#include "model/qwen38.h"
#include "runtime/draft_source.h"
#include "runtime/generate.h"
#include "support/backends.h"
#include "support/test_models.h"

namespace qf {
namespace {

// A small pair (4 layers: 3 DeltaNet + 1 attention, MTP head; DFlash2 and v1 drafters with a
// 64-token window) so that 4,000-token prompts stay quick on the CPU.
struct SmallPair {
  test::TinyTarget t;
  std::string target, drafter, drafter_v1;
};
const SmallPair& small_pair() {
  static SmallPair p = [] {
    SmallPair s;
    s.t.hidden = 128; s.t.layers = 4; s.t.heads = 2; s.t.kv_heads = 1; s.t.head_dim = 64;
    s.t.gdn_k_heads = 1; s.t.gdn_v_heads = 2; s.t.gdn_dk = 64; s.t.gdn_dv = 64;
    s.t.intermediate = 256; s.t.vocab = 1024; s.t.seed = 23;
    s.target = test::write_tiny_target(test::temp_dir("prefill_target"), s.t);
    test::TinyDrafter d;
    d.taps = {0, 2, 3}; d.heads = 2; d.kv_heads = 1; d.intermediate = 256; d.mask_id = 1023; d.rank = 16;
    s.drafter = test::write_tiny_drafter(test::temp_dir("prefill_drafter"), d, s.t);
    d.v2 = false;
    s.drafter_v1 = test::write_tiny_drafter(test::temp_dir("prefill_drafter_v1"), d, s.t);
    return s;
  }();
  return p;
}

std::vector<int32_t> random_prompt(int n, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> p(n);
  for (auto& t : p) t = static_cast<int32_t>(rng() % (vocab - 2));
  return p;
}

template <class T>
std::vector<T> down(Backend& be, const void* p, size_t n) {
  std::vector<T> h(n);
  be.download(h.data(), p, n * sizeof(T));
  return h;
}

// Runs the prompt as prefill forwards ending at each of `cuts` (the last must be N); the head
// runs on the last one only, as in Generator::generate.
void prefill(Qwen38Model& m, TargetState& st, const std::vector<int32_t>& prompt, const std::vector<int>& cuts) {
  int off = 0;
  for (int end : cuts) {
    ForwardOpts fo;
    fo.prefill = true;
    fo.lm_head = end == static_cast<int>(prompt.size());
    fo.logits_last_only = true;
    fo.final_hidden = false;
    m.forward(st, prompt.data() + off, end - off, fo);
    off = end;
  }
}

// Everything a prefill leaves behind: K/V rows [0, N) of every attention layer (as stored, in the
// state's KV dtype), every GDN blob, the last row's logits; compared byte for byte.
struct Snapshot {
  std::vector<std::vector<uint8_t>> kv, gdn;
  std::vector<uint8_t> logits;
};
Snapshot snapshot(Qwen38Model& m, TargetState& st, int N) {
  Backend& be = m.backend();
  Snapshot s;
  const size_t row = static_cast<size_t>(m.attn_dims().n_kv_heads) * m.attn_dims().head_dim * dtype_size(st.kv_dtype);
  for (size_t i = 0; i < st.kcache.size(); i++) {
    s.kv.push_back(down<uint8_t>(be, st.kcache[i].get(), N * row));
    s.kv.push_back(down<uint8_t>(be, st.vcache[i].get(), N * row));
  }
  for (auto& g : st.gdn) s.gdn.push_back(down<uint8_t>(be, g.get(), g.bytes()));
  s.logits = down<uint8_t>(be, m.logits(), m.config().vocab_size * sizeof(float));
  return s;
}
bool same(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) { return a == b; }

class Prefill : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string why;
    be_ = test::make_test_backend(GetParam(), &why);
    ASSERT_TRUE(be_) << why;
  }
  std::unique_ptr<Backend> be_;
};

TEST_P(Prefill, SplitAtMultiplesOf64LeavesTheSameState) {
  const SmallPair& p = small_pair();
  auto m = Qwen38Model::load(p.target, be_.get(), 16);
  const int N = 700;
  auto prompt = random_prompt(N, p.t.vocab, 3);
  m->set_prefill_rows(768);
  auto st = m->new_state(N + 8, 0);
  prefill(*m, *st, prompt, {N});
  const Snapshot ref = snapshot(*m, *st, N);
  const std::vector<std::vector<int>> splits = {{64, N}, {192, N}, {640, N}, {64, 128, N}, {320, 640, N}};
  for (const auto& cuts : splits) {
    m->reset(*st);
    prefill(*m, *st, prompt, cuts);
    const Snapshot s = snapshot(*m, *st, N);
    std::string what = "cuts";
    for (int c : cuts) what += " " + std::to_string(c);
    for (size_t i = 0; i < ref.kv.size(); i++) EXPECT_TRUE(same(s.kv[i], ref.kv[i])) << what << ": K/V buffer " << i;
    for (size_t i = 0; i < ref.gdn.size(); i++) EXPECT_TRUE(same(s.gdn[i], ref.gdn[i])) << what << ": GDN layer " << i;
    EXPECT_TRUE(same(s.logits, ref.logits)) << what << ": logits";
  }
  // The chunk size of the loop is such a split too.
  for (int chunk : {64, 128, 320}) {
    m->set_prefill_rows(chunk);
    m->reset(*st);
    std::vector<int> cuts;
    for (int e = chunk; e < N; e += chunk) cuts.push_back(e);
    cuts.push_back(N);
    prefill(*m, *st, prompt, cuts);
    const Snapshot s = snapshot(*m, *st, N);
    for (size_t i = 0; i < ref.kv.size(); i++) EXPECT_TRUE(same(s.kv[i], ref.kv[i])) << "chunk " << chunk << ": K/V " << i;
    for (size_t i = 0; i < ref.gdn.size(); i++) EXPECT_TRUE(same(s.gdn[i], ref.gdn[i])) << "chunk " << chunk << ": GDN " << i;
    EXPECT_TRUE(same(s.logits, ref.logits)) << "chunk " << chunk;
  }
}

// The prefill fusions in front of the projections (the layer norms and the attention gate write
// the GEMMs' bf16 input, backend.h add_rmsnorm_gemm_group / sigmoid_mul_gemm) leave the state and
// logits of the ops in sequence, bit for bit. A dump hook runs the ops in sequence (it reads the
// fp32 rows the fused forms never write), so the same prompt with and without one compares them.
TEST_P(Prefill, FusedProjectionInputsGiveTheUnfusedBits) {
  const SmallPair& p = small_pair();
  auto m = Qwen38Model::load(p.target, be_.get(), 16);
  const int N = 300;
  auto prompt = random_prompt(N, p.t.vocab, 5);
  auto st = m->new_state(N + 8, 0);
  size_t dumped = 0;
  const DumpHook hook = [&dumped](const std::string&, const float*, size_t n) { dumped += n; };
  for (int chunk : {320, 128}) {
    m->set_prefill_rows(chunk);
    std::vector<int> cuts;
    for (int e = chunk; e < N; e += chunk) cuts.push_back(e);
    cuts.push_back(N);
    m->reset(*st);
    prefill(*m, *st, prompt, cuts);
    const Snapshot fused = snapshot(*m, *st, N);
    m->reset(*st);
    int off = 0;
    for (int end : cuts) {
      ForwardOpts fo;
      fo.prefill = true;
      fo.lm_head = end == N;
      fo.logits_last_only = true;
      fo.final_hidden = false;
      m->forward(*st, prompt.data() + off, end - off, fo, &hook);
      off = end;
    }
    ASSERT_GT(dumped, 0u) << "the hook saw no rows: the comparison would be fused vs fused";
    const Snapshot plain = snapshot(*m, *st, N);
    for (size_t i = 0; i < fused.kv.size(); i++) EXPECT_TRUE(same(fused.kv[i], plain.kv[i])) << "chunk " << chunk << ": K/V " << i;
    for (size_t i = 0; i < fused.gdn.size(); i++) EXPECT_TRUE(same(fused.gdn[i], plain.gdn[i])) << "chunk " << chunk << ": GDN " << i;
    EXPECT_TRUE(same(fused.logits, plain.logits)) << "chunk " << chunk << ": logits";
  }
}

TEST_P(Prefill, RejectsBadChunksAndOversizedForwards) {
  const SmallPair& p = small_pair();
  auto m = Qwen38Model::load(p.target, be_.get(), 16);
  for (int bad : {63, 100, -64}) {
    try {
      m->set_prefill_rows(bad);
      ADD_FAILURE() << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Usage);
      EXPECT_NE(std::string(e.what()).find("multiple of 64"), std::string::npos) << e.what();
    }
  }
  m->set_prefill_rows(128);
  auto st = m->new_state(512, 0);
  auto prompt = random_prompt(129, p.t.vocab, 1);
  ForwardOpts fo;
  fo.prefill = true;
  EXPECT_THROW(m->forward(*st, prompt.data(), 129, fo), Error);
  fo.capture = true;
  EXPECT_THROW(m->forward(*st, prompt.data(), 8, fo), Error);
}

// Chunk 0: the round loop runs the prompt through the decode ops, max_rows at a time: the state
// is exactly what those forwards leave.
TEST_P(Prefill, ChunkZeroRunsThePromptThroughTheDecodeOps) {
  const SmallPair& p = small_pair();
  auto m = Qwen38Model::load(p.target, be_.get(), 16);
  const int N = 100;
  auto prompt = random_prompt(N, p.t.vocab, 41);
  m->set_prefill_rows(0);
  Generator g(*m, nullptr, N + 8);
  GenerateOptions o;
  o.max_new_tokens = 0;
  g.generate(prompt, o, nullptr);
  const Snapshot got = snapshot(*m, g.state(), N);
  auto st = m->new_state(N + 8, 0);
  for (int off = 0; off < N; off += 16) {
    ForwardOpts fo;
    fo.logits_last_only = true;
    fo.final_hidden = false;
    m->forward(*st, prompt.data() + off, std::min(16, N - off), fo);
  }
  const Snapshot want = snapshot(*m, *st, N);
  for (size_t i = 0; i < want.kv.size(); i++) EXPECT_TRUE(same(got.kv[i], want.kv[i])) << "K/V buffer " << i;
  for (size_t i = 0; i < want.gdn.size(); i++) EXPECT_TRUE(same(got.gdn[i], want.gdn[i])) << "GDN layer " << i;
  EXPECT_TRUE(same(got.logits, want.logits));
}

struct GenRun {
  std::vector<int32_t> tokens;
  std::vector<std::vector<int32_t>> drafts;  // per round
  GenStats stats;
};
GenRun generate(Qwen38Model& m, DraftSource* src, const std::vector<int32_t>& prompt, int n, int k, int max_pos) {
  Generator g(m, src, max_pos);
  GenerateOptions o;
  o.max_new_tokens = n;
  o.draft_k = k;
  GenRun r;
  r.stats = g.generate(
      prompt, o, [&](int32_t t) { r.tokens.push_back(t); return true; },
      [&](int, const std::vector<int32_t>& d, int, int32_t) { r.drafts.push_back(d); });
  return r;
}

// Over 4,000 prompt tokens with a 4096-row chunk: one 4096-row prefill forward (and observe),
// then a 4-row one. Every draft source must reproduce plain decoding.
TEST_P(Prefill, LongPromptIdentityAcrossDraftSources) {
  const SmallPair& p = small_pair();
  auto m = Qwen38Model::load(p.target, be_.get(), 16);
  m->set_prefill_rows(4096);
  const int N = 4100, gen = 40, max_pos = N + gen + 16;
  auto prompt = random_prompt(N, p.t.vocab, 17);
  const GenRun plain = generate(*m, nullptr, prompt, gen, 0, max_pos);
  ASSERT_EQ(plain.tokens.size(), static_cast<size_t>(gen));
  EXPECT_EQ(plain.stats.prompt_tokens, N);
  EXPECT_GT(plain.stats.prefill_ms, 0);
  EXPECT_GE(plain.stats.ttft_ms, plain.stats.prefill_ms);
  EXPECT_NEAR(plain.stats.prefill_tokens_per_second(), N / (plain.stats.prefill_ms / 1000.0), 1e-6);
  const std::string js = plain.stats.to_json();
  EXPECT_NE(js.find("\"time_to_first_token_ms\""), std::string::npos);
  EXPECT_NE(js.find("\"prefill_tokens_per_second\""), std::string::npos);
  MtpDraftSource mtp(*m, max_pos);
  DFlashDraftSource dfl(DFlash2Drafter::load(p.drafter, *m));
  DFlashDraftSource dfl1(DFlash2Drafter::load(p.drafter_v1, *m));
  for (auto [src, k] : {std::pair<DraftSource*, int>{&mtp, 3}, {&dfl, 7}, {&dfl1, 4}}) {
    const GenRun r = generate(*m, src, prompt, gen, k, max_pos);
    EXPECT_EQ(r.tokens, plain.tokens) << src->name() << " k=" << k;
  }
}

// The draft sources observe the prompt chunk by chunk (MTP through its own prefill path, DFlash
// appending its window of tap rows): what they propose must not depend on the chunk size either.
TEST_P(Prefill, DraftSourcesSeeTheSameHistoryForAnyChunk) {
  const SmallPair& p = small_pair();
  auto m = Qwen38Model::load(p.target, be_.get(), 16);
  const int N = 1500, gen = 30, max_pos = N + gen + 16;
  auto prompt = random_prompt(N, p.t.vocab, 29);
  MtpDraftSource mtp(*m, max_pos);
  DFlashDraftSource dfl(DFlash2Drafter::load(p.drafter, *m));
  for (auto [src, k] : {std::pair<DraftSource*, int>{&mtp, 3}, {&dfl, 7}}) {
    m->set_prefill_rows(4096);
    const GenRun big = generate(*m, src, prompt, gen, k, max_pos);
    m->set_prefill_rows(64);
    const GenRun small = generate(*m, src, prompt, gen, k, max_pos);
    EXPECT_EQ(small.tokens, big.tokens) << src->name();
    EXPECT_EQ(small.drafts, big.drafts) << src->name() << ": drafts differ between chunks of 64 and 4096 rows";
    EXPECT_GT(big.drafts.size(), 0u);
  }
}

// Rejected before the target, the state or a draft source is touched.
TEST_P(Prefill, PromptLongerThanContextFailsBeforeAnyWork) {
  const SmallPair& p = small_pair();
  auto m = Qwen38Model::load(p.target, be_.get(), 16);
  const int max_pos = 300;
  DFlashDraftSource dfl(DFlash2Drafter::load(p.drafter, *m));
  Generator g(*m, &dfl, max_pos);
  for (int n : {max_pos, max_pos + 1, 5000}) {
    auto prompt = random_prompt(n, p.t.vocab, 5);
    try {
      g.generate(prompt, GenerateOptions{}, nullptr);
      ADD_FAILURE() << "a " << n << "-token prompt was accepted with " << max_pos << " positions";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Usage);
      const std::string msg = e.what();
      EXPECT_NE(msg.find(std::to_string(n) + " tokens"), std::string::npos) << msg;
      EXPECT_NE(msg.find("--max-context"), std::string::npos) << msg;
    }
    EXPECT_EQ(g.state().pos, 0);
    EXPECT_EQ(dfl.drafter().context_rows(), 0);
    for (auto& b : g.state().gdn)
      for (uint8_t v : down<uint8_t>(*be_, b.get(), b.bytes())) ASSERT_EQ(v, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, Prefill, ::testing::ValuesIn(test::test_backends()), test::backend_param_name);

}  // namespace
}  // namespace qf
