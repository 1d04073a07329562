// Causal flash attention for many query rows (Backend::attention_prefill) on the tensor cores.
//
// Tiling. A block owns one kv group's K/V and HB of its q heads (HB = the largest divisor of the
// group size <= 8) for BQ consecutive query rows (BQ = 16 * max(1, 8 / HB): 27B, 6 heads per kv
// head: 6 warps x 16 rows). Warp w holds 16 rows of one head: query position m0 + 16 (w % (BQ/16))
// + r. Each K/V tile (KT = 32 key rows of the buffer at head_dim 256, else 64; tile t = rows
// [KT t, KT t + KT)) is loaded once into shared memory (cp.async, 16-byte chunks, swizzled) for all the block's heads
// and rows: GQA shares the loads 6 ways. K and V have one buffer each; V(t) loads while S = Q K(t)^T
// runs, K(t+1) while O += P V(t) runs (two phases per tile, as FlashAttention-2).
//
// Arithmetic. mma.sync m16n8k16 bf16 x bf16 -> fp32. K and V are bf16 in the cache (exact
// operands). The fp32 queries and the fp32 probabilities are each split into two bf16 pieces,
// x = hi + lo with hi = bf16(x), lo = bf16(x - hi) (|x - hi - lo| <= 2^-18 |x|), and both pieces
// go through the tensor cores: a product is as good as fp32 at twice the mma count. The kernel is
// bound by shared-memory reads of the K/V fragments (every warp reads each tile once), so the second
// piece adds the cheap half. Online softmax in fp32, in the log2 domain (exp2f).
//
// Row-invariance (the backend.h contract: a row's bits never depend on M or on the other rows).
// A row r visible key range [lo, hi) follows from its own position. Its computation is: for every
// tile t that meets [lo, hi), in increasing t from key row 0 (tile boundaries are absolute buffer
// rows, not relative to the call), scores of its own query against the tile (an mma output element
// depends only on its row of A), max/exp2/sum over the tile in a fixed order, and
// acc = fmaf(acc, alpha, P V) with P V computed from zero per tile. Tiles the block walks for its
// other rows but that miss [lo, hi) leave the row's state untouched (explicit per-row skip, not
// an update with zero weights), so the same row in a call that starts elsewhere or has another M
// walks the same tiles with the same operands and produces the same bits.
//
// attn_prefill_v3_kernel (below): the same operations per element in the same order (so the same
// bits; CudaAttentionPrefill.V3MatchesV1BitForBit), two key tiles per double-buffered stage for twice
// the independent mma chains per warp and half the Q fragment reads; 18-20% less kernel time on the
// 27B shape (docs/experiments/prefill_kernels.md). v1 runs where v3's shared memory does not fit,
// and under QFLASH_ATTN_PREFILL=v1.
//
// attn_prefill_v4_kernel (below), where it applies (sm_90a, head_dim 256, an even q-head group):
// warpgroup MMA (wgmma), v1's pieces and softmax step, its own bits; 0.52x of v3's kernel time on
// the 27B layer at 32k rows (H100). v3 elsewhere and under QFLASH_ATTN_PREFILL=v3. The default from
// run 39 to run 66; QFLASH_ATTN_PREFILL=v4 now.
// v4b: the same kernel with q and p carried as one bf16 piece each (no lo pieces: half the wgmma
// work), as FlashAttention-style kernels do; its error grows from ~2^-17 to ~2^-8 relative (bf16
// rounding of q and p, the same size as the bf16 K/V cache's own rounding). 0.70x of v4's time.
// v5b, the default since run 66 where v4 applies: v4b's operations and bits with P V(t) and
// S(t + 1) in flight together, 0.97-0.98x of v4b's time (H100; docs/experiments/prefill_kernels.md).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/device_common.cuh"
#include "backend/cuda/kernels.h"

#ifndef QFLASH_CUDA_ARCHS_STR
#define QFLASH_CUDA_ARCHS_STR "90a"
#endif

namespace qf::cuda {

namespace {

constexpr int kMaxWarps = 8;
// Keys per tile: 64, or 32 at head_dim 256, where 64 would need more than 255 registers per
// thread (the 128 output accumulators plus a 16 x 64 score tile and its two bf16 pieces).
template <int HD>
constexpr int key_tile() {
  return HD == 256 ? 32 : 64;
}

struct PrefillGeom {
  int M, n_heads, group, kvw;
  int hb, bq, n_qtiles;  // heads per block, query rows per block, query tiles
  float scale_log2;      // scale * log2(e): scores go straight into exp2
  int causal, window;
};

// Shared-memory tiles are [rows][HD] bf16 with the 16-byte chunk c of row r stored at chunk
// c ^ (r & 7): the 8 rows an ldmatrix reads hit 8 different bank groups.
template <int HD>
__device__ __forceinline__ int swz(int r, int c) {
  return r * (HD / 8) + (c ^ (r & 7));
}

// What a warp of either kernel works on: its block's query rows and v1 key-tile range, its head,
// kv group and 16 query rows, and this thread's two fragment rows (lane/4 and lane/4 + 8) with
// their visible key ranges ([lo, hi); empty for rows past the call: never active, never written).
struct PrefillWarp {
  int m0, h, g, mw, t_begin, t_end, ra, rb, lo_a, hi_a, lo_b, hi_b;
};
template <int KT>
__device__ __forceinline__ PrefillWarp prefill_warp(const PrefillGeom& G, const StepMeta* meta, int warp, int lane) {
  PrefillWarp w;
  const int qt = G.n_qtiles - 1 - static_cast<int>(blockIdx.x);  // longest causal rows first
  w.m0 = qt * G.bq;
  const int pw = G.bq / 16;
  w.h = blockIdx.y * G.hb + warp / pw;
  w.g = w.h / G.group;
  w.mw = w.m0 + 16 * (warp % pw);  // the warp's first query row
  // Block key range: lo and hi grow with the position, so the first and the last valid row bound it.
  const int m_last = min(w.m0 + G.bq, G.M) - 1;
  int blo, bhi, tmp_lo, tmp_hi;
  attn_visible_range<true>(meta, w.m0, G.causal, G.window, &blo, &tmp_hi);
  attn_visible_range<true>(meta, m_last, G.causal, G.window, &tmp_lo, &bhi);
  w.t_begin = blo / KT;
  w.t_end = bhi > blo ? (bhi + KT - 1) / KT : w.t_begin;
  w.ra = w.mw + (lane >> 2);
  w.rb = w.ra + 8;
  attn_visible_range<true>(meta, w.ra, G.causal, G.window, &w.lo_a, &w.hi_a);
  attn_visible_range<true>(meta, w.rb, G.causal, G.window, &w.lo_b, &w.hi_b);
  if (w.ra >= G.M) w.hi_a = w.lo_a;
  if (w.rb >= G.M) w.hi_b = w.lo_b;
  return w;
}

// Query row m of head h, 16-byte column chunk c (8 values) -> its hi/lo bf16 pieces (zeros for
// rows past the call): the staging of v1/v3 and of v4, which differ only in where they store them.
template <int HD>
__device__ __forceinline__ void q_pieces(const float* __restrict__ q, const PrefillGeom& G, int m, int h, int c,
                                         uint4& hi, uint4& lo) {
  float x[8];
  if (m < G.M) {
    const float4* src = reinterpret_cast<const float4*>(q + (static_cast<size_t>(m) * G.n_heads + h) * HD + c * 8);
    const float4 u = src[0], v = src[1];
    x[0] = u.x, x[1] = u.y, x[2] = u.z, x[3] = u.w, x[4] = v.x, x[5] = v.y, x[6] = v.z, x[7] = v.w;
  } else {
#pragma unroll
    for (int e = 0; e < 8; e++) x[e] = 0.0f;
  }
  split_bf16x2(x[0], x[1], hi.x, lo.x);
  split_bf16x2(x[2], x[3], hi.y, lo.y);
  split_bf16x2(x[4], x[5], hi.z, lo.z);
  split_bf16x2(x[6], x[7], hi.w, lo.w);
}

// The warp's 16 query rows of head h -> hi/lo bf16 pieces in shared memory (sQ: hi [16][HD], then
// lo [16][HD], swizzled; zeros for rows past the call).
template <int HD>
__device__ __forceinline__ void prefill_stage_q(const float* __restrict__ q, uint4* sQ, const PrefillGeom& G, int mw,
                                                int h, int lane) {
  constexpr int CH = HD / 8;
  for (int i = lane; i < 16 * CH; i += 32) {
    const int r = i / CH, c = i % CH;
    const int m = mw + r;
    uint4 hi, lo;
    q_pieces<HD>(q, G, m, h, c, hi, lo);
    sQ[swz<HD>(r, c)] = hi;
    sQ[16 * CH + swz<HD>(r, c)] = lo;
  }
  __syncwarp();
}

// Row sums over the 4 lanes of a row (the same two-level tree in each lane), then O / sum for the
// thread's two rows (zeros where a row sees no key, as the CPU twin).
template <int HD>
__device__ __forceinline__ void prefill_store_out(float* __restrict__ out, const float (&acc)[HD / 8][4], float sum_a,
                                                  float sum_b, const PrefillWarp& w, const PrefillGeom& G, int lane) {
  sum_a = __fadd_rn(sum_a, __shfl_xor_sync(kFull, sum_a, 1));
  sum_a = __fadd_rn(sum_a, __shfl_xor_sync(kFull, sum_a, 2));
  sum_b = __fadd_rn(sum_b, __shfl_xor_sync(kFull, sum_b, 1));
  sum_b = __fadd_rn(sum_b, __shfl_xor_sync(kFull, sum_b, 2));
  const int col = 2 * (lane & 3);
  if (w.ra < G.M) {
    float* o = out + (static_cast<size_t>(w.ra) * G.n_heads + w.h) * HD + col;
    const bool any = w.hi_a > w.lo_a;
#pragma unroll
    for (int n = 0; n < HD / 8; n++)
      *reinterpret_cast<float2*>(o + n * 8) =
          any ? make_float2(__fdiv_rn(acc[n][0], sum_a), __fdiv_rn(acc[n][1], sum_a)) : make_float2(0.0f, 0.0f);
  }
  if (w.rb < G.M) {
    float* o = out + (static_cast<size_t>(w.rb) * G.n_heads + w.h) * HD + col;
    const bool any = w.hi_b > w.lo_b;
#pragma unroll
    for (int n = 0; n < HD / 8; n++)
      *reinterpret_cast<float2*>(o + n * 8) =
          any ? make_float2(__fdiv_rn(acc[n][2], sum_b), __fdiv_rn(acc[n][3], sum_b)) : make_float2(0.0f, 0.0f);
  }
}

// The per-tile online softmax step of both kernels on a tile's scores s (16 rows x KT keys of a
// warp, mma layout), only where the tile meets a row's key range (act): scale, mask (only where the
// tile is not wholly visible to both rows: the diagonal, the window edge), tile max, new max, alpha
// (0 on a row's first tile), P as hi/lo bf16 A fragments of P V (k-step = 16 keys), row sums.
template <int NT>
struct TileSoftmax {
  uint32_t ph[NT / 2][4], pl[NT / 2][4];
  float alpha_a, alpha_b;
  bool act_a, act_b;
};

template <int NT>
__device__ __forceinline__ void softmax_tile(float (&s)[NT][4], int kt0, int lane, float scale_log2, int lo_a,
                                                int hi_a, int lo_b, int hi_b, float& max_a, float& max_b,
                                                float& sum_a, float& sum_b, TileSoftmax<NT>& T) {
  constexpr int KT = NT * 8;
  T.act_a = kt0 < hi_a && kt0 + KT > lo_a;
  T.act_b = kt0 < hi_b && kt0 + KT > lo_b;
  const bool act_a = T.act_a, act_b = T.act_b;
#pragma unroll
  for (int n = 0; n < NT; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) s[n][e] = __fmul_rn(s[n][e], scale_log2);
  if (!(kt0 >= lo_a && kt0 + KT <= hi_a && kt0 >= lo_b && kt0 + KT <= hi_b)) {
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int j = kt0 + n * 8 + 2 * (lane & 3) + (e & 1);
        const bool vis = e < 2 ? (j >= lo_a && j < hi_a) : (j >= lo_b && j < hi_b);
        if (!vis) s[n][e] = -INFINITY;
      }
  }
  float tmax_a = -INFINITY, tmax_b = -INFINITY;
#pragma unroll
  for (int n = 0; n < NT; n++) {
    tmax_a = fmaxf(tmax_a, fmaxf(s[n][0], s[n][1]));
    tmax_b = fmaxf(tmax_b, fmaxf(s[n][2], s[n][3]));
  }
  tmax_a = fmaxf(tmax_a, __shfl_xor_sync(kFull, tmax_a, 1));
  tmax_a = fmaxf(tmax_a, __shfl_xor_sync(kFull, tmax_a, 2));
  tmax_b = fmaxf(tmax_b, __shfl_xor_sync(kFull, tmax_b, 1));
  tmax_b = fmaxf(tmax_b, __shfl_xor_sync(kFull, tmax_b, 2));
  const float nmax_a = fmaxf(max_a, tmax_a), nmax_b = fmaxf(max_b, tmax_b);
  T.alpha_a = act_a ? exp2f(__fsub_rn(max_a, nmax_a)) : 1.0f;
  T.alpha_b = act_b ? exp2f(__fsub_rn(max_b, nmax_b)) : 1.0f;
  float psum_a = 0.0f, psum_b = 0.0f;
#pragma unroll
  for (int n = 0; n < NT; n++) {
    const float p0 = act_a ? exp2f(__fsub_rn(s[n][0], nmax_a)) : 0.0f;
    const float p1 = act_a ? exp2f(__fsub_rn(s[n][1], nmax_a)) : 0.0f;
    const float p2 = act_b ? exp2f(__fsub_rn(s[n][2], nmax_b)) : 0.0f;
    const float p3 = act_b ? exp2f(__fsub_rn(s[n][3], nmax_b)) : 0.0f;
    psum_a = __fadd_rn(__fadd_rn(psum_a, p0), p1);
    psum_b = __fadd_rn(__fadd_rn(psum_b, p2), p3);
    split_bf16x2(p0, p1, T.ph[n / 2][(n & 1) * 2], T.pl[n / 2][(n & 1) * 2]);
    split_bf16x2(p2, p3, T.ph[n / 2][(n & 1) * 2 + 1], T.pl[n / 2][(n & 1) * 2 + 1]);
  }
  if (act_a) {
    sum_a = __fadd_rn(__fmul_rn(sum_a, T.alpha_a), psum_a);
    max_a = nmax_a;
  }
  if (act_b) {
    sum_b = __fadd_rn(__fmul_rn(sum_b, T.alpha_b), psum_b);
    max_b = nmax_b;
  }
}

template <int HD>
__global__ void __launch_bounds__(kMaxWarps * 32, 1)
    attn_prefill_kernel(const float* __restrict__ q, const uint16_t* __restrict__ K, const uint16_t* __restrict__ V,
                        float* __restrict__ out, const PrefillGeom G, const StepMeta* meta) {
  constexpr int CH = HD / 8;   // 16-byte chunks per row
  constexpr int KS = HD / 16;  // k-steps of Q K^T
  constexpr int KT = key_tile<HD>();
  constexpr int NT = KT / 8;
  pdl_trigger();
  pdl_wait();
  extern __shared__ __align__(128) uint4 smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  uint4* sK = smem;                             // [KT][HD]
  uint4* sV = sK + KT * CH;                     // [KT][HD]
  uint4* sQ = sV + KT * CH + warp * 2 * 16 * CH;  // this warp: hi [16][HD], then lo [16][HD]

  const PrefillWarp w = prefill_warp<KT>(G, meta, warp, lane);
  const int h = w.h, g = w.g, mw = w.mw, t_begin = w.t_begin, t_end = w.t_end;
  const int lo_a = w.lo_a, hi_a = w.hi_a, lo_b = w.lo_b, hi_b = w.hi_b;

  const size_t kv_off = static_cast<size_t>(g) * HD;
  auto load_tile = [&](uint4* dst, const uint16_t* src, int t) {
    const uint32_t base = smem_u32(dst);
    for (int i = threadIdx.x; i < KT * CH; i += blockDim.x) {
      const int r = i / CH, c = i % CH;
      const int j = t * KT + r;
      const bool ok = j < meta->n_kv;
      const uint16_t* p = src + (ok ? static_cast<size_t>(j) * G.kvw + kv_off + c * 8 : 0);
      cp_async16(base + swz<HD>(r, c) * 16, p, ok ? 16 : 0);
    }
  };
  if (t_end > t_begin) {
    load_tile(sK, K, t_begin);
    cp_async_commit();
  }

  // Queries -> hi/lo bf16 in shared memory (zeros for rows past the call).
  prefill_stage_q<HD>(q, sQ, G, mw, h, lane);

  float acc[HD / 8][4];
#pragma unroll
  for (int n = 0; n < HD / 8; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
  float max_a = -INFINITY, max_b = -INFINITY, sum_a = 0.0f, sum_b = 0.0f;  // sums: this thread's columns

  // ldmatrix row addresses: lane l reads row r8 = l % 8 of the 8x8 matrix l / 8. Chunk c of a
  // row lies at c ^ r8, and c = h + 2j + 8i (h < 2, j < 4) gives (h ^ r8) ^ 2j + 8i: one lane
  // address per operand, XORed with 32 j bytes and offset by immediates (rows are multiples of
  // 128 bytes), instead of one hoisted register per (row block, chunk) pair.
  const int r8 = lane & 7, mi = lane >> 3;
  constexpr int RB = CH * 16;  // bytes per smem row
  const uint32_t q_lane = smem_u32(sQ) + ((mi & 1) * 8 + r8) * RB + (((mi >> 1) ^ r8) << 4);
  const uint32_t k_lane = smem_u32(sK) + ((mi >> 1) * 8 + r8) * RB + (((mi & 1) ^ r8) << 4);
  const uint32_t v_lane = smem_u32(sV) + ((mi & 1) * 8 + r8) * RB + (((mi >> 1) ^ r8) << 4);

  for (int t = t_begin; t < t_end; t++) {
    load_tile(sV, V, t);
    cp_async_commit();
    cp_async_wait<1>();  // K(t)
    __syncthreads();

    // S = Q K^T for the warp's 16 rows x KT keys (hi and lo pieces of Q into the same accumulator).
    float s[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll 4
    for (int ks = 0; ks < KS; ks++) {
      uint32_t ah[4], al[4];
      const uint32_t qa = (q_lane ^ ((ks & 3) << 5)) + (ks >> 2) * 128;
      ldsm_x4(qa, ah);
      ldsm_x4(qa + 16 * RB, al);
      const uint32_t ka = (k_lane ^ ((ks & 3) << 5)) + (ks >> 2) * 128;
#pragma unroll
      for (int np = 0; np < NT / 2; np++) {
        uint32_t b[4];
        ldsm_x4(ka + np * 16 * RB, b);
        mma_bf16_16816(s[2 * np], ah, b[0], b[1]);
        mma_bf16_16816(s[2 * np], al, b[0], b[1]);
        mma_bf16_16816(s[2 * np + 1], ah, b[2], b[3]);
        mma_bf16_16816(s[2 * np + 1], al, b[2], b[3]);
      }
    }

    // Online softmax, per row, only where this tile meets the row's key range.
    TileSoftmax<NT> T;
    softmax_tile<NT>(s, t * KT, lane, G.scale_log2, lo_a, hi_a, lo_b, hi_b, max_a, max_b, sum_a, sum_b, T);

    cp_async_wait<0>();  // V(t)
    __syncthreads();     // and every warp is done with K(t)
    if (t + 1 < t_end) {
      load_tile(sK, K, t + 1);
      cp_async_commit();
    }

    // O = alpha O + P V(t), P V from zero per 16 output columns (hi and lo pieces of P).
#pragma unroll
    for (int np = 0; np < HD / 16; np++) {
      float o[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
      const uint32_t va = (v_lane ^ ((np & 3) << 5)) + (np >> 2) * 128;
#pragma unroll
      for (int kk = 0; kk < NT / 2; kk++) {
        uint32_t b[4];
        ldsm_x4_t(va + kk * 16 * RB, b);
        mma_bf16_16816(o[0], T.ph[kk], b[0], b[1]);
        mma_bf16_16816(o[0], T.pl[kk], b[0], b[1]);
        mma_bf16_16816(o[1], T.ph[kk], b[2], b[3]);
        mma_bf16_16816(o[1], T.pl[kk], b[2], b[3]);
      }
#pragma unroll
      for (int x = 0; x < 2; x++) {
        float* a = acc[2 * np + x];
        if (T.act_a) {
          a[0] = fmaf(a[0], T.alpha_a, o[x][0]);
          a[1] = fmaf(a[1], T.alpha_a, o[x][1]);
        }
        if (T.act_b) {
          a[2] = fmaf(a[2], T.alpha_b, o[x][2]);
          a[3] = fmaf(a[3], T.alpha_b, o[x][3]);
        }
      }
    }
    __syncthreads();  // every warp is done with V(t) before V(t+1) lands
  }

  prefill_store_out<HD>(out, acc, sum_a, sum_b, w, G, lane);
}

// ---- v3 (QFLASH_ATTN_PREFILL=v3): v1's arithmetic, two key tiles per stage ----------------------
//
// The same operations on every output element as v1, in the same order (so the same bits and the
// same row-invariance argument), scheduled for more independent work per warp. A stage is two of
// v1's key tiles (tiles 2u and 2u + 1, absolute): K and V of a stage are double-buffered in shared
// memory (cp.async, the next stage loads while this one computes: one barrier per stage instead of
// two per tile). Per stage a warp
//  - computes the scores of both tiles in one pass over head_dim: each Q fragment (hi and lo) is
//    read once for both tiles, and 2 NT accumulator chains are in flight instead of NT; every score
//    element is v1's chain (k-steps in order, Q's hi then lo piece into one accumulator);
//  - runs v1's softmax step for tile 2u, then for tile 2u + 1 (the row state max/sum is updated
//    tile by tile as in v1; the second tile's probabilities use the max after the first);
//  - accumulates P V of both tiles per 16 output columns: each tile's P V from zero in v1's order,
//    then acc = fmaf(acc, alpha_2u, o_2u), then acc = fmaf(acc, alpha_2u+1, o_2u+1): v1's two updates.
// A tile of the stage that misses a row's key range leaves that row untouched (v1's act flags), so
// a stage that reaches past the block's range (the first or last one) changes nothing.

// Both tiles of a stage for 16 output columns (the two n8 halves a0, a1 of the accumulator): each
// tile's P V from zero in v1's order (k-steps in order, P's hi then lo piece), the two products side
// by side (independent mma chains), then v1's update acc = fmaf(acc, alpha, o) for the rows the
// tile meets, tile 2u first. va0, va1: the ldmatrix lane addresses of the two tiles' first key rows.
template <int NT>
__device__ __forceinline__ void pv_stage(float (&a0)[4], float (&a1)[4], const TileSoftmax<NT>& T0,
                                         const TileSoftmax<NT>& T1, uint32_t va0, uint32_t va1, int RB) {
  float o[2][2][4];
#pragma unroll
  for (int t = 0; t < 2; t++)
#pragma unroll
    for (int x = 0; x < 2; x++) o[t][x][0] = o[t][x][1] = o[t][x][2] = o[t][x][3] = 0.0f;
  uint32_t c0[NT / 2][4], c1[NT / 2][4];
#pragma unroll
  for (int kk = 0; kk < NT / 2; kk++) {
    ldsm_x4_t(va0 + kk * 16 * RB, c0[kk]);
    ldsm_x4_t(va1 + kk * 16 * RB, c1[kk]);
  }
#pragma unroll
  for (int kk = 0; kk < NT / 2; kk++) {
    mma_bf16_16816(o[0][0], T0.ph[kk], c0[kk][0], c0[kk][1]);
    mma_bf16_16816(o[0][1], T0.ph[kk], c0[kk][2], c0[kk][3]);
    mma_bf16_16816(o[1][0], T1.ph[kk], c1[kk][0], c1[kk][1]);
    mma_bf16_16816(o[1][1], T1.ph[kk], c1[kk][2], c1[kk][3]);
    mma_bf16_16816(o[0][0], T0.pl[kk], c0[kk][0], c0[kk][1]);
    mma_bf16_16816(o[0][1], T0.pl[kk], c0[kk][2], c0[kk][3]);
    mma_bf16_16816(o[1][0], T1.pl[kk], c1[kk][0], c1[kk][1]);
    mma_bf16_16816(o[1][1], T1.pl[kk], c1[kk][2], c1[kk][3]);
  }
#pragma unroll
  for (int t = 0; t < 2; t++) {
    const TileSoftmax<NT>& T = t == 0 ? T0 : T1;
    if (T.act_a) {
      a0[0] = fmaf(a0[0], T.alpha_a, o[t][0][0]);
      a0[1] = fmaf(a0[1], T.alpha_a, o[t][0][1]);
      a1[0] = fmaf(a1[0], T.alpha_a, o[t][1][0]);
      a1[1] = fmaf(a1[1], T.alpha_a, o[t][1][1]);
    }
    if (T.act_b) {
      a0[2] = fmaf(a0[2], T.alpha_b, o[t][0][2]);
      a0[3] = fmaf(a0[3], T.alpha_b, o[t][0][3]);
      a1[2] = fmaf(a1[2], T.alpha_b, o[t][1][2]);
      a1[3] = fmaf(a1[3], T.alpha_b, o[t][1][3]);
    }
  }
}

template <int HD>
__global__ void __launch_bounds__(kMaxWarps * 32, 1)
    attn_prefill_v3_kernel(const float* __restrict__ q, const uint16_t* __restrict__ K,
                           const uint16_t* __restrict__ V, float* __restrict__ out, const PrefillGeom G,
                           const StepMeta* meta) {
  constexpr int CH = HD / 8;
  constexpr int KS = HD / 16;
  constexpr int KT = key_tile<HD>();  // v1's tile
  constexpr int ST = 2 * KT;          // keys per stage
  constexpr int NT = KT / 8;
  constexpr int RB = CH * 16;  // bytes per smem row
  pdl_trigger();
  pdl_wait();
  extern __shared__ __align__(128) uint4 smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  uint4* sK = smem;                                  // [2][ST][HD]
  uint4* sV = sK + 2 * ST * CH;                      // [2][ST][HD]
  uint4* sQ = sV + 2 * ST * CH + warp * 2 * 16 * CH;  // this warp: hi [16][HD], then lo [16][HD]

  const PrefillWarp w = prefill_warp<KT>(G, meta, warp, lane);
  const int h = w.h, g = w.g, mw = w.mw, t_begin = w.t_begin, t_end = w.t_end;
  const int lo_a = w.lo_a, hi_a = w.hi_a, lo_b = w.lo_b, hi_b = w.hi_b;
  // v1's tile range [t_begin, t_end), walked as stages u = t / 2
  const int u_begin = t_begin / 2, u_end = t_end > t_begin ? (t_end + 1) / 2 : u_begin;

  // Stage loads: thread t copies 16-byte chunk t % CH of rows t / CH + k (blockDim / CH) (blockDim
  // is a multiple of 32 and CH divides 32): the chunks v1's loop copies, with the per-thread
  // column fixed, so a chunk costs a few instructions instead of a division and a remainder.
  const int n_kv = meta->n_kv;
  const int lc = threadIdx.x % CH, lr0 = threadIdx.x / CH, lrs = blockDim.x / CH;
  const uint16_t* kcol = K + static_cast<size_t>(g) * HD + lc * 8;
  const uint16_t* vcol = V + static_cast<size_t>(g) * HD + lc * 8;
  auto load_stage = [&](int buf, int u) {
    const uint32_t kbase = smem_u32(sK + buf * ST * CH), vbase = smem_u32(sV + buf * ST * CH);
    for (int r = lr0; r < ST; r += lrs) {
      const int j = u * ST + r;
      const bool ok = j < n_kv;
      const size_t off = ok ? static_cast<size_t>(j) * G.kvw : 0;
      const uint32_t so = swz<HD>(r, lc) * 16;
      cp_async16(kbase + so, kcol + off, ok ? 16 : 0);
      cp_async16(vbase + so, vcol + off, ok ? 16 : 0);
    }
  };
  if (u_end > u_begin) {
    load_stage(0, u_begin);
    cp_async_commit();
  }

  prefill_stage_q<HD>(q, sQ, G, mw, h, lane);

  float acc[HD / 8][4];
#pragma unroll
  for (int n = 0; n < HD / 8; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
  float max_a = -INFINITY, max_b = -INFINITY, sum_a = 0.0f, sum_b = 0.0f;

  const int r8 = lane & 7, mi = lane >> 3;
  const uint32_t q_lane = smem_u32(sQ) + ((mi & 1) * 8 + r8) * RB + (((mi >> 1) ^ r8) << 4);
  const uint32_t k_lane0 = smem_u32(sK) + ((mi >> 1) * 8 + r8) * RB + (((mi & 1) ^ r8) << 4);
  const uint32_t v_lane0 = smem_u32(sV) + ((mi & 1) * 8 + r8) * RB + (((mi >> 1) ^ r8) << 4);

  for (int u = u_begin; u < u_end; u++) {
    const int buf = (u - u_begin) & 1;
    cp_async_wait<0>();  // stage u (this thread's copies)
    __syncthreads();     // everyone's copies; every warp is done with stage u - 1 (the other buffer)
    if (u + 1 < u_end) {
      load_stage(buf ^ 1, u + 1);
      cp_async_commit();
    }
    // buffer offsets are multiples of 128 bytes: the XOR swizzle of the lane address commutes
    const uint32_t k_lane = k_lane0 + buf * ST * RB, v_lane = v_lane0 + buf * ST * RB;

    // Scores of both tiles: s0 (tile 2u), s1 (tile 2u + 1), v1's chain per element.
    float s0[NT][4], s1[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) s0[n][e] = s1[n][e] = 0.0f;
#pragma unroll 4
    for (int ks = 0; ks < KS; ks++) {
      uint32_t ah[4], al[4];
      const uint32_t qa = (q_lane ^ ((ks & 3) << 5)) + (ks >> 2) * 128;
      ldsm_x4(qa, ah);
      ldsm_x4(qa + 16 * RB, al);
      const uint32_t ka = (k_lane ^ ((ks & 3) << 5)) + (ks >> 2) * 128;
      uint32_t b0[NT / 2][4], b1[NT / 2][4];
#pragma unroll
      for (int np = 0; np < NT / 2; np++) {
        ldsm_x4(ka + np * 16 * RB, b0[np]);
        ldsm_x4(ka + (KT + np * 16) * RB, b1[np]);
      }
#pragma unroll
      for (int np = 0; np < NT / 2; np++) {
        mma_bf16_16816(s0[2 * np], ah, b0[np][0], b0[np][1]);
        mma_bf16_16816(s0[2 * np + 1], ah, b0[np][2], b0[np][3]);
        mma_bf16_16816(s1[2 * np], ah, b1[np][0], b1[np][1]);
        mma_bf16_16816(s1[2 * np + 1], ah, b1[np][2], b1[np][3]);
      }
#pragma unroll
      for (int np = 0; np < NT / 2; np++) {
        mma_bf16_16816(s0[2 * np], al, b0[np][0], b0[np][1]);
        mma_bf16_16816(s0[2 * np + 1], al, b0[np][2], b0[np][3]);
        mma_bf16_16816(s1[2 * np], al, b1[np][0], b1[np][1]);
        mma_bf16_16816(s1[2 * np + 1], al, b1[np][2], b1[np][3]);
      }
    }

    TileSoftmax<NT> T0, T1;
    softmax_tile<NT>(s0, 2 * u * KT, lane, G.scale_log2, lo_a, hi_a, lo_b, hi_b, max_a, max_b, sum_a, sum_b, T0);
    softmax_tile<NT>(s1, (2 * u + 1) * KT, lane, G.scale_log2, lo_a, hi_a, lo_b, hi_b, max_a, max_b, sum_a, sum_b,
                        T1);

    // O = alpha1 (alpha0 O + P0 V0) + P1 V1 per 16 output columns, each P V from zero as in v1.
#pragma unroll
    for (int np = 0; np < HD / 16; np++) {
      const uint32_t va = (v_lane ^ ((np & 3) << 5)) + (np >> 2) * 128;
      pv_stage<NT>(acc[2 * np], acc[2 * np + 1], T0, T1, va, va + KT * RB, RB);
    }
  }

  prefill_store_out<HD>(out, acc, sum_a, sum_b, w, G, lane);
}

template <int HD>
void launch_prefill(const float* q, const uint16_t* K, const uint16_t* V, float* out, const PrefillGeom& G,
                    const StepMeta* meta, cudaStream_t st) {
  const int warps = G.hb * (G.bq / 16);
  const size_t smem = (2 * key_tile<HD>() + static_cast<size_t>(warps) * 32) * HD * sizeof(uint16_t);
  static size_t smem_set = 0;  // the opt-in above 48 KB, once per instantiation and size
  if (smem > smem_set) {
    QF_CUDA_CHECK(cudaFuncSetAttribute(attn_prefill_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem)));
    smem_set = smem;
  }
  launch_k(attn_prefill_kernel<HD>, dim3(G.n_qtiles, G.n_heads / G.hb), dim3(warps * 32), smem, st, q, K, V, out, G,
           meta);
  QF_CUDA_LAUNCH_CHECK("attn_prefill_kernel");
}

// v3's dynamic shared memory: two stages of K and V (2 x 2 v1 tiles each) and the Q pieces.
size_t prefill_v3_smem(int head_dim, int warps) {
  const int kt = head_dim == 256 ? key_tile<256>() : key_tile<128>();
  return (4 * 2 * static_cast<size_t>(kt) + static_cast<size_t>(warps) * 32) * head_dim * sizeof(uint16_t);
}
size_t smem_optin() {
  static const size_t v = [] {
    int dev = 0, optin = 0;
    QF_CUDA_CHECK(cudaGetDevice(&dev));
    QF_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    return static_cast<size_t>(optin);
  }();
  return v;
}

// v3's launch; the caller has checked that its shared memory fits (prefill_v3_smem <= smem_optin).
template <int HD>
void launch_prefill_v3(const float* q, const uint16_t* K, const uint16_t* V, float* out, const PrefillGeom& G,
                       const StepMeta* meta, cudaStream_t st) {
  const int warps = G.hb * (G.bq / 16);
  const size_t smem = prefill_v3_smem(HD, warps);
  static size_t smem_set = 0;
  if (smem > smem_set) {
    QF_CUDA_CHECK(cudaFuncSetAttribute(attn_prefill_v3_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem)));
    smem_set = smem;
  }
  launch_k(attn_prefill_v3_kernel<HD>, dim3(G.n_qtiles, G.n_heads / G.hb), dim3(warps * 32), smem, st, q, K, V, out,
           G, meta);
  QF_CUDA_LAUNCH_CHECK("attn_prefill_v3_kernel");
}

// ---- v4 (sm_90a, head_dim 256; v4b and v5b build on it): warpgroup MMA (wgmma) ------------------
//
// Why: v1/v3 issue one mma.sync m16n8k16 plus its ldmatrix fragment reads per 4 KFLOP; at the
// 27B shape their warps spend their issue slots on that stream (Nsight, run 27: ~1 instruction per
// cycle per SM, the tensor pipes far from busy). One wgmma m64nNk16 instruction does a warpgroup's
// 64 rows x N columns x 16 and reads its shared-memory operands itself.
//
// Tiling (head_dim 256, an even number of q heads per kv head): a block is 2 warpgroups, one q head
// each (heads 2 y and 2 y + 1 of one kv group), for the same 64 query rows; each K/V tile (64 keys)
// is loaded once for both. Warp w of a warpgroup holds rows 16 w .. 16 w + 15 (the wgmma accumulator
// layout, the same per warp as mma.sync's), so prefill_warp<64> with 2 heads and 64 rows a block
// gives each warp its geometry, and v1's softmax step and output code apply unchanged.
//
// Arithmetic: the same pieces as v1 (q and p as bf16 hi + lo, both through the tensor cores; K and
// V bf16 exact), fp32 accumulation, v1's online-softmax step per tile (softmax_tile). Unlike v1
// the output accumulates in the tensor core across tiles (o = alpha o, then o += P V by wgmma)
// instead of fmaf(o, alpha, P V from zero), so v4's bits are its own; its error bound is v1's
// (tc_attention_bound), checked against float64 (V4MatchesFloat64AndIsRowAndSplitInvariant).
//
// Row-invariance: a warpgroup's wgmma covers all 64 rows, so there is no per-row skip as in v1.
// A tile outside a row's key range gives the row alpha = 1 (o * 1: exact) and p = 0 (the tensor core
// adds products that are all zero: exact, up to the sign of an accumulator that is exactly zero), and
// v1's act flags keep its max and sum; so the extra tiles a block walks for its other rows, which
// depend on M and on where the call starts, leave the row's bits as they are. Tests: row and split
// invariance bit for bit with calls starting at rows 1, 5, 17, 63, 100.
//
// Shared memory (1024-byte aligned; 128-byte swizzle atoms of 8 rows x 128 bytes, the 16-byte chunk c
// of atom row r at c ^ r, atoms 1 KB apart), 225 KB: per warpgroup its Q hi and lo pieces [4 dim
// blocks of 64][64 rows][128 B] (2 x 32 KB), K [4][64 keys][128 B] (32 KB), V in the same layout,
// double-buffered (2 x 32 KB). Q and K are K-major operands of S = Q K^T; V is read by P V as an
// MN-major operand (transpose bit; descriptor leading offset 8 KB between 64-dim blocks, stride
// 1 KB between 8-key groups: the other assignment was measured to give wrong results, run 38).
// One tile: V(t) loads during S(t) (32 wgmma: 16 k-steps x 2 pieces), K(t + 1) during P V(t)
// (8 wgmma m64n256k16: 4 k-steps x 2 pieces, P from registers). Two barriers a tile.

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Shared-memory matrix descriptor (128-byte swizzle, mode 1 in bits 62-63): start address >> 4,
// leading byte offset >> 4 in bits 16-29, stride byte offset >> 4 in bits 32-45. K-major operands:
// leading unused (1), stride 1 KB between 8-row atoms.
__device__ __forceinline__ uint64_t wg_desc(uint32_t saddr, uint32_t lead = 16, uint32_t stride = 1024) {
  return static_cast<uint64_t>((saddr & 0x3FFFFu) >> 4) | (static_cast<uint64_t>(lead >> 4) << 16) |
         (static_cast<uint64_t>(stride >> 4) << 32) | (1ull << 62);
}
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
// Generic-proxy writes to shared memory (st.shared, cp.async) made visible to the async proxy that
// wgmma reads through; each writing thread fences after its writes, before the barrier.
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void sts128(uint32_t addr, const uint4& v) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}
// Keeps the P fragments' registers live (unchanged) until after the wait that ends the wgmma reading them.
__device__ __forceinline__ void keep_regs(const uint32_t (&a)[4][4]) {
  asm volatile("" ::"r"(a[0][0]), "r"(a[0][1]), "r"(a[0][2]), "r"(a[0][3]), "r"(a[1][0]), "r"(a[1][1]), "r"(a[1][2]),
               "r"(a[1][3]), "r"(a[2][0]), "r"(a[2][1]), "r"(a[2][2]), "r"(a[2][3]), "r"(a[3][0]), "r"(a[3][1]),
               "r"(a[3][2]), "r"(a[3][3]));
}
// D (+)= A B for one warpgroup: m64n64k16, A and B bf16 K-major in shared memory (descriptors),
// fp32 accumulators in the m16n8 layout per warp (d[j]: columns 8 j .. 8 j + 7). accumulate 0: D = A B.
__device__ __forceinline__ void wgmma_64x64_ss(float (&d)[8][4], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
      : "l"(da), "l"(db), "r"(accumulate));
}
// D = A B (the first k-step): as above with the accumulators write-only, so that no other
// instruction defines them while an earlier wgmma is still in flight (ptxas would serialize).
__device__ __forceinline__ void wgmma_64x64_ss_first(float (&d)[8][4], uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "=f"(d[0][0]), "=f"(d[0][1]), "=f"(d[0][2]), "=f"(d[0][3]), "=f"(d[1][0]), "=f"(d[1][1]), "=f"(d[1][2]), "=f"(d[1][3]), "=f"(d[2][0]), "=f"(d[2][1]), "=f"(d[2][2]), "=f"(d[2][3]), "=f"(d[3][0]), "=f"(d[3][1]), "=f"(d[3][2]), "=f"(d[3][3]), "=f"(d[4][0]), "=f"(d[4][1]), "=f"(d[4][2]), "=f"(d[4][3]), "=f"(d[5][0]), "=f"(d[5][1]), "=f"(d[5][2]), "=f"(d[5][3]), "=f"(d[6][0]), "=f"(d[6][1]), "=f"(d[6][2]), "=f"(d[6][3]), "=f"(d[7][0]), "=f"(d[7][1]), "=f"(d[7][2]), "=f"(d[7][3])
      : "l"(da), "l"(db), "r"(0));
}
// D += A B for one warpgroup: m64n256k16, A (bf16, the m16n8k16 A fragment per warp) in registers,
// B bf16 MN-major in shared memory (descriptor, transpose bit set: B stored [k][n]), fp32
// accumulators d[j]: columns 8 j .. 8 j + 7.
__device__ __forceinline__ void wgmma_64x256_rs(float (&d)[32][4], const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, {%128, %129, %130, %131}, %132, p, 1, 1, %134;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]), "+f"(d[16][0]), "+f"(d[16][1]), "+f"(d[16][2]), "+f"(d[16][3]), "+f"(d[17][0]), "+f"(d[17][1]), "+f"(d[17][2]), "+f"(d[17][3]), "+f"(d[18][0]), "+f"(d[18][1]), "+f"(d[18][2]), "+f"(d[18][3]), "+f"(d[19][0]), "+f"(d[19][1]), "+f"(d[19][2]), "+f"(d[19][3]), "+f"(d[20][0]), "+f"(d[20][1]), "+f"(d[20][2]), "+f"(d[20][3]), "+f"(d[21][0]), "+f"(d[21][1]), "+f"(d[21][2]), "+f"(d[21][3]), "+f"(d[22][0]), "+f"(d[22][1]), "+f"(d[22][2]), "+f"(d[22][3]), "+f"(d[23][0]), "+f"(d[23][1]), "+f"(d[23][2]), "+f"(d[23][3]), "+f"(d[24][0]), "+f"(d[24][1]), "+f"(d[24][2]), "+f"(d[24][3]), "+f"(d[25][0]), "+f"(d[25][1]), "+f"(d[25][2]), "+f"(d[25][3]), "+f"(d[26][0]), "+f"(d[26][1]), "+f"(d[26][2]), "+f"(d[26][3]), "+f"(d[27][0]), "+f"(d[27][1]), "+f"(d[27][2]), "+f"(d[27][3]), "+f"(d[28][0]), "+f"(d[28][1]), "+f"(d[28][2]), "+f"(d[28][3]), "+f"(d[29][0]), "+f"(d[29][1]), "+f"(d[29][2]), "+f"(d[29][3]), "+f"(d[30][0]), "+f"(d[30][1]), "+f"(d[30][2]), "+f"(d[30][3]), "+f"(d[31][0]), "+f"(d[31][1]), "+f"(d[31][2]), "+f"(d[31][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1), "n"(1));
}
// wgmma.fence with the accumulators as operands: register writes before it (the rescaling) stay
// before it, as the ISA requires before a wgmma reads those registers.
__device__ __forceinline__ void wgmma_fence_acc(float (&d)[32][4]) {
  asm volatile("wgmma.fence.sync.aligned;\n" : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]), "+f"(d[16][0]), "+f"(d[16][1]), "+f"(d[16][2]), "+f"(d[16][3]), "+f"(d[17][0]), "+f"(d[17][1]), "+f"(d[17][2]), "+f"(d[17][3]), "+f"(d[18][0]), "+f"(d[18][1]), "+f"(d[18][2]), "+f"(d[18][3]), "+f"(d[19][0]), "+f"(d[19][1]), "+f"(d[19][2]), "+f"(d[19][3]), "+f"(d[20][0]), "+f"(d[20][1]), "+f"(d[20][2]), "+f"(d[20][3]), "+f"(d[21][0]), "+f"(d[21][1]), "+f"(d[21][2]), "+f"(d[21][3]), "+f"(d[22][0]), "+f"(d[22][1]), "+f"(d[22][2]), "+f"(d[22][3]), "+f"(d[23][0]), "+f"(d[23][1]), "+f"(d[23][2]), "+f"(d[23][3]), "+f"(d[24][0]), "+f"(d[24][1]), "+f"(d[24][2]), "+f"(d[24][3]), "+f"(d[25][0]), "+f"(d[25][1]), "+f"(d[25][2]), "+f"(d[25][3]), "+f"(d[26][0]), "+f"(d[26][1]), "+f"(d[26][2]), "+f"(d[26][3]), "+f"(d[27][0]), "+f"(d[27][1]), "+f"(d[27][2]), "+f"(d[27][3]), "+f"(d[28][0]), "+f"(d[28][1]), "+f"(d[28][2]), "+f"(d[28][3]), "+f"(d[29][0]), "+f"(d[29][1]), "+f"(d[29][2]), "+f"(d[29][3]), "+f"(d[30][0]), "+f"(d[30][1]), "+f"(d[30][2]), "+f"(d[30][3]), "+f"(d[31][0]), "+f"(d[31][1]), "+f"(d[31][2]), "+f"(d[31][3]) : : "memory");
}
// wgmma.wait_group 0 with the accumulators as operands: no read of them moves above the wait.
__device__ __forceinline__ void wgmma_wait_acc(float (&d)[8][4]) {
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]) : : "memory");
}
__device__ __forceinline__ void wgmma_wait_acc(float (&d)[32][4]) {
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]), "+f"(d[16][0]), "+f"(d[16][1]), "+f"(d[16][2]), "+f"(d[16][3]), "+f"(d[17][0]), "+f"(d[17][1]), "+f"(d[17][2]), "+f"(d[17][3]), "+f"(d[18][0]), "+f"(d[18][1]), "+f"(d[18][2]), "+f"(d[18][3]), "+f"(d[19][0]), "+f"(d[19][1]), "+f"(d[19][2]), "+f"(d[19][3]), "+f"(d[20][0]), "+f"(d[20][1]), "+f"(d[20][2]), "+f"(d[20][3]), "+f"(d[21][0]), "+f"(d[21][1]), "+f"(d[21][2]), "+f"(d[21][3]), "+f"(d[22][0]), "+f"(d[22][1]), "+f"(d[22][2]), "+f"(d[22][3]), "+f"(d[23][0]), "+f"(d[23][1]), "+f"(d[23][2]), "+f"(d[23][3]), "+f"(d[24][0]), "+f"(d[24][1]), "+f"(d[24][2]), "+f"(d[24][3]), "+f"(d[25][0]), "+f"(d[25][1]), "+f"(d[25][2]), "+f"(d[25][3]), "+f"(d[26][0]), "+f"(d[26][1]), "+f"(d[26][2]), "+f"(d[26][3]), "+f"(d[27][0]), "+f"(d[27][1]), "+f"(d[27][2]), "+f"(d[27][3]), "+f"(d[28][0]), "+f"(d[28][1]), "+f"(d[28][2]), "+f"(d[28][3]), "+f"(d[29][0]), "+f"(d[29][1]), "+f"(d[29][2]), "+f"(d[29][3]), "+f"(d[30][0]), "+f"(d[30][1]), "+f"(d[30][2]), "+f"(d[30][3]), "+f"(d[31][0]), "+f"(d[31][1]), "+f"(d[31][2]), "+f"(d[31][3]) : : "memory");
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

constexpr int kV4Threads = 256;
constexpr size_t kV4Smem = 7 * 32768 + 1024;  // Q 4 x 32 KB, K, two V buffers 32 KB each, + alignment slack

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// The v4-form kernels' (v4, v4b, v5b) shared pieces. Tile loads: thread t copies the 16-byte column
// chunk t % 32 of key rows t / 32 + 8 i of a 64-key tile into the [4 dim blocks][64 keys][128 B]
// layout, chunk XOR row & 7; keys past n_kv read as zeros (P is 0 there, and 0 x 0 stays 0).
struct V4TileLoader {
  const uint16_t* kcol;
  const uint16_t* vcol;
  uint32_t col_off;
  int lr0, n_kv, kvw;
  __device__ __forceinline__ V4TileLoader(const uint16_t* K, const uint16_t* V, const PrefillGeom& G,
                                          const PrefillWarp& w, int tid, const StepMeta* meta) {
    const int lc = tid & 31;
    lr0 = tid >> 5;
    n_kv = meta->n_kv;
    kvw = G.kvw;
    kcol = K + static_cast<size_t>(w.g) * 256 + lc * 8;
    vcol = V + static_cast<size_t>(w.g) * 256 + lc * 8;
    col_off = (lc >> 3) * 8192u + ((lc & 7) << 4);  // + r * 128, chunk XOR r & 7
  }
  __device__ __forceinline__ void load(uint32_t dst, const uint16_t* col, int t) const {
#pragma unroll
    for (int r = lr0; r < 64; r += kV4Threads / 32) {
      const int j = t * 64 + r;
      const bool ok = j < n_kv;
      cp_async16((dst + col_off + r * 128u) ^ ((r & 7) << 4), col + (ok ? static_cast<size_t>(j) * kvw : 0),
                 ok ? 16 : 0);
    }
  }
};

// This warpgroup's 64 query rows of head w.h as bf16 pieces into sQ (hi; lo 32 KB further when
// SPLIT), zeros for rows past the call.
template <bool SPLIT>
__device__ __forceinline__ void v4_stage_q(const float* __restrict__ q, const PrefillGeom& G, const PrefillWarp& w,
                                           int tid, uint32_t sQ) {
  constexpr int HD = 256, CH = HD / 8;
  for (int i = tid & 127; i < 64 * CH; i += 128) {
    const int r = i / CH, c = i % CH;
    uint4 hi, lo;
    q_pieces<HD>(q, G, w.m0 + r, w.h, c, hi, lo);
    const uint32_t o = (c >> 3) * 8192u + r * 128u + (((c & 7) ^ (r & 7)) << 4);
    sts128(sQ + o, hi);
    if constexpr (SPLIT) sts128(sQ + 32768u + o, lo);
  }
}

// O = alpha O before a tile's P V (alpha = 1 for rows the tile misses: exact).
template <int NT>
__device__ __forceinline__ void v4_rescale(float (&acc)[32][4], const TileSoftmax<NT>& T) {
#pragma unroll
  for (int n = 0; n < 32; n++) {
    acc[n][0] = __fmul_rn(acc[n][0], T.alpha_a);
    acc[n][1] = __fmul_rn(acc[n][1], T.alpha_a);
    acc[n][2] = __fmul_rn(acc[n][2], T.alpha_b);
    acc[n][3] = __fmul_rn(acc[n][3], T.alpha_b);
  }
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// SPLIT: q and p as bf16 hi + lo (v4), or as bf16 hi alone (v4b).
template <bool SPLIT>
__global__ void __launch_bounds__(kV4Threads, 1)
    attn_prefill_v4_kernel(const float* __restrict__ q, const uint16_t* __restrict__ K,
                           const uint16_t* __restrict__ V, float* __restrict__ out, const PrefillGeom G,
                           const StepMeta* meta) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int HD = 256, KT = 64, NT = KT / 8;
  pdl_trigger();
  pdl_wait();
  extern __shared__ __align__(1024) uint8_t smem_v4[];
  const uint32_t sbase = (smem_u32(smem_v4) + 1023u) & ~1023u;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wg = warp >> 2;
  const uint32_t sQ = sbase + wg * 65536u;  // hi [4][64][128 B], lo 32 KB further
  const uint32_t sK = sbase + 131072u;      // [4 dim blocks][64 keys][128 B]
  const uint32_t sV = sK + 32768u;          // two buffers in K's layout

  const PrefillWarp w = prefill_warp<KT>(G, meta, warp, lane);
  const int t_begin = w.t_begin, t_end = w.t_end;  // the same for every warp of the block

  const V4TileLoader ld(K, V, G, w, tid, meta);
  if (t_end > t_begin) {
    ld.load(sK, ld.kcol, t_begin);
    cp_async_commit();
  }
  v4_stage_q<SPLIT>(q, G, w, tid, sQ);

  float acc[HD / 8][4];
#pragma unroll
  for (int n = 0; n < HD / 8; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
  float max_a = -INFINITY, max_b = -INFINITY, sum_a = 0.0f, sum_b = 0.0f;

  for (int t = t_begin; t < t_end; t++) {
    // V(t)'s buffer was last read by P V(t - 2), which every warpgroup waited for before the
    // second barrier of tile t - 1.
    const uint32_t sVb = sV + ((t - t_begin) & 1) * 32768u;
    ld.load(sVb, ld.vcol, t);
    cp_async_commit();
    cp_async_wait<1>();  // K(t) (and, the first time, the Q stores above are this thread's too)
    fence_proxy_async_smem();
    __syncthreads();

    // S = Q K^T: 16 k-steps of 16 dims, Q's hi then lo piece into the same accumulators.
    float s[NT][4];
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < HD / 16; ks++) {
      const uint32_t off = (ks >> 2) * 8192u + (ks & 3) * 32u;
      const uint64_t db = wg_desc(sK + off);
      if (ks == 0)
        wgmma_64x64_ss_first(s, wg_desc(sQ + off), db);
      else
        wgmma_64x64_ss(s, wg_desc(sQ + off), db, 1);
      if constexpr (SPLIT) wgmma_64x64_ss(s, wg_desc(sQ + 32768u + off), db, 1);
    }
    wgmma_commit();
    wgmma_wait_acc(s);

    TileSoftmax<NT> T;
    softmax_tile<NT>(s, t * KT, lane, G.scale_log2, w.lo_a, w.hi_a, w.lo_b, w.hi_b, max_a, max_b, sum_a, sum_b, T);

    cp_async_wait<0>();  // V(t)
    fence_proxy_async_smem();
    __syncthreads();  // everyone's V(t) copies landed; every warpgroup is done with K(t)
    if (t + 1 < t_end) {
      ld.load(sK, ld.kcol, t + 1);
      cp_async_commit();
    }

    // O = alpha O + P V: rescale, then 4 k-steps of 16 keys (16 keys x 128 B = 2 KB of V each), P's
    // hi then lo piece.
    v4_rescale<NT>(acc, T);
    wgmma_fence_acc(acc);
#pragma unroll
    for (int kk = 0; kk < NT / 2; kk++) {
      const uint64_t db = wg_desc(sVb + kk * 2048u, 8192u, 1024u);
      wgmma_64x256_rs(acc, T.ph[kk], db);
      if constexpr (SPLIT) wgmma_64x256_rs(acc, T.pl[kk], db);
    }
    wgmma_commit();
    wgmma_wait_acc(acc);
    keep_regs(T.ph);
    if constexpr (SPLIT) keep_regs(T.pl);
  }

  prefill_store_out<HD>(out, acc, sum_a, sum_b, w, G, lane);
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
}

// ---- v5b: v4b's operations, P V(t) and S(t + 1) in flight together --------------------------------
// v4 leaves the tensor core idle while a warpgroup waits for P V(t), crosses the next tile's barrier
// and issues S(t + 1). v5b issues P V(t), then (after K(t + 1)'s barrier) S(t + 1), and waits for
// both at once; K(t + 1) and V(t + 1) are both loaded once every warpgroup is past S(t) (V has two
// buffers, so V(t + 1) never overwrites the V(t) that P V(t) reads). Each row's operations are v4b's
// in v4b's order (rescale by alpha(t), P V(t) into the same accumulators, S(t + 1) from zero,
// softmax(t + 1)), so the bits are v4b's (CudaAttentionPrefill.V5bEqualsV4bBitForBit). With q and p
// as two pieces (v4) the same schedule needs 255 registers and spills ("v5", prefill_kernels.md);
// with one piece P is 16 registers a thread instead of 32.
__global__ void __launch_bounds__(kV4Threads, 1)
    attn_prefill_v5b_kernel(const float* __restrict__ q, const uint16_t* __restrict__ K,
                            const uint16_t* __restrict__ V, float* __restrict__ out, const PrefillGeom G,
                            const StepMeta* meta) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int HD = 256, KT = 64, NT = KT / 8;
  pdl_trigger();
  pdl_wait();
  extern __shared__ __align__(1024) uint8_t smem_v4[];
  const uint32_t sbase = (smem_u32(smem_v4) + 1023u) & ~1023u;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wg = warp >> 2;
  const uint32_t sQ = sbase + wg * 65536u;  // [4][64][128 B] (v4's layout; the lo half unused)
  const uint32_t sK = sbase + 131072u;
  const uint32_t sV = sK + 32768u;  // two buffers

  const PrefillWarp w = prefill_warp<KT>(G, meta, warp, lane);
  const int t_begin = w.t_begin, t_end = w.t_end;

  const V4TileLoader ld(K, V, G, w, tid, meta);
  auto vbuf = [&](int t) { return sV + ((t - t_begin) & 1) * 32768u; };
  if (t_end > t_begin) {
    ld.load(sK, ld.kcol, t_begin);
    cp_async_commit();
    ld.load(vbuf(t_begin), ld.vcol, t_begin);
    cp_async_commit();
  }
  v4_stage_q<false>(q, G, w, tid, sQ);

  float acc[HD / 8][4];
#pragma unroll
  for (int n = 0; n < HD / 8; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
  float max_a = -INFINITY, max_b = -INFINITY, sum_a = 0.0f, sum_b = 0.0f;
  if (t_end <= t_begin) {
    prefill_store_out<HD>(out, acc, sum_a, sum_b, w, G, lane);
    return;
  }

  // S = Q K^T of the tile in sK: 16 wgmma (one piece), committed, not waited.
  float s[NT][4];
  auto issue_s = [&]() {
#pragma unroll
    for (int ks = 0; ks < HD / 16; ks++) {
      const uint32_t off = (ks >> 2) * 8192u + (ks & 3) * 32u;
      const uint64_t db = wg_desc(sK + off);
      if (ks == 0)
        wgmma_64x64_ss_first(s, wg_desc(sQ + off), db);
      else
        wgmma_64x64_ss(s, wg_desc(sQ + off), db, 1);
    }
    wgmma_commit();
  };

  cp_async_wait<1>();  // K(t_begin) and this thread's Q stores
  fence_proxy_async_smem();
  __syncthreads();
  wgmma_fence();
  issue_s();
  wgmma_wait_acc(s);
  TileSoftmax<NT> T;
  softmax_tile<NT>(s, t_begin * KT, lane, G.scale_log2, w.lo_a, w.hi_a, w.lo_b, w.hi_b, max_a, max_b, sum_a, sum_b,
                   T);

  for (int t = t_begin; t < t_end; t++) {
    const bool more = t + 1 < t_end;
    cp_async_wait<0>();  // V(t)
    fence_proxy_async_smem();
    __syncthreads();  // V(t) landed for all; every warpgroup is done with S(t) (K(t)) and P V(t - 1)
    if (more) {
      ld.load(sK, ld.kcol, t + 1);
      cp_async_commit();
      ld.load(vbuf(t + 1), ld.vcol, t + 1);  // P V(t - 1), the last reader of this buffer, was waited
      cp_async_commit();
    }
    v4_rescale<NT>(acc, T);
    wgmma_fence_acc(acc);
    const uint32_t sVb = vbuf(t);
#pragma unroll
    for (int kk = 0; kk < NT / 2; kk++) wgmma_64x256_rs(acc, T.ph[kk], wg_desc(sVb + kk * 2048u, 8192u, 1024u));
    wgmma_commit();
    if (more) {
      cp_async_wait<1>();  // K(t + 1)
      fence_proxy_async_smem();
      __syncthreads();
      wgmma_fence();  // S's accumulators were read by softmax(t); P V(t) stays in flight
      issue_s();
      wgmma_wait_acc(s);  // wait_group 0: S(t + 1) and P V(t)
      wgmma_wait_acc(acc);
      keep_regs(T.ph);
      softmax_tile<NT>(s, (t + 1) * KT, lane, G.scale_log2, w.lo_a, w.hi_a, w.lo_b, w.hi_b, max_a, max_b, sum_a,
                       sum_b, T);
    } else {
      wgmma_wait_acc(acc);
      keep_regs(T.ph);
    }
  }

  prefill_store_out<HD>(out, acc, sum_a, sum_b, w, G, lane);
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
}

void launch_prefill_v5b(const float* q, const uint16_t* K, const uint16_t* V, float* out, const PrefillGeom& G,
                        const StepMeta* meta, cudaStream_t st) {
  static bool smem_set = false;
  if (!smem_set) {
    QF_CUDA_CHECK(cudaFuncSetAttribute(attn_prefill_v5b_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(kV4Smem)));
    smem_set = true;
  }
  launch_k(attn_prefill_v5b_kernel, dim3(G.n_qtiles, G.n_heads / 2), dim3(kV4Threads), kV4Smem, st, q, K, V, out, G,
           meta);
  QF_CUDA_LAUNCH_CHECK("attn_prefill_v5b_kernel");
}

template <bool SPLIT>
void launch_prefill_v4(const float* q, const uint16_t* K, const uint16_t* V, float* out, const PrefillGeom& G,
                       const StepMeta* meta, cudaStream_t st) {
  static bool smem_set = false;
  if (!smem_set) {
    QF_CUDA_CHECK(cudaFuncSetAttribute(attn_prefill_v4_kernel<SPLIT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(kV4Smem)));
    smem_set = true;
  }
  launch_k(attn_prefill_v4_kernel<SPLIT>, dim3(G.n_qtiles, G.n_heads / 2), dim3(kV4Threads), kV4Smem, st, q, K, V,
           out, G, meta);
  QF_CUDA_LAUNCH_CHECK("attn_prefill_v4_kernel");
}

// Heads per block (the largest divisor of the group size <= kMaxWarps) and query rows per block.
void prefill_block_shape(int group, int* hb, int* bq) {
  *hb = 1;
  for (int d = 1; d <= kMaxWarps && d <= group; d++)
    if (group % d == 0) *hb = d;
  *bq = 16 * (kMaxWarps / *hb > 1 ? kMaxWarps / *hb : 1);
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// The QFLASH_ATTN_PREFILL switch (read once per process): v5b by default since run 66 (it runs v3
// where v4's kernels do not apply: other head dims, odd groups, devices other than sm_90a); v4,
// v4b, v3 or v1 when asked for.
int prefill_variant_env() {
  static const int v = [] {
    const char* e = std::getenv("QFLASH_ATTN_PREFILL");
    if (e && std::strcmp(e, "v1") == 0) return static_cast<int>(kPrefillV1);
    if (e && std::strcmp(e, "v3") == 0) return static_cast<int>(kPrefillV3);
    if (e && std::strcmp(e, "v4") == 0) return static_cast<int>(kPrefillV4);
    if (e && std::strcmp(e, "v4b") == 0) return static_cast<int>(kPrefillV4B);
    if (e && *e && std::strcmp(e, "v5b") != 0)
      std::fprintf(stderr, "qflash: QFLASH_ATTN_PREFILL=%s unknown (v1 | v3 | v4 | v4b | v5b); using v5b\n", e);
    return static_cast<int>(kPrefillV5B);
  }();
  return v;
}

}  // namespace

bool attention_prefill_v3_applies(const AttnParams& p) {
  if (p.kv_dtype != DType::BF16 || (p.head_dim != 64 && p.head_dim != 128 && p.head_dim != 256)) return false;
  if (p.n_heads <= 0 || p.n_kv_heads <= 0 || p.n_heads % p.n_kv_heads != 0) return false;
  int hb, bq;
  prefill_block_shape(p.n_heads / p.n_kv_heads, &hb, &bq);
  return prefill_v3_smem(p.head_dim, hb * (bq / 16)) <= smem_optin();
}

// v4 needs a device of compute capability 9.0 running this build's sm_90a code, head_dim 256 (its
// tiles are written for it), an even number of q heads per kv head (two per block) and bf16 K/V.
bool attention_prefill_v4_applies(const AttnParams& p) {
  if (p.kv_dtype != DType::BF16 || p.head_dim != 256) return false;
  if (p.n_heads <= 0 || p.n_kv_heads <= 0 || p.n_heads % p.n_kv_heads != 0 || (p.n_heads / p.n_kv_heads) % 2 != 0)
    return false;
  static const bool hopper = [] {
    if (!std::strstr(QFLASH_CUDA_ARCHS_STR, "90a")) return false;
    int dev = 0, major = 0, minor = 0;
    QF_CUDA_CHECK(cudaGetDevice(&dev));
    QF_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    QF_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    return major == 9 && minor == 0;
  }();
  return hopper && kV4Smem <= smem_optin();
}

int attention_prefill_runs(const AttnParams& p, int variant) {
  if (variant == kPrefillEnv) variant = prefill_variant_env();
  const bool wg = variant == kPrefillV4 || variant == kPrefillV4B || variant == kPrefillV5B;
  if (wg && attention_prefill_v4_applies(p)) return variant;
  if (wg) variant = kPrefillV3;  // shapes v4 does not cover
  if (variant == kPrefillV3 && attention_prefill_v3_applies(p)) return kPrefillV3;
  return kPrefillV1;
}

bool attention_prefill(const float* q, const void* K, const void* V, float* out, int M, const AttnParams& p,
                       const StepMeta* meta, cudaStream_t st, int variant) {
  if (M <= 0 || p.n_heads <= 0) return true;
  if (p.kv_dtype != DType::BF16) return false;
  if (p.head_dim != 64 && p.head_dim != 128 && p.head_dim != 256) return false;
  if (!aligned16(q) || !aligned16(K) || !aligned16(V) || !aligned16(out)) return false;
  if (p.n_kv_heads <= 0 || p.n_heads % p.n_kv_heads != 0)
    backend_fail("cuda attention_prefill: %d heads not a multiple of %d kv heads", p.n_heads, p.n_kv_heads);
  PrefillGeom G;
  attn_common_geom(G, p, M);
  prefill_block_shape(G.group, &G.hb, &G.bq);
  G.n_qtiles = (M + G.bq - 1) / G.bq;
  const auto* k16 = static_cast<const uint16_t*>(K);
  const auto* v16 = static_cast<const uint16_t*>(V);
  variant = attention_prefill_runs(p, variant);
  if (variant == kPrefillV4 || variant == kPrefillV4B || variant == kPrefillV5B) {
    G.hb = 2;
    G.bq = 64;
    G.n_qtiles = (M + 63) / 64;
    if (variant == kPrefillV4)
      launch_prefill_v4<true>(q, k16, v16, out, G, meta, st);
    else if (variant == kPrefillV4B)
      launch_prefill_v4<false>(q, k16, v16, out, G, meta, st);
    else
      launch_prefill_v5b(q, k16, v16, out, G, meta, st);
    return true;
  }
  if (variant == kPrefillV3) {
    switch (p.head_dim) {
      case 64: launch_prefill_v3<64>(q, k16, v16, out, G, meta, st); break;
      case 128: launch_prefill_v3<128>(q, k16, v16, out, G, meta, st); break;
      default: launch_prefill_v3<256>(q, k16, v16, out, G, meta, st); break;
    }
    return true;
  }
  switch (p.head_dim) {
    case 64: launch_prefill<64>(q, k16, v16, out, G, meta, st); break;
    case 128: launch_prefill<128>(q, k16, v16, out, G, meta, st); break;
    default: launch_prefill<256>(q, k16, v16, out, G, meta, st); break;
  }
  return true;
}

}  // namespace qf::cuda
