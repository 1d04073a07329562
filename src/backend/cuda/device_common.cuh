// Device helpers shared by the CUDA backend's kernels. Every floating-point reduction here has a
// fixed order (explicit _rn intrinsics, fixed shuffle trees), so a result depends on its inputs
// only, never on launch geometry chosen from the row count M.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "backend/cuda/cuda_util.h"
#include "backend/cuda/kernels.h"

namespace qf::cuda {

constexpr unsigned kFull = 0xffffffffu;

// Sum over the 32 lanes by an xor butterfly. Every lane ends with the same value: at each level
// both partners add the same two operands (fp add is commutative), so the tree is identical.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o >= 1; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(kFull, v, o));
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o >= 1; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFull, v, o));
  return v;
}

// CPU twins (backend/cpu): silu(x) = x / (1 + exp(-x)), sigmoid = 1 / (1 + exp(-x)),
// softplus with torch's threshold 20. Plain IEEE division (no fast-math).
__device__ __forceinline__ float silu_f(float x) { return __fdiv_rn(x, __fadd_rn(1.0f, expf(-x))); }
__device__ __forceinline__ float sigmoid_f(float x) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x))); }
__device__ __forceinline__ float softplus_f(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ float bf16_bits(uint16_t h) { return __uint_as_float(static_cast<uint32_t>(h) << 16); }
__device__ __forceinline__ float f16_bits(uint16_t h) { return __half2float(__ushort_as_half(h)); }
// Exact small-integer to float: 2^23 + q has q in its mantissa.
__device__ __forceinline__ float nib_to_f(uint32_t q) { return __fsub_rn(__uint_as_float(0x4B000000u | q), 8388608.0f); }
// int4 group-affine dequantisation exactly as the CPU twin: q * scale + bias, two roundings.
__device__ __forceinline__ float deq4(uint32_t q, float s, float b) { return __fadd_rn(__fmul_rn(nib_to_f(q), s), b); }

// Programmatic dependent launch (Hopper). pdl_trigger(): a kernel lets the next kernel in the
// stream be scheduled now, if that kernel was launched with the programmatic attribute
// (launch_k sets it on every launch unless QFLASH_PDL=0); the next kernel still sees none of this kernel's writes until it
// has called pdl_wait(), which returns when every earlier kernel has completed and flushed. Both
// are no-ops for a kernel launched the ordinary way.
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Asks L2 for the line holding p (no data returned, nothing to wait for). Used before
// pdl_wait() on buffers an earlier kernel may still write: the line is coherent in L2 either way,
// and the address translation and first fetch overlap the previous kernel's tail.
__device__ __forceinline__ void touch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// Every kernel launch of the backend: the ordinary launch, or with programmatic dependent launch
// unless QFLASH_PDL=0 (pdl_enabled(), cuda_util.h). Every kernel launched here calls pdl_trigger()
// and then pdl_wait() before it touches memory that an earlier kernel may write, so PDL overlaps
// a kernel's launch and scheduling with its predecessor's tail. The exceptions read weights
// before pdl_wait(): the tensor-core GEMVs (their first chunk), the norms (the norm vector) and
// the GDN conv (its taps). Weights are written only by uploads (copies, which never overlap a
// kernel) and by fill_random and the GEMV relayout, which do not trigger early, so no weight
// is still being written when a later kernel starts.
template <class... Exp, class... Act>
void launch_k(void (*kernel)(Exp...), dim3 grid, dim3 block, size_t smem, cudaStream_t st, Act&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 1 : 0;
  const bool prof = prof_on();
  if (prof) prof_before(st);
  cuda_check(cudaLaunchKernelEx(&cfg, kernel, std::forward<Act>(args)...), "cudaLaunchKernelEx", __FILE__, __LINE__);
  if (prof) prof_after(reinterpret_cast<const void*>(kernel), grid.x * grid.y * grid.z, block.x * block.y * block.z, st);
}

// Streaming 16-byte weight load: read once, keep out of L1 (the activations live there).
__device__ __forceinline__ uint4 ld_stream16(const void* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

// One weight element as fp32 for the generic (scalar) paths: dtype codes as qf::DType.
struct WeightView {
  const void* data;
  const uint16_t* scales;
  const uint16_t* biases;
  int64_t rows, cols;
  int group;
  int dtype;  // static_cast<int>(qf::DType)
};

__device__ __forceinline__ float weight_at(const WeightView& W, int64_t r, int64_t c) {
  switch (W.dtype) {
    case 0:  // F32
      return static_cast<const float*>(W.data)[r * W.cols + c];
    case 1:  // F16
      return f16_bits(static_cast<const uint16_t*>(W.data)[r * W.cols + c]);
    case 2:  // BF16
      return bf16_bits(static_cast<const uint16_t*>(W.data)[r * W.cols + c]);
    default: {  // U32: int4 packed 8 per word
      const uint32_t word = static_cast<const uint32_t*>(W.data)[r * (W.cols / 8) + c / 8];
      const uint32_t q = (word >> (4 * (c % 8))) & 0xfu;
      const int64_t ng = W.cols / W.group;
      const float s = bf16_bits(W.scales[r * ng + c / W.group]);
      const float b = bf16_bits(W.biases[r * ng + c / W.group]);
      return deq4(q, s, b);
    }
  }
}

inline WeightView view_of(const WeightRef& W) {
  WeightView v;
  v.data = W.data;
  v.scales = static_cast<const uint16_t*>(W.scales);
  v.biases = static_cast<const uint16_t*>(W.biases);
  v.rows = W.rows;
  v.cols = W.cols;
  v.group = W.group;
  v.dtype = static_cast<int>(W.dtype);
  return v;
}

// Plain stores (the record may live in mapped host memory, where device atomics are not
// guaranteed): when several threads fail at once, one of their reports survives.
__device__ __forceinline__ void set_error(DevError* e, int code, int a, int b, int c) {
  if (!e) return;
  volatile DevError* v = e;
  if (v->code != 0) return;
  v->a = a;
  v->b = b;
  v->c = c;
  __threadfence_system();
  v->code = code;
}

// weight_at decodes F32 / F16 / BF16 and treats anything else as int4: refuse other dtypes (and
// int4 without its scales) on the host, where the CPU twin fails too.
inline void check_weight_view(const WeightRef& W, const char* what) {
  if (!W.data) backend_fail("cuda %s: weight has no data", what);
  if (W.dtype == DType::U32) {
    if (W.group <= 0 || !W.scales || !W.biases || W.cols % 8 != 0 || W.cols % W.group != 0)
      backend_fail("cuda %s: int4 weight without scales/biases or with group %d not dividing cols %lld", what, W.group,
                   static_cast<long long>(W.cols));
  } else if (W.dtype != DType::F32 && W.dtype != DType::F16 && W.dtype != DType::BF16) {
    backend_fail("cuda %s: unsupported weight dtype code %d", what, static_cast<int>(W.dtype));
  }
}

inline unsigned grid_for(size_t n, int block, unsigned cap = 65535u * 8u) {
  size_t g = (n + block - 1) / block;
  if (g < 1) g = 1;
  return static_cast<unsigned>(g > cap ? cap : g);
}

}  // namespace qf::cuda
