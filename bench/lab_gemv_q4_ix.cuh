// Kernel lab, int4 GEMV version 21 "ix" (bench/lab_gemv_q4.cu): exact integer group products on
// the int8 tensor cores. Lab only: nothing here is compiled into the backend.
//
// Why a new arithmetic. Runs 33-37 (docs/experiments/cuda_kernels.md) left production's kernel at
// 30-66% of the copy ceiling with ~280 instructions per 1,152-byte unit, and every schedule change
// that kept its bits lost. Its bits are a constraint because identity (plain == speculative) needs
// a row's result to be the same whatever M is, and its fp32 tensor-core sums of bf16 pieces depend
// on how the work is cut. This version makes the group's inner product exact, so its order stops
// mattering:
//   - x is written, per token and group of 64 columns, in fixed point: e = the exponent of the
//     group's max |x| (frexp), raised by one if that max would round above 2^23 - 2^16;
//     X = rint(x 2^(23 - e)), an integer with |X| <= 2^23 - 2^16, and X = 2^16 h + 2^8 m + l with
//     balanced digits h, m, l in [-128, 127] (l = sext8(X), m = sext8((X - l) / 2^8), h = the
//     rest). The error is <= 2^(e - 24), i.e. <= ~2^-23 of the group's max |x|.
//   - the tensor core (mma.sync m16n8k32 s8 x s8 -> s32) forms H = sum q h, M = sum q m,
//     L = sum q l over the group's 64 columns (q = the nibble, 0..15): exact integers
//     (|H| <= 64 * 15 * 128), whatever the order of the k-slots, the MMA or the warp.
//   - the fold per row, token and group: qd = fl(fl(M 2^8 + L) + H 2^16) (one fma; two roundings at
//     most), y_part = fma(scale, qd * 2^(e - 23), bias * xs) with xs = fl(sum X) 2^(e - 23) (the
//     exact integer sum of the group's X, rounded once), added into the row's accumulator in group
//     order within the warp's column slice; slices added in slice order into +0 (shared memory).
//     Every step is a function of the token's own data and of the shape, so every row has the same
//     bits for every M (row-invariance by construction, which the lab checks).
// Layout. Nibbles stay row-major (mlx: word w of a row holds columns 8w..8w+7, nibble j at bits
// 4j). Thread (g, t) of a warp (g = lane / 4, t = lane % 4) loads 8 bytes per row and group:
// columns 16t..16t+15 of the group (2 words) for rows g, g+8, g+16, g+24 of the warp's 32-row tile.
// w & 0x0F0F0F0F holds the even nibbles of a word as 4 bytes, (w >> 4) & 0x0F0F0F0F the odd ones:
// these are the A fragments (a0 / a1 = rows g / g+8, k-slots 4t..4t+3 = even columns of word j;
// a2 / a3 = odd columns), one MMA per word j, two per group into the same s32 accumulator. The x
// digits are written by the prep kernel in the matching order (per token, group and digit: 64
// bytes, thread t's 16 = word j = 0, 1 x (even, odd) x 4 bytes), so the B fragment of a digit is
// one 16-byte load; tokens are the 8 n-columns (two token tiles for M 9..16). Scales and biases
// are packed per 32-row tile and group as one uint4 per g (rows g + 8i, scale | bias << 16).
// Column split S (1, 2, 4, 8 slices over 8-warp blocks) from the shape only: the smallest power of
// two that gives >= 1,900 warps, at most 8 and at most the group count.
#pragma once
#include <cmath>
#include <cstdint>
#include <stdexcept>

#include "backend/cuda/device_common.cuh"
#include "lab_gemv_q4_more.cuh"  // ld_stream8 (ld_stream16: device_common.cuh)

namespace qf::cuda {
namespace {

constexpr int kIxMaxW = 4;  // weights per call (gate|up, q|k|v, the GDN input: <= 4)

struct Q4IxParams {
  const uint32_t* q[kIxMaxW];
  const uint4* sb[kIxMaxW];
  float* y[kIxMaxW];
  int64_t rows[kIxMaxW];
  int tile0[kIxMaxW + 1];  // first tile of each weight; tile0[n] = all tiles
  int n, cols, ng, S, M;
  const uint4* xq;    // [16 tokens][ng][3 digits][4 t] x 16 bytes
  const float4* xsp;  // [ng][8]: tokens 2i, 2i + 1 as (xs, pow2, xs, pow2)
};

__device__ __forceinline__ void ix_mma(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                       uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
  (void)c, (void)a0, (void)a1, (void)a2, (void)a3, (void)b0, (void)b1;
  __trap();
#endif
}

// One warp per (token, group): the fixed-point digits of 64 activations and the group's
// (xs, pow2). Lane l holds columns 2l, 2l + 1 = column 16t + 8j + 2i + h with t = l / 8,
// j = (l / 4) % 2, i = l % 4, h = 0, 1: byte t 16 + j 8 + h 4 + i of each digit's 64 bytes.
__global__ void q4ix_prep_kernel(const float* __restrict__ x, int x_ld, int M, int ng, uint8_t* __restrict__ xq,
                                 float* __restrict__ xsp) {
  pdl_wait();
  const int lane = threadIdx.x & 31;
  const int wid = blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (wid >= M * ng) return;
  const int tok = wid / ng, gi = wid % ng;
  const float2 v = *reinterpret_cast<const float2*>(x + static_cast<int64_t>(tok) * x_ld + gi * 64 + 2 * lane);
  float mx = fmaxf(fabsf(v.x), fabsf(v.y));
#pragma unroll
  for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  int X0 = 0, X1 = 0;
  float pow2 = 1.0f;
  if (mx > 0.0f) {
    int e;
    frexpf(mx, &e);
    if (rintf(ldexpf(mx, 23 - e)) > 8323072.0f) e += 1;  // 2^23 - 2^16: keeps the top digit in [-127, 127]
    X0 = static_cast<int>(rintf(ldexpf(v.x, 23 - e)));
    X1 = static_cast<int>(rintf(ldexpf(v.y, 23 - e)));
    pow2 = ldexpf(1.0f, e - 23);
  }
  int sum = X0 + X1;
#pragma unroll
  for (int o = 16; o; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  const int t = lane >> 3, j = (lane >> 2) & 1, i = lane & 3;
  uint8_t* base = xq + (static_cast<int64_t>(tok) * ng + gi) * 3 * 64 + t * 16 + j * 8 + i;
  const int Xs[2] = {X0, X1};
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const int X = Xs[h];
    const int l = static_cast<int8_t>(X & 0xFF);
    const int r1 = (X - l) >> 8;
    const int m = static_cast<int8_t>(r1 & 0xFF);
    const int hi = (r1 - m) >> 8;
    base[0 * 64 + h * 4] = static_cast<uint8_t>(hi);
    base[1 * 64 + h * 4] = static_cast<uint8_t>(m);
    base[2 * 64 + h * 4] = static_cast<uint8_t>(l);
  }
  if (lane == 0) {
    xsp[(static_cast<int64_t>(gi) * 16 + tok) * 2 + 0] = static_cast<float>(sum) * pow2;
    xsp[(static_cast<int64_t>(gi) * 16 + tok) * 2 + 1] = pow2;
  }
}

// Scales and biases of a row-major int4 weight packed per 32-row tile and group: uint4 (g) holds
// rows 32 tile + g + 8i (i = 0..3) as scale | bias << 16; rows past the end are 0.
__global__ void q4ix_pack_sb_kernel(const uint16_t* __restrict__ sc, const uint16_t* __restrict__ bi,
                                    uint4* __restrict__ dst, int64_t rows, int ng, int64_t n) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int g = static_cast<int>(k % 8);
    const int gi = static_cast<int>((k / 8) % ng);
    const int64_t tile = k / (8 * static_cast<int64_t>(ng));
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const int64_t r = tile * 32 + g + 8 * i;
      w[i] = r < rows ? static_cast<uint32_t>(sc[r * ng + gi]) | (static_cast<uint32_t>(bi[r * ng + gi]) << 16) : 0u;
    }
    dst[k] = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// Row-major nibbles -> the tiled order of version 22: for each 32-row tile and group, 1 KB =
// [half h][lane (g, t)] x 16 bytes: words 2t, 2t + 1 of the group for row 32 tile + g + 16h, then
// for row + 8 (rows past the end: 0). One thread per 16-byte vector.
__global__ void q4ix_tile_kernel(const uint32_t* __restrict__ q, uint4* __restrict__ dst, int64_t rows, int64_t cols,
                                 int64_t n) {
  const int64_t wpr = cols / 8, ng = cols / 64;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int lane = static_cast<int>(k % 32), h = static_cast<int>((k / 32) % 2);
    const int64_t gi = (k / 64) % ng, tile = k / (64 * ng);
    const int g = lane >> 2, t = lane & 3;
    const int64_t ra = tile * 32 + g + 16 * h, rb2 = ra + 8;
    const int64_t c = gi * 8 + 2 * t;
    uint32_t w[4] = {0u, 0u, 0u, 0u};
    if (ra < rows) w[0] = q[ra * wpr + c], w[1] = q[ra * wpr + c + 1];
    if (rb2 < rows) w[2] = q[rb2 * wpr + c], w[3] = q[rb2 * wpr + c + 1];
    dst[k] = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

template <int NT, bool TILED>
__global__ void __launch_bounds__(256, NT == 1 ? 2 : 1) q4ix_kernel(const Q4IxParams P) {
  constexpr int D = NT == 1 ? 4 : 3;  // groups in flight per warp
  __shared__ float red[8][32][16];
  pdl_wait();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int S = P.S, TPB = 8 / S;
  const int tile = blockIdx.x * TPB + warp / S, slice = warp % S;
  const bool live = tile < P.tile0[P.n];
  int wi = 0;
  while (wi + 1 < P.n && tile >= P.tile0[wi + 1]) wi++;
  const int lt = tile - P.tile0[wi];
  const int64_t rows = P.rows[wi];
  const int ng = P.ng, M = P.M;
  const int gs = slice * ng / S, ge = (slice + 1) * ng / S;
  float acc[NT][2][2][2];
#pragma unroll
  for (int a = 0; a < NT; a++)
#pragma unroll
    for (int b = 0; b < 8; b++) (&acc[a][0][0][0])[b] = 0.0f;
  if (live) {
    // Row g + 8i of the tile, columns 16t.. of group gi: rb[i * rstride + 4 gi] (8-byte units).
    const int64_t r0 = static_cast<int64_t>(lt) * 32 + g;
    const uint2* rb = reinterpret_cast<const uint2*>(P.q[wi] + (r0 < rows ? r0 : 0) * (P.cols / 8)) + t;
    const int rstride = P.cols / 2;
    unsigned rok = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) rok |= (r0 + 8 * i < rows ? 1u : 0u) << i;
    const uint4* sbp = P.sb[wi] + static_cast<int64_t>(lt) * ng * 8 + g;
    // Tiled: [tile][group][half h][lane] x 16 bytes = rows g + 16h (8 bytes) and g + 16h + 8.
    const uint4* tb = reinterpret_cast<const uint4*>(P.q[wi]) + static_cast<int64_t>(lt) * ng * 64 + lane;
    uint2 W[D][4];
    uint4 SB[D];
    auto load = [&](uint2 (&w)[4], uint4& sbv, int gi) {
      if constexpr (TILED) {
        const uint4 u0 = ld_stream16(tb + gi * 64), u1 = ld_stream16(tb + gi * 64 + 32);
        w[0] = make_uint2(u0.x, u0.y);
        w[1] = make_uint2(u0.z, u0.w);
        w[2] = make_uint2(u1.x, u1.y);
        w[3] = make_uint2(u1.z, u1.w);
      } else {
#pragma unroll
        for (int i = 0; i < 4; i++) w[i] = (rok >> i) & 1u ? ld_stream8(rb + i * rstride + gi * 4) : make_uint2(0u, 0u);
      }
      sbv = ld_stream16(sbp + gi * 8);
    };
#pragma unroll
    for (int s = 0; s < D; s++)
      if (gs + s < ge) load(W[s], SB[s], gs + s);
    for (int gb = gs; gb < ge; gb += D) {
#pragma unroll
      for (int s = 0; s < D; s++) {
        const int gi = gb + s;
        if (gi < ge) {
          uint2 w[4];
#pragma unroll
          for (int i = 0; i < 4; i++) w[i] = W[s][i];
          const uint4 sb = SB[s];
          if (gi + D < ge) load(W[s], SB[s], gi + D);
          // x digits (B fragments) and (xs, pow2) of this thread's tokens.
          uint4 xb[NT][3];
          float4 xp[NT];
#pragma unroll
          for (int tt = 0; tt < NT; tt++) {
            const int tok = tt * 8 + g;
#pragma unroll
            for (int d = 0; d < 3; d++)
              xb[tt][d] = tok < M ? __ldg(P.xq + ((static_cast<int64_t>(tok) * ng + gi) * 3 + d) * 4 + t)
                                  : make_uint4(0u, 0u, 0u, 0u);
            xp[tt] = __ldg(P.xsp + static_cast<int64_t>(gi) * 8 + tt * 4 + t);
          }
          // A fragments: even / odd nibbles of word j of rows g + 8i.
          uint32_t ev[4][2], od[4][2];
#pragma unroll
          for (int i = 0; i < 4; i++) {
            const uint32_t wj[2] = {w[i].x, w[i].y};
#pragma unroll
            for (int j = 0; j < 2; j++) {
              ev[i][j] = wj[j] & 0x0F0F0F0Fu;
              od[i][j] = (wj[j] >> 4) & 0x0F0F0F0Fu;
            }
          }
          const uint32_t sbw[4] = {sb.x, sb.y, sb.z, sb.w};
#pragma unroll
          for (int tt = 0; tt < NT; tt++) {
#pragma unroll
            for (int mt = 0; mt < 2; mt++) {
              int c[3][4];
#pragma unroll
              for (int d = 0; d < 3; d++) {
                const uint32_t bx[4] = {xb[tt][d].x, xb[tt][d].y, xb[tt][d].z, xb[tt][d].w};
#pragma unroll
                for (int k = 0; k < 4; k++) c[d][k] = 0;
#pragma unroll
                for (int j = 0; j < 2; j++)
                  ix_mma(c[d], ev[2 * mt][j], ev[2 * mt + 1][j], od[2 * mt][j], od[2 * mt + 1][j], bx[2 * j], bx[2 * j + 1]);
              }
#pragma unroll
              for (int h = 0; h < 2; h++) {
                const uint32_t sw = sbw[2 * mt + h];
                const float scale = __uint_as_float(sw << 16), bias = __uint_as_float(sw & 0xFFFF0000u);
#pragma unroll
                for (int cc = 0; cc < 2; cc++) {
                  if (tt * 8 + 2 * t + cc < M) {
                    const int k = 2 * h + cc;
                    const float low = static_cast<float>(c[1][k] * 256 + c[2][k]);
                    const float qd = fmaf(static_cast<float>(c[0][k]), 65536.0f, low);
                    const float xs = cc ? xp[tt].z : xp[tt].x, p2 = cc ? xp[tt].w : xp[tt].y;
                    acc[tt][mt][h][cc] += fmaf(scale, qd * p2, bias * xs);
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  // Partial sums of the warp's slice -> shared memory; slices added in slice order into +0.
#pragma unroll
  for (int tt = 0; tt < NT; tt++)
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
      for (int h = 0; h < 2; h++)
#pragma unroll
        for (int cc = 0; cc < 2; cc++) {
          const int tok = tt * 8 + 2 * t + cc;
          if (tok < M) red[warp][mt * 16 + 8 * h + g][tok] = acc[tt][mt][h][cc];
        }
  __syncthreads();
  for (int idx = threadIdx.x; idx < TPB * 32 * M; idx += blockDim.x) {
    const int tl = idx / (32 * M), rr = (idx / M) % 32, tok = idx % M;
    const int tg = blockIdx.x * TPB + tl;
    if (tg >= P.tile0[P.n]) continue;
    int w2 = 0;
    while (w2 + 1 < P.n && tg >= P.tile0[w2 + 1]) w2++;
    const int64_t row = static_cast<int64_t>(tg - P.tile0[w2]) * 32 + rr;
    if (row >= P.rows[w2]) continue;
    float v = 0.0f;
    for (int s = 0; s < S; s++) v += red[tl * S + s][rr][tok];
    P.y[w2][static_cast<int64_t>(tok) * P.rows[w2] + row] = v;
  }
}

// The column split S of versions 21 (wave_s false: the smallest power of two giving >= 1,900 warps)
// and 22 (the split whose last wave is fullest, 2 blocks of 8 warps a SM, smaller S on ties). From
// the shape only; the chain mode (lab_gemv_q4_chain.cuh) uses it too, so its bits are version 22's.
inline int q4ix_split(int tiles, int ng, bool wave_s) {
  int S = 1;
  if (!wave_s) {
    while (S < 8 && S * 2 <= ng && static_cast<int64_t>(tiles) * S < 1900) S *= 2;
  } else {
    // Version 22: the split whose last wave is fullest (2 blocks of 8 warps a SM), smaller S on ties.
    static int slots = 0;
    if (!slots) {
      int dev = 0, sms = 0;
      cudaGetDevice(&dev);
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
      slots = 2 * sms;
    }
    double best = -1;
    for (int s2 = 1; s2 <= 8 && s2 <= ng; s2 *= 2) {
      const int64_t blocks = (static_cast<int64_t>(tiles) * s2 + 7) / 8;
      const double waves = static_cast<double>(blocks) / slots, eff = waves / std::ceil(waves);
      if (eff > best + 0.02) best = eff, S = s2;
    }
  }
  return S;
}

// y_i = W_i x for n <= 4 row-major int4 weights of the same cols (group 64; W.scales = the packed
// uint4 array of q4ix_pack_sb_kernel, W.data = the nibbles), M <= 16 tokens of x (row stride
// x_ld). xq / xsp: scratch of 16 * cols * 3 bytes and (cols / 64) * 16 float2.
inline void q4ix_run(const WeightRef* const* Ws, float* const* ys, int n, const float* x, int x_ld, int M,
                     cudaStream_t st, uint8_t* xq, float* xsp, bool tiled = false, bool wave_s = false,
                     bool prep = true) {
  if (n < 1 || n > kIxMaxW || M < 1 || M > 16 || Ws[0]->cols % 64 || Ws[0]->group != 64)
    throw std::runtime_error("q4ix_run: n 1..4, M 1..16, cols % 64 == 0 and group 64 only");
  Q4IxParams P{};
  P.n = n;
  P.cols = static_cast<int>(Ws[0]->cols);
  P.ng = P.cols / 64;
  P.M = M;
  int tiles = 0;
  for (int i = 0; i < n; i++) {
    P.q[i] = static_cast<const uint32_t*>(Ws[i]->data);
    P.sb[i] = static_cast<const uint4*>(Ws[i]->scales);
    P.y[i] = ys[i];
    P.rows[i] = Ws[i]->rows;
    P.tile0[i] = tiles;
    tiles += static_cast<int>((Ws[i]->rows + 31) / 32);
  }
  P.tile0[n] = tiles;
  const int S = q4ix_split(tiles, P.ng, wave_s);
  P.S = S;
  P.xq = reinterpret_cast<const uint4*>(xq);
  P.xsp = reinterpret_cast<const float4*>(xsp);
  const int pw = M * P.ng;
  if (prep) q4ix_prep_kernel<<<(pw + 7) / 8, 256, 0, st>>>(x, x_ld, M, P.ng, xq, xsp);
  const int TPB = 8 / S, blocks = (tiles + TPB - 1) / TPB;
  if (tiled) {
    if (M <= 8)
      q4ix_kernel<1, true><<<blocks, 256, 0, st>>>(P);
    else
      q4ix_kernel<2, true><<<blocks, 256, 0, st>>>(P);
  } else {
    if (M <= 8)
      q4ix_kernel<1, false><<<blocks, 256, 0, st>>>(P);
    else
      q4ix_kernel<2, false><<<blocks, 256, 0, st>>>(P);
  }
}

}  // namespace
}  // namespace qf::cuda
