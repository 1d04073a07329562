// The tensor-core multi-row GEMV for int4 weights (mlx group-affine: w = q * scale + bias per
// group of G = 32, 64 or 128 columns), M <= 16 token rows per pass, on weights relaid at load into
// this kernel's own tiles (WeightRef::kTcQ4). Shared by gemv_tc_q4.cu (the production entry
// points, recipe Q4Recipe) and the kernel lab (bench/lab_gemv_q4.cu, the other recipes). The bf16 twin is gemv_tc.cu; this file shares its
// geometry (a warp owns 32 weight rows and one column slice, tokens are the MMA's n = 8 side).
//
// Arithmetic. For one group and one token, sum_c w_c x_c = scale * sum_c q_c x_c + bias * sum_c x_c.
//  - q_c (0..15) is exact in bf16; each fp32 activation is split exactly into NP bf16 pieces
//    (x = x0 + x1 [+ x2]; NP = 3 is exact, NP = 2 leaves |x - x0 - x1| <= 2^-17 |x|), so every
//    MMA product q * x_i is exact. mma.sync m16n8k16 accumulates a group's products (pieces
//    smallest first) into a fresh fp32 accumulator.
//  - The lanes' activation sums of the group (fixed order, a fixed xor tree over the 4 lanes that
//    share a token) give sum_c x_c.
//  - Per group: acc += fma(scale, group_acc, bias * xsum), with explicit IEEE roundings.
// The CPU reference dequantizes w = q * scale + bias in fp32 first and then sums; the two agree
// to a bound the CUDA tests derive (not bit for bit: different, equally fixed, reduction orders).
//
// Row-invariance. Token m sits in column m % 8 of token tile m / 8; an MMA output element
// depends only on its own weight row, its own token column and its own accumulator; the token
// sums are per token; the k order, group folds, unit order and column-slice reduction depend on
// the shape only. So a token's result is bit-identical for every M (decode == verify).
//
// Layout kTcQ4. Per 32-row tile, the tile's units one after another; a unit is U = max(64, G)
// columns: U / 64 nibble blocks of 1 KB then U / G scale blocks of 128 B. Nibble block: 2 loads
// of 512 B (row half a = 0, 1), one 16-byte vector per lane (g, t) = (lane / 4, lane % 4); word s
// (MMA step s) of lane (g, t) in half a holds, for rows r0 = 16a + g and r1 = r0 + 8 and columns
// c = 64 b + 16 s + 4 t .. c + 3, the eight nibbles the lane's A fragment needs:
//   bits 4i..4i+3, i = 0..7:  q[r0][c], q[r1][c], q[r0][c+2], q[r1][c+2],
//                             q[r0][c+1], q[r1][c+1], q[r0][c+3], q[r1][c+3]
// so (word >> 4i) & 0x000F000F is fragment register a_i as two nibbles (i = 0..3). The B fragment
// maps k-pair t to columns c, c + 1 and k-pair t + 4 to c + 2, c + 3: one float4 per lane per step.
// Scale block of group gi: 8 vectors of 16 B, vector g = rows g, g + 8, g + 16, g + 24, each a
// u32 (scale bf16 low, bias bf16 high). Rows past the matrix are zero (q = scale = bias = 0).
#pragma once
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "backend/cuda/device_common.cuh"
#include "backend/cuda/kernels.h"

namespace qf::cuda {

namespace {

constexpr int kQ4Warps = 8;   // warps per block
constexpr int kQ4MaxSeg = 4;  // weights sharing one launch (same x, same cols, same group)

struct Q4Params {
  const uint8_t* w[kQ4MaxSeg];  // tiled blobs
  float* y[kQ4MaxSeg];
  int rows[kQ4MaxSeg];
  int tile0[kQ4MaxSeg + 1];  // segment i owns global tiles [tile0[i], tile0[i + 1])
  int nseg;
  const float* x;
  int cols, x_ld, M;
  int ks;               // column slices (1, 2, 4, 8)
  int cps;              // units per slice
  int nunits;           // cols / U
  int tiles_per_block;  // kQ4Warps / ks
  // Recipe::pre_x only (the kernel lab): activations prepared by q4_prepare_x_kernel.
  const uint4* xq;   // [16 tokens][cols / 16 k-steps][4 lanes t]: {b0 piece 0, b1 piece 0, b0 piece 1, b1 piece 1}
  const float* xs;   // [cols / G groups][16 tokens]: the token's group sum, as the kernel's lane tree makes it
  int nsteps;        // cols / 16
};

template <int G>
struct Q4Unit {
  static constexpr int U = G > 64 ? G : 64;          // columns per unit
  static constexpr int BLOCKS = U / 64;              // 1 KB nibble blocks per unit
  static constexpr int GROUPS = U / G;               // scale blocks per unit
  static constexpr int STEPS_PER_GROUP = G / 16;     // MMA k-steps per group
  static constexpr int NV = 2 * BLOCKS + GROUPS;     // 16-byte vectors per lane per unit
  static constexpr int BYTES = BLOCKS * 1024 + GROUPS * 128;
  static constexpr int DEPTH = G > 64 ? 3 : 4;       // units in flight per warp
};

__device__ __forceinline__ void q4_mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                       uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// The diagnostic stand-in for q4_mma (Recipe::diag_no_mma): every operand is added into the
// accumulator's bits as an integer (not xor: the two pieces' calls share the A operands and would
// cancel), so the loads, dequant and split that feed it stay live. An empty asm statement with the
// operands as inputs let ptxas drop them all: run 33's "nomma" loaded only the scale vectors (see
// docs/experiments/cuda_kernels.md, 2026-12-06).
__device__ __forceinline__ void q4_nomma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  c[0] = __uint_as_float(__float_as_uint(c[0]) + a0 + a1);
  c[1] = __uint_as_float(__float_as_uint(c[1]) + a2 + a3);
  c[2] = __uint_as_float(__float_as_uint(c[2]) + b0);
  c[3] = __uint_as_float(__float_as_uint(c[3]) + b1);
}

// Fragment register a_i: nibbles i and i + 4 of the word as an exact bf16 pair. 0x4300 | q is
// bf16(128 + q); fma(v, 1, -128) removes the 128 exactly (sm_80+).
__device__ __forceinline__ uint32_t q4_pair(uint32_t w, int i) {
  const uint32_t v = ((w >> (4 * i)) & 0x000F000Fu) | 0x43004300u;
  uint32_t r;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(v), "r"(0x3F803F80u), "r"(0xC300C300u));
  return r;
}

// Exact split of two activations into NP packed bf16 pairs (low half = the lower column).
template <int NP>
__device__ __forceinline__ void q4_split(float lo, float hi, uint32_t (&p)[NP]) {
#pragma unroll
  for (int i = 0; i < NP; i++) {
    const uint32_t l = __bfloat16_as_ushort(__float2bfloat16_rn(lo));
    const uint32_t h = __bfloat16_as_ushort(__float2bfloat16_rn(hi));
    p[i] = l | (h << 16);
    lo = __fsub_rn(lo, __uint_as_float(l << 16));
    hi = __fsub_rn(hi, __uint_as_float(h << 16));
  }
}

// Exact split as q4_split, two activations per conversion (cvt.rn.bf16x2.f32 packs hi above lo):
// the same roundings, so the same bits.
template <int NP>
__device__ __forceinline__ void q4_split_x2(float lo, float hi, uint32_t (&p)[NP]) {
#pragma unroll
  for (int i = 0; i < NP; i++) {
    uint32_t d;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    p[i] = d;
    lo = __fsub_rn(lo, __uint_as_float(d << 16));
    hi = __fsub_rn(hi, __uint_as_float(d & 0xFFFF0000u));
  }
}

__device__ __forceinline__ uint32_t q4_word(const uint4& v, int s) { return s == 0 ? v.x : s == 1 ? v.y : s == 2 ? v.z : v.w; }

// What the kernel does, fixed at compile time. Production runs Q4Recipe as declared here; the
// kernel lab (bench/lab_gemv_q4.cu) instantiates the others. Every variant except the diag_*
// ones computes the same bits as production (the lab checks it with memcmp).
struct Q4Recipe {
  static constexpr int depth = 0;            // units in flight per warp (0: Q4Unit<G>::DEPTH)
  static constexpr bool split_x2 = false;    // split two activations per cvt (q4_split_x2)
  static constexpr bool pre_x = false;       // pieces and group sums read from q4_prepare_x's output (NP 2)
  static constexpr bool diag_no_alu = false; // timing only: raw words into the MMAs, no split, no dequant
  static constexpr bool diag_no_mma = false; // timing only: the MMAs' inputs computed and added
                                             // into the accumulator's bits (q4_nomma), no MMA issued
  static constexpr bool x_prefetch = false;  // activations loaded one unit ahead (a register ring)
};

template <int G, int NT, int NP, class R = Q4Recipe>
__global__ void __launch_bounds__(kQ4Warps * 32, NT == 1 ? 2 : 1) gemv_tc_q4_kernel(const Q4Params P) {
  using UT = Q4Unit<G>;
  constexpr int NV = UT::NV, DEPTH = R::depth > 0 ? R::depth : UT::DEPTH;
  static_assert(!R::pre_x || NP == 2, "pre_x holds two pieces");
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

  bool xv[NT];
  const float* xp[NT];
  float acc[2][NT][4];
  tc_warp_rows<NT>(P.x, P.M, P.x_ld, g, 4 * t, xv, xp, acc);

  const int u0 = slice * P.cps;
  const int u1 = min(u0 + P.cps, P.nunits);
  // Vectors 0 .. 2*BLOCKS-1: nibbles (block v / 2, half v % 2); then one scale vector per group.
  auto load = [&](uint4 (&dst)[NV], int u) {
    const uint8_t* p = tb + static_cast<size_t>(u) * UT::BYTES;
#pragma unroll
    for (int v = 0; v < 2 * UT::BLOCKS; v++) dst[v] = tile_ok ? ld_stream16(p + 512 * v + 16 * lane) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int k = 0; k < UT::GROUPS; k++)
      dst[2 * UT::BLOCKS + k] = tile_ok ? ld_stream16(p + UT::BLOCKS * 1024 + 128 * k + 16 * g) : make_uint4(0, 0, 0, 0);
  };

  // One unit: for each k-step, the activations of every token tile (split into NP pieces, and
  // summed for the group's token sum) and 2 row halves x NT token tiles x NP MMAs; at the end of
  // each group the fold into acc.
  // Recipe::x_prefetch: X[j][kk] holds the activations of k-step kk of the next unit; each slot is
  // refilled for the unit after as soon as it is read (one unit ahead, no extra registers per step).
  constexpr int XJ = R::x_prefetch ? NT : 1, XK = R::x_prefetch ? 4 * UT::BLOCKS : 1;
  float4 X[XJ][XK];
  auto unit = [&](const uint4 (&buf)[NV], int u) {
    float cacc[2][NT][4];
    float xsum[NT];
#pragma unroll
    for (int kk = 0; kk < 4 * UT::BLOCKS; kk++) {
      const int bb = kk / 4, s = kk % 4;
      if (kk % UT::STEPS_PER_GROUP == 0) {
#pragma unroll
        for (int a = 0; a < 2; a++)
#pragma unroll
          for (int j = 0; j < NT; j++) {
            xsum[j] = 0.0f;
#pragma unroll
            for (int e = 0; e < 4; e++) cacc[a][j][e] = 0.0f;
          }
      }
      const int col = (u * UT::BLOCKS + bb) * 64 + 16 * s;
      uint32_t b0[NT][NP], b1[NT][NP];
#pragma unroll
      for (int j = 0; j < NT; j++) {
        if constexpr (R::pre_x) {
          const uint4 pv = xv[j] ? __ldg(P.xq + (static_cast<size_t>(8 * j + g) * P.nsteps + col / 16) * 4 + t)
                                 : make_uint4(0, 0, 0, 0);
          b0[j][0] = pv.x;
          b1[j][0] = pv.y;
          b0[j][1] = pv.z;
          b1[j][1] = pv.w;
        } else {
          if constexpr (R::x_prefetch) {
            // Production's split and sum on the activations taken from the ring (the branch below
            // is production's code, kept as it was so that its instructions do not move).
            const float4 xf = X[j][kk];
            X[j][kk] = xv[j] && u + 1 < u1 ? __ldg(reinterpret_cast<const float4*>(xp[j] + col + UT::U))
                                           : make_float4(0.f, 0.f, 0.f, 0.f);
            q4_split<NP>(xf.x, xf.y, b0[j]);
            q4_split<NP>(xf.z, xf.w, b1[j]);
            xsum[j] = __fadd_rn(xsum[j], __fadd_rn(__fadd_rn(xf.x, xf.y), __fadd_rn(xf.z, xf.w)));
            continue;
          }
          const float4 xf = xv[j] ? __ldg(reinterpret_cast<const float4*>(xp[j] + col)) : make_float4(0.f, 0.f, 0.f, 0.f);
          if constexpr (R::diag_no_alu) {
#pragma unroll
            for (int p = 0; p < NP; p++) {
              b0[j][p] = __float_as_uint(xf.x);
              b1[j][p] = __float_as_uint(xf.y);
            }
          } else if constexpr (R::split_x2) {
            q4_split_x2<NP>(xf.x, xf.y, b0[j]);
            q4_split_x2<NP>(xf.z, xf.w, b1[j]);
          } else {
            q4_split<NP>(xf.x, xf.y, b0[j]);
            q4_split<NP>(xf.z, xf.w, b1[j]);
          }
          if constexpr (!R::diag_no_alu)
            xsum[j] = __fadd_rn(xsum[j], __fadd_rn(__fadd_rn(xf.x, xf.y), __fadd_rn(xf.z, xf.w)));
        }
      }
#pragma unroll
      for (int a = 0; a < 2; a++) {
        const uint32_t w = q4_word(buf[2 * bb + a], s);
        uint32_t a0, a1, a2, a3;
        if constexpr (R::diag_no_alu) {
          a0 = a1 = a2 = a3 = w;
        } else {
          a0 = q4_pair(w, 0), a1 = q4_pair(w, 1), a2 = q4_pair(w, 2), a3 = q4_pair(w, 3);
        }
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
          for (int p = NP - 1; p >= 0; p--) {
            if constexpr (R::diag_no_mma)
              q4_nomma(cacc[a][j], a0, a1, a2, a3, b0[j][p], b1[j][p]);
            else
              q4_mma(cacc[a][j], a0, a1, a2, a3, b0[j][p], b1[j][p]);
          }
      }
      if (kk % UT::STEPS_PER_GROUP == UT::STEPS_PER_GROUP - 1) {
        // Token sums: the 4 lanes of token g by a fixed xor tree (every lane ends with the same
        // bits), then each lane fetches the sums of its accumulator tokens 2t and 2t + 1.
        float xt[NT][2];
#pragma unroll
        for (int j = 0; j < NT; j++) {
          if constexpr (R::pre_x) {
            const float2 v = __ldg(reinterpret_cast<const float2*>(P.xs + (col / G) * 16 + 8 * j + 2 * t));
            xt[j][0] = v.x;
            xt[j][1] = v.y;
          } else if constexpr (R::diag_no_alu) {
            xt[j][0] = xt[j][1] = 0.0f;
          } else {
            float v = xsum[j];
            v = __fadd_rn(v, __shfl_xor_sync(kFull, v, 1));
            v = __fadd_rn(v, __shfl_xor_sync(kFull, v, 2));
            xt[j][0] = __shfl_sync(kFull, v, 8 * t);
            xt[j][1] = __shfl_sync(kFull, v, 8 * t + 4);
          }
        }
        const uint4 sb = buf[2 * UT::BLOCKS + kk / UT::STEPS_PER_GROUP];
        // Accumulator element e of half a: row 16a + g + 8(e / 2) = scale word 2a + e / 2.
#pragma unroll
        for (int a = 0; a < 2; a++)
#pragma unroll
          for (int hr = 0; hr < 2; hr++) {
            const uint32_t sw = q4_word(sb, 2 * a + hr);
            const float sc = bf16_lo(sw), bi = bf16_hi(sw);
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
              for (int tc = 0; tc < 2; tc++) {
                const int e = 2 * hr + tc;
                acc[a][j][e] = __fadd_rn(acc[a][j][e], __fmaf_rn(sc, cacc[a][j][e], __fmul_rn(bi, xt[j][tc])));
              }
          }
      }
    }
  };

  // Ring of DEPTH units in flight: unit u + DEPTH is requested as soon as unit u is used.
  uint4 buf[DEPTH][NV];
#pragma unroll
  for (int d = 0; d < DEPTH; d++)
    if (u0 + d < u1) load(buf[d], u0 + d);  // weights never depend on an earlier kernel: before the wait
  pdl_wait();
  if constexpr (R::x_prefetch) {
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

  tc_store_y<NT, kQ4MaxSeg>(P, acc, seg, row0, nrows, warp, lane, g, t);
}

// Recipe::pre_x: the activations of M <= 16 tokens as the kernel's lanes would make them, once per
// launch instead of once per 32-row tile: one thread per (token, group) splits the group's columns
// (q4_split<2>, k-step order, lane t's 4 columns per step), sums them per lane t in the same
// order, then forms (v0 + v1) + (v2 + v3), the xor tree's result on every lane. Tokens M..15 get
// zero sums (their pieces are never read: the kernel's missing rows take zeros).
template <int G>
__global__ void q4_prepare_x_kernel(const float* __restrict__ x, int x_ld, int M, int cols, uint4* __restrict__ xq,
                                    float* __restrict__ xs) {
  pdl_wait();
  const int ng = cols / G, nsteps = cols / 16;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= 16 * ng) return;
  const int m = i % 16, gi = i / 16;
  if (m >= M) {
    xs[gi * 16 + m] = 0.0f;
    return;
  }
  float v[4];
#pragma unroll
  for (int t = 0; t < 4; t++) {
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < G / 16; k++) {
      const int step = gi * (G / 16) + k, c = 16 * step + 4 * t;
      const float4 xf = *reinterpret_cast<const float4*>(x + static_cast<size_t>(m) * x_ld + c);
      uint32_t b0[2], b1[2];
      q4_split<2>(xf.x, xf.y, b0);
      q4_split<2>(xf.z, xf.w, b1);
      xq[(static_cast<size_t>(m) * nsteps + step) * 4 + t] = make_uint4(b0[0], b1[0], b0[1], b1[1]);
      s = __fadd_rn(s, __fadd_rn(__fadd_rn(xf.x, xf.y), __fadd_rn(xf.z, xf.w)));
    }
    v[t] = s;
  }
  xs[gi * 16 + m] = __fadd_rn(__fadd_rn(v[0], v[1]), __fadd_rn(v[2], v[3]));
}

// x pieces per activation: QFLASH_TC_Q4_PIECES=3 for an exact split (A/B runs), else 2.
inline int q4_pieces() {
  static const int n = [] {
    const char* e = std::getenv("QFLASH_TC_Q4_PIECES");
    return e && std::strcmp(e, "3") == 0 ? 3 : 2;
  }();
  return n;
}

template <int G, int NT, int NP, class R>
void q4_launch(const Q4Params& P, unsigned grid, cudaStream_t st) {
  const size_t smem = P.ks > 1 ? static_cast<size_t>(kQ4Warps) * 2 * NT * 4 * 32 * sizeof(float) : 0;
  launch_k(gemv_tc_q4_kernel<G, NT, NP, R>, dim3(grid), dim3(kQ4Warps * 32), smem, st, P);
}

// nt 4 (32 tokens a pass) only with np 1: activations that are bf16 already (the prefill GEMM).
// pre_x recipes exist for two pieces only (the lab asks for nothing else).
template <int G, class R>
void q4_dispatch(const Q4Params& P, unsigned grid, int nt, int np, cudaStream_t st) {
  if constexpr (R::pre_x) {
    if (nt == 4 || np != 2) backend_fail("cuda matmul (int4 tc): pre_x recipe with %d pieces, %d token tiles", np, nt);
    nt == 1 ? q4_launch<G, 1, 2, R>(P, grid, st) : q4_launch<G, 2, 2, R>(P, grid, st);
  } else {
    if (nt == 4)
      q4_launch<G, 4, 1, R>(P, grid, st);
    else if (nt == 1)
      np == 3 ? q4_launch<G, 1, 3, R>(P, grid, st) : q4_launch<G, 1, 2, R>(P, grid, st);
    else
      np == 3 ? q4_launch<G, 2, 3, R>(P, grid, st) : q4_launch<G, 2, 2, R>(P, grid, st);
  }
}

inline int64_t q4_unit_cols(int group) { return group > 64 ? group : 64; }
inline int64_t q4_unit_bytes(int group) { return group == 32 ? 1280 : group == 64 ? 1152 : 2176; }

// x_bf16: every activation is a bf16 value already (Backend::gemm rounds them), so one piece is
// exact and a pass takes 32 tokens. The results are the bits of the 2- or 3-piece kernels on the
// same x: their extra pieces are exact zeros, whose MMAs add +0 to a fresh +0 accumulator before
// the first piece's, and every other operation is the same; so a token's result still does not
// depend on M, whatever pass width it lands in.
// What the kernel lab changes in a run (production passes the defaults).
struct Q4RunOpts {
  int ks = 0;            // column slices; 0: tc_column_slices from the shape
  int np = 0;            // activation pieces at M <= 16; 0: q4_pieces()
  uint4* xq = nullptr;   // pre_x recipes: scratch of 16 * cols / 16 * 4 uint4
  float* xs = nullptr;   //                and of cols / group * 16 floats
};

template <class R = Q4Recipe>
void q4_run(const WeightRef* const* Ws, float* const* ys, int n, const float* x, int x_ld, int M, cudaStream_t st,
            bool x_bf16, const Q4RunOpts& opt = {}) {
  if (n < 1 || n > kQ4MaxSeg) backend_fail("cuda matmul (int4 tc): %d weights in one group (1..%d)", n, kQ4MaxSeg);
  if (M <= 0) return;
  const int group = Ws[0]->group;
  int64_t tiles = 0;
  for (int i = 0; i < n; i++) {
    const WeightRef& W = *Ws[i];
    if (W.layout != WeightRef::kTcQ4 || W.cols != Ws[0]->cols || W.group != group || !W.data)
      backend_fail("cuda matmul (int4 tc): weight %d of %d is not in the int4 tile layout with the group's cols and "
                   "group (%lld x %lld, group %d, layout %d)", i, n, (long long)W.rows, (long long)W.cols, W.group,
                   static_cast<int>(W.layout));
    tiles += (W.rows + 31) / 32;
  }
  if ((reinterpret_cast<uintptr_t>(x) & 15) != 0 || x_ld % 4 != 0 || x_ld < Ws[0]->cols)
    backend_fail("cuda matmul (int4 tc): activations must be 16-byte aligned with a row stride multiple of 4 >= cols");
  Q4Params P{};
  tc_fill_segments<uint8_t>(P, Ws, n, x_ld, tiles);
  P.nunits = static_cast<int>(P.cols / q4_unit_cols(group));
  P.ks = opt.ks > 0 ? opt.ks : tc_column_slices(tiles, P.nunits, kQ4Warps);
  if (P.ks != 1 && P.ks != 2 && P.ks != 4 && P.ks != 8)
    backend_fail("cuda matmul (int4 tc): column slices %d not in {1,2,4,8}", P.ks);
  P.cps = (P.nunits + P.ks - 1) / P.ks;
  P.tiles_per_block = kQ4Warps / P.ks;
  const unsigned grid = static_cast<unsigned>((tiles + P.tiles_per_block - 1) / P.tiles_per_block);
  const int pass = x_bf16 ? 32 : 16;
  for (int g0 = 0; g0 < M; g0 += pass) {
    const int mg = M - g0 < pass ? M - g0 : pass;
    const int np = mg > 16 ? 1 : opt.np > 0 ? opt.np : q4_pieces();
    P.M = mg;
    P.x = x + static_cast<size_t>(g0) * x_ld;
    for (int i = 0; i < n; i++) P.y[i] = ys[i] + static_cast<size_t>(g0) * Ws[i]->rows;
    if (prof_on()) {
      std::string r;
      for (int i = 0; i < n; i++) r += fmt_str(i ? "+%lld" : "%lld", (long long)Ws[i]->rows);
      prof_tag("%s x %d, M=%d, int4 g%d, ks %d, %d pieces", r.c_str(), P.cols, mg, group, P.ks, np);
    }
    const int nt = mg <= 8 ? 1 : mg <= 16 ? 2 : 4;
    if constexpr (R::pre_x) {
      if (!opt.xq || !opt.xs || mg > 16) backend_fail("cuda matmul (int4 tc): pre_x recipe without its scratch or M > 16");
      P.xq = opt.xq;
      P.xs = opt.xs;
      P.nsteps = P.cols / 16;
      const int threads = 16 * (P.cols / group), blocks = (threads + 127) / 128;
      switch (group) {
        case 32: launch_k(q4_prepare_x_kernel<32>, dim3(blocks), dim3(128), 0, st, P.x, x_ld, mg, P.cols, opt.xq, opt.xs); break;
        case 64: launch_k(q4_prepare_x_kernel<64>, dim3(blocks), dim3(128), 0, st, P.x, x_ld, mg, P.cols, opt.xq, opt.xs); break;
        default: launch_k(q4_prepare_x_kernel<128>, dim3(blocks), dim3(128), 0, st, P.x, x_ld, mg, P.cols, opt.xq, opt.xs); break;
      }
      QF_CUDA_LAUNCH_CHECK("q4_prepare_x_kernel");
    }
    switch (group) {
      case 32: q4_dispatch<32, R>(P, grid, nt, np, st); break;
      case 64: q4_dispatch<64, R>(P, grid, nt, np, st); break;
      default: q4_dispatch<128, R>(P, grid, nt, np, st); break;
    }
    QF_CUDA_LAUNCH_CHECK("gemv_tc_q4_kernel");
  }
}

}  // namespace

}  // namespace qf::cuda
