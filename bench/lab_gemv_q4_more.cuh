// Kernel lab, int4 GEMV versions 17+ (bench/lab_gemv_q4.cu): production's arithmetic, more weight
// loads in flight. Lab only: nothing here is compiled into the backend.
//
// gemv_tc_q4_kernel (production, src/backend/cuda/gemv_tc_q4_impl.cuh, Q4Recipe) retyped with
// three knobs that change where and when the bytes are loaded, never what is computed:
//   - row_halves: each 32-row tile x column slice is served by TWO warps, one per 16-row half
//     (production: one warp does both halves). A warp loads 1 of the 2 nibble vectors of a block
//     and an 8-byte slice of the scale vector (its two scale words), issues half the dequant and
//     MMAs per unit, and redoes the activation split and token sums (the same instructions, the
//     same bits). Blocks are 16 warps (production's 8 warps x 2 halves), so the tiles, slices and
//     column split of a block are production's and the slice reduction is the same.
//   - depth / min_blocks: units in flight per warp and resident blocks per SM asked of ptxas.
//   - pf: lanes issue prefetch.global.L2 for the 128-byte lines of the unit pf units beyond the
//     register ring (no registers, no arithmetic).
// Arithmetic, per row, token and group, exactly production's: the same exact bf16 split of x
// (q4_split, 2 pieces), the MMAs of a k-step in production's order (pieces NP-1..0) into a fresh
// fp32 accumulator per group, the per-lane token sum ((x0 + x1) + (x2 + x3) per k-step), the xor
// tree (1, 2) and the index shuffles (8t, 8t + 4), the fold acc = fl(acc + fma(scale, q, fl(bias *
// xsum))) in group order over the slice's units, and, for ks > 1, the slices added in slice order
// into +0 through shared memory (tc_store_y's scheme). The column split ks is production's
// (tc_column_slices on 8 warps, from the shape only). So every output has production's bits for
// every M, which the lab checks with memcmp.
#pragma once
#include "backend/cuda/gemv_tc_q4_impl.cuh"

namespace qf::cuda {
namespace {

struct Q4LabRecipe {
  static constexpr bool row_halves = false;  // two warps per tile-slice, one per 16-row half
  static constexpr int depth = 4;            // units in flight per warp at one token tile (M <= 8)
  static constexpr int depth_nt2 = 4;        // at two token tiles (M 9..16)
  static constexpr int min_blocks = 2;       // resident blocks per SM asked of ptxas at one token tile
  static constexpr int min_blocks_nt2 = 1;   // at two token tiles
  static constexpr int pf = 0;               // L2 prefetch distance beyond the ring, in units (0: none)
};

// 8-byte streaming load (the row half's two scale words), as ld_stream16.
__device__ __forceinline__ uint2 ld_stream8(const void* p) {
  uint2 r;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v2.u32 {%0, %1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(p));
  return r;
}

__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

template <int G, bool RH>
struct Q4LabBuf {
  static constexpr int NN = RH ? Q4Unit<G>::BLOCKS : 2 * Q4Unit<G>::BLOCKS;  // nibble vectors
  uint4 n[NN];
  // Scale words of the group: production's uint4 (words 0..3 = rows g, g+8, g+16, g+24), or, for
  // a row half a, words 2a and 2a + 1 (x, y).
  typename std::conditional<RH, uint2, uint4>::type s[Q4Unit<G>::GROUPS];
};

template <int G, int NT, class R>
__global__ void __launch_bounds__(kQ4Warps * (R::row_halves ? 2 : 1) * 32, NT == 1 ? R::min_blocks : R::min_blocks_nt2)
    gemv_q4lab_kernel(const Q4Params P) {
  using UT = Q4Unit<G>;
  constexpr int NP = 2;
  constexpr bool RH = R::row_halves;
  constexpr int AH = RH ? 1 : 2;  // row halves a warp computes
  constexpr int DEPTH = NT == 1 ? R::depth : R::depth_nt2;
  constexpr int PF = R::pf;
  using Buf = Q4LabBuf<G, RH>;
  pdl_trigger();
  const int lane = threadIdx.x & 31, warp_b = threadIdx.x >> 5;
  const int half = RH ? (warp_b & 1) : 0;  // the row half of a row_halves warp
  const int warp = RH ? warp_b >> 1 : warp_b;  // production's warp index (tile, slice)
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
#pragma unroll
  for (int j = 0; j < NT; j++) {
    xv[j] = j * 8 + g < P.M;
    xp[j] = P.x + static_cast<size_t>(xv[j] ? j * 8 + g : 0) * P.x_ld + 4 * t;
  }
  float acc[AH][NT][4];
#pragma unroll
  for (int a = 0; a < AH; a++)
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) acc[a][j][e] = 0.0f;

  const int u0 = slice * P.cps;
  const int u1 = min(u0 + P.cps, P.nunits);
  auto load = [&](Buf& dst, int u) {
    const uint8_t* p = tb + static_cast<size_t>(u) * UT::BYTES;
#pragma unroll
    for (int v = 0; v < Buf::NN; v++) {
      const int off = RH ? 1024 * v + 512 * half : 512 * v;
      dst.n[v] = tile_ok ? ld_stream16(p + off + 16 * lane) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int k = 0; k < UT::GROUPS; k++) {
      const uint8_t* sp = p + UT::BLOCKS * 1024 + 128 * k + 16 * g;
      if constexpr (RH)
        dst.s[k] = tile_ok ? ld_stream8(sp + 8 * half) : make_uint2(0, 0);
      else
        dst.s[k] = tile_ok ? ld_stream16(sp) : make_uint4(0, 0, 0, 0);
    }
  };
  // L2 prefetch of unit u's 128-byte lines: nibble lines of the warp's row half(s), scale lines by
  // the half-0 warp.
  auto prefetch = [&](int u) {
    constexpr int NL = UT::BYTES / 128;
    if (!tile_ok || u >= u1 || lane >= NL) return;
    const bool nib = lane < 8 * UT::BLOCKS;
    if (RH && (nib ? ((lane >> 2) & 1) != half : half != 0)) return;
    prefetch_l2(tb + static_cast<size_t>(u) * UT::BYTES + 128 * lane);
  };

  auto unit = [&](const Buf& buf, int u) {
    float cacc[AH][NT][4];
    float xsum[NT];
#pragma unroll
    for (int kk = 0; kk < 4 * UT::BLOCKS; kk++) {
      const int bb = kk / 4, s = kk % 4;
      if (kk % UT::STEPS_PER_GROUP == 0) {
#pragma unroll
        for (int a = 0; a < AH; a++)
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
        const float4 xf = xv[j] ? __ldg(reinterpret_cast<const float4*>(xp[j] + col)) : make_float4(0.f, 0.f, 0.f, 0.f);
        q4_split<NP>(xf.x, xf.y, b0[j]);
        q4_split<NP>(xf.z, xf.w, b1[j]);
        xsum[j] = __fadd_rn(xsum[j], __fadd_rn(__fadd_rn(xf.x, xf.y), __fadd_rn(xf.z, xf.w)));
      }
#pragma unroll
      for (int a = 0; a < AH; a++) {
        const uint32_t w = q4_word(buf.n[RH ? bb : 2 * bb + a], s);
        const uint32_t a0 = q4_pair(w, 0), a1 = q4_pair(w, 1), a2 = q4_pair(w, 2), a3 = q4_pair(w, 3);
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
          for (int p = NP - 1; p >= 0; p--) q4_mma(cacc[a][j], a0, a1, a2, a3, b0[j][p], b1[j][p]);
      }
      if (kk % UT::STEPS_PER_GROUP == UT::STEPS_PER_GROUP - 1) {
        float xt[NT][2];
#pragma unroll
        for (int j = 0; j < NT; j++) {
          float v = xsum[j];
          v = __fadd_rn(v, __shfl_xor_sync(kFull, v, 1));
          v = __fadd_rn(v, __shfl_xor_sync(kFull, v, 2));
          xt[j][0] = __shfl_sync(kFull, v, 8 * t);
          xt[j][1] = __shfl_sync(kFull, v, 8 * t + 4);
        }
        const auto sb = buf.s[kk / UT::STEPS_PER_GROUP];
#pragma unroll
        for (int a = 0; a < AH; a++)
#pragma unroll
          for (int hr = 0; hr < 2; hr++) {
            uint32_t sw;
            if constexpr (RH)
              sw = hr == 0 ? sb.x : sb.y;
            else
              sw = q4_word(sb, 2 * a + hr);
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

  Buf buf[DEPTH];
#pragma unroll
  for (int d = 0; d < DEPTH; d++)
    if (u0 + d < u1) load(buf[d], u0 + d);
  if constexpr (PF > 0) {
#pragma unroll
    for (int d = 0; d < PF; d++) prefetch(u0 + DEPTH + d);
  }
  pdl_wait();
  for (int u = u0; u < u1; u += DEPTH) {
#pragma unroll
    for (int d = 0; d < DEPTH; d++) {
      if (u + d < u1) {
        unit(buf[d], u + d);
        if (u + d + DEPTH < u1) {
          load(buf[d], u + d + DEPTH);
          if constexpr (PF > 0) prefetch(u + d + DEPTH + PF);
        }
      }
    }
  }

  // Results: tc_store_y's scheme. One slice: stored directly; else every warp's partial sums into
  // shared memory at production's index (warp, a), then each (tile, row, token) adds the slices in
  // slice order into +0.
  if (P.ks == 1) {
#pragma unroll
    for (int ai = 0; ai < AH; ai++)
#pragma unroll
      for (int j = 0; j < NT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int a = RH ? half : ai;
          const int r = row0 + 16 * a + g + 8 * (e >> 1), m = 8 * j + 2 * t + (e & 1);
          if (r < nrows && m < P.M) P.y[seg][static_cast<size_t>(m) * nrows + r] = acc[ai][j][e];
        }
    return;
  }
  extern __shared__ float red[];  // [warp][a][j][e][lane]
#pragma unroll
  for (int ai = 0; ai < AH; ai++)
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int a = RH ? half : ai;
        red[(((warp * 2 + a) * NT + j) * 4 + e) * 32 + lane] = acc[ai][j][e];
      }
  __syncthreads();
  const int per_tile = 2 * NT * 4 * 32;
  for (int idx = threadIdx.x; idx < P.tiles_per_block * per_tile; idx += blockDim.x) {
    const int tl = idx / per_tile, rem = idx % per_tile;
    const int ln = rem % 32, e = (rem / 32) % 4, j = (rem / 128) % NT, a = rem / (128 * NT);
    const int gt = blockIdx.x * P.tiles_per_block + tl;
    if (gt >= P.tile0[P.nseg]) continue;
    const int sg = tc_seg_of<kQ4MaxSeg>(P, gt);
    const int rows_s = P.rows[sg];
    const int r = (gt - P.tile0[sg]) * 32 + 16 * a + (ln >> 2) + 8 * (e >> 1);
    const int m = 8 * j + 2 * (ln & 3) + (e & 1);
    if (r >= rows_s || m >= P.M) continue;
    float sum = 0.0f;
    for (int k = 0; k < P.ks; k++) sum = __fadd_rn(sum, red[((((tl * P.ks + k) * 2 + a) * NT + j) * 4 + e) * 32 + ln]);
    P.y[sg][static_cast<size_t>(m) * rows_s + r] = sum;
  }
}

// q4_run's grid and passes for the lab kernel: group 64 and 2 pieces only (what the lab times;
// anything else fails loudly), 16 tokens a pass (fp32 activations).
template <class R>
void q4lab_run(const WeightRef* const* Ws, float* const* ys, int n, const float* x, int x_ld, int M, cudaStream_t st) {
  if (n < 1 || n > kQ4MaxSeg) backend_fail("int4 lab: %d weights in one group (1..%d)", n, kQ4MaxSeg);
  if (M <= 0) return;
  const int group = Ws[0]->group;
  if (group != 64 || q4_pieces() != 2) backend_fail("int4 lab v17+: group 64 and 2 pieces only (group %d)", group);
  int64_t tiles = 0;
  for (int i = 0; i < n; i++) {
    const WeightRef& W = *Ws[i];
    if (W.layout != WeightRef::kTcQ4 || W.cols != Ws[0]->cols || W.group != group || !W.data)
      backend_fail("int4 lab: weight %d of %d is not in the int4 tile layout with the group's cols and group", i, n);
    tiles += (W.rows + 31) / 32;
  }
  if ((reinterpret_cast<uintptr_t>(x) & 15) != 0 || x_ld % 4 != 0 || x_ld < Ws[0]->cols)
    backend_fail("int4 lab: activations must be 16-byte aligned with a row stride multiple of 4 >= cols");
  Q4Params P{};
  tc_fill_segments<uint8_t>(P, Ws, n, x_ld, tiles);
  P.nunits = static_cast<int>(P.cols / q4_unit_cols(group));
  P.ks = tc_column_slices(tiles, P.nunits, kQ4Warps);  // production's split
  P.cps = (P.nunits + P.ks - 1) / P.ks;
  P.tiles_per_block = kQ4Warps / P.ks;
  const unsigned grid = static_cast<unsigned>((tiles + P.tiles_per_block - 1) / P.tiles_per_block);
  const unsigned threads = kQ4Warps * (R::row_halves ? 2 : 1) * 32;
  for (int g0 = 0; g0 < M; g0 += 16) {
    const int mg = M - g0 < 16 ? M - g0 : 16;
    P.M = mg;
    P.x = x + static_cast<size_t>(g0) * x_ld;
    for (int i = 0; i < n; i++) P.y[i] = ys[i] + static_cast<size_t>(g0) * Ws[i]->rows;
    const int nt = mg <= 8 ? 1 : 2;
    const size_t smem = P.ks > 1 ? static_cast<size_t>(kQ4Warps) * 2 * nt * 4 * 32 * sizeof(float) : 0;
    if (nt == 1)
      launch_k(gemv_q4lab_kernel<64, 1, R>, dim3(grid), dim3(threads), smem, st, P);
    else
      launch_k(gemv_q4lab_kernel<64, 2, R>, dim3(grid), dim3(threads), smem, st, P);
    QF_CUDA_LAUNCH_CHECK("gemv_q4lab_kernel");
  }
}

}  // namespace
}  // namespace qf::cuda
