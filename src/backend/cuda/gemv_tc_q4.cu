// Production entry points of the int4 tensor-core GEMV (kernel and geometry: gemv_tc_q4_impl.cuh),
// the relayout into its tiles and the device quantizer.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "backend/cuda/gemv_tc_q4_impl.cuh"

namespace qf::cuda {

namespace {

// ---- relayout: row-major mlx int4 -> kTcQ4 ----------------------------------------------------
// One thread per output 16-byte vector of the blob (layout: the note at the top of gemv_tc_q4_impl.cuh).
template <int G>
__global__ void q4_relayout_kernel(const uint32_t* __restrict__ q, const uint16_t* __restrict__ sc,
                                   const uint16_t* __restrict__ bi, uint4* __restrict__ dst, int64_t rows,
                                   int64_t cols, int64_t nvec) {
  using UT = Q4Unit<G>;
  pdl_wait();  // no early trigger: the result is a weight (see device_common.cuh)
  const int64_t nunits = cols / UT::U, ng = cols / G, per_unit = UT::BYTES / 16;
  for (int64_t d = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; d < nvec;
       d += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t tile = d / (nunits * per_unit), u = (d / per_unit) % nunits;
    const int v = static_cast<int>(d % per_unit);
    uint32_t w[4] = {0, 0, 0, 0};
    if (v < UT::BLOCKS * 64) {  // nibbles: block v / 64, half (v / 32) % 2, lane v % 32
      const int blk = v / 64, a = (v / 32) % 2, lane = v % 32, gg = lane >> 2, tt = lane & 3;
      const int64_t r0 = tile * 32 + 16 * a + gg, r1 = r0 + 8;
#pragma unroll
      for (int s = 0; s < 4; s++) {
        const int64_t c = (u * UT::BLOCKS + blk) * 64 + 16 * s + 4 * tt;
        // The 4 nibbles of columns c .. c + 3 of a row: one 16-bit field of a source word.
        const uint32_t h0 = r0 < rows ? (q[(r0 * cols + c) / 8] >> (4 * (c % 8))) & 0xFFFFu : 0u;
        const uint32_t h1 = r1 < rows ? (q[(r1 * cols + c) / 8] >> (4 * (c % 8))) & 0xFFFFu : 0u;
        const uint32_t n[8] = {h0 & 15u, h1 & 15u, (h0 >> 8) & 15u, (h1 >> 8) & 15u,
                               (h0 >> 4) & 15u, (h1 >> 4) & 15u, (h0 >> 12) & 15u, (h1 >> 12) & 15u};
        uint32_t word = 0;
#pragma unroll
        for (int i = 0; i < 8; i++) word |= n[i] << (4 * i);
        w[s] = word;
      }
    } else {  // scales: group u * GROUPS + k, vector g = rows g + 8i
      const int k = (v - UT::BLOCKS * 64) / 8, gg = (v - UT::BLOCKS * 64) % 8;
      const int64_t gi = u * UT::GROUPS + k;
#pragma unroll
      for (int i = 0; i < 4; i++) {
        const int64_t r = tile * 32 + gg + 8 * i;
        w[i] = r < rows ? static_cast<uint32_t>(sc[r * ng + gi]) | (static_cast<uint32_t>(bi[r * ng + gi]) << 16) : 0u;
      }
    }
    dst[d] = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// ---- dequantize: int4 -> row-major bf16 (the prefill GEMM's int4 route, gemm.h) ----------------
// w = bf16_rn(fl(q * scale) + bias): the two fp32 roundings of the CPU twin's dequantization
// (cpu_backend.cpp, dequant_int4_row), then round-to-nearest-even to bf16.
__device__ __forceinline__ uint16_t q4_weight_bf16(uint32_t q, float scale, float bias) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(__fadd_rn(__fmul_rn(static_cast<float>(q), scale), bias)));
}

// kTcQ4 -> row-major: one thread per 16-byte nibble vector of the blob, i.e. per (tile, unit,
// nibble block, row half a, lane (g, t)); word s holds rows r0 = 16a + g, r1 = r0 + 8 of the tile
// and columns 64 blk + 16 s + 4 t .. + 3 of the unit, nibble (column j, row half h) at index
// {0, 4, 2, 6}[j] + h (the layout note of gemv_tc_q4_impl.cuh; q4_relayout_kernel writes it).
template <int G>
__global__ void q4_dequant_tiled_kernel(const uint8_t* __restrict__ blob, uint16_t* __restrict__ dst, int64_t rows,
                                        int64_t cols, int64_t nvec) {
  using UT = Q4Unit<G>;
  pdl_wait();
  const int64_t nunits = cols / UT::U;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < nvec;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int lane = static_cast<int>(i % 32), a = static_cast<int>((i / 32) % 2);
    const int blk = static_cast<int>((i / 64) % UT::BLOCKS);
    const int64_t u = (i / (64 * UT::BLOCKS)) % nunits, tile = i / (64 * UT::BLOCKS * nunits);
    const uint8_t* unit = blob + (tile * nunits + u) * UT::BYTES;
    const uint4 v = *reinterpret_cast<const uint4*>(unit + blk * 1024 + a * 512 + lane * 16);
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int rr = 16 * a + g + 8 * h;  // row within the tile
      const int64_t r = tile * 32 + rr;
      if (r >= rows) continue;
#pragma unroll
      for (int s = 0; s < 4; s++) {
        const int cu = blk * 64 + 16 * s + 4 * t;  // column within the unit
        const uint32_t sb =
            *reinterpret_cast<const uint32_t*>(unit + UT::BLOCKS * 1024 + (cu / G) * 128 + (rr % 8) * 16 + (rr / 8) * 4);
        const float scale = bf16_bits(static_cast<uint16_t>(sb & 0xFFFFu)), bias = bf16_bits(static_cast<uint16_t>(sb >> 16));
        const uint32_t w = words[s];
        const uint32_t o0 = q4_weight_bf16((w >> (4 * (0 + h))) & 15u, scale, bias);
        const uint32_t o1 = q4_weight_bf16((w >> (4 * (4 + h))) & 15u, scale, bias);
        const uint32_t o2 = q4_weight_bf16((w >> (4 * (2 + h))) & 15u, scale, bias);
        const uint32_t o3 = q4_weight_bf16((w >> (4 * (6 + h))) & 15u, scale, bias);
        *reinterpret_cast<uint2*>(dst + r * cols + u * UT::U + cu) = make_uint2(o0 | (o1 << 16), o2 | (o3 << 16));
      }
    }
  }
}

// Row-major mlx int4 -> row-major bf16: one thread per source word (8 columns, one 16-byte store).
__global__ void q4_dequant_rows_kernel(const uint32_t* __restrict__ q, const uint16_t* __restrict__ sc,
                                       const uint16_t* __restrict__ bi, uint16_t* __restrict__ dst, int64_t rows,
                                       int64_t cols, int group) {
  pdl_wait();
  const int64_t nw = rows * (cols / 8), ng = cols / group;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < nw;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / (cols / 8), c = (i % (cols / 8)) * 8;
    const float scale = bf16_bits(sc[r * ng + c / group]), bias = bf16_bits(bi[r * ng + c / group]);
    const uint32_t w = q[i];
    uint32_t o[4];
#pragma unroll
    for (int j = 0; j < 4; j++)
      o[j] = q4_weight_bf16((w >> (8 * j)) & 15u, scale, bias) | (q4_weight_bf16((w >> (8 * j + 4)) & 15u, scale, bias) << 16);
    *reinterpret_cast<uint4*>(dst + r * cols + c) = make_uint4(o[0], o[1], o[2], o[3]);
  }
}

// ---- quantize (synthetic int4 weights): one thread per (row, group), as int4_quantize_row -----
__global__ void q4_quantize_kernel(const uint16_t* __restrict__ src, int64_t rows, int64_t cols, int group,
                                   uint32_t* __restrict__ q, uint16_t* __restrict__ sc, uint16_t* __restrict__ bi) {
  pdl_wait();
  const int64_t ng = cols / group, n = rows * ng;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / ng, g0 = (i % ng) * group;
    const uint16_t* x = src + r * cols + g0;
    float lo = bf16_bits(x[0]), hi = lo;
    for (int k = 1; k < group; k++) {
      const float v = bf16_bits(x[k]);
      lo = fminf(lo, v);
      hi = fmaxf(hi, v);
    }
    const uint16_t sb = __bfloat16_as_ushort(__float2bfloat16_rn(__fdiv_rn(__fsub_rn(hi, lo), 15.0f)));
    const uint16_t bb = __bfloat16_as_ushort(__float2bfloat16_rn(lo));
    sc[i] = sb;
    bi[i] = bb;
    const float s = bf16_bits(sb), b = bf16_bits(bb);
    for (int w = 0; w < group / 8; w++) {
      uint32_t word = 0;
      for (int j = 0; j < 8; j++) {
        // lround: halves away from zero, like roundf.
        int v = s > 0.0f ? static_cast<int>(roundf(__fdiv_rn(__fsub_rn(bf16_bits(x[8 * w + j]), b), s))) : 0;
        v = v < 0 ? 0 : v > 15 ? 15 : v;
        word |= static_cast<uint32_t>(v) << (4 * j);
      }
      q[(r * cols + g0) / 8 + w] = word;
    }
  }
}

}  // namespace

bool gemv_tc_q4_eligible(const WeightRef& W) {
  const int g = W.group;
  return W.dtype == DType::U32 && W.layout == WeightRef::kRowMajor && (g == 32 || g == 64 || g == 128) &&
         W.rows > 0 && W.rows < (1 << 30) && W.cols > 0 && W.cols < (1 << 30) && W.cols % q4_unit_cols(g) == 0 &&
         W.data && W.scales && W.biases && (reinterpret_cast<uintptr_t>(W.data) & 3) == 0 &&
         (reinterpret_cast<uintptr_t>(W.scales) & 1) == 0 && (reinterpret_cast<uintptr_t>(W.biases) & 1) == 0;
}

size_t gemv_tc_q4_bytes(int64_t rows, int64_t cols, int group) {
  return static_cast<size_t>((rows + 31) / 32) * static_cast<size_t>(cols / q4_unit_cols(group)) *
         static_cast<size_t>(q4_unit_bytes(group));
}

void gemv_tc_q4_relayout(const WeightRef& W, void* dst, cudaStream_t st) {
  if (!gemv_tc_q4_eligible(W) || (reinterpret_cast<uintptr_t>(dst) & 15))
    backend_fail("cuda int4 relayout: %lld x %lld, group %d (needs group 32/64/128, cols a multiple of %lld, "
                 "scales and biases, a 16-byte aligned destination)", (long long)W.rows, (long long)W.cols, W.group,
                 (long long)q4_unit_cols(W.group));
  const int64_t nvec = static_cast<int64_t>(gemv_tc_q4_bytes(W.rows, W.cols, W.group) / 16);
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((nvec + 255) / 256, 132 * 32));
  const auto* q = static_cast<const uint32_t*>(W.data);
  const auto* s = static_cast<const uint16_t*>(W.scales);
  const auto* b = static_cast<const uint16_t*>(W.biases);
  auto* d = static_cast<uint4*>(dst);
  switch (W.group) {
    case 32: launch_k(q4_relayout_kernel<32>, dim3(blocks), dim3(256), 0, st, q, s, b, d, W.rows, W.cols, nvec); break;
    case 64: launch_k(q4_relayout_kernel<64>, dim3(blocks), dim3(256), 0, st, q, s, b, d, W.rows, W.cols, nvec); break;
    default: launch_k(q4_relayout_kernel<128>, dim3(blocks), dim3(256), 0, st, q, s, b, d, W.rows, W.cols, nvec); break;
  }
  QF_CUDA_LAUNCH_CHECK("q4_relayout_kernel");
}

void q4_dequant_bf16(const WeightRef& W, void* dst, cudaStream_t st) {
  if (W.dtype != DType::U32 || W.rows <= 0 || W.cols <= 0 || W.cols % 8 != 0 || (reinterpret_cast<uintptr_t>(dst) & 15) ||
      !W.data || (W.group != 32 && W.group != 64 && W.group != 128) || W.cols % W.group != 0)
    backend_fail("cuda int4 dequantize: %lld x %lld, group %d (needs an int4 matrix, group 32/64/128, cols a multiple "
                 "of the group and of 8, a 16-byte aligned destination)", (long long)W.rows, (long long)W.cols, W.group);
  auto* d = static_cast<uint16_t*>(dst);
  if (W.layout == WeightRef::kTcQ4) {
    if (W.cols % q4_unit_cols(W.group) != 0 || (reinterpret_cast<uintptr_t>(W.data) & 15))
      backend_fail("cuda int4 dequantize: tiled %lld x %lld, group %d: cols not a multiple of %lld or blob not aligned",
                   (long long)W.rows, (long long)W.cols, W.group, (long long)q4_unit_cols(W.group));
    const int64_t nvec = ((W.rows + 31) / 32) * (W.cols / q4_unit_cols(W.group)) * (q4_unit_cols(W.group) / 64) * 64;
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((nvec + 255) / 256, 132 * 32));
    const auto* b = static_cast<const uint8_t*>(W.data);
    switch (W.group) {
      case 32: launch_k(q4_dequant_tiled_kernel<32>, dim3(blocks), dim3(256), 0, st, b, d, W.rows, W.cols, nvec); break;
      case 64: launch_k(q4_dequant_tiled_kernel<64>, dim3(blocks), dim3(256), 0, st, b, d, W.rows, W.cols, nvec); break;
      default: launch_k(q4_dequant_tiled_kernel<128>, dim3(blocks), dim3(256), 0, st, b, d, W.rows, W.cols, nvec); break;
    }
    QF_CUDA_LAUNCH_CHECK("q4_dequant_tiled_kernel");
    return;
  }
  if (W.layout != WeightRef::kRowMajor || !W.scales || !W.biases || (reinterpret_cast<uintptr_t>(W.data) & 3))
    backend_fail("cuda int4 dequantize: %lld x %lld: neither tiled nor row-major with scales and biases",
                 (long long)W.rows, (long long)W.cols);
  const int64_t nw = W.rows * (W.cols / 8);
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((nw + 255) / 256, 132 * 32));
  launch_k(q4_dequant_rows_kernel, dim3(blocks), dim3(256), 0, st, static_cast<const uint32_t*>(W.data),
           static_cast<const uint16_t*>(W.scales), static_cast<const uint16_t*>(W.biases), d, W.rows, W.cols, W.group);
  QF_CUDA_LAUNCH_CHECK("q4_dequant_rows_kernel");
}

void gemv_tc_q4_group(const WeightRef* const* Ws, float* const* ys, int n, const float* x, int x_ld, int M,
                      cudaStream_t st) {
  q4_run(Ws, ys, n, x, x_ld, M, st, false);
}

void gemv_tc_q4(const WeightRef& W, const float* x, int x_ld, float* y, int M, cudaStream_t st) {
  const WeightRef* ws[1] = {&W};
  float* ys[1] = {y};
  q4_run(ws, ys, 1, x, x_ld, M, st, false);
}

void gemm_tc_q4(const WeightRef& W, const float* xr, int x_ld, float* y, int M, cudaStream_t st) {
  const WeightRef* ws[1] = {&W};
  float* ys[1] = {y};
  q4_run(ws, ys, 1, xr, x_ld, M, st, true);
}

void quantize_int4(const void* bf16, int64_t rows, int64_t cols, int group, void* q, void* scales, void* biases,
                   cudaStream_t st) {
  if (rows <= 0 || cols <= 0 || (group != 32 && group != 64 && group != 128) || cols % group != 0)
    backend_fail("cuda quantize_int4: %lld x %lld with group %d (expected 32, 64 or 128 dividing cols)",
                 (long long)rows, (long long)cols, group);
  const int64_t n = rows * (cols / group);
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 132 * 64));
  launch_k(q4_quantize_kernel, dim3(blocks), dim3(256), 0, st, static_cast<const uint16_t*>(bf16), rows, cols, group,
           static_cast<uint32_t*>(q), static_cast<uint16_t*>(scales), static_cast<uint16_t*>(biases));
  QF_CUDA_LAUNCH_CHECK("q4_quantize_kernel");
}

}  // namespace qf::cuda
