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
// (a fixed permutation of the columns inside each 64-column chunk), the chunk order, the
// column-slice reduction and the cross-block split (tc_split_blocks) depend on the matrix shape
// only. So token m's result is bit-identical for every M: decode (M = 1, seven zero columns) and
// verify (M = k + 1) agree bit for bit.
//
// Cross-block split (matrices with too few 32-row tiles to fill the GPU, e.g. the drafter's
// 1280 x 5120 conv kernel projection: 40 tiles, 40 blocks on 132 SMs). The blocks of a tile group
// (the tiles one block serves) are split further by columns: block cb of nsplit sums its chunks
// exactly as a block of the plain grid sums its own (warps' slices, added in slice order), stores
// that partial to a scratch slot, and the last of the group's blocks to arrive (an atomic ticket
// per group) adds the nsplit slots in block order 0, 1, .. into y. The order is fixed whichever
// block arrives last: deterministic and, the split being a function of the shape, row-invariant.
//
// Geometry. A warp owns 32 weight rows (two 16-row A tiles) and one column slice. Lane (g, t),
// g = lane / 4, t = lane % 4, reads 16 bytes twice from rows g, g + 8, g + 16, g + 24 of its
// tile at columns [c + 16 t, c + 16 t + 16) of each 64-column chunk c; MMA step s (0..3) of the
// chunk uses words 2s, 2s + 1 of those 8 words, i.e. logical k-pair t <- columns 16t + 4s + {0,1}
// and logical k-pair t + 4 <- columns 16t + 4s + {2,3}. The B fragment for token g uses the same
// mapping, so the permutation cancels in the dot product.
#pragma once
#include <algorithm>

#include "backend/cuda/device_common.cuh"
#include "backend/cuda/kernels.h"

namespace qf::cuda {

namespace {

constexpr int kTcWarps = 8;  // warps per block

constexpr int kTcMaxSeg = 4;  // weights sharing one launch (same x, same cols)

// The cross-block split's scratch (gemv_tc_scratch_bytes): kTcTickets arrival tickets (ints,
// zero between launches), then the partial slots, one per (column block, tile) of 16 tokens x 32
// rows. The split keeps nsplit * blocks <= kTcConcurrentBlocks and a block serves <= kTcWarps
// tiles, so nsplit * tiles <= kTcConcurrentBlocks * kTcWarps slots, and its tile groups (blocks of
// the plain grid) number < kTcConcurrentBlocks / 2 < kTcTickets.
constexpr int kTcTickets = 1024;
constexpr int kTcSlotFloats = 16 * 32;
constexpr size_t kTcScratchBytes =
    kTcTickets * sizeof(int) + static_cast<size_t>(kTcConcurrentBlocks) * kTcWarps * kTcSlotFloats * sizeof(float);
// A warp's slice under the split keeps at least this many 64-column chunks (its double buffer).
constexpr int kTcSplitMinChunks = 2;

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
  // Cross-block split (gemv_tc_kernel<.., XS = true>): nsplit blocks share each tile group's
  // columns; ticket[group] counts their arrivals, part holds their partial sums.
  int nsplit;
  int* ticket;
  float* part;  // [nsplit][tiles][16 tokens][32 rows]
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

// The cross-block split's end for tile group tg: this block's partial is in its slots. The last
// of the group's P.nsplit blocks to arrive adds every block's slot in block order (whichever block
// that is: a fixed order), writes y and resets the group's ticket for the next launch. The slots
// of other blocks are read through L2 (__ldcg) after the fence that follows the ticket.
template <int MaxSeg, class Params>
__device__ __forceinline__ void tc_split_finish(const Params& P, int tg) {
  __shared__ int last;
  __threadfence();  // this thread's slot stores, before the block's arrival
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(P.ticket + tg, 1) == P.nsplit - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  const int ntiles = P.tile0[P.nseg], per_tile = 32 * P.M;
  const size_t stride = static_cast<size_t>(ntiles) * kTcSlotFloats;  // from one block's slots to the next's
  for (int idx = threadIdx.x; idx < P.tiles_per_block * per_tile; idx += blockDim.x) {
    const int gt = tg * P.tiles_per_block + idx / per_tile, m = idx % per_tile / 32, rt = idx % 32;
    if (gt >= ntiles) continue;
    const int sg = tc_seg_of<MaxSeg>(P, gt), r = (gt - P.tile0[sg]) * 32 + rt;
    if (r >= P.rows[sg]) continue;
    const float* p = P.part + static_cast<size_t>(gt) * kTcSlotFloats + m * 32 + rt;
    float s = 0.0f;
    for (int b = 0; b < P.nsplit; b++) s = __fadd_rn(s, __ldcg(p + b * stride));
    P.y[sg][static_cast<size_t>(m) * P.rows[sg] + r] = s;
  }
  if (threadIdx.x == 0) P.ticket[tg] = 0;
}

// TL: the weights are in the tiled layout (gemv_tc_relayout) instead of row-major. XS: the
// cross-block split (P.nsplit > 1: block b serves tile group b / nsplit, column block b % nsplit);
// without it, block b is tile group b and its slices are the plain grid's, as before the split.
template <int NT, bool TL, bool XS>
__global__ void __launch_bounds__(kTcWarps * 32) gemv_tc_kernel(const TcParams P) {
  pdl_trigger();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int slice = warp % P.ks, rl = warp / P.ks;
  const int tg = XS ? static_cast<int>(blockIdx.x) / P.nsplit : static_cast<int>(blockIdx.x);
  const int gtile = tg * P.tiles_per_block + rl;
  const int seg = tc_seg_of<kTcMaxSeg>(P, gtile);
  const int nrows = gtile < P.tile0[P.nseg] ? P.rows[seg] : 0;  // tiles past the end: no rows
  const uint16_t* W = P.w[seg];
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

  // Chunks [ch0, ch1): slice `slice` of cps chunks; under the split, slice cb * ks + slice of the
  // ks * nsplit slices, as even as can be (floor(s n / S) .. floor((s + 1) n / S)).
  int ch0, ch1;
  if constexpr (XS) {
    const int64_t ns = static_cast<int64_t>(P.ks) * P.nsplit, s = (blockIdx.x % P.nsplit) * P.ks + slice;
    ch0 = static_cast<int>(s * P.nchunks / ns);
    ch1 = static_cast<int>((s + 1) * P.nchunks / ns);
  } else {
    ch0 = slice * P.cps;
    ch1 = min(ch0 + P.cps, P.nchunks);
  }
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

  if constexpr (XS) {
    // This block's sums (slices added in slice order, as tc_store_y adds them) to its slots.
    float* part = P.part + static_cast<size_t>(blockIdx.x % P.nsplit) * P.tile0[P.nseg] * kTcSlotFloats;
    tc_reduce_block<NT, kTcMaxSeg>(P, acc, tg * P.tiles_per_block, seg, row0, nrows, warp, lane, g, t,
                                   [&](int sg, int r, int m, float v) {
                                     part[static_cast<size_t>(P.tile0[sg] + (r >> 5)) * kTcSlotFloats + m * 32 +
                                          (r & 31)] = v;
                                   });
    tc_split_finish<kTcMaxSeg>(P, tg);
  } else {
    tc_store_y<NT, kTcMaxSeg>(P, acc, seg, row0, nrows, warp, lane, g, t);
  }
}

// Column blocks per tile group of the cross-block split, from the shape alone (never from M):
// tiles (32-row tiles of the group), nchunks (64-column chunks), ks (column slices per block,
// tc_column_slices). 1, the plain grid, where that grid has more than kTcConcurrentBlocks / 2 =
// 132 blocks (a block for every SM of an H100 / H200 already): every matrix of the 27B target
// (>= 160 tiles: 5120+ rows, >= 160 blocks) and the drafter's fc, q|k|v, o, gate|up, down and
// head keep the schedule and the bits they had before the split. Else the most blocks that keep
// the grid within one wave (kTcConcurrentBlocks) and every warp's slice >= kTcSplitMinChunks
// chunks; e.g. 1280 x 5120 (40 tiles, ks 8): 40 -> 200 blocks of 2 chunks a warp.
inline int tc_split_blocks(int64_t tiles, int64_t nchunks, int ks) {
  const int64_t blocks = (tiles * ks + kTcWarps - 1) / kTcWarps;
  if (2 * blocks > kTcConcurrentBlocks) return 1;
  const int64_t s = std::min<int64_t>(kTcConcurrentBlocks / blocks, nchunks / (static_cast<int64_t>(ks) * kTcSplitMinChunks));
  return s > 1 ? static_cast<int>(s) : 1;
}

// One launch of gemv_tc_kernel<NT, ..> in the layout and split asked for.
template <int NT>
void tc_launch(bool tiled, bool xs, unsigned grid, cudaStream_t st, const TcParams& P) {
  const size_t smem = P.ks > 1 ? static_cast<size_t>(kTcWarps) * 2 * NT * 4 * 32 * sizeof(float) : 0;
  auto* k = tiled ? (xs ? gemv_tc_kernel<NT, true, true> : gemv_tc_kernel<NT, true, false>)
                  : (xs ? gemv_tc_kernel<NT, false, true> : gemv_tc_kernel<NT, false, false>);
  launch_k(k, dim3(grid), dim3(kTcWarps * 32), smem, st, P);
}

// The column-slice launches of up to kTcMaxSeg weights with the same cols (tiles: their 32-row
// tiles together), in passes of 16 token rows; ks column slices (1, 2, 4 or 8), nsplit column
// blocks per tile group (1: no cross-block split; else scratch: kTcScratchBytes, its tickets
// zero). gemv_tc_group passes gemv_tc_slices(tiles, cols) and tc_split_blocks; the kernel lab
// forces others. tag(mg) runs before each launch.
template <class Tag>
void tc_slices_run(const WeightRef* const* Ws, float* const* ys, int n, const float* x, int x_ld, int M, int64_t tiles,
                   int ks, int nsplit, void* scratch, bool tiled, cudaStream_t st, Tag&& tag) {
  TcParams P{};
  tc_fill_segments<uint16_t>(P, Ws, n, x_ld, tiles);
  P.ks = ks;
  if (P.ks != 1 && P.ks != 2 && P.ks != 4 && P.ks != 8) backend_fail("cuda matmul (tc): column slices %d not in {1,2,4,8}", P.ks);
  P.nchunks = P.cols / 64;
  P.cps = (P.nchunks + P.ks - 1) / P.ks;
  P.tiles_per_block = kTcWarps / P.ks;
  const int64_t groups = (tiles + P.tiles_per_block - 1) / P.tiles_per_block;
  P.nsplit = nsplit;
  if (nsplit > 1) {
    if (!scratch || groups > kTcTickets || nsplit > P.nchunks ||
        kTcTickets * sizeof(int) + static_cast<size_t>(nsplit) * tiles * kTcSlotFloats * sizeof(float) > kTcScratchBytes)
      backend_fail("cuda matmul (tc): a %lld-tile split over %d blocks needs the GEMV scratch (%zu bytes%s)",
                   (long long)tiles, nsplit, kTcScratchBytes, scratch ? ", too small" : ", none given");
    P.ticket = static_cast<int*>(scratch);
    P.part = reinterpret_cast<float*>(static_cast<char*>(scratch) + kTcTickets * sizeof(int));
  }
  const unsigned grid = static_cast<unsigned>(groups * nsplit);
  for (int g0 = 0; g0 < M; g0 += 16) {
    const int mg = M - g0 < 16 ? M - g0 : 16;
    P.M = mg;
    P.x = x + static_cast<size_t>(g0) * x_ld;
    for (int i = 0; i < n; i++) P.y[i] = ys[i] + static_cast<size_t>(g0) * Ws[i]->rows;
    tag(mg);
    if (mg <= 8)
      tc_launch<1>(tiled, nsplit > 1, grid, st, P);
    else
      tc_launch<2>(tiled, nsplit > 1, grid, st, P);
    QF_CUDA_LAUNCH_CHECK("gemv_tc_kernel");
  }
}

}  // namespace

}  // namespace qf::cuda
