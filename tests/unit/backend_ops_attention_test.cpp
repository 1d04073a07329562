// Backend op table, attention: the decode / verify op (causal, sliding window, non-causal with and
// without a window, GQA and MHA, offset key buffers, contexts from 3 to 5000 keys) and the prefill
// op attention_prefill. Each against the float64 reference within the tolerance table, and each
// row's bits independent of the other rows: for attention, a verify of M rows equals M decode
// steps; for attention_prefill, rows alone and a prompt split at a multiple of kPrefillChunk rows.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "support/op_harness.h"
#include "support/op_reference.h"

namespace qf::test {
namespace {

const StepMeta* meta_ptr(const DeviceBuffer& b) { return reinterpret_cast<const StepMeta*>(b.get()); }

AttnParams attn_params(int nh, int nkv, int hd, bool causal, int window) {
  AttnParams p;
  p.n_heads = nh;
  p.n_kv_heads = nkv;
  p.head_dim = hd;
  p.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  p.causal = causal;
  p.window = window;
  return p;
}

struct AttnCase {
  const char* name;
  int nh, nkv, hd;
  bool causal;
  int window, n_ctx, kv_pos0;
};

// 16 query rows after n_ctx context keys (key buffer row j at position kv_pos0 + j, query row 0 at
// kv_pos0 + n_ctx): the 16-row call against float64; every M = 1..16 call with the keys a verify of
// that size has, and each row alone as a decode step, give the 16-row call's bits.
void check_attention(Backend& be, const AttnCase& c) {
  const AttnParams p = attn_params(c.nh, c.nkv, c.hd, c.causal, c.window);
  const int Mmax = 16, kvw = c.nkv * c.hd, nkeys = c.n_ctx + Mmax;
  const auto K = randn(static_cast<size_t>(nkeys) * kvw, 6, 1.5f), V = randn(static_cast<size_t>(nkeys) * kvw, 7);
  const auto q = randn(static_cast<size_t>(Mmax) * c.nh * c.hd, 8, 1.5f);
  const DeviceBuffer dK = to_device(be, K), dV = to_device(be, V), dq = to_device(be, q);
  const int P = c.kv_pos0 + c.n_ctx;
  const size_t rowf = static_cast<size_t>(c.nh) * c.hd;
  const StepMeta meta{P, c.kv_pos0, nkeys, 0};
  const DeviceBuffer dm = to_device(be, std::vector<StepMeta>{meta});
  Out out(be, Mmax * rowf);
  be.attention(dq.f(), dK.f(), dV.f(), out.f(), Mmax, p, meta_ptr(dm));
  const auto all = out.floats("attention");
  const Ref ref = ref_attention(q, K, V, Mmax, p, meta);
  EXPECT_TRUE(within(all, ref.y, ref.tol, "16 rows vs float64"));
  // Causal rows see the same keys whatever n_kv is beyond their own position.
  const std::vector<int> all_rows = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  for (int M : sweep(be, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, {1, 2, 7, 9, 16})) {
    const DeviceBuffer dmm = to_device(be, std::vector<StepMeta>{StepMeta{P, c.kv_pos0, c.causal ? c.n_ctx + M : nkeys, 0}});
    Out o(be, M * rowf);
    be.attention(dq.f(), dK.f(), dV.f(), o.f(), M, p, meta_ptr(dmm));
    EXPECT_TRUE(same_bits(o.floats("verify").data(), all.data(), M * rowf, "verify of M=" + std::to_string(M)));
  }
  for (int m : sweep(be, all_rows, {0, 1, 8, 15})) {
    const DeviceBuffer dm1 =
        to_device(be, std::vector<StepMeta>{StepMeta{P + m, c.kv_pos0, c.causal ? c.n_ctx + m + 1 : nkeys, 0}});
    Out o(be, rowf);
    be.attention(dq.f() + m * rowf, dK.f(), dV.f(), o.f(), 1, p, meta_ptr(dm1));
    EXPECT_TRUE(same_bits(o.floats("decode").data(), all.data() + m * rowf, rowf, "decode step of row " + std::to_string(m)));
  }
}

std::vector<OpCase> attention_cases() {
  const AttnCase cases[] = {
      {"target_H6_KV2_D256_ctx300", 6, 2, 256, true, 0, 300, 0},            // target-like heads, several chunks
      {"drafter_H4_KV2_D128_noncausal_w9_ctx22_off78", 4, 2, 128, false, 9, 22, 78},  // bidirectional window
      {"causal_w9_H4_KV2_D16_ctx22_off78", 4, 2, 16, true, 9, 22, 78},      // causal window, offset buffer
      {"noncausal_w9_H4_KV2_D16_ctx22_off78", 4, 2, 16, false, 9, 22, 78},
      {"window40_H4_KV1_D64_ctx5000", 4, 1, 64, true, 40, 5000, 0},         // long context, sliding window
      {"tiny_H4_KV2_D16_ctx3", 4, 2, 16, true, 0, 3, 0},                    // fewer keys than a chunk
      {"mha_noncausal_H8_KV8_D128_ctx1500_off10", 8, 8, 128, false, 0, 1500, 10},
      {"q27b_H24_KV4_D256_ctx2100", 24, 4, 256, true, 0, 2100, 0},          // the 27B's attention geometry
  };
  std::vector<OpCase> cs;
  for (const AttnCase& c : cases) cs.push_back({c.name, [c](Backend& be) { check_attention(be, c); }});
  return cs;
}
QF_OP_SUITE(Attention, attention_cases);

// attention_prefill: M prompt rows at positions P.. (keys for all of them already written, key
// buffer from position 0): against float64; rows alone (with only the keys up to their own
// position) and the prompt split at kPrefillChunk rows give the full call's bits.
struct PrefillCase {
  const char* name;
  int nh, nkv, hd, window, P, M;
};

void check_attention_prefill(Backend& be, const PrefillCase& c) {
  const AttnParams p = attn_params(c.nh, c.nkv, c.hd, true, c.window);
  const int nkeys = c.P + c.M, kvw = c.nkv * c.hd;
  const auto K = randn(static_cast<size_t>(nkeys) * kvw, 16, 1.5f), V = randn(static_cast<size_t>(nkeys) * kvw, 17);
  const auto q = randn(static_cast<size_t>(c.M) * c.nh * c.hd, 18, 1.5f);
  const DeviceBuffer dK = to_device(be, K), dV = to_device(be, V), dq = to_device(be, q);
  const size_t rowf = static_cast<size_t>(c.nh) * c.hd;
  const StepMeta meta{c.P, 0, nkeys, 0};
  const DeviceBuffer dm = to_device(be, std::vector<StepMeta>{meta});
  Out out(be, c.M * rowf);
  be.attention_prefill(dq.f(), dK.f(), dV.f(), out.f(), c.M, p, meta_ptr(dm));
  const auto all = out.floats("attention_prefill");
  const Ref ref = ref_attention(q, K, V, c.M, p, meta);
  EXPECT_TRUE(within(all, ref.y, ref.tol, "prefill rows vs float64"));
  for (int m : {0, 1, Backend::kPrefillChunk - 1, Backend::kPrefillChunk, Backend::kPrefillChunk + 1, c.M - 1}) {
    if (m >= c.M) continue;
    const DeviceBuffer dm1 = to_device(be, std::vector<StepMeta>{StepMeta{c.P + m, 0, c.P + m + 1, 0}});
    Out o(be, rowf);
    be.attention_prefill(dq.f() + m * rowf, dK.f(), dV.f(), o.f(), 1, p, meta_ptr(dm1));
    EXPECT_TRUE(same_bits(o.floats("row alone").data(), all.data() + m * rowf, rowf, "row " + std::to_string(m) + " alone"));
  }
  for (int A = Backend::kPrefillChunk; A < c.M; A += Backend::kPrefillChunk) {
    // rows [0, A) with the keys up to row A, then rows [A, M)
    Out o(be, c.M * rowf);
    const DeviceBuffer d1 = to_device(be, std::vector<StepMeta>{StepMeta{c.P, 0, c.P + A, 0}});
    const DeviceBuffer d2 = to_device(be, std::vector<StepMeta>{StepMeta{c.P + A, 0, nkeys, 0}});
    be.attention_prefill(dq.f(), dK.f(), dV.f(), o.f(), A, p, meta_ptr(d1));
    be.attention_prefill(dq.f() + A * rowf, dK.f(), dV.f(), o.f() + A * rowf, c.M - A, p, meta_ptr(d2));
    EXPECT_TRUE(same_bits(o.floats("split"), all, "prompt split at row " + std::to_string(A)));
  }
}

std::vector<OpCase> prefill_cases() {
  const PrefillCase cases[] = {
      {"H4_KV2_D64_M150", 4, 2, 64, 0, 0, 150},
      {"q27b_H24_KV4_D256_M130", 24, 4, 256, 0, 0, 130},
      {"after_ctx200_H8_KV2_D128_M100", 8, 2, 128, 0, 200, 100},
      {"window40_H4_KV1_D64_M150", 4, 1, 64, 40, 0, 150},
      {"short_H4_KV2_D32_M7", 4, 2, 32, 0, 0, 7},
  };
  std::vector<OpCase> cs;
  for (const PrefillCase& c : cases) cs.push_back({c.name, [c](Backend& be) { check_attention_prefill(be, c); }});
  return cs;
}
QF_OP_SUITE(AttentionPrefill, prefill_cases);

}  // namespace
}  // namespace qf::test
