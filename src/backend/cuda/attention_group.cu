// Decode / verify attention with bf16 K/V: one block per (kv group, key split, up to kGrpRows q
// rows), so each K/V chunk is read once for all the group's q heads and verify rows (the
// per-(head, row, split) kernel in attention.cu reads it 6 x M times).
//
// Splits. Keys are cut into chunks of kAttnChunk (64) at absolute buffer rows; chunk c belongs to
// split c % kGrpSplits; a block walks its split's chunks in increasing order with an online
// softmax and writes one partial (max, sum, acc) per (row, head); attn_grp_combine merges the
// kGrpSplits partials of a (row, head) in split order, in the log2 domain. Which chunks a row
// reads, and in which order, follows from its own key range [lo, hi) alone.
//
// Arithmetic per chunk (4 warps): S = Q K^T on the tensor cores (mma m16n8k16 bf16, fp32
// accumulate; q as bf16 hi + lo pieces; warp w scores keys 16w..16w+15 for every row), the row
// max and sum over the 4 warps through shared memory in warp order, P as bf16 hi + lo in shared
// memory, then O += P V with warp w owning head dims [w HD/4, (w+1) HD/4). A row's state is updated
// only for chunks that meet its key range (acc = fmaf(acc, alpha, P V), P V from zero per chunk).
//
// Row-invariance: every step above is per row with a fixed order (an mma output element depends
// on its own row of A only; the cross-warp reductions go in warp order), so a row's bits do not
// depend on M, on which m16 tile it lands in, or on the other rows: decode at position P+m and
// row m of a verify block agree bit for bit. The grid depends on M and the shapes only.
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/device_common.cuh"
#include "backend/cuda/kernels.h"

namespace qf::cuda {

namespace {

constexpr int kGrpThreads = 128;
constexpr int kGrpWarps = kGrpThreads / 32;
constexpr int kChunk = kAttnChunk;

struct GrpGeom {
  int M, n_heads, group, kvw;
  int mr;            // verify rows per block: group * mr <= kGrpRows
  float scale_log2;  // scale * log2(e)
  int causal, window;
};

// Shared memory: K [64][HD], V [64][HD], Q hi / lo [RT*16][HD], P hi / lo [kGrpRows][64] (all
// bf16, 16-byte chunk c of row r at c ^ (r & 7)), then the per-warp row maxima and sums.
template <int HD>
constexpr size_t grp_smem_bytes(int rt) {
  return (2 * kChunk * HD + 2 * static_cast<size_t>(rt) * 16 * HD + 2 * kGrpRows * kChunk) * 2 +
         2 * kGrpWarps * kGrpRows * sizeof(float);
}

template <int HD>
__global__ void __launch_bounds__(kGrpThreads) attn_grp_kernel(const float* __restrict__ q,
                                                               const uint16_t* __restrict__ K,
                                                               const uint16_t* __restrict__ V,
                                                               float* __restrict__ part, const GrpGeom G,
                                                               const StepMeta* meta) {
  constexpr int CH = HD / 8, RB = CH * 16, KS = HD / 16;
  constexpr int NPW = HD / kGrpWarps / 16;  // pairs of 8-wide output tiles per warp
  constexpr int PRB = kChunk * 2;           // bytes per P row (64 keys)
  pdl_trigger();
  pdl_wait();
  extern __shared__ __align__(128) uint4 smem[];
  const int g = blockIdx.x, z = blockIdx.y;
  const int m0 = blockIdx.z * G.mr, mr = min(G.mr, G.M - m0);
  const int R = G.group * mr, RT = (R + 15) / 16;  // rows r = ml * group + hl
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  uint4* sK = smem;
  uint4* sV = sK + kChunk * CH;
  uint4* sQ = sV + kChunk * CH;                       // hi [RT*16][HD], lo after it
  uint4* sP = sQ + 2 * RT * 16 * CH;                  // hi [kGrpRows][64], lo after it
  float* red_max = reinterpret_cast<float*>(sP + 2 * kGrpRows * (kChunk / 8));  // [warps][kGrpRows]
  float* red_sum = red_max + kGrpWarps * kGrpRows;

  // This thread's rows: fragment rows lane/4 and lane/4 + 8 of each m16 tile.
  int lo[3][2], hi[3][2];
#pragma unroll
  for (int mt = 0; mt < 3; mt++)
#pragma unroll
    for (int x = 0; x < 2; x++) {
      const int r = mt * 16 + (lane >> 2) + 8 * x;
      if (r < R) attn_visible_range<true>(meta, m0 + r / G.group, G.causal, G.window, &lo[mt][x], &hi[mt][x]);
      else lo[mt][x] = hi[mt][x] = 0;
    }
  int blo, bhi, t0, t1;
  attn_visible_range<true>(meta, m0, G.causal, G.window, &blo, &t1);
  attn_visible_range<true>(meta, m0 + mr - 1, G.causal, G.window, &t0, &bhi);
  const int c_begin = blo / kChunk, c_end = bhi > blo ? (bhi + kChunk - 1) / kChunk : c_begin;
  const int c_first = c_begin + ((z - c_begin % kGrpSplits) + kGrpSplits) % kGrpSplits;

  const size_t kv_off = static_cast<size_t>(g) * HD;
  auto load_chunk = [&](uint4* dst, const uint16_t* src, int c) {
    const uint32_t base = smem_u32(dst);
    for (int i = threadIdx.x; i < kChunk * CH; i += kGrpThreads) {
      const int r = i / CH, cc = i % CH;
      const int j = c * kChunk + r;
      const bool ok = j < meta->n_kv;
      cp_async16(base + (r * CH + (cc ^ (r & 7))) * 16, src + (ok ? static_cast<size_t>(j) * G.kvw + kv_off + cc * 8 : 0),
                 ok ? 16 : 0);
    }
  };
  if (c_first < c_end) {
    load_chunk(sK, K, c_first);
    cp_async_commit();
  }
  for (int i = threadIdx.x; i < RT * 16 * CH; i += kGrpThreads) {  // queries -> hi / lo (zero rows past R)
    const int r = i / CH, cc = i % CH;
    float x[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (r < R) {
      const int m = m0 + r / G.group, h = g * G.group + r % G.group;
      const float4* src = reinterpret_cast<const float4*>(q + (static_cast<size_t>(m) * G.n_heads + h) * HD + cc * 8);
      const float4 u = src[0], v = src[1];
      x[0] = u.x, x[1] = u.y, x[2] = u.z, x[3] = u.w, x[4] = v.x, x[5] = v.y, x[6] = v.z, x[7] = v.w;
    }
    uint4 h4, l4;
    split_bf16x2(x[0], x[1], h4.x, l4.x);
    split_bf16x2(x[2], x[3], h4.y, l4.y);
    split_bf16x2(x[4], x[5], h4.z, l4.z);
    split_bf16x2(x[6], x[7], h4.w, l4.w);
    sQ[r * CH + (cc ^ (r & 7))] = h4;
    sQ[RT * 16 * CH + r * CH + (cc ^ (r & 7))] = l4;
  }

  float acc[3][2 * NPW][4];
  float run_max[3][2], run_sum[3][2];
#pragma unroll
  for (int mt = 0; mt < 3; mt++) {
#pragma unroll
    for (int n = 0; n < 2 * NPW; n++) acc[mt][n][0] = acc[mt][n][1] = acc[mt][n][2] = acc[mt][n][3] = 0.0f;
    run_max[mt][0] = run_max[mt][1] = -INFINITY;
    run_sum[mt][0] = run_sum[mt][1] = 0.0f;
  }

  // Lane addresses for ldmatrix (chunk c = h + 2j + 8i of row r8 lies at (h ^ r8) ^ 2j + 8i).
  const int r8 = lane & 7, mi = lane >> 3;
  const uint32_t q_lane = smem_u32(sQ) + ((mi & 1) * 8 + r8) * RB + (((mi >> 1) ^ r8) << 4);
  const uint32_t k_lane = smem_u32(sK) + (warp * 16 + (mi >> 1) * 8 + r8) * RB + (((mi & 1) ^ r8) << 4);
  const int vc = warp * (HD / kGrpWarps / 8) + (mi >> 1);  // this warp's first output chunk (+1 for matrices 2, 3)
  const uint32_t v_lane = smem_u32(sV) + ((mi & 1) * 8 + r8) * RB + (((vc & ~7) | ((vc & 7) ^ r8)) << 4);
  const uint32_t p_lane = smem_u32(sP) + ((mi & 1) * 8 + r8) * PRB + (((mi >> 1) ^ r8) << 4);
  const uint32_t q_lo_off = RT * 16 * RB, p_lo_off = kGrpRows * PRB;

  for (int c = c_first; c < c_end; c += kGrpSplits) {
    load_chunk(sV, V, c);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();  // K(c) (and the queries on the first chunk)

    // Scores of keys 16 warp .. 16 warp + 15 for every row tile.
    float s[3][2][4];
#pragma unroll
    for (int mt = 0; mt < 3; mt++)
#pragma unroll
      for (int n = 0; n < 2; n++) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.0f;
#pragma unroll 4
    for (int ks = 0; ks < KS; ks++) {
      const uint32_t x = (ks & 3) << 5, o = (ks >> 2) * 128;
      uint32_t b[4];
      ldsm_x4((k_lane ^ x) + o, b);
#pragma unroll
      for (int mt = 0; mt < 3; mt++) {
        if (mt < RT) {
          uint32_t ah[4], al[4];
          const uint32_t qa = (q_lane ^ x) + o + mt * 16 * RB;
          ldsm_x4(qa, ah);
          ldsm_x4(qa + q_lo_off, al);
          mma_bf16_16816(s[mt][0], ah, b[0], b[1]);
          mma_bf16_16816(s[mt][0], al, b[0], b[1]);
          mma_bf16_16816(s[mt][1], ah, b[2], b[3]);
          mma_bf16_16816(s[mt][1], al, b[2], b[3]);
        }
      }
    }
    const int kc0 = c * kChunk;
    bool act[3][2];
#pragma unroll
    for (int mt = 0; mt < 3; mt++)
#pragma unroll
      for (int x = 0; x < 2; x++) {
        act[mt][x] = kc0 < hi[mt][x] && kc0 + kChunk > lo[mt][x];
        float mx = -INFINITY;
#pragma unroll
        for (int n = 0; n < 2; n++)
#pragma unroll
          for (int e = 0; e < 2; e++) {
            const int j = kc0 + warp * 16 + n * 8 + 2 * (lane & 3) + e;
            float v = __fmul_rn(s[mt][n][2 * x + e], G.scale_log2);
            if (j < lo[mt][x] || j >= hi[mt][x]) v = -INFINITY;
            s[mt][n][2 * x + e] = v;
            mx = fmaxf(mx, v);
          }
        mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, 2));
        if ((lane & 3) == 0 && mt < RT) red_max[warp * kGrpRows + mt * 16 + (lane >> 2) + 8 * x] = mx;
      }
    __syncthreads();  // red_max

    float alpha[3][2];
#pragma unroll
    for (int mt = 0; mt < 3; mt++)
#pragma unroll
      for (int x = 0; x < 2; x++) {
        const int row = mt * 16 + (lane >> 2) + 8 * x;
        float cmax = -INFINITY;
        if (mt < RT)
#pragma unroll
          for (int w = 0; w < kGrpWarps; w++) cmax = fmaxf(cmax, red_max[w * kGrpRows + row]);
        const float nmax = fmaxf(run_max[mt][x], cmax);
        alpha[mt][x] = act[mt][x] ? exp2f(__fsub_rn(run_max[mt][x], nmax)) : 1.0f;
        float ps = 0.0f;
        float p[2][2];
#pragma unroll
        for (int n = 0; n < 2; n++)
#pragma unroll
          for (int e = 0; e < 2; e++) {
            p[n][e] = act[mt][x] ? exp2f(__fsub_rn(s[mt][n][2 * x + e], nmax)) : 0.0f;
            ps = __fadd_rn(ps, p[n][e]);
          }
        ps = __fadd_rn(ps, __shfl_xor_sync(kFull, ps, 1));
        ps = __fadd_rn(ps, __shfl_xor_sync(kFull, ps, 2));
        if (mt < RT) {
          if ((lane & 3) == 0) red_sum[warp * kGrpRows + row] = ps;
#pragma unroll
          for (int n = 0; n < 2; n++) {  // P row `row`, keys 16 warp + 8 n + 2 (lane & 3) + {0, 1}
            uint32_t ph, pl;
            split_bf16x2(p[n][0], p[n][1], ph, pl);
            const uint32_t off = row * PRB + (((2 * warp + n) ^ (row & 7)) << 4) + (lane & 3) * 4;
            *reinterpret_cast<uint32_t*>(reinterpret_cast<char*>(sP) + off) = ph;
            *reinterpret_cast<uint32_t*>(reinterpret_cast<char*>(sP) + p_lo_off + off) = pl;
          }
        }
        if (act[mt][x]) run_max[mt][x] = nmax;
      }

    cp_async_wait<0>();
    __syncthreads();  // V(c), P, red_sum; every warp is done with K(c)
    if (c + kGrpSplits < c_end) {
      load_chunk(sK, K, c + kGrpSplits);
      cp_async_commit();
    }
#pragma unroll
    for (int mt = 0; mt < 3; mt++)
#pragma unroll
      for (int x = 0; x < 2; x++) {
        const int row = mt * 16 + (lane >> 2) + 8 * x;
        if (mt < RT && act[mt][x]) {
          float tot = red_sum[row];
#pragma unroll
          for (int w = 1; w < kGrpWarps; w++) tot = __fadd_rn(tot, red_sum[w * kGrpRows + row]);
          run_sum[mt][x] = __fadd_rn(__fmul_rn(run_sum[mt][x], alpha[mt][x]), tot);
        }
      }

    // O = alpha O + P V for this warp's output columns.
#pragma unroll
    for (int np = 0; np < NPW; np++) {
      uint32_t bv[kChunk / 16][4];
      const uint32_t va = (v_lane ^ ((np & 3) << 5)) + (np >> 2) * 128;
#pragma unroll
      for (int kk = 0; kk < kChunk / 16; kk++) ldsm_x4_t(va + kk * 16 * RB, bv[kk]);
#pragma unroll
      for (int mt = 0; mt < 3; mt++) {
        if (mt < RT) {
          float o[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
          for (int kk = 0; kk < kChunk / 16; kk++) {
            uint32_t ah[4], al[4];
            const uint32_t pa = (p_lane ^ ((kk & 3) << 5)) + mt * 16 * PRB;
            ldsm_x4(pa, ah);
            ldsm_x4(pa + p_lo_off, al);
            mma_bf16_16816(o[0], ah, bv[kk][0], bv[kk][1]);
            mma_bf16_16816(o[0], al, bv[kk][0], bv[kk][1]);
            mma_bf16_16816(o[1], ah, bv[kk][2], bv[kk][3]);
            mma_bf16_16816(o[1], al, bv[kk][2], bv[kk][3]);
          }
#pragma unroll
          for (int y = 0; y < 2; y++) {
            float* a = acc[mt][2 * np + y];
            if (act[mt][0]) {
              a[0] = fmaf(a[0], alpha[mt][0], o[y][0]);
              a[1] = fmaf(a[1], alpha[mt][0], o[y][1]);
            }
            if (act[mt][1]) {
              a[2] = fmaf(a[2], alpha[mt][1], o[y][2]);
              a[3] = fmaf(a[3], alpha[mt][1], o[y][3]);
            }
          }
        }
      }
    }
    __syncthreads();  // V, P and the reductions are free for the next chunk
  }

  // Partials: [m][h][split] x (max, sum, acc[HD]); a row that saw no key of this split: max = -inf.
#pragma unroll
  for (int mt = 0; mt < 3; mt++)
#pragma unroll
    for (int x = 0; x < 2; x++) {
      const int r = mt * 16 + (lane >> 2) + 8 * x;
      if (r >= R) continue;
      const int m = m0 + r / G.group, h = g * G.group + r % G.group;
      float* out = part + ((static_cast<size_t>(m) * G.n_heads + h) * kGrpSplits + z) * (HD + 2);
      if (warp == 0 && (lane & 3) == 0) {
        out[0] = run_max[mt][x];
        out[1] = run_sum[mt][x];
      }
      if (run_max[mt][x] == -INFINITY) continue;
#pragma unroll
      for (int n = 0; n < 2 * NPW; n++) {
        const int d = warp * (HD / kGrpWarps) + n * 8 + 2 * (lane & 3);
        out[2 + d] = acc[mt][n][2 * x];
        out[3 + d] = acc[mt][n][2 * x + 1];
      }
    }
}

// Merges the kGrpSplits partials of one (row, head) in split order (log2-domain maxima).
template <int HD>
__global__ void __launch_bounds__(HD) attn_grp_combine(const float* __restrict__ part, float* __restrict__ o,
                                                       int n_heads) {
  pdl_trigger();
  pdl_wait();
  const int h = blockIdx.x, m = blockIdx.y, d = threadIdx.x;
  const float* base = part + (static_cast<size_t>(m) * n_heads + h) * kGrpSplits * (HD + 2);
  float gmax = -INFINITY;
  for (int z = 0; z < kGrpSplits; z++) gmax = fmaxf(gmax, base[z * (HD + 2)]);
  float* oh = o + (static_cast<size_t>(m) * n_heads + h) * HD;
  if (gmax == -INFINITY) {  // no visible key: zeros, as the CPU twin
    oh[d] = 0.0f;
    return;
  }
  float total = 0.0f, s = 0.0f;
  for (int z = 0; z < kGrpSplits; z++) {
    const float mz = base[z * (HD + 2)];
    if (mz == -INFINITY) continue;
    const float w = exp2f(__fsub_rn(mz, gmax));
    total = __fadd_rn(total, __fmul_rn(base[z * (HD + 2) + 1], w));
    s = fmaf(base[z * (HD + 2) + 2 + d], w, s);
  }
  oh[d] = __fdiv_rn(s, total);
}

template <int HD>
void launch_grp(const float* q, const uint16_t* K, const uint16_t* V, float* out, float* part, const GrpGeom& G,
                const StepMeta* meta, cudaStream_t st) {
  const int rows = G.group * (G.M < G.mr ? G.M : G.mr);
  const size_t smem = grp_smem_bytes<HD>((rows + 15) / 16);
  static size_t smem_set = 0;
  if (smem > smem_set) {
    QF_CUDA_CHECK(cudaFuncSetAttribute(attn_grp_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(grp_smem_bytes<HD>(3))));
    smem_set = grp_smem_bytes<HD>(3);
  }
  const dim3 grid(G.kvw / HD, kGrpSplits, (G.M + G.mr - 1) / G.mr);
  launch_k(attn_grp_kernel<HD>, grid, dim3(kGrpThreads), smem, st, q, K, V, part, G, meta);
  QF_CUDA_LAUNCH_CHECK("attn_grp_kernel");
  launch_k(attn_grp_combine<HD>, dim3(G.n_heads, G.M), dim3(HD), 0, st, static_cast<const float*>(part), out,
           G.n_heads);
  QF_CUDA_LAUNCH_CHECK("attn_grp_combine");
}

}  // namespace

bool attention_grouped_applies(const AttnParams& p) {
  if (p.kv_dtype != DType::BF16) return false;
  if (p.head_dim != 64 && p.head_dim != 128 && p.head_dim != 256) return false;
  if (p.n_kv_heads <= 0 || p.n_heads % p.n_kv_heads != 0 || p.n_heads / p.n_kv_heads > kGrpRows) return false;
  static const bool off = [] {
    const char* e = std::getenv("QFLASH_ATTN");
    return e && std::strcmp(e, "split") == 0;
  }();
  return !off;
}

void attention_grouped(const float* q, const void* K, const void* V, float* out, int M, const AttnParams& p,
                       const StepMeta* meta, float* scratch, cudaStream_t st) {
  if ((reinterpret_cast<uintptr_t>(q) | reinterpret_cast<uintptr_t>(K) | reinterpret_cast<uintptr_t>(V)) & 15)
    backend_fail("cuda attention: q/K/V must be 16-byte aligned for the grouped kernel");
  GrpGeom G;
  attn_common_geom(G, p, M);
  G.mr = kGrpRows / G.group;
  const auto* k16 = static_cast<const uint16_t*>(K);
  const auto* v16 = static_cast<const uint16_t*>(V);
  switch (p.head_dim) {
    case 64: launch_grp<64>(q, k16, v16, out, scratch, G, meta, st); break;
    case 128: launch_grp<128>(q, k16, v16, out, scratch, G, meta, st); break;
    default: launch_grp<256>(q, k16, v16, out, scratch, G, meta, st); break;
  }
}

}  // namespace qf::cuda
