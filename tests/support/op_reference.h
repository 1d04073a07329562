// Float64 references of the backend ops, written from the contracts in backend/backend.h and
// docs/spec (not from a backend's code), each returning the exact-arithmetic result and the
// per-element tolerance of tests/support/tolerance.h for it. Inputs are the fp32 values a
// backend reads (weights as their exact stored values).
#pragma once
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "support/op_harness.h"

namespace qf::test {

// A float64 result and its tolerance, element for element.
struct Ref {
  std::vector<double> y, tol;
};

// y[m, r] = sum_c W[r, c] x[m, c]; with bf16_x the activations are first rounded to bf16 (gemm).
Ref ref_matmul(const HostWeight& W, const std::vector<float>& x, int M, bool bf16_x = false);
// The same values with the tolerance of the int4 tensor-core form (tol::matmul_int4_tc; W int4):
// `pieces` bf16 parts per activation (1 with bf16_x).
Ref ref_matmul_int4_tc(const HostWeight& W, const std::vector<float>& x, int M, int pieces, bool bf16_x = false);

// rmsnorm over rows of n (w nullptr = ones); with gate: w * rmsnorm(x) * silu(gate).
Ref ref_rmsnorm(const std::vector<float>& x, const float* gate, const float* w, int rows, int n, float eps);

// NeoX rotate-half RoPE on dims [0, rot) of each head, row m at position pos0 + m.
Ref ref_rope(const std::vector<float>& x, int M, int n_heads, int head_dim, int rot, float theta, int pos0);

// Attention as backend.h defines it (visibility from AttnParams and StepMeta).
Ref ref_attention(const std::vector<float>& q, const std::vector<float>& K, const std::vector<float>& V, int M,
                  const AttnParams& p, const StepMeta& meta);

// The gated DeltaNet recurrence (docs/spec/qwen38.md 3.3), row by row from `state0` (the layer's
// blob, GdnDims layout). states[m] is the blob after row m (as float64); the conv tail part is
// copies of raw rows, so it is exact. Tolerances follow tolerance.h (the gdn_* entries; with
// chunk_rows > 0 also the chunk-parallel form's extra terms): per element of y, and per state row
// S_i (2-norm of its error) after each row.
struct GdnRef {
  std::vector<double> y;                       // [M, value_dim]
  std::vector<std::vector<double>> states;     // M blobs
  std::vector<double> tol_y;                   // [M, value_dim]
  std::vector<std::vector<double>> tol_rows;   // [M][n_v_heads * d_v]
};
GdnRef ref_gdn(const std::vector<float>& mixed, const std::vector<float>& alpha, const std::vector<float>& beta_in,
               const std::vector<float>& conv_w, const std::vector<float>& A_log, const std::vector<float>& dt_bias,
               const GdnDims& d, const std::vector<float>& state0, int M, int chunk_rows = 0);

// dyn_conv (docs/spec/dflash2.md 2.5); base already offset by side * Kc * H.
Ref ref_dyn_conv(const std::vector<float>& x, const float* base, const std::vector<float>& D, int L, int H, int Kc,
                 int gs, int side);

// Greedy selector walk (docs/spec/dflash2.md 3.1). `margin_ok` is false when some slot's best
// score is within tolerance of a different candidate (the data would not decide the pick).
struct SelectorRef {
  std::vector<int32_t> drafts;
  Ref scores;
  bool margin_ok = true;
};
SelectorRef ref_selector_walk(const std::vector<float>& cand_vals, const std::vector<int32_t>& cand_ids,
                              const std::vector<float>& P, const HostWeight& Epre, const HostWeight& Esuc, int32_t anchor,
                              int k, int K, int R);

// First index of the largest value per row ('>' scan: lowest index among equal maxima; a NaN is
// never greater, so it is never picked after index 0 and never beaten at index 0).
std::vector<int32_t> ref_argmax(const std::vector<float>& x, int M, int n);
// Top-k per row ordered by (value desc, index asc).
void ref_topk(const std::vector<float>& x, int M, int n, int k, std::vector<float>* vals, std::vector<int32_t>* ids);

// fill_random's definition (backend.h): element i = scale * (2 u - 1), u = top 24 bits of
// splitmix64(seed + i) / 2^24, as bf16 (round to nearest even) or f32 bytes; elements
// [first, first + n).
std::vector<uint8_t> ref_fill_random(size_t first, size_t n, DType dt, uint64_t seed, float scale);

}  // namespace qf::test
