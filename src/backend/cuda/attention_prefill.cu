// Causal flash attention for many query rows (Backend::attention_prefill) on the tensor cores.
//
// Tiling. A block owns one kv group's K/V and HB of its q heads (HB = the largest divisor of the
// group size <= 8) for BQ consecutive query rows (BQ = 16 * max(1, 8 / HB): 27B, 6 heads per kv
// head: 6 warps x 16 rows). Warp w holds 16 rows of one head: query position m0 + 16 (w % (BQ/16))
// + r. Each K/V tile (KT = 32 key rows of the buffer at head_dim 256, else 64; tile t = rows
// [KT t, KT t + KT)) is loaded once into shared memory (cp.async, 16-byte chunks, swizzled) for all the block's heads
// and rows: GQA shares the loads 6 ways. K and V have one buffer each; V(t) loads while S = Q K(t)^T
// runs, K(t+1) while O += P V(t) runs (two phases per tile, as FlashAttention-2).
//
// Arithmetic. mma.sync m16n8k16 bf16 x bf16 -> fp32. K and V are bf16 in the cache (exact
// operands). The fp32 queries and the fp32 probabilities are each split into two bf16 pieces,
// x = hi + lo with hi = bf16(x), lo = bf16(x - hi) (|x - hi - lo| <= 2^-18 |x|), and both pieces
// go through the tensor cores: a product is as good as fp32 at twice the mma count. The kernel is
// bound by shared-memory reads of the K/V fragments (every warp reads each tile once), so the second
// piece adds the cheap half. Online softmax in fp32, in the log2 domain (exp2f).
//
// Row-invariance (the backend.h contract: a row's bits never depend on M or on the other rows).
// A row r visible key range [lo, hi) follows from its own position. Its computation is: for every
// tile t that meets [lo, hi), in increasing t from key row 0 (tile boundaries are absolute buffer
// rows, not relative to the call), scores of its own query against the tile (an mma output element
// depends only on its row of A), max/exp2/sum over the tile in a fixed order, and
// acc = fmaf(acc, alpha, P V) with P V computed from zero per tile. Tiles the block walks for its
// other rows but that miss [lo, hi) leave the row's state untouched (explicit per-row skip, not
// an update with zero weights), so the same row in a call that starts elsewhere or has another M
// walks the same tiles with the same operands and produces the same bits.
#include <cmath>

#include "backend/cuda/device_common.cuh"
#include "backend/cuda/kernels.h"

namespace qf::cuda {

namespace {

constexpr int kMaxWarps = 8;
// Keys per tile: 64, or 32 at head_dim 256, where 64 would need more than 255 registers per
// thread (the 128 output accumulators plus a 16 x 64 score tile and its two bf16 pieces).
template <int HD>
constexpr int key_tile() {
  return HD == 256 ? 32 : 64;
}

struct PrefillGeom {
  int M, n_heads, group, kvw;
  int hb, bq, n_qtiles;  // heads per block, query rows per block, query tiles
  float scale_log2;      // scale * log2(e): scores go straight into exp2
  int causal, window;
};

// Shared-memory tiles are [rows][HD] bf16 with the 16-byte chunk c of row r stored at chunk
// c ^ (r & 7): the 8 rows an ldmatrix reads hit 8 different bank groups.
template <int HD>
__device__ __forceinline__ int swz(int r, int c) {
  return r * (HD / 8) + (c ^ (r & 7));
}

template <int HD>
__global__ void __launch_bounds__(kMaxWarps * 32, 1)
    attn_prefill_kernel(const float* __restrict__ q, const uint16_t* __restrict__ K, const uint16_t* __restrict__ V,
                        float* __restrict__ out, const PrefillGeom G, const StepMeta* meta) {
  constexpr int CH = HD / 8;   // 16-byte chunks per row
  constexpr int KS = HD / 16;  // k-steps of Q K^T
  constexpr int KT = key_tile<HD>();
  constexpr int NT = KT / 8;
  pdl_trigger();
  pdl_wait();
  extern __shared__ __align__(128) uint4 smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  uint4* sK = smem;                             // [KT][HD]
  uint4* sV = sK + KT * CH;                     // [KT][HD]
  uint4* sQ = sV + KT * CH + warp * 2 * 16 * CH;  // this warp: hi [16][HD], then lo [16][HD]

  const int qt = G.n_qtiles - 1 - static_cast<int>(blockIdx.x);  // longest causal rows first
  const int m0 = qt * G.bq;
  const int pw = G.bq / 16;
  const int h = blockIdx.y * G.hb + warp / pw;
  const int g = h / G.group;
  const int mw = m0 + 16 * (warp % pw);  // the warp's first query row

  // Block key range: lo and hi grow with the position, so the first and the last valid row bound it.
  const int m_last = min(m0 + G.bq, G.M) - 1;
  int blo, bhi, tmp_lo, tmp_hi;
  attn_visible_range<true>(meta, m0, G.causal, G.window, &blo, &tmp_hi);
  attn_visible_range<true>(meta, m_last, G.causal, G.window, &tmp_lo, &bhi);
  const int t_begin = blo / KT, t_end = bhi > blo ? (bhi + KT - 1) / KT : t_begin;

  // This thread's two rows (mma fragment rows lane/4 and lane/4 + 8).
  const int ra = mw + (lane >> 2), rb = ra + 8;
  int lo_a, hi_a, lo_b, hi_b;
  attn_visible_range<true>(meta, ra, G.causal, G.window, &lo_a, &hi_a);
  attn_visible_range<true>(meta, rb, G.causal, G.window, &lo_b, &hi_b);
  if (ra >= G.M) hi_a = lo_a;  // rows past the call: never active, never written
  if (rb >= G.M) hi_b = lo_b;

  const size_t kv_off = static_cast<size_t>(g) * HD;
  auto load_tile = [&](uint4* dst, const uint16_t* src, int t) {
    const uint32_t base = smem_u32(dst);
    for (int i = threadIdx.x; i < KT * CH; i += blockDim.x) {
      const int r = i / CH, c = i % CH;
      const int j = t * KT + r;
      const bool ok = j < meta->n_kv;
      const uint16_t* p = src + (ok ? static_cast<size_t>(j) * G.kvw + kv_off + c * 8 : 0);
      cp_async16(base + swz<HD>(r, c) * 16, p, ok ? 16 : 0);
    }
  };
  if (t_end > t_begin) {
    load_tile(sK, K, t_begin);
    cp_async_commit();
  }

  // Queries -> hi/lo bf16 in shared memory (zeros for rows past the call).
  for (int i = lane; i < 16 * CH; i += 32) {
    const int r = i / CH, c = i % CH;
    const int m = mw + r;
    float x[8];
    if (m < G.M) {
      const float4* src = reinterpret_cast<const float4*>(q + (static_cast<size_t>(m) * G.n_heads + h) * HD + c * 8);
      const float4 u = src[0], v = src[1];
      x[0] = u.x, x[1] = u.y, x[2] = u.z, x[3] = u.w, x[4] = v.x, x[5] = v.y, x[6] = v.z, x[7] = v.w;
    } else {
#pragma unroll
      for (int e = 0; e < 8; e++) x[e] = 0.0f;
    }
    uint4 hi, lo;
    split_bf16x2(x[0], x[1], hi.x, lo.x);
    split_bf16x2(x[2], x[3], hi.y, lo.y);
    split_bf16x2(x[4], x[5], hi.z, lo.z);
    split_bf16x2(x[6], x[7], hi.w, lo.w);
    sQ[swz<HD>(r, c)] = hi;
    sQ[16 * CH + swz<HD>(r, c)] = lo;
  }
  __syncwarp();

  float acc[HD / 8][4];
#pragma unroll
  for (int n = 0; n < HD / 8; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
  float max_a = -INFINITY, max_b = -INFINITY, sum_a = 0.0f, sum_b = 0.0f;  // sums: this thread's columns

  // ldmatrix row addresses: lane l reads row r8 = l % 8 of the 8x8 matrix l / 8. Chunk c of a
  // row lies at c ^ r8, and c = h + 2j + 8i (h < 2, j < 4) gives (h ^ r8) ^ 2j + 8i: one lane
  // address per operand, XORed with 32 j bytes and offset by immediates (rows are multiples of
  // 128 bytes), instead of one hoisted register per (row block, chunk) pair.
  const int r8 = lane & 7, mi = lane >> 3;
  constexpr int RB = CH * 16;  // bytes per smem row
  const uint32_t q_lane = smem_u32(sQ) + ((mi & 1) * 8 + r8) * RB + (((mi >> 1) ^ r8) << 4);
  const uint32_t k_lane = smem_u32(sK) + ((mi >> 1) * 8 + r8) * RB + (((mi & 1) ^ r8) << 4);
  const uint32_t v_lane = smem_u32(sV) + ((mi & 1) * 8 + r8) * RB + (((mi >> 1) ^ r8) << 4);

  for (int t = t_begin; t < t_end; t++) {
    load_tile(sV, V, t);
    cp_async_commit();
    cp_async_wait<1>();  // K(t)
    __syncthreads();

    // S = Q K^T for the warp's 16 rows x KT keys (hi and lo pieces of Q into the same accumulator).
    float s[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll 4
    for (int ks = 0; ks < KS; ks++) {
      uint32_t ah[4], al[4];
      const uint32_t qa = (q_lane ^ ((ks & 3) << 5)) + (ks >> 2) * 128;
      ldsm_x4(qa, ah);
      ldsm_x4(qa + 16 * RB, al);
      const uint32_t ka = (k_lane ^ ((ks & 3) << 5)) + (ks >> 2) * 128;
#pragma unroll
      for (int np = 0; np < NT / 2; np++) {
        uint32_t b[4];
        ldsm_x4(ka + np * 16 * RB, b);
        mma_bf16_16816(s[2 * np], ah, b[0], b[1]);
        mma_bf16_16816(s[2 * np], al, b[0], b[1]);
        mma_bf16_16816(s[2 * np + 1], ah, b[2], b[3]);
        mma_bf16_16816(s[2 * np + 1], al, b[2], b[3]);
      }
    }

    // Online softmax, per row, only where this tile meets the row's key range.
    const int kt0 = t * KT;
    const bool act_a = kt0 < hi_a && kt0 + KT > lo_a;
    const bool act_b = kt0 < hi_b && kt0 + KT > lo_b;
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) s[n][e] = __fmul_rn(s[n][e], G.scale_log2);
    // Masking only where the tile is not wholly visible to both rows (the diagonal, the window edge).
    if (!(kt0 >= lo_a && kt0 + KT <= hi_a && kt0 >= lo_b && kt0 + KT <= hi_b)) {
#pragma unroll
      for (int n = 0; n < NT; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int j = kt0 + n * 8 + 2 * (lane & 3) + (e & 1);
          const bool vis = e < 2 ? (j >= lo_a && j < hi_a) : (j >= lo_b && j < hi_b);
          if (!vis) s[n][e] = -INFINITY;
        }
    }
    float tmax_a = -INFINITY, tmax_b = -INFINITY;
#pragma unroll
    for (int n = 0; n < NT; n++) {
      tmax_a = fmaxf(tmax_a, fmaxf(s[n][0], s[n][1]));
      tmax_b = fmaxf(tmax_b, fmaxf(s[n][2], s[n][3]));
    }
    tmax_a = fmaxf(tmax_a, __shfl_xor_sync(kFull, tmax_a, 1));
    tmax_a = fmaxf(tmax_a, __shfl_xor_sync(kFull, tmax_a, 2));
    tmax_b = fmaxf(tmax_b, __shfl_xor_sync(kFull, tmax_b, 1));
    tmax_b = fmaxf(tmax_b, __shfl_xor_sync(kFull, tmax_b, 2));
    const float nmax_a = fmaxf(max_a, tmax_a), nmax_b = fmaxf(max_b, tmax_b);
    const float alpha_a = act_a ? exp2f(__fsub_rn(max_a, nmax_a)) : 1.0f;  // 0 on a row's first tile
    const float alpha_b = act_b ? exp2f(__fsub_rn(max_b, nmax_b)) : 1.0f;
    uint32_t ph[NT / 2][4], pl[NT / 2][4];  // P as the A operand of P V: k-step = 16 keys
    float psum_a = 0.0f, psum_b = 0.0f;
#pragma unroll
    for (int n = 0; n < NT; n++) {
      const float p0 = act_a ? exp2f(__fsub_rn(s[n][0], nmax_a)) : 0.0f;
      const float p1 = act_a ? exp2f(__fsub_rn(s[n][1], nmax_a)) : 0.0f;
      const float p2 = act_b ? exp2f(__fsub_rn(s[n][2], nmax_b)) : 0.0f;
      const float p3 = act_b ? exp2f(__fsub_rn(s[n][3], nmax_b)) : 0.0f;
      psum_a = __fadd_rn(__fadd_rn(psum_a, p0), p1);
      psum_b = __fadd_rn(__fadd_rn(psum_b, p2), p3);
      split_bf16x2(p0, p1, ph[n / 2][(n & 1) * 2], pl[n / 2][(n & 1) * 2]);
      split_bf16x2(p2, p3, ph[n / 2][(n & 1) * 2 + 1], pl[n / 2][(n & 1) * 2 + 1]);
    }
    if (act_a) {
      sum_a = __fadd_rn(__fmul_rn(sum_a, alpha_a), psum_a);
      max_a = nmax_a;
    }
    if (act_b) {
      sum_b = __fadd_rn(__fmul_rn(sum_b, alpha_b), psum_b);
      max_b = nmax_b;
    }

    cp_async_wait<0>();  // V(t)
    __syncthreads();     // and every warp is done with K(t)
    if (t + 1 < t_end) {
      load_tile(sK, K, t + 1);
      cp_async_commit();
    }

    // O = alpha O + P V(t), P V from zero per 16 output columns (hi and lo pieces of P).
#pragma unroll
    for (int np = 0; np < HD / 16; np++) {
      float o[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
      const uint32_t va = (v_lane ^ ((np & 3) << 5)) + (np >> 2) * 128;
#pragma unroll
      for (int kk = 0; kk < NT / 2; kk++) {
        uint32_t b[4];
        ldsm_x4_t(va + kk * 16 * RB, b);
        mma_bf16_16816(o[0], ph[kk], b[0], b[1]);
        mma_bf16_16816(o[0], pl[kk], b[0], b[1]);
        mma_bf16_16816(o[1], ph[kk], b[2], b[3]);
        mma_bf16_16816(o[1], pl[kk], b[2], b[3]);
      }
#pragma unroll
      for (int x = 0; x < 2; x++) {
        float* a = acc[2 * np + x];
        if (act_a) {
          a[0] = fmaf(a[0], alpha_a, o[x][0]);
          a[1] = fmaf(a[1], alpha_a, o[x][1]);
        }
        if (act_b) {
          a[2] = fmaf(a[2], alpha_b, o[x][2]);
          a[3] = fmaf(a[3], alpha_b, o[x][3]);
        }
      }
    }
    __syncthreads();  // every warp is done with V(t) before V(t+1) lands
  }

  // Row sums over the 4 lanes of a row (the same two-level tree in each lane), then O / sum.
  sum_a = __fadd_rn(sum_a, __shfl_xor_sync(kFull, sum_a, 1));
  sum_a = __fadd_rn(sum_a, __shfl_xor_sync(kFull, sum_a, 2));
  sum_b = __fadd_rn(sum_b, __shfl_xor_sync(kFull, sum_b, 1));
  sum_b = __fadd_rn(sum_b, __shfl_xor_sync(kFull, sum_b, 2));
  const int col = 2 * (lane & 3);
  if (ra < G.M) {
    float* o = out + (static_cast<size_t>(ra) * G.n_heads + h) * HD + col;
    const bool any = hi_a > lo_a;  // no visible key: zeros, as the CPU twin
#pragma unroll
    for (int n = 0; n < HD / 8; n++)
      *reinterpret_cast<float2*>(o + n * 8) =
          any ? make_float2(__fdiv_rn(acc[n][0], sum_a), __fdiv_rn(acc[n][1], sum_a)) : make_float2(0.0f, 0.0f);
  }
  if (rb < G.M) {
    float* o = out + (static_cast<size_t>(rb) * G.n_heads + h) * HD + col;
    const bool any = hi_b > lo_b;
#pragma unroll
    for (int n = 0; n < HD / 8; n++)
      *reinterpret_cast<float2*>(o + n * 8) =
          any ? make_float2(__fdiv_rn(acc[n][2], sum_b), __fdiv_rn(acc[n][3], sum_b)) : make_float2(0.0f, 0.0f);
  }
}

template <int HD>
void launch_prefill(const float* q, const uint16_t* K, const uint16_t* V, float* out, const PrefillGeom& G,
                    const StepMeta* meta, cudaStream_t st) {
  const int warps = G.hb * (G.bq / 16);
  const size_t smem = (2 * key_tile<HD>() + static_cast<size_t>(warps) * 32) * HD * sizeof(uint16_t);
  static size_t smem_set = 0;  // the opt-in above 48 KB, once per instantiation and size
  if (smem > smem_set) {
    QF_CUDA_CHECK(cudaFuncSetAttribute(attn_prefill_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem)));
    smem_set = smem;
  }
  launch_k(attn_prefill_kernel<HD>, dim3(G.n_qtiles, G.n_heads / G.hb), dim3(warps * 32), smem, st, q, K, V, out, G,
           meta);
  QF_CUDA_LAUNCH_CHECK("attn_prefill_kernel");
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace

bool attention_prefill(const float* q, const void* K, const void* V, float* out, int M, const AttnParams& p,
                       const StepMeta* meta, cudaStream_t st) {
  if (M <= 0 || p.n_heads <= 0) return true;
  if (p.kv_dtype != DType::BF16) return false;
  if (p.head_dim != 64 && p.head_dim != 128 && p.head_dim != 256) return false;
  if (!aligned16(q) || !aligned16(K) || !aligned16(V) || !aligned16(out)) return false;
  if (p.n_kv_heads <= 0 || p.n_heads % p.n_kv_heads != 0)
    backend_fail("cuda attention_prefill: %d heads not a multiple of %d kv heads", p.n_heads, p.n_kv_heads);
  PrefillGeom G;
  attn_common_geom(G, p, M);
  G.hb = 1;
  for (int d = 1; d <= kMaxWarps && d <= G.group; d++)
    if (G.group % d == 0) G.hb = d;
  G.bq = 16 * (kMaxWarps / G.hb > 1 ? kMaxWarps / G.hb : 1);
  G.n_qtiles = (M + G.bq - 1) / G.bq;
  const auto* k16 = static_cast<const uint16_t*>(K);
  const auto* v16 = static_cast<const uint16_t*>(V);
  switch (p.head_dim) {
    case 64: launch_prefill<64>(q, k16, v16, out, G, meta, st); break;
    case 128: launch_prefill<128>(q, k16, v16, out, G, meta, st); break;
    default: launch_prefill<256>(q, k16, v16, out, G, meta, st); break;
  }
  return true;
}

}  // namespace qf::cuda
