// GQA attention for decode and verify (flash-decoding style, two kernels), for fp32 K/V and the
// shapes the grouped kernel (attention_group.cu: bf16 K/V, one block per kv group) does not take.
//
// Kernel 1, grid (head, row, split): query row m of head h sees key rows [lo, hi) (causal /
// window rules of backend.h, read from the StepMeta in device memory). The key buffer is cut
// into chunks at absolute multiples of kAttnChunk; chunk c belongs to split c % kAttnSplits.
// Each block walks its chunks in increasing order with an online softmax (running max, sum,
// weighted V accumulator) and writes one partial. Kernel 2 combines the kAttnSplits partials of
// a (row, head) in split order.
//
// Row-invariance: everything row m computes depends on its own query, its own [lo, hi) and the
// two constants; not on M, not on n_kv beyond what bounds [lo, hi). Decode at position P+m
// (n_kv = P+m+1) and row m of a verify block (n_kv = P+M) therefore agree bit for bit.
// The grid depends on M and the head count only, so a captured graph can be replayed after the
// host updates the StepMeta.
#include <cmath>

#include "backend/cuda/device_common.cuh"
#include "backend/cuda/kernels.h"

namespace qf::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kDPerThread = kAttnMaxHeadDim / kThreads;  // 4
constexpr int kKeyBatch = 4;   // keys per warp whose K rows are loaded together
constexpr int kValBatch = 16;  // keys whose V entries a thread loads together
static_assert((kAttnChunk / kWarps) % kKeyBatch == 0, "key batches must tile a warp's keys");

struct AttnGeom {
  int n_heads, group, head_dim, kvw;
  float scale;
  int causal, window;
};

// K/V elements widened to fp32 (bf16 exactly).
__device__ __forceinline__ float kv_ld(const float* p) { return *p; }
__device__ __forceinline__ float kv_ld(const uint16_t* p) { return bf16_bits(*p); }

template <class T>
__global__ void __launch_bounds__(kThreads) attn_split_kernel(const float* __restrict__ q, const T* __restrict__ K,
                                                              const T* __restrict__ V, float* __restrict__ part,
                                                              const AttnGeom G, const StepMeta* meta) {
  pdl_trigger();
  pdl_wait();
  const int h = blockIdx.x, m = blockIdx.y, z = blockIdx.z;
  const int hd = G.head_dim;
  const int g = h / G.group;
  __shared__ float qs[kAttnMaxHeadDim];
  __shared__ float sc[kAttnChunk];
  __shared__ float ps[kAttnChunk];

  int64_t lo, hi;
  attn_visible_range<false>(meta, m, G.causal, G.window, &lo, &hi);
  const float* qh = q + (static_cast<size_t>(m) * G.n_heads + h) * hd;
  for (int d = threadIdx.x; d < hd; d += kThreads) qs[d] = qh[d];

  float run_max = -INFINITY, run_sum = 0.0f;
  float acc[kDPerThread];
#pragma unroll
  for (int k = 0; k < kDPerThread; k++) acc[k] = 0.0f;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (hi > lo) {
    const int64_t c_lo = lo / kAttnChunk, c_hi = (hi + kAttnChunk - 1) / kAttnChunk;
    int64_t c = c_lo + ((z - c_lo % kAttnSplits) + kAttnSplits) % kAttnSplits;  // first chunk of this split
    __syncthreads();  // qs
    for (; c < c_hi; c += kAttnSplits) {
      const int64_t cbase = c * kAttnChunk;
      const int64_t j0 = cbase > lo ? cbase : lo;
      const int64_t j1 = cbase + kAttnChunk < hi ? cbase + kAttnChunk : hi;
      // L2 prefetch (no data, no change to the arithmetic): this chunk's V rows, read after the
      // scores, and the next chunk's K rows, so the serial chunk walk of a long context finds
      // them in L2 instead of HBM. Only where this split has a next chunk (a long context: up to
      // 1024 keys every split has at most one), and only the block of row 0 and the group's
      // first head (the other heads and rows read the same lines). A prefetch never changes a
      // result, so these choices cannot break row-invariance.
      if (m == 0 && h % G.group == 0 && c + kAttnSplits < c_hi) {
        const int lines = (hd * static_cast<int>(sizeof(T)) + 127) / 128;  // 128-byte lines per key row of one kv head
        const int64_t jn0 = cbase + static_cast<int64_t>(kAttnSplits) * kAttnChunk;  // this split's next chunk
        const int64_t jn1 = jn0 + kAttnChunk < hi ? jn0 + kAttnChunk : hi;
        for (int L = threadIdx.x; L < 2 * kAttnChunk * lines; L += kThreads) {
          const bool next = L >= kAttnChunk * lines;
          const int LL = next ? L - kAttnChunk * lines : L;
          const int64_t j = (next ? jn0 : cbase) + LL / lines;
          if (next ? (j < jn1) : (j >= j0 && j < j1)) {
            const T* base = next ? K : V;
            touch_l2(base + static_cast<size_t>(j) * G.kvw + static_cast<size_t>(g) * hd +
                     (128 / sizeof(T)) * (LL % lines));
          }
        }
      }
      // scores: one warp per key (keys warp, warp + kWarps, ...), lanes over the head dimension
      // (d = lane, lane + 32, ... in order), then a fixed tree. The keys of a warp go in batches of
      // kKeyBatch whose loads are all issued before the first product (latency, not bandwidth,
      // bounds a short chunk).
      for (int u0 = 0; u0 < kAttnChunk / kWarps; u0 += kKeyBatch) {
        float kv[kKeyBatch][kAttnMaxHeadDim / 32];
#pragma unroll
        for (int u = 0; u < kKeyBatch; u++) {
          const int64_t j = cbase + warp + kWarps * (u0 + u);
          const bool ok = j >= j0 && j < j1;
          const T* kj = K + static_cast<size_t>(ok ? j : j0) * G.kvw + static_cast<size_t>(g) * hd;
#pragma unroll
          for (int e = 0; e < kAttnMaxHeadDim / 32; e++) {
            const int d = lane + 32 * e;
            kv[u][e] = ok && d < hd ? kv_ld(kj + d) : 0.0f;
          }
        }
#pragma unroll
        for (int u = 0; u < kKeyBatch; u++) {
          const int jj = warp + kWarps * (u0 + u);
          const int64_t j = cbase + jj;
          float p = 0.0f;
#pragma unroll
          for (int e = 0; e < kAttnMaxHeadDim / 32; e++)
            if (lane + 32 * e < hd) p = fmaf(qs[lane + 32 * e], kv[u][e], p);
          const float sum = warp_sum(p);
          if (lane == 0) sc[jj] = (j >= j0 && j < j1) ? __fmul_rn(sum, G.scale) : -INFINITY;
        }
      }
      __syncthreads();
      float cmax = -INFINITY;
      for (int t = 0; t < kAttnChunk; t++) cmax = fmaxf(cmax, sc[t]);
      const float new_max = fmaxf(run_max, cmax);
      const float alpha = expf(run_max - new_max);  // 0 on the first chunk (run_max = -inf)
      for (int t = threadIdx.x; t < kAttnChunk; t += kThreads) {
        const int64_t j = cbase + t;
        ps[t] = (j >= j0 && j < j1) ? expf(sc[t] - new_max) : 0.0f;
      }
      __syncthreads();
      float csum = 0.0f;
      for (int t = 0; t < kAttnChunk; t++) csum = __fadd_rn(csum, ps[t]);
      run_sum = __fadd_rn(__fmul_rn(run_sum, alpha), csum);
      // weighted values: keys j0 .. j1 - 1 in order, their loads issued kValBatch at a time
#pragma unroll
      for (int k = 0; k < kDPerThread; k++) {
        const int d = threadIdx.x + k * kThreads;
        if (d < hd) {
          float a = __fmul_rn(acc[k], alpha);
          const T* vd = V + static_cast<size_t>(g) * hd + d;
          for (int64_t jb = j0; jb < j1; jb += kValBatch) {
            float vv[kValBatch];
#pragma unroll
            for (int u = 0; u < kValBatch; u++) vv[u] = jb + u < j1 ? kv_ld(vd + static_cast<size_t>(jb + u) * G.kvw) : 0.0f;
#pragma unroll
            for (int u = 0; u < kValBatch; u++)
              if (jb + u < j1) a = fmaf(ps[jb + u - cbase], vv[u], a);
          }
          acc[k] = a;
        }
      }
      run_max = new_max;
      __syncthreads();  // sc / ps reused by the next chunk
    }
  }
  float* out = part + ((static_cast<size_t>(m) * G.n_heads + h) * kAttnSplits + z) * (hd + 2);
  if (threadIdx.x == 0) {
    out[0] = run_max;
    out[1] = run_sum;
  }
#pragma unroll
  for (int k = 0; k < kDPerThread; k++) {
    const int d = threadIdx.x + k * kThreads;
    if (d < hd) out[2 + d] = acc[k];
  }
}

__global__ void __launch_bounds__(kThreads) attn_combine_kernel(const float* __restrict__ part, float* __restrict__ o,
                                                                int n_heads, int hd) {
  pdl_trigger();
  pdl_wait();
  const int h = blockIdx.x, m = blockIdx.y;
  const float* base = part + (static_cast<size_t>(m) * n_heads + h) * kAttnSplits * (hd + 2);
  float gmax = -INFINITY;
  for (int z = 0; z < kAttnSplits; z++) gmax = fmaxf(gmax, base[z * (hd + 2)]);
  float* oh = o + (static_cast<size_t>(m) * n_heads + h) * hd;
  if (gmax == -INFINITY) {  // no visible key: the CPU twin writes zeros
    for (int d = threadIdx.x; d < hd; d += kThreads) oh[d] = 0.0f;
    return;
  }
  float wz[kAttnSplits];
  float total = 0.0f;
#pragma unroll
  for (int z = 0; z < kAttnSplits; z++) {
    const float mz = base[z * (hd + 2)];
    wz[z] = mz == -INFINITY ? 0.0f : expf(mz - gmax);
    if (mz != -INFINITY) total = __fadd_rn(total, __fmul_rn(base[z * (hd + 2) + 1], wz[z]));
  }
  for (int d = threadIdx.x; d < hd; d += kThreads) {
    float s = 0.0f;
#pragma unroll
    for (int z = 0; z < kAttnSplits; z++)
      if (wz[z] != 0.0f) s = fmaf(base[z * (hd + 2) + 2 + d], wz[z], s);
    oh[d] = __fdiv_rn(s, total);
  }
}

}  // namespace

size_t attention_scratch_floats(int M, int n_heads, int head_dim) {
  return static_cast<size_t>(M) * n_heads * (kGrpSplits > kAttnSplits ? kGrpSplits : kAttnSplits) * (head_dim + 2);
}

void attention(const float* q, const void* K, const void* V, float* out, int M, const AttnParams& p,
               const StepMeta* meta, float* scratch, cudaStream_t st) {
  if (M <= 0 || p.n_heads <= 0) return;
  if (p.head_dim <= 0 || p.head_dim > kAttnMaxHeadDim)
    backend_fail("cuda attention: head_dim %d outside 1..%d", p.head_dim, kAttnMaxHeadDim);
  if (p.n_kv_heads <= 0 || p.n_heads % p.n_kv_heads != 0)
    backend_fail("cuda attention: %d heads not a multiple of %d kv heads", p.n_heads, p.n_kv_heads);
  if (M > 65535) backend_fail("cuda attention: %d rows in one call", M);
  if (attention_grouped_applies(p)) return attention_grouped(q, K, V, out, M, p, meta, scratch, st);
  AttnGeom G;
  G.n_heads = p.n_heads;
  G.group = p.n_heads / p.n_kv_heads;
  G.head_dim = p.head_dim;
  G.kvw = p.n_kv_heads * p.head_dim;
  G.scale = p.scale;
  G.causal = p.causal ? 1 : 0;
  G.window = p.window;
  const dim3 grid(p.n_heads, M, kAttnSplits);
  if (p.kv_dtype == DType::BF16)
    launch_k(attn_split_kernel<uint16_t>, grid, dim3(kThreads), 0, st, q, static_cast<const uint16_t*>(K),
             static_cast<const uint16_t*>(V), scratch, G, meta);
  else if (p.kv_dtype == DType::F32)
    launch_k(attn_split_kernel<float>, grid, dim3(kThreads), 0, st, q, static_cast<const float*>(K),
             static_cast<const float*>(V), scratch, G, meta);
  else
    backend_fail("cuda attention: K/V dtype code %d (F32 or BF16 expected)", static_cast<int>(p.kv_dtype));
  QF_CUDA_LAUNCH_CHECK("attn_split_kernel");
  launch_k(attn_combine_kernel, dim3(dim3(p.n_heads, M)), dim3(kThreads), 0, st, scratch, out, p.n_heads, p.head_dim);
  QF_CUDA_LAUNCH_CHECK("attn_combine_kernel");
}

}  // namespace qf::cuda
