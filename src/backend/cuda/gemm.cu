// Kernels of the prefill GEMM (gemm.h): the bf16 rounding of the activations, the tiled-layout
// copy back to row-major, and the CUDA-core reference/fallback GEMM. The cuBLASLt route and the
// per-shape choice live in gemm.cpp.
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/gemm.h"

namespace qf::cuda {

namespace {

// qf::f32_to_bf16 on the device: the same integer formula, so the two backends round alike
// (NaN included, which __float2bfloat16_rn would canonicalise).
__device__ __forceinline__ uint32_t bf16_rn_u32(float f) {
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u;
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

__global__ void to_bf16_kernel(const float* __restrict__ x, uint16_t* __restrict__ xb, size_t n, bool vec) {
  pdl_trigger();
  pdl_wait();  // x is an activation; xb may still be read by the previous matmul
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (vec) {  // x 16-byte and xb 8-byte aligned: four elements per step
    const size_t n4 = n / 4;
    for (size_t j = i; j < n4; j += stride) {
      const float4 v = reinterpret_cast<const float4*>(x)[j];
      uint2 o;
      o.x = bf16_rn_u32(v.x) | (bf16_rn_u32(v.y) << 16);
      o.y = bf16_rn_u32(v.z) | (bf16_rn_u32(v.w) << 16);
      reinterpret_cast<uint2*>(xb)[j] = o;
    }
    const size_t j = n4 * 4 + i;  // the last n % 4 elements, one per thread
    if (j < n) xb[j] = static_cast<uint16_t>(bf16_rn_u32(x[j]));
    return;
  }
  for (; i < n; i += stride) xb[i] = static_cast<uint16_t>(bf16_rn_u32(x[i]));
}

__global__ void round_f32_kernel(const float* __restrict__ x, float* __restrict__ xr, size_t n) {
  pdl_trigger();
  pdl_wait();  // x is an activation; xr may still be read by the previous matmul
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    xr[i] = __uint_as_float(bf16_rn_u32(x[i]) << 16);
}

// Index of the 16-byte vector holding row r, columns [8 c8, 8 c8 + 8) in the tiled layout
// (kernels.h, gemv_tc_relayout): block (tile, chunk) of 256 vectors, vector v * 32 + lane with
// lane = 4 g + t, v = 2 i + h, for row-in-tile 16 (i / 2) + g + 8 (i % 2) and column-in-chunk 16 t + 8 h.
__device__ __forceinline__ int64_t tiled_vec(int64_t r, int64_t c8, int64_t nch) {
  const int rr = static_cast<int>(r & 31), cc = static_cast<int>((c8 * 8) & 63);
  const int i = 2 * (rr >> 4) + ((rr & 15) >> 3), g = rr & 7;
  const int t = cc >> 4, h = (cc & 15) >> 3;
  return ((r >> 5) * nch + (c8 >> 3)) * 256 + (2 * i + h) * 32 + 4 * g + t;
}

__global__ void untile_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst, int64_t rows, int64_t cols) {
  pdl_trigger();
  pdl_wait();  // dst is a scratch buffer the previous matmul may still read
  const int64_t cv = cols / 8, nch = cols / 64, n = rows * cv;
  for (int64_t d = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; d < n;
       d += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = d / cv, c8 = d - r * cv;
    dst[d] = src[tiled_vec(r, c8, nch)];
  }
}

constexpr int kSimtTile = 16;   // 16 x 16 outputs per block, one per thread
constexpr int kSimtK = 64;      // columns staged in shared memory per step

__global__ void __launch_bounds__(kSimtTile* kSimtTile)
    gemm_simt_kernel(const uint16_t* __restrict__ W, bool tiled, int64_t rows, int64_t cols,
                     const uint16_t* __restrict__ xb, float* __restrict__ y, int M) {
  pdl_trigger();
  pdl_wait();
  __shared__ float ws[kSimtTile][kSimtK + 1], xs[kSimtTile][kSimtK + 1];
  const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * kSimtTile + tx;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kSimtTile;
  const int m0 = blockIdx.y * kSimtTile;
  const int64_t nch = cols / 64;
  float acc = 0.0f;
  for (int64_t c0 = 0; c0 < cols; c0 += kSimtK) {
    for (int e = tid; e < kSimtTile * kSimtK; e += kSimtTile * kSimtTile) {
      const int a = e / kSimtK, k = e % kSimtK;
      const int64_t r = r0 + a, c = c0 + k;
      float w = 0.0f;
      if (r < rows && c < cols)
        w = bf16_bits(tiled ? W[tiled_vec(r, c / 8, nch) * 8 + (c & 7)] : W[r * cols + c]);
      ws[a][k] = w;
      const int m = m0 + a;
      xs[a][k] = (m < M && c < cols) ? bf16_bits(xb[static_cast<int64_t>(m) * cols + c]) : 0.0f;
    }
    __syncthreads();
    const int n = cols - c0 < kSimtK ? static_cast<int>(cols - c0) : kSimtK;
    // A product of two bf16 values is exact in fp32, so the fused add rounds once, as x*w + acc does.
    for (int k = 0; k < n; k++) acc = __fmaf_rn(ws[tx][k], xs[ty][k], acc);
    __syncthreads();
  }
  const int64_t r = r0 + tx;
  const int m = m0 + ty;
  if (r < rows && m < M) y[static_cast<int64_t>(m) * rows + r] = acc;
}

}  // namespace

void gemm_to_bf16(const float* x, uint16_t* xb, size_t n, cudaStream_t st) {
  if (n == 0) return;
  const bool vec = (reinterpret_cast<uintptr_t>(x) & 15) == 0 && (reinterpret_cast<uintptr_t>(xb) & 7) == 0;
  launch_k(to_bf16_kernel, dim3(grid_for(vec ? (n + 3) / 4 : n, 256, 132 * 16)), dim3(256), 0, st, x, xb, n, vec);
  QF_CUDA_LAUNCH_CHECK("to_bf16_kernel");
}

void gemm_round_f32(const float* x, float* xr, size_t n, cudaStream_t st) {
  if (n == 0) return;
  launch_k(round_f32_kernel, dim3(grid_for(n, 256, 132 * 16)), dim3(256), 0, st, x, xr, n);
  QF_CUDA_LAUNCH_CHECK("round_f32_kernel");
}

void gemm_untile(const void* tiled, void* row_major, int64_t rows, int64_t cols, cudaStream_t st) {
  if (rows <= 0 || cols <= 0 || cols % 64 != 0 || (reinterpret_cast<uintptr_t>(tiled) & 15) ||
      (reinterpret_cast<uintptr_t>(row_major) & 15))
    backend_fail("cuda gemm untile: %lld x %lld (cols must be a multiple of 64, buffers 16-byte aligned)",
                 (long long)rows, (long long)cols);
  launch_k(untile_kernel, dim3(grid_for(static_cast<size_t>(rows) * (cols / 8), 256, 132 * 32)), dim3(256), 0, st,
           static_cast<const uint4*>(tiled), static_cast<uint4*>(row_major), rows, cols);
  QF_CUDA_LAUNCH_CHECK("untile_kernel");
}

void gemm_simt(const WeightRef& W, const uint16_t* xb, float* y, int M, cudaStream_t st) {
  if (W.dtype != DType::BF16 || !W.data) backend_fail("cuda gemm (simt): bf16 weights expected");
  const bool tiled = W.layout == WeightRef::kTc32x64;
  if (tiled && W.cols % 64 != 0) backend_fail("cuda gemm (simt): tiled weight with %lld cols", (long long)W.cols);
  if (M <= 0) return;
  const int64_t gx = (W.rows + kSimtTile - 1) / kSimtTile, gy = (M + kSimtTile - 1) / kSimtTile;
  if (gx > 0x7fffffff || gy > 65535) backend_fail("cuda gemm (simt): %lld x %d outputs exceed the grid", (long long)W.rows, M);
  launch_k(gemm_simt_kernel, dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy)), dim3(kSimtTile, kSimtTile), 0,
           st, static_cast<const uint16_t*>(W.data), tiled, W.rows, W.cols, xb, y, M);
  QF_CUDA_LAUNCH_CHECK("gemm_simt_kernel");
}

// Never launched: its address names the cuBLASLt matmuls in the kernel profile (prof_after).
__global__ void cublaslt_matmul() {}
const void* gemm_lt_marker() { return reinterpret_cast<const void*>(cublaslt_matmul); }

}  // namespace qf::cuda
