// Internals of the chunked gated DeltaNet kernels (gdn_chunk.cu): the split-tf32 tensor-core
// products and the recurrence's arguments. Included by gdn_chunk.cu only.
#pragma once
#include <atomic>
#include <cstdint>

#include "backend/cuda/cuda_util.h"
#include "backend/cuda/gdn_chunk.h"

namespace qf::cuda::gdn_detail {

constexpr int kC = Backend::kPrefillChunk;
static_assert(kC == 64, "the kernels tile a chunk as 4 warps x 16 rows and 8-row k-steps");
constexpr int kMaxD = 128;
constexpr int kRows = 32;  // rows of S per recurrence block (d_v is a multiple)

struct RecArgs {
  GdnChunkScratch sc;
  float* S;  // [Hv, dv, DK]
  float* y;  // [M, VD]
  int M, nc, Hk, Hv, ratio, dv, VD;
};

// Allows `bytes` of dynamic shared memory once per device: no API call per launch, so a launch
// inside a graph capture needs nothing else.
template <class Kernel>
void allow_smem(Kernel kernel, size_t bytes, std::atomic<uint64_t>& done) {
  int dev = 0;
  QF_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 64 && (done.load() >> dev & 1)) return;
  QF_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  if (dev < 64) done.fetch_or(uint64_t(1) << dev);
}

namespace {

// ---- tensor-core helpers (mma.m16n8k8, tf32 in, fp32 accumulate) ------------------------------
// Fragments of one lane (g = lane / 4, q = lane % 4): A 16x8 row-major a0 (g, q), a1 (g+8, q),
// a2 (g, q+4), a3 (g+8, q+4); B 8x8 (k x n) b0 (q, g), b1 (q+4, g); C 16x8 c0 (g, 2q),
// c1 (g, 2q+1), c2 (g+8, 2q), c3 (g+8, 2q+1).
__device__ __forceinline__ uint32_t to_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}
struct FragA {
  uint32_t hi[4], lo[4];
};
struct FragB {
  uint32_t hi[2], lo[2];
};
// x = hi + lo to about 22 significant bits; x - hi is exact in fp32.
__device__ __forceinline__ void split_tf32(float x, uint32_t& hi, uint32_t& lo) {
  hi = to_tf32(x);
  lo = to_tf32(__fsub_rn(x, __uint_as_float(hi)));
}
__device__ __forceinline__ FragA frag_a(float a0, float a1, float a2, float a3) {
  FragA f;
  split_tf32(a0, f.hi[0], f.lo[0]);
  split_tf32(a1, f.hi[1], f.lo[1]);
  split_tf32(a2, f.hi[2], f.lo[2]);
  split_tf32(a3, f.hi[3], f.lo[3]);
  return f;
}
__device__ __forceinline__ FragB frag_b(float b0, float b1) {
  FragB f;
  split_tf32(b0, f.hi[0], f.lo[0]);
  split_tf32(b1, f.hi[1], f.lo[1]);
  return f;
}
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// d += a b in split precision (lo x lo dropped): the three products of this k-step go into a fresh
// accumulator, which is then added to d with one correctly rounded fp32 add. The tensor core's
// own fp32 accumulation truncates; chaining every k-step into d would let that bias grow with the
// depth (simulated: ~7 u sqrt(n) ||terms|| in the tail at n = 128, against ~1 u sqrt(n) this way,
// which is below a sequential fp32 sum's).
__device__ __forceinline__ void mma3(float (&d)[4], const FragA& a, const FragB& b) {
  float t[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  mma_tf32(t, a.lo, b.hi[0], b.hi[1]);
  mma_tf32(t, a.hi, b.lo[0], b.lo[1]);
  mma_tf32(t, a.hi, b.hi[0], b.hi[1]);
#pragma unroll
  for (int e = 0; e < 4; e++) d[e] = __fadd_rn(d[e], t[e]);
}

}  // namespace
}  // namespace qf::cuda::gdn_detail
