// Tensor-core multi-row GEMV for bf16 weights: y[m, r] = sum_c x[m, c] * W[r, c] for M <= 16
// token rows, with the token dimension as the MMA's narrow side (n = 8), always padded to a full
// tile. Design notes: docs/experiments/cuda_kernels.md ("tensor-core GEMV").
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
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <string>

#include "backend/cuda/device_common.cuh"
#include "backend/cuda/kernels.h"

namespace qf::cuda {

namespace {

constexpr int kTcWarps = 8;  // warps per block

constexpr int kTcMaxSeg = 4;  // weights sharing one launch (same x, same cols)
constexpr int kSkSlotFloats = 2 * 2 * 4 * 32;  // one piece of one 32-row tile, up to 16 tokens

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

__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

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

template <class Params>
__device__ __forceinline__ int seg_of(const Params& P, int tile) {
  int s = 0;
#pragma unroll
  for (int i = 1; i < kTcMaxSeg; i++)
    if (i < P.nseg && tile >= P.tile0[i]) s = i;
  return s;
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
#pragma unroll
  for (int a = 0; a < 2; a++)
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) cacc[a][j][e] = 0.0f;
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
      const uint32_t a0 = word_of(w[4 * a], w[4 * a + 1], 2 * s);
      const uint32_t a1 = word_of(w[4 * a + 2], w[4 * a + 3], 2 * s);
      const uint32_t a2 = word_of(w[4 * a], w[4 * a + 1], 2 * s + 1);
      const uint32_t a3 = word_of(w[4 * a + 2], w[4 * a + 3], 2 * s + 1);
#pragma unroll
      for (int j = 0; j < NT; j++) {
        mma_bf16(cacc[a][j], a0, a1, a2, a3, b0[j][2], b1[j][2]);
        mma_bf16(cacc[a][j], a0, a1, a2, a3, b0[j][1], b1[j][1]);
        mma_bf16(cacc[a][j], a0, a1, a2, a3, b0[j][0], b1[j][0]);
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
  const int seg = seg_of(P, gtile);
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
#pragma unroll
  for (int j = 0; j < NT; j++) {
    xv[j] = j * 8 + g < P.M;
    xp[j] = P.x + static_cast<size_t>(xv[j] ? j * 8 + g : 0) * P.x_ld;
  }

  float acc[2][NT][4];
#pragma unroll
  for (int a = 0; a < 2; a++)
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) acc[a][j][e] = 0.0f;

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

  // Accumulator element e of tile (a, j): row row0 + 16a + g + 8(e / 2), token 8j + 2t + (e % 2).
  if (P.ks == 1) {
#pragma unroll
    for (int a = 0; a < 2; a++)
#pragma unroll
      for (int j = 0; j < NT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int r = row0 + 16 * a + g + 8 * (e >> 1), m = 8 * j + 2 * t + (e & 1);
          if (r < nrows && m < P.M) Y[static_cast<size_t>(m) * nrows + r] = acc[a][j][e];
        }
    return;
  }
  // Column slices: partial sums through shared memory, added in slice order.
  extern __shared__ float red[];  // [warp][a][j][e][lane]
#pragma unroll
  for (int a = 0; a < 2; a++)
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) red[(((warp * 2 + a) * NT + j) * 4 + e) * 32 + lane] = acc[a][j][e];
  __syncthreads();
  const int per_tile = 2 * NT * 4 * 32;
  for (int idx = threadIdx.x; idx < P.tiles_per_block * per_tile; idx += blockDim.x) {
    const int tl = idx / per_tile, rem = idx % per_tile;
    const int ln = rem % 32, e = (rem / 32) % 4, j = (rem / 128) % NT, a = rem / (128 * NT);
    const int gg = ln >> 2, tt = ln & 3;
    const int gt = blockIdx.x * P.tiles_per_block + tl;
    if (gt >= P.tile0[P.nseg]) continue;
    const int sg = seg_of(P, gt);
    const int rows_s = P.rows[sg];
    const int r = (gt - P.tile0[sg]) * 32 + 16 * a + gg + 8 * (e >> 1);
    const int m = 8 * j + 2 * tt + (e & 1);
    if (r >= rows_s || m >= P.M) continue;
    float s = 0.0f;
    for (int k = 0; k < P.ks; k++) s = __fadd_rn(s, red[((((tl * P.ks + k) * 2 + a) * NT + j) * 4 + e) * 32 + ln]);
    P.y[sg][static_cast<size_t>(m) * rows_s + r] = s;
  }
}

// ---- stream-K schedule ----------------------------------------------------------------------
// The work is the list of (tile, chunk) items in tile-major order, N = tiles * nchunks, split into
// W equal contiguous ranges, one per warp: warp w takes items [floor(w N / W), floor((w+1) N / W)).
// Every warp streams the same number of bytes (+-1 chunk) whatever the shape, so no SM waits on a
// last partial wave. W depends on the shape and the device only (never on M), so the pieces a tile
// is cut into, and with them the reduction order, are the same for every M: row-invariant.
//
// The loads and the arithmetic are the column-slice kernel's (gemv_skr_kernel below). A cp.async
// shared-memory pipeline (3-6 stages per warp) was tried and streamed at half the speed; see
// docs/experiments/cuda_kernels.md.
//
// A tile that one warp covers completely is written to y directly. A tile cut into pieces: each
// piece's sum goes to a scratch slot (slot 0 = the warp's first tile, 1 = its last), then a fence
// and a per-tile counter; the warp that arrives last adds the pieces in piece order (a fixed
// order, whoever arrives last), writes y and resets the counter for the next launch.
struct SkParams {
  const uint16_t* w[kTcMaxSeg];
  float* y[kTcMaxSeg];
  int rows[kTcMaxSeg];
  int tile0[kTcMaxSeg + 1];
  int nseg;
  const float* x;
  int cols, x_ld, M, nch;
  long long N;  // items
  int W;        // warps sharing the items
  float* part;  // [W][2][kSkSlotFloats]
  int* cnt;     // [tiles], zero between launches
};

__device__ __forceinline__ int sk_warp_of(long long i, long long N, int W) {
  return static_cast<int>(((i + 1) * W + N - 1) / N - 1);
}

template <int NT>
__device__ __forceinline__ void sk_write_y(const SkParams& P, int tile, int g, int t, const float (&v)[2][NT][4]) {
  const int seg = seg_of(P, tile);
  const int rows_s = P.rows[seg];
  const int row0 = (tile - P.tile0[seg]) * 32;
  float* Y = P.y[seg];
#pragma unroll
  for (int a = 0; a < 2; a++)
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int r = row0 + 16 * a + g + 8 * (e >> 1), m = 8 * j + 2 * t + (e & 1);
        if (r < rows_s && m < P.M) Y[static_cast<size_t>(m) * rows_s + r] = v[a][j][e];
      }
}

// End of a tile's piece (chunks cs..cc of tile ct): written directly when the piece is the whole
// tile, else through the scratch slot and the tile's arrival counter (the last piece adds all).
template <int NT>
__device__ __forceinline__ void sk_flush(const SkParams& P, int ct, int cs, int cc, int first_tile, int gw, int g,
                                         int t, int lane, const float (&acc)[2][NT][4]) {
  const int nch = P.nch;
  if (cs == 0 && cc == nch - 1) {
    sk_write_y<NT>(P, ct, g, t, acc);
  } else {
    float* slot = P.part + (static_cast<size_t>(gw) * 2 + (ct == first_tile ? 0 : 1)) * kSkSlotFloats;
#pragma unroll
    for (int a = 0; a < 2; a++)
#pragma unroll
      for (int j = 0; j < NT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) slot[((a * NT + j) * 4 + e) * 32 + lane] = acc[a][j][e];
    __threadfence();
    __syncwarp();
    int old = 0;
    if (lane == 0) old = atomicAdd(P.cnt + ct, 1);
    old = __shfl_sync(kFull, old, 0);
    const long long tb = static_cast<long long>(ct) * nch;
    const int wlo = sk_warp_of(tb, P.N, P.W), whi = sk_warp_of(tb + nch - 1, P.N, P.W);
    if (old == whi - wlo) {  // last piece in: add the pieces in piece order
      __threadfence();
      float sum[2][NT][4];
#pragma unroll
      for (int a = 0; a < 2; a++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
          for (int e = 0; e < 4; e++) sum[a][j][e] = 0.0f;
      for (int w = wlo; w <= whi; w++) {
        const int ft = static_cast<int>(static_cast<long long>(w) * P.N / P.W / nch);
        const float* sl = P.part + (static_cast<size_t>(w) * 2 + (ct == ft ? 0 : 1)) * kSkSlotFloats;
#pragma unroll
        for (int a = 0; a < 2; a++)
#pragma unroll
          for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
              sum[a][j][e] = __fadd_rn(sum[a][j][e], __ldcg(sl + ((a * NT + j) * 4 + e) * 32 + lane));
      }
      sk_write_y<NT>(P, ct, g, t, sum);
      if (lane == 0) P.cnt[ct] = 0;
    }
  }
}

// The stream-K split with the column-slice kernel's load path: weights straight into registers
// (ld.global.nc, L2 256-byte prefetch), the next chunk in flight while this one is multiplied,
// activations read per chunk. 8 warps per block. Same pieces, same flush as gemv_sk_kernel.
constexpr int kSkrWarps = 8;
template <int NT, bool TL>
__global__ void __launch_bounds__(kSkrWarps * 32, NT == 1 ? 2 : 1) gemv_skr_kernel(const SkParams P) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int gw = blockIdx.x * kSkrWarps + warp;
  if (gw >= P.W) return;
  const int nch = P.nch;
  const long long i0 = static_cast<long long>(gw) * P.N / P.W, i1 = static_cast<long long>(gw + 1) * P.N / P.W;
  bool xv[NT];
  const float* xp[NT];
#pragma unroll
  for (int j = 0; j < NT; j++) {
    xv[j] = j * 8 + g < P.M;
    xp[j] = P.x + static_cast<size_t>(xv[j] ? j * 8 + g : 0) * P.x_ld + 16 * t;
  }
  long long ip = i0;
  int pt = static_cast<int>(i0 / nch), pc = static_cast<int>(i0 - static_cast<long long>(pt) * nch);
  const char* pw[4];
  bool pv[4];
  auto set_rows = [&](int tile) {
    const int seg = seg_of(P, tile);
    if constexpr (TL) {  // pw[0]: the tile's contiguous run of 4 KB chunk blocks
      pw[0] = reinterpret_cast<const char*>(P.w[seg]) +
              static_cast<size_t>(tile - P.tile0[seg]) * nch * 4096 + lane * 16;
      return;
    }
    const int nrows = P.rows[seg];
    const int row0 = (tile - P.tile0[seg]) * 32;
    const char* base = reinterpret_cast<const char*>(P.w[seg]) + 32 * t;
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const int r = row0 + 16 * (i >> 1) + g + 8 * (i & 1);
      pv[i] = r < nrows;
      pw[i] = base + static_cast<size_t>(pv[i] ? r : 0) * P.cols * 2;
    }
  };
  set_rows(pt);
  const uint4 z4 = make_uint4(0u, 0u, 0u, 0u);
  auto load_w = [&](uint4 (&dst)[8]) {
    if constexpr (TL) {
      const char* p = pw[0] + static_cast<size_t>(pc) * 4096;
#pragma unroll
      for (int v = 0; v < 8; v++) dst[v] = ld_stream16(p + 512 * v);
    } else {
      const size_t wo = static_cast<size_t>(pc) * 128;
#pragma unroll
      for (int i = 0; i < 4; i++) {
        dst[2 * i] = pv[i] ? ld_stream16(pw[i] + wo) : z4;
        dst[2 * i + 1] = pv[i] ? ld_stream16(pw[i] + wo + 16) : z4;
      }
    }
    ip++;
    if (++pc == nch) {
      pc = 0;
      pt++;
      if (ip < i1) set_rows(pt);
    }
  };
  uint4 wcur[8], wnxt[8];
  if (ip < i1) load_w(wcur);  // weights never depend on an earlier kernel
  pdl_wait();
  pdl_trigger();

  float acc[2][NT][4];
#pragma unroll
  for (int a = 0; a < 2; a++)
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) acc[a][j][e] = 0.0f;
  int ct = static_cast<int>(i0 / nch), cc = static_cast<int>(i0 - static_cast<long long>(ct) * nch), cs = cc;
  const int first_tile = ct;
  for (long long i = i0; i < i1; i++) {
    if (ip < i1) load_w(wnxt);
    tc_chunk<NT>(wcur, xp, xv, cc * 64, acc);
    if (cc == nch - 1 || i == i1 - 1) {
      sk_flush<NT>(P, ct, cs, cc, first_tile, gw, g, t, lane, acc);
#pragma unroll
      for (int a = 0; a < 2; a++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
          for (int e = 0; e < 4; e++) acc[a][j][e] = 0.0f;
    }
    if (++cc == nch) {
      cc = 0;
      cs = 0;
      ct++;
    }
#pragma unroll
    for (int v = 0; v < 8; v++) wcur[v] = wnxt[v];
  }
}

// Schedules: 1 = column slices (the default), 2 = stream-K (gemv_skr_kernel), 3 = hybrid (stream-K
// where the slice grid is ragged and the stream-K ranges are long, slices elsewhere: shape-only).
constexpr int kSlicesSched = 1, kSkrSched = 2, kHybSched = 3;
constexpr int kDefaultSched = kSlicesSched;

template <int NT, bool TL>
void skr_launch(const SkParams& P, cudaStream_t st) {
  launch_k(gemv_skr_kernel<NT, TL>, dim3(static_cast<unsigned>((P.W + kSkrWarps - 1) / kSkrWarps)), dim3(kSkrWarps * 32), 0,
           st, P);
}

// The automatic schedule: QFLASH_GEMV=tc forces column slices; QFLASH_TC_SCHED=slices|skr|hyb
// picks one for A/B runs. Returns a sched index >= 1.
int auto_sched() {
  static const int m = [] {
    const char* e = std::getenv("QFLASH_GEMV");
    if (e && std::strcmp(e, "tc") == 0) return kSlicesSched;
    const char* n = std::getenv("QFLASH_TC_SCHED");
    if (n && *n) {
      for (int v = 1; v < gemv_tc_sched_count(); v++)
        if (std::strcmp(n, gemv_tc_sched_name(v)) == 0) return v;
      std::fprintf(stderr, "qflash: warning: QFLASH_TC_SCHED=%s is not a schedule (slices, skr, hyb); using the default\n", n);
    }
    return kDefaultSched;
  }();
  return m;
}

}  // namespace

namespace {
// One 16-byte vector of the tiled layout per thread: vector d is lane d % 32 of load (d / 32) % 8
// of chunk block d / 256 = tile * nch + chunk (see kernels.h); load v = 2i + h of lane (g, t)
// holds row tile * 32 + 16 (i / 2) + g + 8 (i % 2), columns chunk * 64 + 16 t + 8 h .. + 8, as
// gemv_tc_kernel's row-major loads do.
__global__ void tc_relayout_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst, int64_t rows, int64_t cols,
                                   int64_t nvec) {
  pdl_wait();  // no early trigger: the result is a weight (see device_common.cuh)
  const int64_t nch = cols / 64;
  for (int64_t d = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; d < nvec;
       d += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int lane = static_cast<int>(d & 31), v = static_cast<int>((d >> 5) & 7);
    const int64_t blk = d >> 8, ch = blk % nch, tile = blk / nch;
    const int i = v >> 1, h = v & 1, g = lane >> 2, t = lane & 3;
    const int64_t r = tile * 32 + 16 * (i >> 1) + g + 8 * (i & 1);
    const int64_t c = ch * 64 + 16 * t + 8 * h;
    dst[d] = r < rows ? src[(r * cols + c) / 8] : make_uint4(0u, 0u, 0u, 0u);
  }
}
}  // namespace

size_t gemv_tc_tiled_bytes(int64_t rows, int64_t cols) {
  return static_cast<size_t>((rows + 31) / 32) * 32 * static_cast<size_t>(cols) * 2;
}

void gemv_tc_relayout(const void* src, void* dst, int64_t rows, int64_t cols, cudaStream_t st) {
  if (rows <= 0 || cols <= 0 || cols % 64 != 0 || (reinterpret_cast<uintptr_t>(src) & 15) || (reinterpret_cast<uintptr_t>(dst) & 15))
    backend_fail("cuda gemv relayout: %lld x %lld (cols must be a multiple of 64, buffers 16-byte aligned)",
                 (long long)rows, (long long)cols);
  const int64_t nvec = static_cast<int64_t>(gemv_tc_tiled_bytes(rows, cols) / 16);
  const int64_t blocks = std::min<int64_t>((nvec + 255) / 256, 132 * 32);
  launch_k(tc_relayout_kernel, dim3(static_cast<unsigned>(blocks)), dim3(256), 0, st, static_cast<const uint4*>(src),
           static_cast<uint4*>(dst), rows, cols, nvec);
  QF_CUDA_LAUNCH_CHECK("tc_relayout_kernel");
}

bool gemv_tc_eligible(const WeightRef& W) {
  return W.dtype == DType::BF16 && W.cols % 64 == 0 && (reinterpret_cast<uintptr_t>(W.data) & 15) == 0 &&
         W.rows > 0 && W.rows < (1 << 30) && W.cols < (1 << 30);
}

// Column slices from the shape alone (never from M): the smallest ks in {1, 2, 4, 8} that keeps at
// least 8 chunks per slice and fills the last wave of blocks best. A wave is kTcConcurrentBlocks
// blocks (132 SMs x 2 resident 8-warp blocks on the H200; a constant, so the choice is the same on
// every device and for every M).
constexpr int kTcConcurrentBlocks = 264;
int gemv_tc_slices(int64_t tiles, int64_t cols) {
  const int64_t nch = cols / 64;
  int best = 1;
  double best_eff = -1;
  for (int ks = 1; ks <= kTcWarps; ks *= 2) {
    if (ks > 1 && nch < 8 * ks) break;
    const double blocks = std::ceil(static_cast<double>(tiles) * ks / kTcWarps);
    const double waves = blocks / kTcConcurrentBlocks;
    const double eff = waves / std::ceil(waves);
    if (eff > best_eff + 0.02) {
      best = ks;
      best_eff = eff;
    }
  }
  return best;
}

void gemv_scratch_create(GemvScratch& s) {
  gemv_scratch_destroy(s);
  int dev = 0, sms = 0;
  QF_CUDA_CHECK(cudaGetDevice(&dev));
  QF_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  int nb = 0;
  QF_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, gemv_skr_kernel<1, false>, kSkrWarps * 32, 0));
  const int maxw = (nb > 0 ? nb : 1) * kSkrWarps * sms;
  s.warps = maxw;
  s.max_warps = maxw;
  s.max_tiles = 1 << 17;
  const size_t pb = static_cast<size_t>(maxw) * 2 * kSkSlotFloats * sizeof(float);
  const size_t cb = static_cast<size_t>(s.max_tiles) * sizeof(int);
  void* p = nullptr;
  void* c = nullptr;
  if (cudaMalloc(&p, pb) != cudaSuccess || cudaMalloc(&c, cb) != cudaSuccess) {
    cudaGetLastError();
    if (p) cudaFree(p);
    backend_fail("cuda matmul: cannot allocate the GEMV scratch (%.1f MB)", (pb + cb) / 1e6);
  }
  s.part = static_cast<float*>(p);
  s.cnt = static_cast<int*>(c);
  QF_CUDA_CHECK(cudaMemset(s.cnt, 0, cb));
  QF_CUDA_CHECK(cudaDeviceSynchronize());
}

void gemv_scratch_destroy(GemvScratch& s) noexcept {
  if (s.part) cudaFree(s.part);
  if (s.cnt) cudaFree(s.cnt);
  s = GemvScratch{};
}

int gemv_tc_sched_count() { return 4; }
const char* gemv_tc_sched_name(int v) {
  static const char* const names[] = {"auto", "slices", "skr", "hyb"};
  return v >= 0 && v < 4 ? names[v] : "?";
}

// A stream-K warp gets at least this many chunks (a shorter range is mostly pipeline fill).
constexpr long long kSkMinItems = 8;

void gemv_tc_group(const WeightRef* const* Ws, float* const* ys, int n, const float* x, int x_ld, int M,
                   cudaStream_t st, const GemvScratch* sc, int sched, int force_ks) {
  if (n < 1 || n > kTcMaxSeg) backend_fail("cuda matmul (tc): %d weights in one group (1..%d)", n, kTcMaxSeg);
  if (sched < 0 || sched >= gemv_tc_sched_count()) backend_fail("cuda matmul (tc): no schedule %d", sched);
  int64_t tiles = 0;
  const bool tiled = Ws[0]->layout == WeightRef::kTc32x64;
  for (int i = 0; i < n; i++) {
    if (Ws[i]->cols != Ws[0]->cols) backend_fail("cuda matmul (tc): grouped weights differ in cols");
    if (Ws[i]->layout != Ws[0]->layout) backend_fail("cuda matmul (tc): grouped weights differ in layout");
    tiles += (Ws[i]->rows + 31) / 32;
  }
  int mode = sched;
  if (mode == 0) mode = sc && sc->part && tiles <= sc->max_tiles ? auto_sched() : 1;
  if (mode == kHybSched) {
    // Shape-only choice: the register stream-K kernel where the column-slice grid fills its last
    // wave of blocks badly (< 90%) and every stream-K warp still gets a long range (>= 16
    // chunks, so its pipeline start is amortised); column slices everywhere else.
    const long long items = tiles * (Ws[0]->cols / 64);
    const int ks = gemv_tc_slices(tiles, Ws[0]->cols);
    const double waves = std::ceil(static_cast<double>(tiles) * ks / kTcWarps) / kTcConcurrentBlocks;
    const bool ragged = waves / std::ceil(waves) < 0.9;
    mode = sc && sc->part && tiles <= sc->max_tiles && ragged && items >= 16LL * sc->warps ? kSkrSched : kSlicesSched;
  }
  if (mode >= 2 && (!sc || !sc->part || tiles > sc->max_tiles))
    backend_fail("cuda matmul (tc): stream-K schedule without a scratch for %lld tiles", (long long)tiles);
  // Profiler tag (qflash bench --profile): the shape, the rows and the schedule of each launch.
  auto tag = [&](int mg) {
    if (!prof_on()) return;
    std::string r;
    for (int i = 0; i < n; i++) r += fmt_str(i ? "+%lld" : "%lld", (long long)Ws[i]->rows);
    prof_tag("%s x %lld, M=%d, %s%s", r.c_str(), (long long)Ws[0]->cols, mg, gemv_tc_sched_name(mode),
             tiled ? ", tiled" : "");
  };

  if (mode == kSkrSched) {
    SkParams P{};
    P.nseg = n;
    P.cols = static_cast<int>(Ws[0]->cols);
    P.x_ld = x_ld;
    int64_t t0 = 0;
    for (int i = 0; i < n; i++) {
      P.w[i] = static_cast<const uint16_t*>(Ws[i]->data);
      P.rows[i] = static_cast<int>(Ws[i]->rows);
      P.tile0[i] = static_cast<int>(t0);
      t0 += (Ws[i]->rows + 31) / 32;
    }
    P.tile0[n] = static_cast<int>(tiles);
    P.nch = P.cols / 64;
    P.N = static_cast<long long>(tiles) * P.nch;
    long long W = P.N / kSkMinItems;
    if (W < 1) W = 1;
    if (W > sc->warps) W = sc->warps;
    P.W = static_cast<int>(W);
    P.part = sc->part;
    P.cnt = sc->cnt;
    for (int g0 = 0; g0 < M; g0 += 16) {
      const int mg = M - g0 < 16 ? M - g0 : 16;
      P.M = mg;
      P.x = x + static_cast<size_t>(g0) * x_ld;
      for (int i = 0; i < n; i++) P.y[i] = ys[i] + static_cast<size_t>(g0) * Ws[i]->rows;
      tag(mg);
      if (mg <= 8)
        tiled ? skr_launch<1, true>(P, st) : skr_launch<1, false>(P, st);
      else
        tiled ? skr_launch<2, true>(P, st) : skr_launch<2, false>(P, st);
      QF_CUDA_LAUNCH_CHECK("gemv_skr_kernel");
    }
    return;
  }

  TcParams P{};
  P.nseg = n;
  P.cols = static_cast<int>(Ws[0]->cols);
  P.x_ld = x_ld;
  for (int i = 0, t0 = 0; i < n; i++) {
    P.w[i] = static_cast<const uint16_t*>(Ws[i]->data);
    P.rows[i] = static_cast<int>(Ws[i]->rows);
    P.tile0[i] = t0;
    t0 += static_cast<int>((Ws[i]->rows + 31) / 32);
  }
  P.tile0[n] = static_cast<int>(tiles);
  P.ks = force_ks > 0 ? force_ks : gemv_tc_slices(tiles, P.cols);
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

void gemv_tc(const WeightRef& W, const float* x, int x_ld, float* y, int M, cudaStream_t st, const GemvScratch* sc,
             int sched, int force_ks) {
  const WeightRef* ws[1] = {&W};
  float* ys[1] = {y};
  gemv_tc_group(ws, ys, 1, x, x_ld, M, st, sc, sched, force_ks);
}

}  // namespace qf::cuda
