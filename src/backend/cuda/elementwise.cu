// Small ops of the CUDA backend: embedding lookup, norms, elementwise math, q/gate split, RoPE,
// KV writes and DFlash2's dynamic conv. Each output element (or each row, for the norms) is
// computed by code that does not depend on the row count, mirroring the CPU twin's operation
// order (explicit _rn intrinsics where the CPU, built with -ffp-contract=off, rounds twice).
#include <type_traits>
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/kernels.h"

namespace qf::cuda {

namespace {

constexpr int kBlock = 256;

__global__ void embed_kernel(WeightView E, const int32_t* __restrict__ ids, float* __restrict__ out, int M,
                             DevError* err) {
  pdl_trigger();
  pdl_wait();
  const int m = blockIdx.y;
  const int64_t id = ids[m];
  const bool ok = id >= 0 && id < E.rows;
  if (!ok && blockIdx.x == 0 && threadIdx.x == 0) set_error(err, kErrEmbedId, static_cast<int>(id), static_cast<int>(E.rows), m);
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < E.cols;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[m * E.cols + c] = ok ? weight_at(E, id, c) : 0.0f;
}

// ss -> 1 / sqrt(ss / n + eps), exactly the CPU's expression.
__device__ __forceinline__ float rms_inv(float ss, int n, float eps) {
  return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, static_cast<float>(n)), eps)));
}

// A norm's thread: its first element t0 and stride (a lane of the row's warp, or a
// thread of the row's block).
template <bool WARP_ROWS>
__device__ __forceinline__ int norm_t0() {
  return WARP_ROWS ? (threadIdx.x & 31) : threadIdx.x;
}
template <bool WARP_ROWS>
constexpr int kNormStep = WARP_ROWS ? 32 : kBlock;

// Sum of one value per thread over a row's threads (a warp, or the 256-thread block), in a fixed
// order: the warp tree, then the warps in order.
template <bool WARP_ROWS>
__device__ __forceinline__ float row_total(float s, float* sh) {
  s = warp_sum(s);
  if constexpr (WARP_ROWS) {
    return s;
  } else {
    const int w = threadIdx.x >> 5;
    __syncthreads();  // sh may still be read from a previous use
    if ((threadIdx.x & 31) == 0) sh[w] = s;
    __syncthreads();
    float t = sh[0];
#pragma unroll
    for (int k = 1; k < kBlock / 32; k++) t = __fadd_rn(t, sh[k]);
    return t;
  }
}

// Row sum of squares. WARP_ROWS: one warp per row (n <= 1024); else one 256-thread block per row.
// The choice depends on n only; the order inside depends on n only: thread t0 adds elements
// t0, t0 + step, ... in that order (fmaf), then row_total.
template <bool WARP_ROWS>
__device__ __forceinline__ float row_sumsq(const float* xr, int n, float* sh) {
  const int t0 = norm_t0<WARP_ROWS>(), step = kNormStep<WARP_ROWS>;
  float s = 0.0f;
  for (int i = t0; i < n; i += step) s = fmaf(xr[i], xr[i], s);
  return row_total<WARP_ROWS>(s, sh);
}

// Rows of up to kNormPer elements per thread (n <= 1024 per warp, n <= 8192 per block) are held in
// registers: every load of the row is issued before the first use, instead of one dependent
// round trip per element (the output may alias the input, so the compiler cannot reorder the
// loop's loads above its stores). Same arithmetic, same order as the loops above.
constexpr int kNormPer = 32;

// The thread's norm weights (1 without a weight vector), loaded before pdl_wait(): weights are
// never written by a kernel in flight.
template <bool WARP_ROWS, int PER>
__device__ __forceinline__ void load_norm_weights(const float* __restrict__ w, int n, float (&wv)[PER]) {
  const int t0 = norm_t0<WARP_ROWS>(), step = kNormStep<WARP_ROWS>;
#pragma unroll
  for (int k = 0; k < PER; k++) wv[k] = w && t0 + k * step < n ? w[t0 + k * step] : 1.0f;
}

// 1 / rms of a row held in registers (v[k] = element t0 + k * step): the thread's fmaf sum in k
// order, then row_total; the same order as row_sumsq.
template <bool WARP_ROWS, int PER>
__device__ __forceinline__ float reg_rms_inv(const float (&v)[PER], int n, float eps, float* sh) {
  const int t0 = norm_t0<WARP_ROWS>(), step = kNormStep<WARP_ROWS>;
  float s = 0.0f;
#pragma unroll
  for (int k = 0; k < PER; k++)
    if (t0 + k * step < n) s = fmaf(v[k], v[k], s);
  return rms_inv(row_total<WARP_ROWS>(s, sh), n, eps);
}

// Before pdl_wait(): the norm weights (weights are never written by a kernel in flight) and a
// touch of the row's pages; the row itself only after.
// OUT: float, or uint16_t for bf16 (f32_to_bf16_bits of the same fp32 value: the prefill's fused
// norm + gemm input, Backend::rmsnorm_gated_gemm).
__device__ __forceinline__ void store_out(float* y, int i, float v) { y[i] = v; }
__device__ __forceinline__ void store_out(uint16_t* y, int i, float v) { y[i] = f32_to_bf16_bits(v); }

// PER: elements a thread holds (n <= 32 PER per warp); short rows (the per-head norms: 128, 256)
// take a smaller PER, which frees registers for more resident warps and leaves the arithmetic
// and its order as they are (the elements past n were skipped anyway).
template <bool WARP_ROWS, bool GATED, class OUT = float, int PER = kNormPer>
__global__ void __launch_bounds__(kBlock) rmsnorm_reg_kernel(const float* x, const float* gate,
                                                             const float* __restrict__ w, OUT* y, int rows, int n,
                                                             float eps) {
  pdl_trigger();
  __shared__ float sh[kBlock / 32];
  const int r = WARP_ROWS ? blockIdx.x * (kBlock / 32) + (threadIdx.x >> 5) : blockIdx.x;
  if (r >= rows) {  // uniform per warp (WARP_ROWS) or per block
    pdl_wait();
    return;
  }
  const float* xr = x + static_cast<size_t>(r) * n;
  OUT* yr = y + static_cast<size_t>(r) * n;
  const int t0 = norm_t0<WARP_ROWS>(), step = kNormStep<WARP_ROWS>;
  float wv[PER];
  load_norm_weights<WARP_ROWS>(w, n, wv);
  if (t0 == 0) {
    touch_l2(xr);
    touch_l2(yr);
    if (GATED) touch_l2(gate + static_cast<size_t>(r) * n);
  }
  pdl_wait();
  float v[PER], gv[GATED ? PER : 1];
#pragma unroll
  for (int k = 0; k < PER; k++) {
    const int i = t0 + k * step;
    v[k] = i < n ? xr[i] : 0.0f;
    if constexpr (GATED) gv[k] = i < n ? gate[static_cast<size_t>(r) * n + i] : 0.0f;
  }
  const float inv = reg_rms_inv<WARP_ROWS>(v, n, eps, sh);
#pragma unroll
  for (int k = 0; k < PER; k++) {
    const int i = t0 + k * step;
    if (i >= n) break;
    if constexpr (GATED)
      store_out(yr, i, __fmul_rn(__fmul_rn(wv[k], __fmul_rn(v[k], inv)), silu_f(gv[k])));
    else
      store_out(yr, i, __fmul_rn(__fmul_rn(v[k], inv), wv[k]));
  }
}

// OUT as in rmsnorm_reg_kernel: uint16_t is the prefill's fused norm + projection-group input
// (Backend::add_rmsnorm_gemm_group), h still updated in fp32.
template <bool WARP_ROWS, class OUT = float>
__global__ void __launch_bounds__(kBlock) add_rmsnorm_reg_kernel(float* h, const float* __restrict__ res,
                                                                 const float* __restrict__ w, OUT* y, int rows,
                                                                 int n, float eps) {
  pdl_trigger();
  __shared__ float sh[kBlock / 32];
  const int r = WARP_ROWS ? blockIdx.x * (kBlock / 32) + (threadIdx.x >> 5) : blockIdx.x;
  if (r >= rows) {
    pdl_wait();
    return;
  }
  float* hr = h + static_cast<size_t>(r) * n;
  const float* rr = res + static_cast<size_t>(r) * n;
  OUT* yr = y + static_cast<size_t>(r) * n;
  const int t0 = norm_t0<WARP_ROWS>(), step = kNormStep<WARP_ROWS>;
  float wv[kNormPer];  // as in rmsnorm_reg_kernel: weights and page touches before the wait
  load_norm_weights<WARP_ROWS>(w, n, wv);
  if (t0 == 0) {
    touch_l2(hr);
    touch_l2(rr);
    touch_l2(yr);
  }
  pdl_wait();
  float v[kNormPer], rv[kNormPer];
#pragma unroll
  for (int k = 0; k < kNormPer; k++) {
    const int i = t0 + k * step;
    v[k] = i < n ? hr[i] : 0.0f;
    rv[k] = i < n ? rr[i] : 0.0f;
  }
#pragma unroll
  for (int k = 0; k < kNormPer; k++) v[k] = __fadd_rn(v[k], rv[k]);
  const float inv = reg_rms_inv<WARP_ROWS>(v, n, eps, sh);
#pragma unroll
  for (int k = 0; k < kNormPer; k++) {
    const int i = t0 + k * step;
    if (i >= n) break;
    hr[i] = v[k];
    store_out(yr, i, __fmul_rn(__fmul_rn(v[k], inv), wv[k]));
  }
}

template <bool WARP_ROWS, bool GATED>
__global__ void __launch_bounds__(kBlock) rmsnorm_kernel(const float* x, const float* gate, const float* __restrict__ w,
                                                         float* y, int rows, int n, float eps) {
  pdl_trigger();
  pdl_wait();
  __shared__ float sh[kBlock / 32];
  const int r = WARP_ROWS ? blockIdx.x * (kBlock / 32) + (threadIdx.x >> 5) : blockIdx.x;
  if (r >= rows) return;  // uniform per warp (WARP_ROWS) or per block
  const float* xr = x + static_cast<size_t>(r) * n;
  float* yr = y + static_cast<size_t>(r) * n;
  const float inv = rms_inv(row_sumsq<WARP_ROWS>(xr, n, sh), n, eps);
  const int t0 = norm_t0<WARP_ROWS>(), step = kNormStep<WARP_ROWS>;
  for (int i = t0; i < n; i += step) {
    const float wi = w ? w[i] : 1.0f;
    if constexpr (GATED) {
      const float g = gate[static_cast<size_t>(r) * n + i];
      yr[i] = __fmul_rn(__fmul_rn(wi, __fmul_rn(xr[i], inv)), silu_f(g));
    } else {
      yr[i] = __fmul_rn(__fmul_rn(xr[i], inv), wi);
    }
  }
}

// h += r, then y = rmsnorm(h) * w: the add kernel and rmsnorm_kernel<WARP_ROWS, false> in one
// launch, same arithmetic (each thread re-reads only the elements it wrote itself).
template <bool WARP_ROWS>
__global__ void __launch_bounds__(kBlock) add_rmsnorm_kernel(float* h, const float* __restrict__ res,
                                                             const float* __restrict__ w, float* y, int rows, int n,
                                                             float eps) {
  pdl_trigger();
  pdl_wait();
  __shared__ float sh[kBlock / 32];
  const int r = WARP_ROWS ? blockIdx.x * (kBlock / 32) + (threadIdx.x >> 5) : blockIdx.x;
  if (r >= rows) return;
  float* hr = h + static_cast<size_t>(r) * n;
  const float* rr = res + static_cast<size_t>(r) * n;
  float* yr = y + static_cast<size_t>(r) * n;
  const int t0 = norm_t0<WARP_ROWS>(), step = kNormStep<WARP_ROWS>;
  for (int i = t0; i < n; i += step) hr[i] = __fadd_rn(hr[i], rr[i]);
  const float inv = rms_inv(row_sumsq<WARP_ROWS>(hr, n, sh), n, eps);
  for (int i = t0; i < n; i += step) yr[i] = __fmul_rn(__fmul_rn(hr[i], inv), w ? w[i] : 1.0f);
}

// The norm kernel for rows of n: warp-rows with 4 / 8 / 32 elements a thread up to 128 / 256 / 1024,
// block-rows with registers up to kNormPer * kBlock, past that the plain kernel (fp32 output only:
// false for bf16, nothing launched).
template <bool GATED, class OUT>
bool rmsnorm_launch(const float* x, const float* gate, const float* w, OUT* y, int rows, int n, float eps,
                    cudaStream_t st) {
  if (rows <= 0 || n <= 0) return true;
  const dim3 grid_w((rows + 7) / 8);
  if (n <= 128) {
    launch_k(rmsnorm_reg_kernel<true, GATED, OUT, 4>, grid_w, dim3(kBlock), 0, st, x, gate, w, y, rows, n, eps);
  } else if (n <= 256) {
    launch_k(rmsnorm_reg_kernel<true, GATED, OUT, 8>, grid_w, dim3(kBlock), 0, st, x, gate, w, y, rows, n, eps);
  } else if (n <= 1024) {
    launch_k(rmsnorm_reg_kernel<true, GATED, OUT>, grid_w, dim3(kBlock), 0, st, x, gate, w, y, rows, n, eps);
  } else if (n <= kNormPer * kBlock) {
    launch_k(rmsnorm_reg_kernel<false, GATED, OUT>, dim3(rows), dim3(kBlock), 0, st, x, gate, w, y, rows, n, eps);
  } else if constexpr (std::is_same_v<OUT, float>) {
    launch_k(rmsnorm_kernel<false, GATED>, dim3(rows), dim3(kBlock), 0, st, x, gate, w, y, rows, n, eps);
  } else {
    return false;
  }
  QF_CUDA_LAUNCH_CHECK("rmsnorm_kernel");
  return true;
}

enum class EwOp { Add, Scale, Swiglu, SigmoidMul, Softcap };

template <EwOp OP>
__global__ void ew_kernel(float* y, const float* a, const float* b, float s, size_t n) {
  pdl_trigger();
  pdl_wait();
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    if constexpr (OP == EwOp::Add) y[i] = __fadd_rn(y[i], a[i]);
    if constexpr (OP == EwOp::Scale) y[i] = __fmul_rn(y[i], s);
    if constexpr (OP == EwOp::Swiglu) y[i] = swiglu_f(a[i], b[i]);
    if constexpr (OP == EwOp::SigmoidMul) y[i] = __fmul_rn(y[i], sigmoid_f(a[i]));
    if constexpr (OP == EwOp::Softcap) y[i] = __fmul_rn(tanhf(__fdiv_rn(y[i], s)), s);
  }
}

// swiglu with bf16 output (f32_to_bf16_bits of swiglu's fp32 value): the prefill's fused
// down-projection input (Backend::swiglu_gemm). Four elements per step where aligned.
__global__ void swiglu_bf16_kernel(const float* __restrict__ g, const float* __restrict__ u, uint16_t* __restrict__ out,
                                   size_t n, bool vec) {
  pdl_trigger();
  pdl_wait();
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t i0 = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  size_t tail = 0;
  if (vec) {
    const size_t n4 = n / 4;
    for (size_t j = i0; j < n4; j += stride) {
      const float4 a = reinterpret_cast<const float4*>(g)[j], b = reinterpret_cast<const float4*>(u)[j];
      uint2 o;
      o.x = f32_to_bf16_bits(swiglu_f(a.x, b.x)) | (static_cast<uint32_t>(f32_to_bf16_bits(swiglu_f(a.y, b.y))) << 16);
      o.y = f32_to_bf16_bits(swiglu_f(a.z, b.z)) | (static_cast<uint32_t>(f32_to_bf16_bits(swiglu_f(a.w, b.w))) << 16);
      reinterpret_cast<uint2*>(out)[j] = o;
    }
    tail = n4 * 4;
  }
  for (size_t j = tail + i0; j < n; j += stride) out[j] = f32_to_bf16_bits(swiglu_f(g[j], u[j]));
}

// x * sigmoid(g) with bf16 output (f32_to_bf16_bits of sigmoid_mul's fp32 value): the prefill's
// fused o-projection input (Backend::sigmoid_mul_gemm).
__global__ void sigmoid_mul_bf16_kernel(const float* __restrict__ x, const float* __restrict__ g,
                                        uint16_t* __restrict__ out, size_t n) {
  pdl_trigger();
  pdl_wait();
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    out[i] = f32_to_bf16_bits(__fmul_rn(x[i], sigmoid_f(g[i])));
}

template <EwOp OP>
void ew_launch(float* y, const float* a, const float* b, float s, size_t n, cudaStream_t st) {
  if (n == 0) return;
  launch_k(ew_kernel<OP>, dim3(grid_for(n, kBlock)), dim3(kBlock), 0, st, y, a, b, s, n);
  QF_CUDA_LAUNCH_CHECK("ew_kernel");
}

__global__ void split_qgate_kernel(const float* __restrict__ qg, float* __restrict__ q, float* __restrict__ gate,
                                   size_t total, int hd) {
  pdl_trigger();
  pdl_wait();
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t mh = i / hd, d = i % hd;
    q[i] = qg[mh * 2 * hd + d];
    gate[i] = qg[mh * 2 * hd + hd + d];
  }
}

__global__ void rope_kernel(float* x, int M, int nh, int hd, int half, const RopeFreqs f, const StepMeta* meta) {
  pdl_trigger();
  pdl_wait();
  // One thread per (row, head, rotated pair); each computes its own angle (the same expression for
  // every head, so the same bits).
  const size_t total = static_cast<size_t>(M) * nh * half;
  const int32_t pos0 = meta->q_pos0;
  for (size_t t = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int i = static_cast<int>(t % half);
    const size_t mh = t / half;  // m * nh + h
    const int m = static_cast<int>(mh / nh);
    const float pos = static_cast<float>(pos0 + m);
    const float ang = __fmul_rn(pos, f.inv[i]);
    const float c = cosf(ang), s = sinf(ang);
    float* xh = x + mh * hd;
    const float a = xh[i], b = xh[i + half];
    xh[i] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    xh[i + half] = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
  }
}

template <class T>
__global__ void kv_write_kernel(T* cache, const float* __restrict__ rows, int M, int width, const StepMeta* meta,
                                DevError* err) {
  pdl_trigger();
  pdl_wait();
  const int64_t row0 = static_cast<int64_t>(meta->q_pos0) - meta->kv_pos0;
  if (row0 < 0) {
    if (blockIdx.x == 0 && threadIdx.x == 0) set_error(err, kErrKvWrite, meta->q_pos0, meta->kv_pos0, 0);
    return;
  }
  const size_t total = static_cast<size_t>(M) * width;
  T* dst = cache + static_cast<size_t>(row0) * width;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    if constexpr (sizeof(T) == 2)
      dst[i] = f32_to_bf16_bits(rows[i]);
    else
      dst[i] = rows[i];
  }
}

__global__ void dyn_conv_kernel(const float* __restrict__ x, const float* __restrict__ base,
                                const float* __restrict__ D, float* __restrict__ out, int L, int H, int Kc, int gs,
                                int side) {
  pdl_trigger();
  pdl_wait();
  const int G = H / gs;
  const size_t total = static_cast<size_t>(L) * H;
  for (size_t t = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int i = static_cast<int>(t / H), c = static_cast<int>(t % H);
    float acc = 0.0f;
    for (int tt = 0; tt < Kc && tt <= i; tt++) {
      const float coef = __fadd_rn(base[static_cast<size_t>(tt) * H + c],
                                   D[static_cast<size_t>(i) * 2 * Kc * G + side * Kc * G + tt * G + c / gs]);
      acc = __fadd_rn(acc, __fmul_rn(coef, x[static_cast<size_t>(i - tt) * H + c]));
    }
    out[t] = acc;
  }
}

__device__ __forceinline__ uint64_t splitmix64_d(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The host's f32_to_bf16: round to nearest even, NaN kept quiet.
__device__ __forceinline__ uint16_t f32_to_bf16_d(float f) {
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

template <bool BF16>
__global__ void fill_random_kernel(void* dst, size_t n, uint64_t seed, float scale) {
  // No early pdl_trigger(): fill_random writes weights (synthetic checkpoints), and the GEMVs read
  // their first weights before pdl_wait(); without the trigger no later kernel starts before
  // this one has completed, so that early read can never see a weight being filled.
  pdl_wait();
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float u = __fsub_rn(__fmul_rn(static_cast<float>(splitmix64_d(seed + i) >> 40), 2.0f / 16777216.0f), 1.0f);
    const float v = __fmul_rn(scale, u);
    if constexpr (BF16)
      static_cast<uint16_t*>(dst)[i] = f32_to_bf16_d(v);
    else
      static_cast<float*>(dst)[i] = v;
  }
}

__global__ void probe_kernel(int* x) {
  if (x) *x = 1;
}

}  // namespace

cudaError_t probe_launch(cudaStream_t st) {
  probe_kernel<<<1, 1, 0, st>>>(nullptr);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  return cudaStreamSynchronize(st);
}

void fill_random(void* dst, size_t n, DType dt, uint64_t seed, float scale, cudaStream_t st) {
  if (n == 0) return;
  if (dt == DType::BF16)
    launch_k(fill_random_kernel<true>, dim3(grid_for(n, kBlock, 132 * 64)), dim3(kBlock), 0, st, dst, n, seed, scale);
  else if (dt == DType::F32)
    launch_k(fill_random_kernel<false>, dim3(grid_for(n, kBlock, 132 * 64)), dim3(kBlock), 0, st, dst, n, seed, scale);
  else
    backend_fail("cuda fill_random: dtype code %d (only BF16 and F32)", static_cast<int>(dt));
  QF_CUDA_LAUNCH_CHECK("fill_random_kernel");
}

void embed(const WeightRef& E, const int32_t* ids, float* out, int M, DevError* err, cudaStream_t st) {
  if (M <= 0 || E.cols <= 0) return;
  check_weight_view(E, "embed");
  if (M > 65535) backend_fail("cuda embed: %d rows in one call", M);
  const unsigned gx = grid_for(static_cast<size_t>(E.cols), kBlock, 64);
  launch_k(embed_kernel, dim3(dim3(gx, M)), dim3(kBlock), 0, st, view_of(E), ids, out, M, err);
  QF_CUDA_LAUNCH_CHECK("embed_kernel");
}

void rmsnorm(const float* x, const float* w, float* y, int rows, int n, float eps, cudaStream_t st) {
  rmsnorm_launch<false>(x, nullptr, w, y, rows, n, eps, st);
}
void rmsnorm_gated(const float* x, const float* gate, const float* w, float* y, int rows, int n, float eps,
                   cudaStream_t st) {
  rmsnorm_launch<true>(x, gate, w, y, rows, n, eps, st);
}
void add_rmsnorm(float* h, const float* r, const float* w, float* y, int rows, int n, float eps, cudaStream_t st) {
  if (rows <= 0 || n <= 0) return;
  if (n <= 1024)
    launch_k(add_rmsnorm_reg_kernel<true>, dim3((rows + 7) / 8), dim3(kBlock), 0, st, h, r, w, y, rows, n, eps);
  else if (n <= kNormPer * kBlock)
    launch_k(add_rmsnorm_reg_kernel<false>, dim3(rows), dim3(kBlock), 0, st, h, r, w, y, rows, n, eps);
  else
    launch_k(add_rmsnorm_kernel<false>, dim3(rows), dim3(kBlock), 0, st, h, r, w, y, rows, n, eps);
  QF_CUDA_LAUNCH_CHECK("add_rmsnorm_kernel");
}
void add(float* y, const float* x, size_t n, cudaStream_t st) { ew_launch<EwOp::Add>(y, x, nullptr, 0, n, st); }
void scale(float* y, float s, size_t n, cudaStream_t st) { ew_launch<EwOp::Scale>(y, nullptr, nullptr, s, n, st); }
void swiglu(const float* g, const float* u, float* out, size_t n, cudaStream_t st) {
  ew_launch<EwOp::Swiglu>(out, g, u, 0, n, st);
}
void swiglu_bf16(const float* g, const float* u, uint16_t* out, size_t n, cudaStream_t st) {
  if (n == 0) return;
  const bool vec = ((reinterpret_cast<uintptr_t>(g) | reinterpret_cast<uintptr_t>(u)) & 15) == 0 &&
                   (reinterpret_cast<uintptr_t>(out) & 7) == 0;
  launch_k(swiglu_bf16_kernel, dim3(grid_for(vec ? (n + 3) / 4 : n, kBlock, 132 * 16)), dim3(kBlock), 0, st, g, u, out,
           n, vec);
  QF_CUDA_LAUNCH_CHECK("swiglu_bf16_kernel");
}
bool rmsnorm_gated_bf16(const float* x, const float* gate, const float* w, uint16_t* y, int rows, int n, float eps,
                        cudaStream_t st) {
  return rmsnorm_launch<true>(x, gate, w, y, rows, n, eps, st);
}
bool rmsnorm_bf16(const float* x, const float* w, uint16_t* y, int rows, int n, float eps, cudaStream_t st) {
  return rmsnorm_launch<false>(x, nullptr, w, y, rows, n, eps, st);
}
bool add_rmsnorm_bf16(float* h, const float* r, const float* w, uint16_t* y, int rows, int n, float eps,
                      cudaStream_t st) {
  if (rows <= 0 || n <= 0) return true;
  if (n <= 1024)  // add_rmsnorm's choice of kernel
    launch_k(add_rmsnorm_reg_kernel<true, uint16_t>, dim3((rows + 7) / 8), dim3(kBlock), 0, st, h, r, w, y, rows, n,
             eps);
  else if (n <= kNormPer * kBlock)
    launch_k(add_rmsnorm_reg_kernel<false, uint16_t>, dim3(rows), dim3(kBlock), 0, st, h, r, w, y, rows, n, eps);
  else
    return false;
  QF_CUDA_LAUNCH_CHECK("add_rmsnorm_kernel");
  return true;
}
void sigmoid_mul_bf16(const float* x, const float* g, uint16_t* out, size_t n, cudaStream_t st) {
  if (n == 0) return;
  launch_k(sigmoid_mul_bf16_kernel, dim3(grid_for(n, kBlock)), dim3(kBlock), 0, st, x, g, out, n);
  QF_CUDA_LAUNCH_CHECK("sigmoid_mul_bf16_kernel");
}
void sigmoid_mul(float* y, const float* g, size_t n, cudaStream_t st) {
  ew_launch<EwOp::SigmoidMul>(y, g, nullptr, 0, n, st);
}
void softcap(float* y, float cap, size_t n, cudaStream_t st) {
  if (cap <= 0) return;
  ew_launch<EwOp::Softcap>(y, nullptr, nullptr, cap, n, st);
}

void split_qgate(const float* qg, float* q, float* gate, int M, int n_heads, int head_dim, cudaStream_t st) {
  const size_t total = static_cast<size_t>(M) * n_heads * head_dim;
  if (total == 0) return;
  launch_k(split_qgate_kernel, dim3(grid_for(total, kBlock)), dim3(kBlock), 0, st, qg, q, gate, total, head_dim);
  QF_CUDA_LAUNCH_CHECK("split_qgate_kernel");
}

void rope(float* x, int M, int n_heads, int head_dim, int rot_dim, const RopeFreqs& f, const StepMeta* meta,
          cudaStream_t st) {
  const int half = rot_dim / 2;
  if (M <= 0 || half <= 0) return;
  if (half > kMaxRopeHalf || rot_dim > head_dim)
    backend_fail("cuda rope: rot_dim %d (head_dim %d) exceeds what the kernel supports (%d)", rot_dim, head_dim,
                 2 * kMaxRopeHalf);
  const size_t total = static_cast<size_t>(M) * n_heads * half;
  launch_k(rope_kernel, dim3(grid_for(total, 128)), dim3(128), 0, st, x, M, n_heads, head_dim, half, f, meta);
  QF_CUDA_LAUNCH_CHECK("rope_kernel");
}

void kv_write(void* cache, DType dt, const float* rows, int M, int width, const StepMeta* meta, DevError* err,
              cudaStream_t st) {
  const size_t total = static_cast<size_t>(M) * width;
  if (total == 0) return;
  const dim3 grid(grid_for(total, kBlock));
  if (dt == DType::BF16)
    launch_k(kv_write_kernel<uint16_t>, grid, dim3(kBlock), 0, st, static_cast<uint16_t*>(cache), rows, M, width, meta,
             err);
  else if (dt == DType::F32)
    launch_k(kv_write_kernel<float>, grid, dim3(kBlock), 0, st, static_cast<float*>(cache), rows, M, width, meta, err);
  else
    backend_fail("cuda kv_write: cache dtype code %d (F32 or BF16 expected)", static_cast<int>(dt));
  QF_CUDA_LAUNCH_CHECK("kv_write_kernel");
}

void dyn_conv(const float* x, const float* base, const float* D, float* out, int L, int H, int Kc, int gs, int side,
              cudaStream_t st) {
  const size_t total = static_cast<size_t>(L) * H;
  if (total == 0) return;
  if (gs <= 0 || H % gs != 0) backend_fail("cuda dyn_conv: group size %d does not divide H %d", gs, H);
  launch_k(dyn_conv_kernel, dim3(grid_for(total, kBlock)), dim3(kBlock), 0, st, x, base, D, out, L, H, Kc, gs, side);
  QF_CUDA_LAUNCH_CHECK("dyn_conv_kernel");
}

}  // namespace qf::cuda
