// Identity in int4 mode (--weights int4, quantized at load through the cache): greedy output
// with MTP or DFlash2 drafting equals plain decoding's on the same int4 pair, on every backend
// present (CUDA: the int4 tensor-core GEMV for decode and verify alike). The load-time weights
// compute exactly what the same checkpoint run through `qflash quantize` computes.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "backend/backend.h"
#include "io/int4_cache.h"
#include "io/quantize.h"
#include "model/dflash2.h"
#include "model/qwen38.h"
#include "runtime/draft_source.h"
#include "runtime/generate.h"
#include "support/backends.h"
#include "support/test_models.h"

namespace qf {
namespace {

namespace fs = std::filesystem;

struct Int4Pair {
  std::string target, drafter;
  test::TinyTarget t;
};

const Int4Pair& int4_pair() {
  static Int4Pair p;
  static bool made = false;
  if (!made) {
    p.t.seed = 21;
    p.target = test::write_tiny_target(test::temp_dir("q4id_target"), p.t);
    p.drafter = test::write_tiny_drafter(p.target + "/drafter", test::TinyDrafter{}, p.t);
    made = true;
  }
  return p;
}

std::vector<int32_t> random_prompt(int n, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> p(n);
  for (auto& t : p) t = static_cast<int32_t>(rng() % (vocab - 2));
  return p;
}

std::vector<int32_t> gen(Qwen38Model& m, DraftSource* src, const std::vector<int32_t>& prompt, int n, int k) {
  Generator g(m, src, 512);
  GenerateOptions o;
  o.max_new_tokens = n;
  o.draft_k = k;
  std::vector<int32_t> out;
  g.generate(prompt, o, [&](int32_t t) {
    out.push_back(t);
    return true;
  });
  return out;
}

class Int4LoadIdentity : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string why;
    be = test::make_test_backend(GetParam(), &why);
    ASSERT_TRUE(be) << GetParam() << " is available but did not start: " << why;
    wo.int4 = true;
    wo.cache_root = test::temp_dir("q4id_root");
  }
  std::unique_ptr<Backend> be;
  WeightOptions wo;
};

TEST_P(Int4LoadIdentity, PlainEqualsMtpEqualsDflash2) {
  const Int4Pair& p = int4_pair();
  auto m = Qwen38Model::load(p.target, be.get(), 64, wo);
  EXPECT_EQ(m->lm_head_weight().dtype, DType::U32);
  EXPECT_EQ(m->embed_weight().dtype, DType::U32);
  if (be->is_gpu()) {
    EXPECT_EQ(m->lm_head_weight().layout, WeightRef::kTcQ4);
  }
  EXPECT_TRUE(fs::exists(int4_cache_path_beside(p.target, wo.spec)));
  MtpDraftSource mtp(*m, 512);
  DFlashDraftSource dfl(DFlash2Drafter::load(p.drafter, *m));
  EXPECT_TRUE(fs::exists(int4_cache_path_beside(p.drafter, wo.spec)));  // the drafter follows the target
  for (uint64_t s : {1, 2}) {
    SCOPED_TRACE(s);
    const auto prompt = random_prompt(5 + 7 * static_cast<int>(s), p.t.vocab, s);
    const auto plain = gen(*m, nullptr, prompt, 64, 0);
    ASSERT_EQ(plain.size(), 64u);
    EXPECT_EQ(gen(*m, &mtp, prompt, 64, 1), plain);
    EXPECT_EQ(gen(*m, &mtp, prompt, 64, 3), plain);
    EXPECT_EQ(gen(*m, &dfl, prompt, 64, 7), plain);
  }
}

TEST_P(Int4LoadIdentity, Bf16HeadStaysBf16AndIdentityHolds) {
  const Int4Pair& p = int4_pair();
  wo.spec.lm_head_int4 = false;
  auto m = Qwen38Model::load(p.target, be.get(), 64, wo);
  EXPECT_EQ(m->lm_head_weight().dtype, DType::BF16);
  EXPECT_EQ(m->embed_weight().dtype, DType::U32);
  DFlashDraftSource dfl(DFlash2Drafter::load(p.drafter, *m));
  const auto prompt = random_prompt(9, p.t.vocab, 7);
  EXPECT_EQ(gen(*m, &dfl, prompt, 64, 7), gen(*m, nullptr, prompt, 64, 0));
}

// The prompt through the prefill path (Backend::gemm on int4 weights: bf16(x) W^T; CUDA: the
// int4 tensor-core kernel in 32-token passes): every draft source reproduces plain decoding,
// and the output does not depend on the chunk size (64 or 128 rows, a prompt of 300).
TEST_P(Int4LoadIdentity, PrefillPathIdentityForAnyChunk) {
  const Int4Pair& p = int4_pair();
  auto m = Qwen38Model::load(p.target, be.get(), 64, wo);
  MtpDraftSource mtp(*m, 512);
  DFlashDraftSource dfl(DFlash2Drafter::load(p.drafter, *m));
  const auto prompt = random_prompt(300, p.t.vocab, 11);
  m->set_prefill_rows(128);
  const auto plain = gen(*m, nullptr, prompt, 48, 0);
  ASSERT_EQ(plain.size(), 48u);
  EXPECT_EQ(gen(*m, &mtp, prompt, 48, 3), plain);
  EXPECT_EQ(gen(*m, &dfl, prompt, 48, 7), plain);
  m->set_prefill_rows(64);
  EXPECT_EQ(gen(*m, nullptr, prompt, 48, 0), plain) << "chunk 64 vs 128";
  EXPECT_EQ(gen(*m, &dfl, prompt, 48, 7), plain) << "chunk 64, DFlash2";
}

INSTANTIATE_TEST_SUITE_P(Backends, Int4LoadIdentity, ::testing::ValuesIn(test::test_backends()), test::backend_param_name);

// The load-time path and `qflash quantize` give the same int4 matrices, so the same logits, bit
// for bit (same backend, same kernels).
TEST(Int4Load, SameLogitsAsAQuantizedCheckpoint) {
  const Int4Pair& p = int4_pair();
  const std::string q = test::temp_dir("q4id_quantized") + "/m";
  quantize_checkpoint(p.target, q, QuantizeOptions{});
  auto be = make_cpu_backend();
  WeightOptions wo;
  wo.int4 = true;
  wo.cache_root = test::temp_dir("q4id_root2");
  auto a = Qwen38Model::load(p.target, be.get(), 64, wo);
  auto b = Qwen38Model::load(q, be.get(), 64);
  const auto prompt = random_prompt(12, p.t.vocab, 5);
  auto sa = a->new_state(64, 0), sb = b->new_state(64, 0);
  ForwardOpts fo;
  a->forward(*sa, prompt.data(), static_cast<int>(prompt.size()), fo);
  b->forward(*sb, prompt.data(), static_cast<int>(prompt.size()), fo);
  const size_t n = prompt.size() * static_cast<size_t>(p.t.vocab);
  std::vector<float> la(n), lb(n);
  be->download(la.data(), a->logits(), n * 4);
  be->download(lb.data(), b->logits(), n * 4);
  EXPECT_EQ(0, std::memcmp(la.data(), lb.data(), n * 4));
  // A bf16 load of the same folder is a different model (the int4 path is really taken).
  auto c = Qwen38Model::load(p.target, be.get(), 64);
  auto sc = c->new_state(64, 0);
  c->forward(*sc, prompt.data(), static_cast<int>(prompt.size()), fo);
  std::vector<float> lc(n);
  be->download(lc.data(), c->logits(), n * 4);
  EXPECT_NE(0, std::memcmp(la.data(), lc.data(), n * 4));
}

// Synthetic int4 weights (qflash bench --synthetic --weights int4) are the bf16 synthetic values
// quantized as int4_quantize_row quantizes them; on a GPU, quantized on the device.
TEST_P(Int4LoadIdentity, SyntheticInt4IsTheQuantizedSyntheticBf16) {
  const uint64_t seed = 5;
  WeightOptions q4;
  q4.int4 = true;
  WeightSet ws4(be.get(), seed, q4), ws16(be.get(), seed);
  const int64_t rows = 96, cols = 256;
  const WeightRef w16 = ws16.matrix("model.layers.0.mlp.up_proj.weight", rows, cols, false);
  const WeightRef w4 = ws4.matrix("model.layers.0.mlp.up_proj.weight", rows, cols, false);
  ASSERT_EQ(w4.dtype, DType::U32);
  ASSERT_EQ(w4.layout, WeightRef::kRowMajor);  // matmul_only = false: rows readable
  std::vector<uint16_t> h(static_cast<size_t>(rows * cols));
  be->download(h.data(), w16.data, h.size() * 2);
  std::vector<uint32_t> q(h.size() / 8), gq(q.size());
  std::vector<uint16_t> s(static_cast<size_t>(rows * cols / 64)), b(s.size()), gs(s.size()), gb(s.size());
  int4_quantize_matrix(h.data(), DType::BF16, rows, cols, 64, q.data(), s.data(), b.data());
  be->download(gq.data(), w4.data, gq.size() * 4);
  be->download(gs.data(), w4.scales, gs.size() * 2);
  be->download(gb.data(), w4.biases, gb.size() * 2);
  EXPECT_EQ(gq, q);
  EXPECT_EQ(gs, s);
  EXPECT_EQ(gb, b);
  // Norm-like and codebook tensors stay as they were.
  EXPECT_EQ(ws4.matrix("candidate_selector.predecessor_codebook.weight", 64, 32, false).dtype, DType::BF16);
}

}  // namespace
}  // namespace qf
