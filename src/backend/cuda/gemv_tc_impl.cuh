// The tensor-core multi-row GEMV's kernel for bf16 weights, shared by gemv_tc.cu (the production
// entry points) and the kernel lab (bench/lab_gemv_tc.cu): y[m, r] = sum_c x[m, c] * W[r, c] for
// M <= 16 token rows, with the token dimension as the MMA's narrow side (n = 8), always padded to a
// full tile. Design notes: docs/experiments/cuda_kernels.md ("tensor-core GEMV").
//
// Arithmetic. mma.sync m16n8k16 bf16 x bf16 -> fp32. The weights are bf16 already. Each fp32
// activation is split exactly into three bf16 pieces, x = x0 + x1 + x2 (x0 = bf16_rn(x),
// x1 = bf16_rn(x - x0), x2 = x - x0 - x1, every subtraction exact), so each product w * x_i is
// exact and the sum carries fp32-level accuracy. The three pieces go through three MMAs into the
// same accumulator (x2, x1, x0 in that order).
//
// Row-invariance. Token m always sits in column m % 8 of token tile m / 8, and an MMA output
// element depends only on its own A row, its own B column and its own accumulator. The k order
// (a fixed permutation of the columns inside each 64-column chunk), the chunk order and the
// column-slice reduction depend on the matrix shape only. So token m's result is bit-identical
// for every M: decode (M = 1, seven zero columns) and verify (M = k + 1) agree bit for bit.
//
// Geometry. A warp owns 32 weight rows (two 16-row A tiles) and one column slice. Lane (g, t),
// g = lane / 4, t = lane % 4, reads 16 bytes twice from rows g, g + 8, g + 16, g + 24 of its
// tile at columns [c + 16 t, c + 16 t + 16) of each 64-column chunk c; MMA step s (0..3) of the
// chunk uses words 2s, 2s + 1 of those 8 words, i.e. logical k-pair t <- columns 16t + 4s + {0,1}
// and logical k-pair t + 4 <- columns 16t + 4s + {2,3}. The B fragment for token g uses the same
// mapping, so the permutation cancels in the dot product.
#pragma once
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/kernels.h"

namespace qf::cuda {

namespace {

constexpr int kTcWarps = 8;  // warps per block

constexpr int kTcMaxSeg = 4;  // weights sharing one launch (same x, same cols)

struct TcParams {
  // Segment i: weight w[i] [rows[i], cols] -> y[i] [M, rows[i]]; its 32-row tiles are the global
  // tiles [tile0[i], tile0[i + 1]).
  const uint16_t* w[kTcMaxSeg];
  float* y[kTcMaxSeg];
  int rows[kTcMaxSeg];
  int tile0[kTcMaxSeg + 1];
  int nseg;
  const float* x;
  int cols, x_ld, M;
  int ks;               // column slices (power of two <= 8)
  int cps;              // chunks per slice
  int nchunks;          // cols / 64
  int tiles_per_block;  // kTcWarps / ks
};

__device__ __forceinline__ uint32_t bf16_rn_bits(float v) {
  return static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(v)));
}

// Exact three-way split of two adjacent activations into packed bf16 pairs (low half = the
// lower column). p[i] holds piece i of (lo, hi).
__device__ __forceinline__ void split_pair(float lo, float hi, uint32_t (&p)[3]) {
  const uint32_t l0 = bf16_rn_bits(lo), h0 = bf16_rn_bits(hi);
  const float lr = __fsub_rn(lo, __uint_as_float(l0 << 16)), hr = __fsub_rn(hi, __uint_as_float(h0 << 16));
  const uint32_t l1 = bf16_rn_bits(lr), h1 = bf16_rn_bits(hr);
  const float lr2 = __fsub_rn(lr, __uint_as_float(l1 << 16)), hr2 = __fsub_rn(hr, __uint_as_float(h1 << 16));
  const uint32_t l2 = bf16_rn_bits(lr2), h2 = bf16_rn_bits(hr2);
  p[0] = l0 | (h0 << 16);
  p[1] = l1 | (h1 << 16);
  p[2] = l2 | (h2 << 16);
}

__device__ __forceinline__ uint32_t word_of(const uint4& a, const uint4& b, int w) {
  // words 0..3 in a, 4..7 in b (w is a compile-time constant after unrolling)
  return w == 0 ? a.x : w == 1 ? a.y : w == 2 ? a.z : w == 3 ? a.w : w == 4 ? b.x : w == 5 ? b.y : w == 6 ? b.z : b.w;
}

// One 64-column chunk of one warp's 32-row tile: reads the lane's 16 activations per token tile
// (xp[j] + off .. + 16), splits them exactly into three bf16 pieces, runs the 24 MMAs (2 row
// tiles x 4 k-steps x 3 pieces) into a fresh per-chunk accumulator and adds that to acc with one
// IEEE add per element (the tensor core's own fp32 accumulation truncates, so its error stays
// relative to one chunk's partial sum instead of the whole row's). w holds the lane's 8 weight
// vectors: w[2i], w[2i + 1] are row i's two 16-byte halves (rows as in the geometry note above).
template <int NT>
__device__ __forceinline__ void tc_chunk(const uint4 (&w)[8], const float* const (&xp)[NT], const bool (&xv)[NT],
                                         int off, float (&acc)[2][NT][4]) {
  float4 xs[NT][4];
#pragma unroll
  for (int j = 0; j < NT; j++)
#pragma unroll
    for (int q = 0; q < 4; q++)
      xs[j][q] = xv[j] ? __ldg(reinterpret_cast<const float4*>(xp[j] + off + 4 * q)) : make_float4(0.f, 0.f, 0.f, 0.f);
  float cacc[2][NT][4];
  tc_zero<NT>(cacc);
#pragma unroll
  for (int s = 0; s < 4; s++) {
    uint32_t b0[NT][3], b1[NT][3];
#pragma unroll
    for (int j = 0; j < NT; j++) {
      split_pair(xs[j][s].x, xs[j][s].y, b0[j]);
      split_pair(xs[j][s].z, xs[j][s].w, b1[j]);
    }
#pragma unroll
    for (int a = 0; a < 2; a++) {
      const uint32_t af[4] = {word_of(w[4 * a], w[4 * a + 1], 2 * s), word_of(w[4 * a + 2], w[4 * a + 3], 2 * s),
                              word_of(w[4 * a], w[4 * a + 1], 2 * s + 1),
                              word_of(w[4 * a + 2], w[4 * a + 3], 2 * s + 1)};
#pragma unroll
      for (int j = 0; j < NT; j++) {
        mma_bf16_16816(cacc[a][j], af, b0[j][2], b1[j][2]);
        mma_bf16_16816(cacc[a][j], af, b0[j][1], b1[j][1]);
        mma_bf16_16816(cacc[a][j], af, b0[j][0], b1[j][0]);
      }
    }
  }
#pragma unroll
  for (int a = 0; a < 2; a++)
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) acc[a][j][e] = __fadd_rn(acc[a][j][e], cacc[a][j][e]);
}

// TL: the weights are in the tiled layout (gemv_tc_relayout) instead of row-major.
template <int NT, bool TL>
__global__ void __launch_bounds__(kTcWarps * 32) gemv_tc_kernel(const TcParams P) {
  pdl_trigger();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int slice = warp % P.ks, rl = warp / P.ks;
  const int gtile = blockIdx.x * P.tiles_per_block + rl;
  const int seg = tc_seg_of<kTcMaxSeg>(P, gtile);
  const int nrows = gtile < P.tile0[P.nseg] ? P.rows[seg] : 0;  // tiles past the end: no rows
  const uint16_t* W = P.w[seg];
  float* Y = P.y[seg];
  const int row0 = (gtile - P.tile0[seg]) * 32;

  // Rows of this lane: i = 0..3 -> row0 + 16 * (i / 2) + g + 8 * (i % 2).
  const char* wp[4];
  bool rv[4];
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const int r = row0 + 16 * (i >> 1) + g + 8 * (i & 1);
    rv[i] = r < nrows;
    wp[i] = reinterpret_cast<const char*>(W) + static_cast<size_t>(rv[i] ? r : 0) * P.cols * 2;
  }
  bool xv[NT];
  const float* xp[NT];
  float acc[2][NT][4];
  tc_warp_rows<NT>(P.x, P.M, P.x_ld, g, 0, xv, xp, acc);

  const int ch0 = slice * P.cps;
  const int ch1 = min(ch0 + P.cps, P.nchunks);
  const uint4 z4 = make_uint4(0u, 0u, 0u, 0u);

  // Tiled layout: this warp's tile is one contiguous run of nchunks 4 KB blocks.
  const bool tile_ok = nrows > 0;
  const char* tb = reinterpret_cast<const char*>(W) +
                   (static_cast<size_t>(tile_ok ? gtile - P.tile0[seg] : 0) * P.nchunks * 4096 + lane * 16);

  // Double buffer: the next chunk's 8 weight vectors are in flight while this one is used.
  uint4 wcur[8], wnxt[8];
  auto load_w = [&](uint4 (&dst)[8], int ch) {
    if constexpr (TL) {
      const char* p = tb + static_cast<size_t>(ch) * 4096;
#pragma unroll
      for (int v = 0; v < 8; v++) dst[v] = tile_ok ? ld_stream16(p + 512 * v) : z4;
    } else {
      const size_t off = (static_cast<size_t>(ch) * 64 + 16 * t) * 2;
#pragma unroll
      for (int i = 0; i < 4; i++) {
        dst[2 * i] = rv[i] ? ld_stream16(wp[i] + off) : z4;
        dst[2 * i + 1] = rv[i] ? ld_stream16(wp[i] + off + 16) : z4;
      }
    }
  };
  if (ch0 < ch1) load_w(wcur, ch0);  // weights never depend on an earlier kernel: before the wait
  pdl_wait();
  for (int ch = ch0; ch < ch1; ch++) {
    if (ch + 1 < ch1) load_w(wnxt, ch + 1);
    tc_chunk<NT>(wcur, xp, xv, ch * 64 + 16 * t, acc);
#pragma unroll
    for (int v = 0; v < 8; v++) wcur[v] = wnxt[v];
  }

  tc_store_y<NT, kTcMaxSeg>(P, acc, [&] { return Y; }, row0, nrows, warp, lane, g, t);
}

// The column-slice launches of up to kTcMaxSeg weights with the same cols (tiles: their 32-row
// tiles together), in passes of 16 token rows; ks column slices (1, 2, 4 or 8). gemv_tc_group
// passes gemv_tc_slices(tiles, cols); the kernel lab forces others. tag(mg) runs before each launch.
template <class Tag>
void tc_slices_run(const WeightRef* const* Ws, float* const* ys, int n, const float* x, int x_ld, int M, int64_t tiles,
                   int ks, bool tiled, cudaStream_t st, Tag&& tag) {
  TcParams P{};
  tc_fill_segments<uint16_t>(P, Ws, n, x_ld, tiles);
  P.ks = ks;
  if (P.ks != 1 && P.ks != 2 && P.ks != 4 && P.ks != 8) backend_fail("cuda matmul (tc): column slices %d not in {1,2,4,8}", P.ks);
  P.nchunks = P.cols / 64;
  P.cps = (P.nchunks + P.ks - 1) / P.ks;
  P.tiles_per_block = kTcWarps / P.ks;
  const unsigned grid = static_cast<unsigned>((tiles + P.tiles_per_block - 1) / P.tiles_per_block);
  for (int g0 = 0; g0 < M; g0 += 16) {
    const int mg = M - g0 < 16 ? M - g0 : 16;
    P.M = mg;
    P.x = x + static_cast<size_t>(g0) * x_ld;
    for (int i = 0; i < n; i++) P.y[i] = ys[i] + static_cast<size_t>(g0) * Ws[i]->rows;
    tag(mg);
    if (mg <= 8) {
      const size_t smem = P.ks > 1 ? static_cast<size_t>(kTcWarps) * 2 * 1 * 4 * 32 * sizeof(float) : 0;
      launch_k(tiled ? gemv_tc_kernel<1, true> : gemv_tc_kernel<1, false>, dim3(grid), dim3(kTcWarps * 32), smem, st, P);
    } else {
      const size_t smem = P.ks > 1 ? static_cast<size_t>(kTcWarps) * 2 * 2 * 4 * 32 * sizeof(float) : 0;
      launch_k(tiled ? gemv_tc_kernel<2, true> : gemv_tc_kernel<2, false>, dim3(grid), dim3(kTcWarps * 32), smem, st, P);
    }
    QF_CUDA_LAUNCH_CHECK("gemv_tc_kernel");
  }
}

}  // namespace

}  // namespace qf::cuda
