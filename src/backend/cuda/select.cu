// Selection ops: argmax_rows, topk_rows, and DFlash2's selector walk.
//
// argmax and top-k order elements by the strict total order "larger value first, lower index
// among equal values" (NaN never ranks above anything). Because that order is total, the result
// is unique and independent of how the work is split: the kernels may reduce in any tree and
// still return exactly what the CPU twin returns.
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/device_common.cuh"
#include "backend/cuda/kernels.h"

namespace qf::cuda {

namespace {

struct VI {
  float v;
  int i;
};
// a ranks before b
__device__ __forceinline__ bool before(float av, int ai, float bv, int bi) {
  return av > bv || (av == bv && ai < bi);
}

// ---- argmax -----------------------------------------------------------------------------------
constexpr int kArgThreads = 256;
constexpr int kArgMaxBlocks = 64;

__device__ __forceinline__ void warp_best(float& v, int& i) {
#pragma unroll
  for (int o = 16; o >= 1; o >>= 1) {
    const float ov = __shfl_xor_sync(kFull, v, o);
    const int oi = __shfl_xor_sync(kFull, i, o);
    if (before(ov, oi, v, i)) {
      v = ov;
      i = oi;
    }
  }
}

__global__ void __launch_bounds__(kArgThreads) argmax_partial_kernel(const float* __restrict__ x, int n,
                                                                     VI* __restrict__ part) {
  pdl_trigger();
  pdl_wait();
  const int m = blockIdx.y, nb = gridDim.x;
  const float* r = x + static_cast<size_t>(m) * n;
  float bv = -INFINITY;
  int bi = INT_MAX;
  for (int i = blockIdx.x * kArgThreads + threadIdx.x; i < n; i += nb * kArgThreads) {
    const float v = r[i];
    if (before(v, i, bv, bi)) {
      bv = v;
      bi = i;
    }
  }
  warp_best(bv, bi);
  __shared__ float sv[kArgThreads / 32];
  __shared__ int si[kArgThreads / 32];
  if ((threadIdx.x & 31) == 0) {
    sv[threadIdx.x >> 5] = bv;
    si[threadIdx.x >> 5] = bi;
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    bv = threadIdx.x < kArgThreads / 32 ? sv[threadIdx.x] : -INFINITY;
    bi = threadIdx.x < kArgThreads / 32 ? si[threadIdx.x] : INT_MAX;
    warp_best(bv, bi);
    if (threadIdx.x == 0) part[static_cast<size_t>(m) * nb + blockIdx.x] = VI{bv, bi};
  }
}

__global__ void argmax_final_kernel(const VI* __restrict__ part, int nb, const float* __restrict__ x, int n,
                                    int32_t* out) {
  pdl_trigger();
  pdl_wait();
  const int m = blockIdx.x;
  float bv = -INFINITY;
  int bi = INT_MAX;
  for (int b = threadIdx.x; b < nb; b += 32) {
    const VI p = part[static_cast<size_t>(m) * nb + b];
    if (before(p.v, p.i, bv, bi)) {
      bv = p.v;
      bi = p.i;
    }
  }
  warp_best(bv, bi);
  // The CPU twin starts from index 0 and moves on strict '>': a NaN at index 0 is never beaten
  // (returns 0), and every value NaN returns 0 too.
  if (threadIdx.x == 0) out[m] = (bi == INT_MAX || isnan(x[static_cast<size_t>(m) * n])) ? 0 : bi;
}

int argmax_blocks(int n) {
  const int nb = (n + kArgThreads * 16 - 1) / (kArgThreads * 16);
  return nb < 1 ? 1 : nb > kArgMaxBlocks ? kArgMaxBlocks : nb;
}

// ---- top-k ------------------------------------------------------------------------------------
// Pass: each block sorts one segment of kSeg (value, index) pairs in shared memory (bitonic) and
// keeps the first k. Passes repeat on the survivors until one segment remains.
constexpr int kSeg = 4096;
constexpr int kSortThreads = 512;

// One (row m, segment seg) of a top-k pass: its input row (values; indices, or none on the first
// pass, where an element's index is its position) and where its k survivors go.
struct PassRow {
  const float* rv;
  const int32_t* ri;
  float* ov;
  int32_t* oi;
  // Element e of the input row, or past n_in the padding (-inf, INT_MAX), which ranks last.
  __device__ __forceinline__ void load(int e, int n_in, float& v, int& id) const {
    if (e < n_in) {
      v = rv[e];
      id = ri ? ri[e] : e;
    } else {
      v = -INFINITY;
      id = INT_MAX;
    }
  }
};
__device__ __forceinline__ PassRow pass_row(const float* in_v, const int32_t* in_i, size_t in_ld, int k,
                                            float* out_v, int32_t* out_i, size_t out_ld) {
  const int m = blockIdx.y, seg = blockIdx.x;
  return {in_v + m * in_ld, in_i ? in_i + m * in_ld : nullptr, out_v + m * out_ld + static_cast<size_t>(seg) * k,
          out_i + m * out_ld + static_cast<size_t>(seg) * k};
}

__global__ void __launch_bounds__(kSortThreads) topk_pass_kernel(const float* __restrict__ in_v,
                                                                 const int32_t* __restrict__ in_i, int n_in,
                                                                 size_t in_ld, int k, float* __restrict__ out_v,
                                                                 int32_t* __restrict__ out_i, size_t out_ld) {
  pdl_trigger();
  pdl_wait();
  __shared__ float sv[kSeg];
  __shared__ int si[kSeg];
  const PassRow row = pass_row(in_v, in_i, in_ld, k, out_v, out_i, out_ld);
  const int base = blockIdx.x * kSeg;
  for (int t = threadIdx.x; t < kSeg; t += kSortThreads) row.load(base + t, n_in, sv[t], si[t]);
  __syncthreads();
  for (int kk = 2; kk <= kSeg; kk <<= 1) {
    for (int j = kk >> 1; j > 0; j >>= 1) {
      for (int t = threadIdx.x; t < kSeg; t += kSortThreads) {
        const int p = t ^ j;
        if (p > t) {
          const bool up = (t & kk) == 0;
          const float a = sv[t], b = sv[p];
          const int ai = si[t], bi = si[p];
          const bool swap = up ? before(b, bi, a, ai) : before(a, ai, b, bi);
          if (swap) {
            sv[t] = b;
            sv[p] = a;
            si[t] = bi;
            si[p] = ai;
          }
        }
      }
      __syncthreads();
    }
  }
  for (int t = threadIdx.x; t < k; t += kSortThreads) {
    row.ov[t] = sv[t];
    row.oi[t] = si[t];
  }
}

// Selection pass for small k (<= kSelMaxK): a block holds one segment of kSelSeg pairs in
// registers (kSelE per thread) and extracts its first k in order, one block-wide "best of the
// rest" per output. Cheaper than sorting the segment when k is small; same total order, so the
// same result.
constexpr int kSelThreads = 256;
constexpr int kSelE = 8;
constexpr int kSelSeg = kSelThreads * kSelE;
constexpr int kSelMaxK = 64;

__global__ void __launch_bounds__(kSelThreads) topk_select_kernel(const float* __restrict__ in_v,
                                                                  const int32_t* __restrict__ in_i, int n_in,
                                                                  size_t in_ld, int k, float* __restrict__ out_v,
                                                                  int32_t* __restrict__ out_i, size_t out_ld) {
  pdl_trigger();
  pdl_wait();
  __shared__ float wv[kSelThreads / 32];
  __shared__ int wi[kSelThreads / 32];
  __shared__ int win;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const PassRow row = pass_row(in_v, in_i, in_ld, k, out_v, out_i, out_ld);
  float v[kSelE];
  int id[kSelE];
#pragma unroll
  for (int e = 0; e < kSelE; e++) row.load(blockIdx.x * kSelSeg + e * kSelThreads + threadIdx.x, n_in, v[e], id[e]);
  for (int r = 0; r < k; r++) {
    float bv = -INFINITY;
    int bi = INT_MAX;
#pragma unroll
    for (int e = 0; e < kSelE; e++)
      if (before(v[e], id[e], bv, bi)) {
        bv = v[e];
        bi = id[e];
      }
    warp_best(bv, bi);
    if (lane == 0) {
      wv[warp] = bv;
      wi[warp] = bi;
    }
    __syncthreads();
    if (warp == 0) {
      bv = lane < kSelThreads / 32 ? wv[lane] : -INFINITY;
      bi = lane < kSelThreads / 32 ? wi[lane] : INT_MAX;
      warp_best(bv, bi);
      if (lane == 0) {
        row.ov[r] = bv;
        row.oi[r] = bi;
        win = bi;
      }
    }
    __syncthreads();
    const int w = win;
#pragma unroll
    for (int e = 0; e < kSelE; e++)
      if (id[e] == w) {  // indices are unique (padding is INT_MAX and ranks last)
        v[e] = -INFINITY;
        id[e] = INT_MAX;
      }
  }
}

// ---- selector walk -----------------------------------------------------------------------------
constexpr int kWalkThreads = 256;

__global__ void __launch_bounds__(kWalkThreads) selector_walk_kernel(const float* __restrict__ cand_vals,
                                                                     const int32_t* __restrict__ cand_ids,
                                                                     const float* __restrict__ P, WeightView Epre,
                                                                     WeightView Esuc, const int32_t* anchor, int k,
                                                                     int K, int R, int32_t* drafts, float* scores,
                                                                     DevError* err) {
  pdl_trigger();
  pdl_wait();
  extern __shared__ float sm[];
  float* gp = sm;      // [R]
  float* sc = sm + R;  // [K]
  __shared__ int pred_s;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = kWalkThreads / 32;
  if (threadIdx.x == 0) pred_s = *anchor;
  __syncthreads();
  for (int j = 0; j < k; j++) {
    const int pred = pred_s;
    const bool pred_ok = pred >= 0 && pred < Epre.rows;
    if (!pred_ok && threadIdx.x == 0) set_error(err, kErrSelectorId, pred, static_cast<int>(Epre.rows), j);
    for (int r = threadIdx.x; r < R; r += kWalkThreads)
      gp[r] = pred_ok ? __fmul_rn(weight_at(Epre, pred, r), P[static_cast<size_t>(j) * R + r]) : 0.0f;
    __syncthreads();
    for (int c = warp; c < K; c += nw) {
      const int32_t b = cand_ids[static_cast<size_t>(j) * K + c];
      const bool ok = b >= 0 && b < Esuc.rows;
      float s = 0.0f;
      if (ok)
        for (int r = lane; r < R; r += 32) s = fmaf(gp[r], weight_at(Esuc, b, r), s);
      s = warp_sum(s);
      s = __fadd_rn(s, cand_vals[static_cast<size_t>(j) * K + c]);
      if (lane == 0) {
        if (!ok) set_error(err, kErrSelectorId, b, static_cast<int>(Esuc.rows), j);
        sc[c] = s;
        scores[static_cast<size_t>(j) * K + c] = s;
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int best = 0;
      for (int c = 1; c < K; c++)
        if (sc[c] > sc[best]) best = c;  // strict: the first maximum wins
      const int32_t d = cand_ids[static_cast<size_t>(j) * K + best];
      drafts[j] = d;
      pred_s = d;
    }
    __syncthreads();
  }
}

// ---- selector walk, table form --------------------------------------------------------------------
// The walk's only sequential part is which candidate of step j-1 is the predecessor of step j. The
// score of candidate c at step j given predecessor p is a dot product of the step's own data, so
// every (j, p, c) is computed at once, one warp each, with the arithmetic of selector_walk_kernel
// (gp[r] = Epre[pred, r] * P[j, r], the same lane-strided fma chain, warp_sum, + cand_vals): the
// bits of each score are those the sequential kernel computes for that predecessor. A one-warp
// walk then follows the argmax through the table. Step 0's predecessor is the anchor (row p = 0).
constexpr int kTableThreads = 256;

__global__ void __launch_bounds__(kTableThreads) selector_table_kernel(const float* __restrict__ cand_vals,
                                                                      const int32_t* __restrict__ cand_ids,
                                                                      const float* __restrict__ P, WeightView Epre,
                                                                      WeightView Esuc, const int32_t* anchor, int k,
                                                                      int K, int R, float* __restrict__ table,
                                                                      DevError* err) {
  pdl_trigger();
  pdl_wait();
  const int lane = threadIdx.x & 31;
  const int64_t w = static_cast<int64_t>(blockIdx.x) * (kTableThreads / 32) + (threadIdx.x >> 5);
  const int64_t n = K + static_cast<int64_t>(k - 1) * K * K;
  if (w >= n) return;
  int j, pi, c;
  if (w < K) {
    j = 0, pi = 0, c = static_cast<int>(w);
  } else {
    const int64_t v = w - K;
    j = 1 + static_cast<int>(v / (K * K));
    pi = static_cast<int>((v / K) % K);
    c = static_cast<int>(v % K);
  }
  const int pred = j == 0 ? *anchor : cand_ids[static_cast<size_t>(j - 1) * K + pi];
  const bool pred_ok = pred >= 0 && pred < Epre.rows;  // reported by the walk, where it is the path's
  const int32_t b = cand_ids[static_cast<size_t>(j) * K + c];
  const bool ok = b >= 0 && b < Esuc.rows;
  float s = 0.0f;
  if (ok)
    for (int r = lane; r < R; r += 32) {
      const float g = pred_ok ? __fmul_rn(weight_at(Epre, pred, r), P[static_cast<size_t>(j) * R + r]) : 0.0f;
      s = fmaf(g, weight_at(Esuc, b, r), s);
    }
  s = warp_sum(s);
  s = __fadd_rn(s, cand_vals[static_cast<size_t>(j) * K + c]);
  if (lane == 0) {
    if (!ok && pi == 0) set_error(err, kErrSelectorId, b, static_cast<int>(Esuc.rows), j);
    table[(static_cast<size_t>(j) * K + pi) * K + c] = s;
  }
}

__global__ void __launch_bounds__(32) selector_follow_kernel(const float* __restrict__ table,
                                                             const int32_t* __restrict__ cand_ids, WeightView Epre,
                                                             const int32_t* anchor, int k, int K, int32_t* drafts,
                                                             float* scores, DevError* err) {
  pdl_trigger();
  pdl_wait();
  const int lane = threadIdx.x;
  int pi = 0;
  int pred = *anchor;
  for (int j = 0; j < k; j++) {
    if (lane == 0 && !(pred >= 0 && pred < Epre.rows)) set_error(err, kErrSelectorId, pred, static_cast<int>(Epre.rows), j);
    const float v = lane < K ? table[(static_cast<size_t>(j) * K + pi) * K + lane] : 0.0f;
    if (lane < K) scores[static_cast<size_t>(j) * K + lane] = v;
    // the sequential kernel's scan: strict >, so the first maximum wins
    int best = 0;
    float bv = __shfl_sync(kFull, v, 0);
    for (int c = 1; c < K; c++) {
      const float vc = __shfl_sync(kFull, v, c);
      if (vc > bv) best = c, bv = vc;
    }
    const int32_t d = cand_ids[static_cast<size_t>(j) * K + best];
    if (lane == 0) drafts[j] = d;
    pred = d;
    pi = best;
  }
}

}  // namespace

size_t argmax_scratch_bytes(int M, int n) { return static_cast<size_t>(M) * argmax_blocks(n) * sizeof(VI); }

void argmax_rows(const float* x, int M, int n, int32_t* out, void* scratch, cudaStream_t st) {
  if (M <= 0) return;
  if (n <= 0) backend_fail("cuda argmax_rows: empty rows");
  if (M > 65535) backend_fail("cuda argmax_rows: %d rows in one call", M);
  const int nb = argmax_blocks(n);
  VI* part = static_cast<VI*>(scratch);
  launch_k(argmax_partial_kernel, dim3(dim3(nb, M)), dim3(kArgThreads), 0, st, x, n, part);
  QF_CUDA_LAUNCH_CHECK("argmax_partial_kernel");
  launch_k(argmax_final_kernel, dim3(M), dim3(32), 0, st, part, nb, x, n, out);
  QF_CUDA_LAUNCH_CHECK("argmax_final_kernel");
}

int topk_seg_len(int k) { return k <= kSelMaxK ? kSelSeg : kSeg; }

size_t topk_scratch_bytes(int M, int n, int k) {
  const size_t seg = static_cast<size_t>(topk_seg_len(k));
  const size_t nseg = (static_cast<size_t>(n) + seg - 1) / seg;
  if (nseg <= 1) return 0;
  // two ping-pong buffers of (value, index) planes
  return 2 * static_cast<size_t>(M) * nseg * k * (sizeof(float) + sizeof(int32_t));
}

void topk_rows(const float* x, int M, int n, int k, float* vals, int32_t* ids, void* scratch, cudaStream_t st) {
  if (M <= 0 || k <= 0) return;
  if (k > n) backend_fail("cuda topk_rows: k %d exceeds the row length %d", k, n);
  if (k > kSeg / 2) backend_fail("cuda topk_rows: k %d exceeds the supported %d", k, kSeg / 2);
  if (M > 65535) backend_fail("cuda topk_rows: %d rows in one call", M);
  const bool sel = k <= kSelMaxK;
  const int seg_len = topk_seg_len(k);
  const size_t nseg0 = (static_cast<size_t>(n) + seg_len - 1) / seg_len;
  const size_t plane = static_cast<size_t>(M) * nseg0 * k;  // elements per buffer plane
  char* s = static_cast<char*>(scratch);
  float* bufv[2] = {reinterpret_cast<float*>(s), reinterpret_cast<float*>(s + plane * 8)};
  int32_t* bufi[2] = {reinterpret_cast<int32_t*>(s + plane * 4), reinterpret_cast<int32_t*>(s + plane * 12)};
  const float* in_v = x;
  const int32_t* in_i = nullptr;
  size_t in_ld = static_cast<size_t>(n);
  int n_cur = n, which = 0;
  auto pass = [&](int nseg, float* ov, int32_t* oi, size_t out_ld) {
    if (sel) {
      launch_k(topk_select_kernel, dim3(dim3(nseg, M)), dim3(kSelThreads), 0, st, in_v, in_i, n_cur, in_ld, k, ov, oi, out_ld);
      QF_CUDA_LAUNCH_CHECK("topk_select_kernel");
    } else {
      launch_k(topk_pass_kernel, dim3(dim3(nseg, M)), dim3(kSortThreads), 0, st, in_v, in_i, n_cur, in_ld, k, ov, oi, out_ld);
      QF_CUDA_LAUNCH_CHECK("topk_pass_kernel");
    }
  };
  for (;;) {
    const int nseg = (n_cur + seg_len - 1) / seg_len;
    if (nseg == 1) {
      pass(1, vals, ids, static_cast<size_t>(k));
      return;
    }
    const size_t out_ld = static_cast<size_t>(nseg) * k;
    pass(nseg, bufv[which], bufi[which], out_ld);
    in_v = bufv[which];
    in_i = bufi[which];
    in_ld = out_ld;
    n_cur = nseg * k;
    which ^= 1;
  }
}

bool selector_walk_table(int k, int K) {
  static const bool seq = [] {
    const char* e = std::getenv("QFLASH_SELECTOR_WALK");
    return e && std::strcmp(e, "seq") == 0;
  }();
  return !seq && K <= 32 && k >= 1;
}

size_t selector_walk_scratch_bytes(int k, int K) {
  return selector_walk_table(k, K) ? static_cast<size_t>(k) * K * K * sizeof(float) : 0;
}

void selector_walk(const float* cand_vals, const int32_t* cand_ids, const float* P, const WeightRef& Epre,
                   const WeightRef& Esuc, const int32_t* anchor, int k, int K, int R, int32_t* drafts, float* scores,
                   void* scratch, DevError* err, cudaStream_t st, int mode) {
  if (k <= 0 || K <= 0) return;
  if (mode == 1 && K > 32) backend_fail("cuda selector_walk: the table form takes top-k <= 32, got %d", K);
  if (R > Epre.cols || R > Esuc.cols) backend_fail("cuda selector_walk: rank %d exceeds the codebooks' columns", R);
  check_weight_view(Epre, "selector_walk predecessor codebook");
  check_weight_view(Esuc, "selector_walk successor codebook");
  if (mode == 1 || (mode < 0 && selector_walk_table(k, K))) {
    if (!scratch) backend_fail("cuda selector_walk: no table scratch for k %d, top-k %d", k, K);
    float* table = static_cast<float*>(scratch);
    const int64_t warps = K + static_cast<int64_t>(k - 1) * K * K;
    const int blocks = static_cast<int>((warps + kTableThreads / 32 - 1) / (kTableThreads / 32));
    launch_k(selector_table_kernel, dim3(blocks), dim3(kTableThreads), 0, st, cand_vals, cand_ids, P, view_of(Epre),
             view_of(Esuc), anchor, k, K, R, table, err);
    QF_CUDA_LAUNCH_CHECK("selector_table_kernel");
    launch_k(selector_follow_kernel, dim3(1), dim3(32), 0, st, static_cast<const float*>(table), cand_ids, view_of(Epre),
             anchor, k, K, drafts, scores, err);
    QF_CUDA_LAUNCH_CHECK("selector_follow_kernel");
    return;
  }
  const size_t smem = static_cast<size_t>(R + K) * sizeof(float);
  // 48 KB is the default limit for static (pred_s) + dynamic shared memory together.
  if (smem + 64 > 48 * 1024) backend_fail("cuda selector_walk: rank %d + top-k %d too large", R, K);
  launch_k(selector_walk_kernel, dim3(1), dim3(kWalkThreads), smem, st, cand_vals, cand_ids, P, view_of(Epre), view_of(Esuc), anchor, k,
                                                      K, R, drafts, scores, err);
  QF_CUDA_LAUNCH_CHECK("selector_walk_kernel");
}

}  // namespace qf::cuda
