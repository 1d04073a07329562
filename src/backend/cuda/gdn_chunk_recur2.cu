// v2 of the chunked gated DeltaNet's sequential stage (gdn_chunk.cu step 3 and its header
// comment give the algorithm; gdn_chunk_impl.cuh the split-tf32 products).
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/gdn_chunk_impl.cuh"

namespace qf::cuda::gdn_detail {
namespace {

// ---- 3'. sequential stage, v2 ---------------------------------------------------------------
// Same per-warp arithmetic as gdn_chunk_recur_kernel (bit-identical results), but a block of 8
// warps owns 64 rows of S (warps 4..7 do for rows 32..63 what warps 0..3 do for rows 0..31), so
// the chunk's operands are shared by twice the rows, and every operand comes from shared memory,
// staged by cp.async one phase ahead instead of being read from L2 inside the mma loops (v1 is
// bound by those round trips). Per chunk c, in order:
//   wait K, e^G, e^{G_L-G}, W, Q, U of c | stage K.. of c+1 (double buffer) | (1) Delta, P |
//   stage W, Q, U of c+1 | (3) S update | wait Aqk of c | (2) y | stage Aqk of c+1.
// (2) and (3) are independent (both read Delta; (2) reads P, (3) S), so (3) runs first and
// Aqk's copy overlaps (1) and (3) of the next chunk.
constexpr int kRows2 = 64;
constexpr int kRecThreads2 = 256;

__device__ __forceinline__ void cp16(float* dst, const float* src) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
// rows x cols floats (cols a multiple of 4, 16-byte aligned rows) from src (row stride lds) to
// dst (row stride ldd), spread over the block.
__device__ __forceinline__ void stage(float* dst, int ldd, const float* src, size_t lds, int rows, int cols, int tid) {
  const int c4 = cols / 4;
  for (int e = tid; e < rows * c4; e += kRecThreads2) {
    const int r = e / c4, k = 4 * (e % c4);
    cp16(dst + r * ldd + k, src + r * lds + k);
  }
}

template <int DK>
struct Rec2Smem {
  static constexpr int LDS = DK + 4, LDW = DK + 4, LDK = DK + 8;  // bank-conflict-free fragment reads
  static constexpr int LDD = kRows2 + 8, LDU = kRows2 + 8, LDA = kC + 4;
  static constexpr int S = 0, D = S + kRows2 * LDS, W = D + kC * LDD, Q = W + kC * LDW, U = Q + kC * LDW,
                       A = U + kC * LDU, K = A + kC * LDA, E = K + 2 * kC * LDK, total = E + 4 * kC;
};

template <int DK>
size_t recur2_smem_bytes() {
  return static_cast<size_t>(Rec2Smem<DK>::total) * sizeof(float);
}

template <int DK>
__global__ void __launch_bounds__(kRecThreads2, 1) gdn_chunk_recur2_kernel(const RecArgs a) {
  using L_ = Rec2Smem<DK>;
  constexpr int KS = DK / 8, JW = DK / 4, NJ = JW / 8;
  constexpr int LDS = L_::LDS, LDW = L_::LDW, LDK = L_::LDK, LDD = L_::LDD, LDU = L_::LDU, LDA = L_::LDA;
  extern __shared__ __align__(16) float sm2[];
  float* Ss = sm2 + L_::S;  // S0 rows of this block [64][LDS]
  float* Ds = sm2 + L_::D;  // Delta [s][i]
  float* Ws = sm2 + L_::W;
  float* Qs = sm2 + L_::Q;
  float* Us = sm2 + L_::U;
  float* As = sm2 + L_::A;
  float* Kb = sm2 + L_::K;  // 2 buffers of [64][LDK]
  float* Eb = sm2 + L_::E;  // 2 buffers of e^G [64], e^{G_{L-1}-G} [64]
  pdl_trigger();
  pdl_wait();
  const int h = blockIdx.x, i0 = blockIdx.y * kRows2, kh = h / a.ratio;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, q = lane & 3;
  const int rh = warp >> 2, wq = warp & 3;  // row half of S, warp within the half (v1's warp)
  const int cb = 32 * rh;                   // this warp's first row of S (column of Delta)
  auto stage_k = [&](int c) {
    const size_t hc = static_cast<size_t>(c) * a.Hv + h, kc = static_cast<size_t>(c) * a.Hk + kh;
    stage(Kb + (c & 1) * kC * LDK, LDK, a.sc.kn + kc * kC * DK, DK, kC, DK, tid);
    float* e = Eb + (c & 1) * 2 * kC;
    if (tid < kC / 4) cp16(e + 4 * tid, a.sc.eg + hc * kC + 4 * tid);
    else if (tid < kC / 2) cp16(e + kC + 4 * (tid - kC / 4), a.sc.er + hc * kC + 4 * (tid - kC / 4));
  };
  auto stage_wqu = [&](int c) {
    const size_t hc = static_cast<size_t>(c) * a.Hv + h, kc = static_cast<size_t>(c) * a.Hk + kh;
    stage(Ws, LDW, a.sc.w + hc * kC * DK, DK, kC, DK, tid);
    stage(Qs, LDW, a.sc.qn + kc * kC * DK, DK, kC, DK, tid);
    stage(Us, LDU, a.sc.u + hc * kC * a.dv + i0, a.dv, kC, kRows2, tid);
  };
  auto stage_a = [&](int c) {
    const size_t hc = static_cast<size_t>(c) * a.Hv + h;
    stage(As, LDA, a.sc.aqk + hc * kC * kC, kC, kC, kC, tid);
  };
  // cp.async groups, in issue order: K(c), WQU(c), A(c), K(c+1), WQU(c+1), A(c+1), ... (an empty
  // group past the last chunk keeps the counts of the waits below right)
  stage_k(0);
  cp_commit();
  stage_wqu(0);
  cp_commit();
  stage_a(0);
  cp_commit();

  float* Sg = a.S + (static_cast<size_t>(h) * a.dv + i0) * DK;
  for (int e = tid; e < kRows2 * DK; e += kRecThreads2) Ss[(e / DK) * LDS + e % DK] = Sg[e];
  __syncthreads();
  const int jw = wq * JW, s0 = 16 * wq;
  float sacc[2][NJ][4];
#pragma unroll
  for (int mt = 0; mt < 2; mt++)
#pragma unroll
    for (int nt = 0; nt < NJ; nt++) {
      const int i = cb + 16 * mt + g, j = jw + 8 * nt + 2 * q;
      sacc[mt][nt][0] = Ss[i * LDS + j];
      sacc[mt][nt][1] = Ss[i * LDS + j + 1];
      sacc[mt][nt][2] = Ss[(i + 8) * LDS + j];
      sacc[mt][nt][3] = Ss[(i + 8) * LDS + j + 1];
    }

  for (int c = 0; c < a.nc; c++) {
    const int L = min(kC, a.M - c * kC);
    const float* Kc = Kb + (c & 1) * kC * LDK;
    const float* egs = Eb + (c & 1) * 2 * kC;
    const float* ers = egs + kC;
    cp_wait<1>();  // K, e^G, W, Q, U of chunk c (Aqk of c may still be in flight)
    __syncthreads();
    if (c + 1 < a.nc) stage_k(c + 1);
    cp_commit();
    // (1) Delta = U - W S0^T and P = Q S0^T for rows s0..s0+15, this half's 32 columns
    float dacc[4][4], pacc[4][4];
#pragma unroll
    for (int nt = 0; nt < 4; nt++)
#pragma unroll
      for (int e = 0; e < 4; e++) dacc[nt][e] = pacc[nt][e] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < KS; ks++) {
      const float* w0 = Ws + (s0 + g) * LDW + 8 * ks + q;
      const float* q0 = Qs + (s0 + g) * LDW + 8 * ks + q;
      const FragA fw = frag_a(w0[0], w0[8 * LDW], w0[4], w0[8 * LDW + 4]);
      const FragA fq = frag_a(q0[0], q0[8 * LDW], q0[4], q0[8 * LDW + 4]);
#pragma unroll
      for (int nt = 0; nt < 4; nt++) {
        const float* sr = Ss + (cb + 8 * nt + g) * LDS + 8 * ks + q;
        const FragB fb = frag_b(sr[0], sr[4]);
        mma3(dacc[nt], fw, fb);
        mma3(pacc[nt], fq, fb);
      }
    }
#pragma unroll
    for (int nt = 0; nt < 4; nt++) {
      const int i = cb + 8 * nt + 2 * q, s = s0 + g;
      Ds[s * LDD + i] = __fsub_rn(Us[s * LDU + i], dacc[nt][0]);
      Ds[s * LDD + i + 1] = __fsub_rn(Us[s * LDU + i + 1], dacc[nt][1]);
      Ds[(s + 8) * LDD + i] = __fsub_rn(Us[(s + 8) * LDU + i], dacc[nt][2]);
      Ds[(s + 8) * LDD + i + 1] = __fsub_rn(Us[(s + 8) * LDU + i + 1], dacc[nt][3]);
    }
    __syncthreads();
    if (c + 1 < a.nc) stage_wqu(c + 1);
    cp_commit();
    // (3) S = e^{G_{L-1}} S + sum_s (Delta_s e^{G_{L-1} - G_s}) k_s^T (rows of Delta past L are 0)
    {
      const float gL = egs[L - 1];
#pragma unroll
      for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < NJ; nt++)
#pragma unroll
          for (int e = 0; e < 4; e++) sacc[mt][nt][e] = __fmul_rn(sacc[mt][nt][e], gL);
#pragma unroll
      for (int ks = 0; ks < kC / 8; ks++) {
        const int s = 8 * ks + q;
        const float r0 = ers[s], r1 = ers[s + 4];
        FragA fa[2];
#pragma unroll
        for (int mt = 0; mt < 2; mt++) {
          const float* d0 = Ds + s * LDD + cb + 16 * mt + g;
          fa[mt] = frag_a(__fmul_rn(d0[0], r0), __fmul_rn(d0[8], r0), __fmul_rn(d0[4 * LDD], r1),
                          __fmul_rn(d0[4 * LDD + 8], r1));
        }
#pragma unroll
        for (int nt = 0; nt < NJ; nt++) {
          const float* k0 = Kc + s * LDK + jw + 8 * nt + g;
          const FragB fb = frag_b(k0[0], k0[4 * LDK]);
#pragma unroll
          for (int mt = 0; mt < 2; mt++) mma3(sacc[mt][nt], fa[mt], fb);
        }
      }
#pragma unroll
      for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < NJ; nt++) {
          const int i = cb + 16 * mt + g, j = jw + 8 * nt + 2 * q;
          Ss[i * LDS + j] = sacc[mt][nt][0];
          Ss[i * LDS + j + 1] = sacc[mt][nt][1];
          Ss[(i + 8) * LDS + j] = sacc[mt][nt][2];
          Ss[(i + 8) * LDS + j + 1] = sacc[mt][nt][3];
        }
    }
    cp_wait<2>();  // Aqk of chunk c (K.. and W, Q, U of c + 1 may still be in flight)
    __syncthreads();
    // (2) y = e^G P + Aqk Delta for rows s0..s0+15; Aqk is 0 right of row s0+15
    {
      const float e0 = egs[s0 + g], e1 = egs[s0 + g + 8];
#pragma unroll
      for (int nt = 0; nt < 4; nt++) {
        pacc[nt][0] = __fmul_rn(pacc[nt][0], e0);
        pacc[nt][1] = __fmul_rn(pacc[nt][1], e0);
        pacc[nt][2] = __fmul_rn(pacc[nt][2], e1);
        pacc[nt][3] = __fmul_rn(pacc[nt][3], e1);
      }
      for (int ks = 0; ks < 2 * wq + 2; ks++) {
        const float* a0 = As + (s0 + g) * LDA + 8 * ks + q;
        const FragA fa = frag_a(a0[0], a0[8 * LDA], a0[4], a0[8 * LDA + 4]);
#pragma unroll
        for (int nt = 0; nt < 4; nt++) {
          const float* dr = Ds + (8 * ks + q) * LDD + cb + 8 * nt + g;
          mma3(pacc[nt], fa, frag_b(dr[0], dr[4 * LDD]));
        }
      }
      float* yr = a.y + static_cast<size_t>(c) * kC * a.VD + static_cast<size_t>(h) * a.dv + i0 + cb;
#pragma unroll
      for (int nt = 0; nt < 4; nt++) {
        const int i = 8 * nt + 2 * q;
        if (s0 + g < L) {
          yr[static_cast<size_t>(s0 + g) * a.VD + i] = pacc[nt][0];
          yr[static_cast<size_t>(s0 + g) * a.VD + i + 1] = pacc[nt][1];
        }
        if (s0 + g + 8 < L) {
          yr[static_cast<size_t>(s0 + g + 8) * a.VD + i] = pacc[nt][2];
          yr[static_cast<size_t>(s0 + g + 8) * a.VD + i + 1] = pacc[nt][3];
        }
      }
    }
    __syncthreads();
    if (c + 1 < a.nc) stage_a(c + 1);
    cp_commit();
  }
  cp_wait<0>();
#pragma unroll
  for (int mt = 0; mt < 2; mt++)
#pragma unroll
    for (int nt = 0; nt < NJ; nt++) {
      const int i = cb + 16 * mt + g, j = jw + 8 * nt + 2 * q;
      Sg[static_cast<size_t>(i) * DK + j] = sacc[mt][nt][0];
      Sg[static_cast<size_t>(i) * DK + j + 1] = sacc[mt][nt][1];
      Sg[static_cast<size_t>(i + 8) * DK + j] = sacc[mt][nt][2];
      Sg[static_cast<size_t>(i + 8) * DK + j + 1] = sacc[mt][nt][3];
    }
}

template <int DK>
void launch_recur2_dk(const RecArgs& ra, const GdnDims& d, cudaStream_t st) {
  static std::atomic<uint64_t> set{0};
  allow_smem(gdn_chunk_recur2_kernel<DK>, recur2_smem_bytes<DK>(), set);
  launch_k(gdn_chunk_recur2_kernel<DK>, dim3(d.n_v_heads, d.d_v / kRows2), dim3(kRecThreads2), recur2_smem_bytes<DK>(),
           st, ra);
}

}  // namespace

bool launch_recur2(const RecArgs& ra, const GdnDims& d, cudaStream_t st) {
  if (d.d_v % kRows2 != 0) return false;
  switch (d.d_k) {
    case 32: launch_recur2_dk<32>(ra, d, st); break;
    case 64: launch_recur2_dk<64>(ra, d, st); break;
    case 96: launch_recur2_dk<96>(ra, d, st); break;
    default: launch_recur2_dk<128>(ra, d, st); break;
  }
  QF_CUDA_LAUNCH_CHECK("gdn_chunk_recur2_kernel");
  return true;
}

}  // namespace qf::cuda::gdn_detail
