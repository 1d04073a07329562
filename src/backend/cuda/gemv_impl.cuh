// The multi-row GEMV behind Backend::matmul (design and invariance argument: docs/experiments/
// cuda_kernels.md). Included by gemv_*.cu, each of which instantiates one weight format so that
// the instantiations compile in parallel.
//
// Geometry. A warp serves 4*R weight rows: its lanes form 4 groups of 8 (group gi = lane / 8);
// group gi owns rows rowset*4R + 4r + gi (r < R). Within a group, lane `sub` = lane % 8 reads 16
// bytes of its row per "chunk": columns [ch*8*CW + sub*CW, +CW), CW = 8 (bf16/f16), 4 (f32),
// 32 (int4). Each 16-byte weight vector is converted to fp32 once and multiplied into all M
// activation rows (x through L1, weights streamed past it), so the weights are read once per
// call whatever M is.
//
// Row-invariance. Accumulator acc[m][r] of a lane receives, for the lane's chunks in increasing
// order and within a chunk its columns in increasing order, acc = fmaf(w, x[m, c], acc): the
// exact same operation sequence for every M (M only gates which accumulators exist). The 8 lane
// sums of a row are combined by a fixed xor tree (4, 2, 1); when the columns are split into KS
// slices (one warp each) the slice sums are added in slice order. KS depends on the matrix
// shape only. R (rows per group), U (chunks loaded per step) and MB (compile-time row capacity)
// change the schedule, never the arithmetic.
#pragma once
#include <type_traits>

#include "backend/cuda/device_common.cuh"
#include "backend/cuda/kernels.h"

namespace qf::cuda {

enum class WK : int { F32 = 0, F16 = 1, BF16 = 2, Q4 = 3 };

template <WK K> struct WTraits;
template <> struct WTraits<WK::BF16> { static constexpr int CW = 8, ESZ = 2; };
template <> struct WTraits<WK::F16> { static constexpr int CW = 8, ESZ = 2; };
template <> struct WTraits<WK::F32> { static constexpr int CW = 4, ESZ = 4; };
template <> struct WTraits<WK::Q4> { static constexpr int CW = 32, ESZ = 0; };

struct GemvParams {
  const void* w;
  const uint16_t* scales;
  const uint16_t* biases;
  const float* x;
  float* y;
  int rows, cols, x_ld, M, group;
  int ks;                 // column slices (one warp each)
  int cps;                // chunks per slice
  int nchunks;            // ceil(cols / chunk)
  int full_chunks;        // chunks entirely inside cols
  int rowsets_per_block;  // (warps per block) / ks
  size_t row_bytes;       // bytes of one weight row
};

// Column slices from the shape alone: split the columns until there are enough warps to cover
// the machine (counted as if each warp served 16 rows), keeping >= 8 chunks per slice.
inline int gemv_slices_for(int64_t rows, int64_t cols, int cw) {
  const int64_t chunk = 8 * cw;
  const int64_t nch = (cols + chunk - 1) / chunk;
  const int64_t rowsets = (rows + 15) / 16;
  int ks = 1;
  while (ks < 8 && rowsets * ks < 1024 && nch >= 16 * ks) ks *= 2;
  return ks;
}

// 4 columns of weights (piece p of a 16-byte vector) as fp32.
template <WK K>
__device__ __forceinline__ void gemv_piece(const uint4& raw, int p, float s, float b, float out[4]) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
  if constexpr (K == WK::BF16) {
    out[0] = bf16_lo(w[2 * p]);
    out[1] = bf16_hi(w[2 * p]);
    out[2] = bf16_lo(w[2 * p + 1]);
    out[3] = bf16_hi(w[2 * p + 1]);
  } else if constexpr (K == WK::F16) {
    out[0] = f16_bits(static_cast<uint16_t>(w[2 * p] & 0xffffu));
    out[1] = f16_bits(static_cast<uint16_t>(w[2 * p] >> 16));
    out[2] = f16_bits(static_cast<uint16_t>(w[2 * p + 1] & 0xffffu));
    out[3] = f16_bits(static_cast<uint16_t>(w[2 * p + 1] >> 16));
  } else if constexpr (K == WK::F32) {
    out[0] = __uint_as_float(w[0]);
    out[1] = __uint_as_float(w[1]);
    out[2] = __uint_as_float(w[2]);
    out[3] = __uint_as_float(w[3]);
  } else {
    const uint32_t word = w[p >> 1];
    const int sh = (p & 1) * 16;
#pragma unroll
    for (int i = 0; i < 4; i++) out[i] = deq4((word >> (sh + 4 * i)) & 0xfu, s, b);
  }
}

// One scalar weight (guarded paths): element c of row `row`.
template <WK K>
__device__ __forceinline__ float gemv_scalar(const GemvParams& P, int row, int c) {
  if constexpr (K == WK::BF16) {
    return bf16_bits(static_cast<const uint16_t*>(P.w)[static_cast<size_t>(row) * P.cols + c]);
  } else if constexpr (K == WK::F16) {
    return f16_bits(static_cast<const uint16_t*>(P.w)[static_cast<size_t>(row) * P.cols + c]);
  } else if constexpr (K == WK::F32) {
    return static_cast<const float*>(P.w)[static_cast<size_t>(row) * P.cols + c];
  } else {
    const uint32_t word = static_cast<const uint32_t*>(P.w)[static_cast<size_t>(row) * (P.cols / 8) + c / 8];
    const int ng = P.cols / P.group;
    const size_t gi = static_cast<size_t>(row) * ng + c / P.group;
    return deq4((word >> (4 * (c % 8))) & 0xfu, bf16_bits(P.scales[gi]), bf16_bits(P.biases[gi]));
  }
}

template <WK K, int MB, int R, int U, bool VEC>
__global__ void __launch_bounds__(256) gemv_kernel(const GemvParams P) {
  pdl_trigger();
  pdl_wait();
  constexpr int CW = WTraits<K>::CW;
  constexpr int CHUNK = 8 * CW;
  constexpr int NP = CW / 4;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int gi = lane >> 3, sub = lane & 7;
  const int slice = warp % P.ks, rl = warp / P.ks;
  const int rowset = blockIdx.x * P.rowsets_per_block + rl;
  const int M = P.M;

  float acc[MB][R];
#pragma unroll
  for (int m = 0; m < MB; m++)
#pragma unroll
    for (int r = 0; r < R; r++) acc[m][r] = 0.0f;

  int row[R];
  bool rvalid[R];
  const char* wrow[R];
#pragma unroll
  for (int r = 0; r < R; r++) {
    row[r] = rowset * 4 * R + 4 * r + gi;
    rvalid[r] = row[r] < P.rows;
    wrow[r] = static_cast<const char*>(P.w) + static_cast<size_t>(rvalid[r] ? row[r] : 0) * P.row_bytes;
  }

  const int ch0 = slice * P.cps;
  const int ch1 = min(ch0 + P.cps, P.nchunks);
  int ch = ch0;

  if constexpr (VEC) {
    const int fe = min(ch1, P.full_chunks);
    // Full chunks: U chunks of R rows loaded, then used; no per-element guards.
    auto body = [&](auto UU, int cbase) {
      constexpr int UN = decltype(UU)::value;
      uint4 raw[UN][R];
      float sc[UN][R], bi[UN][R];
#pragma unroll
      for (int u = 0; u < UN; u++)
#pragma unroll
        for (int r = 0; r < R; r++) {
          const int c = (cbase + u) * CHUNK + sub * CW;
          if (rvalid[r]) {
            if constexpr (K == WK::Q4) {
              raw[u][r] = ld_stream16(wrow[r] + static_cast<size_t>(c) / 2);
              const size_t g = static_cast<size_t>(row[r]) * (P.cols / P.group) + c / P.group;
              sc[u][r] = bf16_bits(__ldg(P.scales + g));
              bi[u][r] = bf16_bits(__ldg(P.biases + g));
            } else {
              raw[u][r] = ld_stream16(wrow[r] + static_cast<size_t>(c) * WTraits<K>::ESZ);
              sc[u][r] = bi[u][r] = 0.0f;
            }
          } else {
            raw[u][r] = make_uint4(0u, 0u, 0u, 0u);
            sc[u][r] = bi[u][r] = 0.0f;
          }
        }
#pragma unroll
      for (int u = 0; u < UN; u++) {
        const int c = (cbase + u) * CHUNK + sub * CW;
#pragma unroll
        for (int p = 0; p < NP; p++) {
          float wv[R][4];
#pragma unroll
          for (int r = 0; r < R; r++) gemv_piece<K>(raw[u][r], p, sc[u][r], bi[u][r], wv[r]);
#pragma unroll
          for (int m = 0; m < MB; m++) {
            if (m < M) {
              const float4 xv = __ldg(reinterpret_cast<const float4*>(P.x + static_cast<size_t>(m) * P.x_ld + c + 4 * p));
#pragma unroll
              for (int r = 0; r < R; r++) {
                acc[m][r] = fmaf(wv[r][0], xv.x, acc[m][r]);
                acc[m][r] = fmaf(wv[r][1], xv.y, acc[m][r]);
                acc[m][r] = fmaf(wv[r][2], xv.z, acc[m][r]);
                acc[m][r] = fmaf(wv[r][3], xv.w, acc[m][r]);
              }
            }
          }
        }
      }
    };
    for (; ch + U <= fe; ch += U) body(std::integral_constant<int, U>{}, ch);
    for (; ch < fe; ch++) body(std::integral_constant<int, 1>{}, ch);
  }

  // Guarded chunks (the partial last chunk, or every chunk of an unaligned matrix): scalar
  // loads, the same per-accumulator operation sequence.
  for (; ch < ch1; ch++) {
    const int c0 = ch * CHUNK + sub * CW;
    const int nvalid = max(0, min(CW, P.cols - c0));
    for (int e = 0; e < nvalid; e++) {
      float wv[R];
#pragma unroll
      for (int r = 0; r < R; r++) wv[r] = rvalid[r] ? gemv_scalar<K>(P, row[r], c0 + e) : 0.0f;
#pragma unroll
      for (int m = 0; m < MB; m++) {
        if (m < M) {
          const float xv = __ldg(P.x + static_cast<size_t>(m) * P.x_ld + c0 + e);
#pragma unroll
          for (int r = 0; r < R; r++) acc[m][r] = fmaf(wv[r], xv, acc[m][r]);
        }
      }
    }
  }

  // Fixed 8-lane tree per row, then (KS > 1) slice sums in slice order.
  extern __shared__ float red[];
#pragma unroll
  for (int m = 0; m < MB; m++) {
    if (m < M) {
#pragma unroll
      for (int r = 0; r < R; r++) {
        float v = acc[m][r];
        v = __fadd_rn(v, __shfl_xor_sync(kFull, v, 4));
        v = __fadd_rn(v, __shfl_xor_sync(kFull, v, 2));
        v = __fadd_rn(v, __shfl_xor_sync(kFull, v, 1));
        if (sub == 0) {
          if (P.ks == 1) {
            if (rvalid[r]) P.y[static_cast<size_t>(m) * P.rows + row[r]] = v;
          } else {
            red[((rl * P.ks + slice) * MB + m) * (4 * R) + 4 * r + gi] = v;
          }
        }
      }
    }
  }
  if (P.ks > 1) {
    __syncthreads();
    const int per = P.rowsets_per_block * M * 4 * R;
    for (int idx = threadIdx.x; idx < per; idx += blockDim.x) {
      const int rr = idx % (4 * R);
      const int t = idx / (4 * R);
      const int m = t % M, rl2 = t / M;
      const int rw = (blockIdx.x * P.rowsets_per_block + rl2) * 4 * R + rr;
      if (rw < P.rows) {
        float s = red[((rl2 * P.ks + 0) * MB + m) * (4 * R) + rr];
        for (int k = 1; k < P.ks; k++) s = __fadd_rn(s, red[((rl2 * P.ks + k) * MB + m) * (4 * R) + rr]);
        P.y[static_cast<size_t>(m) * P.rows + rw] = s;
      }
    }
  }
}

template <WK K, int MB, int R, int U, bool VEC>
void gemv_launch(GemvParams P, cudaStream_t st) {
  const int nw = P.ks > 4 ? P.ks : 4;
  P.rowsets_per_block = nw / P.ks;
  const int64_t rowsets = (static_cast<int64_t>(P.rows) + 4 * R - 1) / (4 * R);
  const int64_t grid = (rowsets + P.rowsets_per_block - 1) / P.rowsets_per_block;
  const size_t smem = P.ks > 1 ? static_cast<size_t>(nw) * MB * 4 * R * sizeof(float) : 0;
  launch_k(gemv_kernel<K, MB, R, U, VEC>, dim3(static_cast<unsigned>(grid)), dim3(nw * 32), smem, st, P);
  QF_CUDA_LAUNCH_CHECK("gemv_kernel");
}

// Default schedule per row capacity MB: (R rows per lane group, U chunks per load step).
template <int MB> struct GemvSched;
template <> struct GemvSched<1> { static constexpr int R = 2, U = 4; };
template <> struct GemvSched<2> { static constexpr int R = 2, U = 4; };
template <> struct GemvSched<4> { static constexpr int R = 4, U = 4; };
template <> struct GemvSched<8> { static constexpr int R = 4, U = 4; };
template <> struct GemvSched<16> { static constexpr int R = 4, U = 2; };

// int4 dequantises 32 columns per 16-byte vector and keeps a scale and bias per vector: a
// lighter schedule keeps it within the register file.
template <int MB> struct GemvSchedQ4 { static constexpr int R = 2, U = MB >= 16 ? 1 : 2; };

template <WK K, int MB>
void gemv_launch_default(const GemvParams& P, bool vec, cudaStream_t st) {
  constexpr int R = K == WK::Q4 ? GemvSchedQ4<MB>::R : GemvSched<MB>::R;
  constexpr int U = K == WK::Q4 ? GemvSchedQ4<MB>::U : GemvSched<MB>::U;
  if (vec)
    gemv_launch<K, MB, R, U, true>(P, st);
  else
    gemv_launch<K, MB, R, 1, false>(P, st);
}

template <WK K>
void gemv_dispatch_mb(const GemvParams& P, int mb, bool vec, cudaStream_t st) {
  switch (mb) {
    case 1: return gemv_launch_default<K, 1>(P, vec, st);
    case 2: return gemv_launch_default<K, 2>(P, vec, st);
    case 4: return gemv_launch_default<K, 4>(P, vec, st);
    case 8: return gemv_launch_default<K, 8>(P, vec, st);
    default: return gemv_launch_default<K, 16>(P, vec, st);
  }
}

// Per-format entry points (one per .cu file): the default schedule at row capacity mb (1, 2, 4,
// 8 or 16); vec: 16-byte weight loads (aligned rows).
void gemv_run_bf16(const GemvParams& P, int mb, bool vec, cudaStream_t st);
void gemv_run_f16(const GemvParams& P, int mb, bool vec, cudaStream_t st);
void gemv_run_f32(const GemvParams& P, int mb, bool vec, cudaStream_t st);
void gemv_run_q4(const GemvParams& P, int mb, bool vec, cudaStream_t st);

// gemv()'s launch parameters for W with ks column slices (gemv() passes gemv_slices_for; the
// kernel lab forces others) and whether its rows allow 16-byte loads; P.M, P.x and P.y are the
// caller's. gemv_bucket: the row capacity gemv() runs m rows with.
GemvParams gemv_params(const WeightRef& W, int x_ld, int ks, bool* vec);
int gemv_bucket(int m);

}  // namespace qf::cuda
