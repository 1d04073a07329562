// int4 GEMV v2, "pieces in columns" (lab version 12): both bf16 pieces of an activation in two
// n-columns of one mma. Tried in production behind QFLASH_Q4_GEMV=v2 in run 34 and taken out (it
// broke the int4 identity tests and was no faster: docs/experiments/cuda_kernels.md, run 35); kept
// here for the lab only. Uses the production header's tiles, units and helpers.
#pragma once
#include "backend/cuda/gemv_tc_q4_impl.cuh"

namespace qf::cuda {
namespace {

// The same tiles, unit ring, column slices and group fold as production's gemv_tc_q4_kernel, with the two bf16 pieces of an
// activation in two n-columns of ONE mma instead of two mmas over the same column: B column n
// holds piece n % 2 of token 4j + n / 2 of token tile j (4 tokens a tile). So M <= 4 (decode)
// issues one mma per k-step and row half instead of two (8 per 1,152-byte unit instead of 16), a
// group's dependent mma chain is G / 16 deep instead of 2G / 16, and each lane converts only its
// own piece. M 5..8 (two token tiles) and 9..16 (four) issue as many mmas as production.
// Arithmetic of one token, row and group (a function of the token's own data only, so the same
// for every M): p0 = sum of q * piece0 and p1 = sum of q * piece1, each accumulated by the
// tensor core from a fresh +0 over the group's k-steps (k order as production); the group's
// q-dot is fl(p0 + p1); then acc = fl(acc + fma(scale, q-dot, fl(bias * xsum))) as production,
// xsum summed per lane over its k-steps ((x0 + x1) + (x2 + x3) per step) and over the 4 lanes of
// the token by the xor tree (1, 2). Not production's bits (production accumulates both pieces in
// one chain), the same error bound (tests/unit/cuda_gemv_q4_test.cpp: one fewer rounding inside
// the chain, one add after it).
struct Q4PcRecipe {
  static constexpr int depth = 0;            // units in flight (0: 4 at 1 and 4 token tiles, 3 at 2; G 128: 2)
  static constexpr bool x_prefetch = true;   // activations loaded ahead: 4 k-steps at 1 token tile, 2 at more
  static constexpr bool diag_no_mma = false; // timing only: q4_nomma instead of the mma
  static constexpr int min_blocks = 0;       // resident 8-warp blocks a SM asked of ptxas (0: 2 at <= 2 token tiles, else 1)
};

// Piece g % 2 of two activations as a packed bf16 pair (lo in the low half): pmask = 0 gives
// bf16(x) (x - 0 is x), pmask = ~0 gives bf16(x - bf16(x)) (exact difference): no branch.
__device__ __forceinline__ uint32_t q4_piece(float lo, float hi, uint32_t pmask) {
  uint32_t d, r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  const float rl = __fsub_rn(lo, __uint_as_float((d << 16) & pmask));
  const float rh = __fsub_rn(hi, __uint_as_float(d & 0xffff0000u & pmask));
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(rh), "f"(rl));
  return r;
}

// q4_pair with the mask and the exponent bits in one lop3 ((s & 0x000F000F) | 0x43004300): the
// same bits.
__device__ __forceinline__ uint32_t q4_pair3(uint32_t w, int i) {
  uint32_t v;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(v) : "r"(w >> (4 * i)), "r"(0x000F000Fu), "r"(0x43004300u));
  uint32_t r;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(v), "r"(0x3F803F80u), "r"(0xC300C300u));
  return r;
}

template <int G, int NT>
constexpr int q4pc_depth() {
  return G > 64 ? 2 : NT == 2 ? 2 : 4;
}

template <int G, int NT, class R = Q4PcRecipe>
__global__ void __launch_bounds__(kQ4Warps * 32, R::min_blocks > 0 ? R::min_blocks : NT <= 2 ? 2 : 1)
    gemv_tc_q4_pc_kernel(const Q4Params P) {
  using UT = Q4Unit<G>;
  constexpr int NV = UT::NV, KK = 4 * UT::BLOCKS, SPG = UT::STEPS_PER_GROUP;
  constexpr int DEPTH = R::depth > 0 ? R::depth : q4pc_depth<G, NT>();
  pdl_trigger();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int slice = warp % P.ks, rl = warp / P.ks;
  const int gtile = blockIdx.x * P.tiles_per_block + rl;
  const bool tile_ok = gtile < P.tile0[P.nseg];
  const int seg = tc_seg_of<kQ4MaxSeg>(P, gtile);
  const int nrows = tile_ok ? P.rows[seg] : 0;
  const int row0 = (gtile - P.tile0[seg]) * 32;
  const uint8_t* tb = P.w[seg] + static_cast<size_t>(tile_ok ? gtile - P.tile0[seg] : 0) * P.nunits * UT::BYTES;

  // B column g: token 4j + g / 2, piece g % 2; the lane's 4 columns of a k-step start at 4t.
  const uint32_t pmask = (g & 1) ? 0xffffffffu : 0u;
  bool xv[NT];
  const float* xp[NT];
#pragma unroll
  for (int j = 0; j < NT; j++) {
    const int m = 4 * j + (g >> 1);
    xv[j] = m < P.M;
    xp[j] = P.x + static_cast<size_t>(xv[j] ? m : 0) * P.x_ld + 4 * t;
  }
  // acc[a][j][hr]: row 16a + g + 8hr, token 4j + t.
  float acc[2][NT][2];
#pragma unroll
  for (int a = 0; a < 2; a++)
#pragma unroll
    for (int j = 0; j < NT; j++) acc[a][j][0] = acc[a][j][1] = 0.0f;

  const int u0 = slice * P.cps;
  const int u1 = min(u0 + P.cps, P.nunits);
  auto load = [&](uint4 (&dst)[NV], int u) {
    const uint8_t* p = tb + static_cast<size_t>(u) * UT::BYTES;
#pragma unroll
    for (int v = 0; v < 2 * UT::BLOCKS; v++) dst[v] = tile_ok ? ld_stream16(p + 512 * v + 16 * lane) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int k = 0; k < UT::GROUPS; k++)
      dst[2 * UT::BLOCKS + k] = tile_ok ? ld_stream16(p + UT::BLOCKS * 1024 + 128 * k + 16 * g) : make_uint4(0, 0, 0, 0);
  };
  // x_prefetch: the activations of k-step s are loaded PD k-steps ahead (k-steps are consecutive
  // 16-column blocks across units, so step s + PD is 16 PD columns on): slot s % PD is read and at
  // once refilled with step s + PD. PD = 4 (one G-64 unit) for one token tile, 2 for more, where
  // the registers are short.
  constexpr int PD = R::x_prefetch ? (NT == 1 ? (KK < 4 ? KK : 4) : 2) : 0;
  constexpr bool XPF = PD > 0;
  constexpr int XJ = XPF ? NT : 1, XK = XPF ? PD : 1;
  float4 X[XJ][XK];

  auto unit = [&](const uint4 (&buf)[NV], int u) {
    float cacc[2][NT][4];
    float xsum[NT];
#pragma unroll
    for (int kk = 0; kk < KK; kk++) {
      const int bb = kk / 4, s = kk % 4;
      if (kk % SPG == 0) {
#pragma unroll
        for (int j = 0; j < NT; j++) {
          xsum[j] = 0.0f;
#pragma unroll
          for (int a = 0; a < 2; a++)
#pragma unroll
            for (int e = 0; e < 4; e++) cacc[a][j][e] = 0.0f;
        }
      }
      const int col = u * UT::U + 16 * kk;
      uint32_t b0[NT], b1[NT];
#pragma unroll
      for (int j = 0; j < NT; j++) {
        float4 xf;
        if constexpr (XPF) {
          xf = X[j][kk % XK];
          X[j][kk % XK] = xv[j] && u * KK + kk + PD < u1 * KK
                              ? __ldg(reinterpret_cast<const float4*>(xp[j] + col + 16 * PD))
                              : make_float4(0.f, 0.f, 0.f, 0.f);
        } else {
          xf = xv[j] ? __ldg(reinterpret_cast<const float4*>(xp[j] + col)) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
        b0[j] = q4_piece(xf.x, xf.y, pmask);
        b1[j] = q4_piece(xf.z, xf.w, pmask);
        xsum[j] = __fadd_rn(xsum[j], __fadd_rn(__fadd_rn(xf.x, xf.y), __fadd_rn(xf.z, xf.w)));
      }
#pragma unroll
      for (int a = 0; a < 2; a++) {
        const uint32_t w = q4_word(buf[2 * bb + a], s);
        const uint32_t a0 = q4_pair3(w, 0), a1 = q4_pair3(w, 1), a2 = q4_pair3(w, 2), a3 = q4_pair3(w, 3);
#pragma unroll
        for (int j = 0; j < NT; j++) {
          if constexpr (R::diag_no_mma)
            q4_nomma(cacc[a][j], a0, a1, a2, a3, b0[j], b1[j]);
          else
            q4_mma(cacc[a][j], a0, a1, a2, a3, b0[j], b1[j]);
        }
      }
      if (kk % SPG == SPG - 1) {
        // Token sums: the 4 lanes of column g by the xor tree; lane (g, t) then fetches token
        // 4j + t's sum from lane 8t (column 2t).
        float xt[NT];
#pragma unroll
        for (int j = 0; j < NT; j++) {
          float v = xsum[j];
          v = __fadd_rn(v, __shfl_xor_sync(kFull, v, 1));
          v = __fadd_rn(v, __shfl_xor_sync(kFull, v, 2));
          xt[j] = __shfl_sync(kFull, v, 8 * t);
        }
        const uint4 sb = buf[2 * UT::BLOCKS + kk / SPG];
        // C element e of half a: row 16a + g + 8(e / 2), column 2t + e % 2 (token 4j + t, piece e % 2).
#pragma unroll
        for (int a = 0; a < 2; a++)
#pragma unroll
          for (int hr = 0; hr < 2; hr++) {
            const uint32_t sw = q4_word(sb, 2 * a + hr);
            const float sc = bf16_lo(sw), bi = bf16_hi(sw);
#pragma unroll
            for (int j = 0; j < NT; j++) {
              const float qd = __fadd_rn(cacc[a][j][2 * hr], cacc[a][j][2 * hr + 1]);
              acc[a][j][hr] = __fadd_rn(acc[a][j][hr], __fmaf_rn(sc, qd, __fmul_rn(bi, xt[j])));
            }
          }
      }
    }
  };

  uint4 buf[DEPTH][NV];
#pragma unroll
  for (int d = 0; d < DEPTH; d++)
    if (u0 + d < u1) load(buf[d], u0 + d);  // weights never depend on an earlier kernel: before the wait
  pdl_wait();
  if constexpr (XPF) {
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
      for (int kk = 0; kk < XK; kk++)
        X[j][kk] = xv[j] && u0 < u1 ? __ldg(reinterpret_cast<const float4*>(xp[j] + u0 * UT::U + 16 * kk))
                                    : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  for (int u = u0; u < u1; u += DEPTH) {
#pragma unroll
    for (int d = 0; d < DEPTH; d++) {
      if (u + d < u1) {
        unit(buf[d], u + d);
        if (u + d + DEPTH < u1) load(buf[d], u + d + DEPTH);
      }
    }
  }

  // Results: one slice stores directly; else partial sums through shared memory, added in slice
  // order (tc_store_y's scheme for this accumulator layout).
  if (P.ks == 1) {
#pragma unroll
    for (int a = 0; a < 2; a++)
#pragma unroll
      for (int j = 0; j < NT; j++)
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
          const int r = row0 + 16 * a + g + 8 * hr, m = 4 * j + t;
          if (r < nrows && m < P.M) P.y[seg][static_cast<size_t>(m) * nrows + r] = acc[a][j][hr];
        }
    return;
  }
  extern __shared__ float red[];  // [warp][a][j][hr][lane]
#pragma unroll
  for (int a = 0; a < 2; a++)
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
      for (int hr = 0; hr < 2; hr++) red[(((warp * 2 + a) * NT + j) * 2 + hr) * 32 + lane] = acc[a][j][hr];
  __syncthreads();
  constexpr int per_tile = 2 * NT * 2 * 32;
  for (int idx = threadIdx.x; idx < P.tiles_per_block * per_tile; idx += blockDim.x) {
    const int tl = idx / per_tile, rem = idx % per_tile;
    const int ln = rem % 32, hr = (rem / 32) % 2, j = (rem / 64) % NT, a = rem / (64 * NT);
    const int gt = blockIdx.x * P.tiles_per_block + tl;
    if (gt >= P.tile0[P.nseg]) continue;
    const int sg = tc_seg_of<kQ4MaxSeg>(P, gt);
    const int rows_s = P.rows[sg];
    const int r = (gt - P.tile0[sg]) * 32 + 16 * a + (ln >> 2) + 8 * hr;
    const int m = 4 * j + (ln & 3);
    if (r >= rows_s || m >= P.M) continue;
    float sum = 0.0f;
    for (int k = 0; k < P.ks; k++) sum = __fadd_rn(sum, red[((((tl * P.ks + k) * 2 + a) * NT + j) * 2 + hr) * 32 + ln]);
    P.y[sg][static_cast<size_t>(m) * rows_s + r] = sum;
  }
}

// v2 (gemv_tc_q4_pc_kernel): passes of 16 tokens for every M, bf16-valued activations (the
// prefill GEMM's xr) included, so a token's bits never depend on the pass it lands in; token
// tiles of 4: 1 (M <= 4), 2 (M <= 8) or 4 (M <= 16). Two pieces always (QFLASH_TC_Q4_PIECES
// does not apply: the production entry points keep the v1 kernel when it asks for 3).
template <int G, int NT, class R>
void q4pc_launch(const Q4Params& P, unsigned grid, cudaStream_t st) {
  const size_t smem = P.ks > 1 ? static_cast<size_t>(kQ4Warps) * 2 * NT * 2 * 32 * sizeof(float) : 0;
  launch_k(gemv_tc_q4_pc_kernel<G, NT, R>, dim3(grid), dim3(kQ4Warps * 32), smem, st, P);
}

template <int G, class R>
void q4pc_dispatch(const Q4Params& P, unsigned grid, int nt, cudaStream_t st) {
  if (nt == 1)
    q4pc_launch<G, 1, R>(P, grid, st);
  else if (nt == 2)
    q4pc_launch<G, 2, R>(P, grid, st);
  else
    q4pc_launch<G, 4, R>(P, grid, st);
}

template <class R = Q4PcRecipe>
void q4_run_pc(const WeightRef* const* Ws, float* const* ys, int n, const float* x, int x_ld, int M, cudaStream_t st,
               const Q4RunOpts& opt = {}) {
  if (n < 1 || n > kQ4MaxSeg) backend_fail("cuda matmul (int4 tc v2): %d weights in one group (1..%d)", n, kQ4MaxSeg);
  if (M <= 0) return;
  const int group = Ws[0]->group;
  int64_t tiles = 0;
  for (int i = 0; i < n; i++) {
    const WeightRef& W = *Ws[i];
    if (W.layout != WeightRef::kTcQ4 || W.cols != Ws[0]->cols || W.group != group || !W.data)
      backend_fail("cuda matmul (int4 tc v2): weight %d of %d is not in the int4 tile layout with the group's cols "
                   "and group (%lld x %lld, group %d, layout %d)", i, n, (long long)W.rows, (long long)W.cols, W.group,
                   static_cast<int>(W.layout));
    tiles += (W.rows + 31) / 32;
  }
  if ((reinterpret_cast<uintptr_t>(x) & 15) != 0 || x_ld % 4 != 0 || x_ld < Ws[0]->cols)
    backend_fail("cuda matmul (int4 tc v2): activations must be 16-byte aligned with a row stride multiple of 4 >= cols");
  Q4Params P{};
  tc_fill_segments<uint8_t>(P, Ws, n, x_ld, tiles);
  P.nunits = static_cast<int>(P.cols / q4_unit_cols(group));
  P.ks = opt.ks > 0 ? opt.ks : tc_column_slices(tiles, P.nunits, kQ4Warps);
  if (P.ks != 1 && P.ks != 2 && P.ks != 4 && P.ks != 8)
    backend_fail("cuda matmul (int4 tc v2): column slices %d not in {1,2,4,8}", P.ks);
  P.cps = (P.nunits + P.ks - 1) / P.ks;
  P.tiles_per_block = kQ4Warps / P.ks;
  const unsigned grid = static_cast<unsigned>((tiles + P.tiles_per_block - 1) / P.tiles_per_block);
  for (int g0 = 0; g0 < M; g0 += 16) {
    const int mg = M - g0 < 16 ? M - g0 : 16;
    P.M = mg;
    P.x = x + static_cast<size_t>(g0) * x_ld;
    for (int i = 0; i < n; i++) P.y[i] = ys[i] + static_cast<size_t>(g0) * Ws[i]->rows;
    if (prof_on()) {
      std::string r;
      for (int i = 0; i < n; i++) r += fmt_str(i ? "+%lld" : "%lld", (long long)Ws[i]->rows);
      prof_tag("%s x %d, M=%d, int4 g%d, ks %d, v2", r.c_str(), P.cols, mg, group, P.ks);
    }
    const int nt = mg <= 4 ? 1 : mg <= 8 ? 2 : 4;
    switch (group) {
      case 32: q4pc_dispatch<32, R>(P, grid, nt, st); break;
      case 64: q4pc_dispatch<64, R>(P, grid, nt, st); break;
      default: q4pc_dispatch<128, R>(P, grid, nt, st); break;
    }
    QF_CUDA_LAUNCH_CHECK("gemv_tc_q4_pc_kernel");
  }
}

}  // namespace
}  // namespace qf::cuda
