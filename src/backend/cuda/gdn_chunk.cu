// Chunked gated DeltaNet (Backend::gdn_chunked): the gated delta rule in its chunk-parallel
// (WY / UT-transform) form of docs/spec/qwen38.md 3.4, chunks of 64 rows from row 0, state in fp32.
//
// Per value head, a chunk of L <= 64 rows t (l2-normalised q_t, k_t; v_t; beta_t) and the state
// S0 [d_v, d_k] it receives (the CPU twin backend/cpu/gdn_chunked.cpp computes the same formulas):
//   gamma_t = -exp(A_log) softplus(alpha_t + dt_bias)   log of the decay g_t
//   G_t     = gamma_0 + ... + gamma_t                     in double
//   A_ts    = beta_t e^{G_t - G_s} (k_t . k_s), s < t;   Aqk_ts = e^{G_t - G_s} (q_t . k_s), s <= t
//   (I + A) W = diag(beta e^G) K,   (I + A) U = diag(beta) V
//   Delta   = U - W S0^T
//   y_t     = e^{G_t} S0 q_t + sum_s Aqk_ts Delta_s
//   S       = e^{G_{L-1}} S0 + sum_s e^{G_{L-1} - G_s} Delta_s k_s^T
// Why: the recurrence S_t = g_t S_{t-1} + Delta_t k_t^T with Delta_t = beta_t (v_t - g_t S_{t-1} k_t)
// unrolls to S_t = e^{G_t} S0 + sum_{s<=t} e^{G_t - G_s} Delta_s k_s^T; substituting S_{t-1}
// into Delta_t gives (I + A) Delta = diag(beta) V - diag(beta e^G) K S0^T, i.e. Delta = U - W S0^T.
// Every exponent is a difference of cumulative log-decays inside one chunk and is <= 0, so
// strong decay underflows to 0 instead of overflowing; G is summed in double so that the
// difference of two large sums keeps fp32 accuracy.
//
// Kernels, in stream order:
//  1. gdn_chunk_prep_kernel, grid (key head, chunk), all chunks in parallel: conv + SiLU of the
//     chunk's q and k channels over [tail | rows], l2 norms, the Gram products K K^T and Q K^T
//     (once per key head, on split-tf32 mma), then for each value head of the key head the gates,
//     A and Aqk, and one blocked forward substitution for [W | U] (split-tf32 mma between the
//     16-row blocks, one thread per column inside a block). Writes the intermediates
//     (GdnChunkScratch, gdn_chunk.h). Its first form ran the Gram products as scalar FMAs and one
//     64-step substitution per column; the tensor-core form measured 22% faster and closer to the
//     float64 reference (docs/experiments/prefill_kernels.md, "GDN prep v2"), and the scalar form
//     was removed.
//  2. gdn_chunk_tail_kernel: the new conv tail (the last K-1 raw rows of [tail | rows]).
//  3. gdn_chunk_recur_kernel, grid (value head, 32-row block of d_v), sequential over chunks.
//     Rows of S are independent (row i of Delta needs only row i of S0), so a block keeps its 32
//     rows of S as tensor-core accumulators across chunks. Per chunk: Delta = U - W S0^T and
//     Q S0^T; then y = e^G (Q S0^T) + Aqk Delta and S = e^{G_{L-1}} S + (Delta e^{G_{L-1}-G})^T K.
//     Products run on mma m16n8k8 tf32 with each fp32 operand split into a tf32 high part and
//     a tf32 residual (3 products, about fp32 accuracy; one tf32 product alone costs ~1e-3),
//     each k-step in a fresh accumulator added to the running sum in fp32 (see mma3).
//
// Split invariance: a chunk's arithmetic depends only on its rows, the raw rows before it and the
// state it receives, never on M or the chunk count, so splitting a prompt at a multiple of 64
// repeats the same operations on the same values.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/device_common.cuh"
#include "backend/cuda/gdn_chunk.h"
#include "backend/cuda/gdn_chunk_impl.cuh"

namespace qf::cuda {

namespace {

using namespace gdn_detail;  // kC, kMaxD, kRows, RecArgs, the split-tf32 products
constexpr int kConvMax = 8;
constexpr int kPrepThreads = 2 * kMaxD;  // threads [0, d_k) solve columns of W, [128, 128 + d_v) of U
constexpr int kLdA = kC + 4;             // A rows: 16-byte aligned for float4 broadcasts
constexpr int kPrepHead = 5 * kC;        // G (double) + beta + beta e^G + pad, in floats

// ---- 1. parallel stage ----------------------------------------------------------------------
struct PrepArgs {
  const float* mixed;  // [M, C] raw projections
  const float* alpha;  // [M, Hv]
  const float* beta_in;
  const float* conv_w;  // [C, K]
  const float* A_log;   // [Hv]
  const float* dt_bias;
  const float* tail;  // [K-1, C] raw rows before row 0 (the state's conv tail, read only here)
  GdnChunkScratch sc;
  int M, C, K, Hk, Hv, ratio, dk, dv, key_dim;
  float eps, qscale;
};

// conv_taps: channel ch's taps w (and wlast = w[K - 1], read directly: selecting w[K - 1] would
// index the array dynamically) and the window before chunk row t0, raw rows m0 + t0 - K + 1 ..
// m0 + t0 - 1 of [tail | mixed] (a window row at or past L reads as 0). Returns K.
template <int KFIX>
__device__ __forceinline__ int conv_taps(const PrepArgs& a, int ch, int m0, int t0, int L, float (&w)[kConvMax],
                                         float& wlast, float (&win)[kConvMax - 1]) {
  const int K = KFIX > 0 ? KFIX : a.K;
  const size_t C = a.C;
#pragma unroll
  for (int j = 0; j < kConvMax; j++) w[j] = j < K ? a.conv_w[static_cast<size_t>(ch) * K + j] : 0.0f;
  wlast = a.conv_w[static_cast<size_t>(ch) * K + K - 1];
#pragma unroll
  for (int j = 0; j < kConvMax - 1; j++) {
    const int tt = t0 - (K - 1) + j;  // chunk row of this window entry
    const int m = m0 + tt;
    win[j] = 0.0f;
    if (j < K - 1 && tt < L)
      win[j] = m >= 0 ? a.mixed[static_cast<size_t>(m) * C + ch] : a.tail[static_cast<size_t>(K - 1 + m) * C + ch];
  }
  return K;
}

// Conv + SiLU of channel ch for the chunk's rows t = 0..63 (0 past row L) with gdn_rows'
// arithmetic; emit(t, u) in row order. Row m0 + t reads raw rows m0 + t - K + 1 .. m0 + t of
// [tail | mixed]. KFIX > 0: the conv kernel size is KFIX (== a.K, the launcher's choice), known at
// compile time: the same operations without the per-tap tests and window moves of a runtime K,
// which were two thirds of the prep kernel's stall samples (Nsight Compute, run 66).
template <int KFIX, class Emit>
__device__ __forceinline__ void conv_rows(const PrepArgs& a, int ch, int m0, int L, Emit&& emit) {
  const size_t C = a.C;
  float w[kConvMax], win[kConvMax - 1], wlast;
  const int K = conv_taps<KFIX>(a, ch, m0, 0, kC, w, wlast, win);  // the window (rows < 0) is never cut
#pragma unroll
  for (int t = 0; t < kC; t++) {
    const float raw = t < L ? a.mixed[static_cast<size_t>(m0 + t) * C + ch] : 0.0f;
    const float acc = gdn_conv_acc<kConvMax, KFIX>(w, win, wlast, raw, K);
    emit(t, t < L ? silu_f(acc) : 0.0f);
    gdn_conv_push<kConvMax - 1, KFIX>(win, raw, K);
  }
}

// conv_rows for a channel whose raw rows are already in shared memory (col[t * ld], t < 64; rows
// from L on hold 0): the same arithmetic in place, each row read before it is overwritten. The
// window before row 0 comes from [tail | mixed] as in conv_rows.
template <int KFIX>
__device__ __forceinline__ void conv_rows_in_place(const PrepArgs& a, int ch, int m0, int L, float* col, int ld) {
  static_assert(KFIX > 0, "the staged form takes a compile-time conv size");
  constexpr int K = KFIX;
  float w[kConvMax], win[kConvMax - 1], wlast;
  conv_taps<KFIX>(a, ch, m0, 0, kC, w, wlast, win);
#pragma unroll
  for (int t = 0; t < kC; t++) {
    const float raw = t < L ? col[t * ld] : 0.0f;
    const float acc = gdn_conv_acc<kConvMax, KFIX>(w, win, wlast, raw, K);
    col[t * ld] = t < L ? silu_f(acc) : 0.0f;
    gdn_conv_push<kConvMax - 1, KFIX>(win, raw, K);
  }
}

// ---- 1b. parallel stage: what the tensor-core form changes --------------------------------------
// Run 27 found the scalar form latency-bound at 25% occupancy, with two parts making up most of a
// warp's instruction stream; this kernel evaluates both on the tensor cores:
//  - Gram products K K^T and Q K^T on split-tf32 mma (mma3: about fp32 accuracy), only the 16x8
//    tiles on or below the diagonal (20 of 32 per product), 5 tiles a warp (scalar: 64x64x128 FMAs,
//    ~5.6k instructions a warp).
//  - (I + A) [W | U] = [diag(beta e^G) K | diag(beta) V] as one blocked forward substitution over
//    four 16-row blocks: block i first subtracts A[i, <i] X[<i] (split-tf32 mma, all 8 warps, the
//    columns of W and U side by side), then a 16-step substitution inside the block, one thread per
//    column (scalar: a chain of 2,016 dependent FMAs a thread with the column in spilling registers).
// Every value is a function of the chunk's rows alone, so split invariance holds (tests:
// CudaGdnChunked.*).
constexpr int kLdM = kC + 1;  // Gram rows in shared memory (both products in one array)
constexpr int kBlk = 16;      // rows of a diagonal block of the blocked substitution

// Conv + SiLU of channel ch for chunk rows t0 .. t0 + NR - 1 (0 from row L on), conv_rows'
// arithmetic for each row; the window is loaded for row t0. Raw rows past the call's last row are
// never read (they only feed rows that are emitted as 0).
template <int NR, int KFIX, class Emit>
__device__ __forceinline__ void conv_rows_from(const PrepArgs& a, int ch, int m0, int t0, int L, Emit&& emit) {
  const size_t C = a.C;
  float w[kConvMax], win[kConvMax - 1], wlast;
  const int K = conv_taps<KFIX>(a, ch, m0, t0, L, w, wlast, win);
#pragma unroll
  for (int t = 0; t < NR; t++) {
    const int tt = t0 + t;
    const float raw = tt < L ? a.mixed[static_cast<size_t>(m0 + tt) * C + ch] : 0.0f;
    const float acc = gdn_conv_acc<kConvMax, KFIX>(w, win, wlast, raw, K);
    emit(tt, tt < L ? silu_f(acc) : 0.0f);
    gdn_conv_push<kConvMax - 1, KFIX>(win, raw, K);
  }
}

// KFIX: 4 where the conv kernel size is 4 (every Qwen3.8 checkpoint), else 0 (any size up to kConvMax).
template <int KFIX>
__global__ void __launch_bounds__(kPrepThreads, 2) gdn_chunk_prep_kernel(const PrepArgs a) {
  pdl_trigger();
  pdl_wait();
  extern __shared__ __align__(16) float smem[];
  const int kh = blockIdx.x, c = blockIdx.y, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, q = lane & 3;
  // Row strides: ldk = 4 (mod 32) and ldx = 8 (mod 32) make every fragment read below hit 32 banks
  // (A and [n][k] B fragments read rows g, columns q; [k][n] B fragments rows q, columns g).
  const int dk = a.dk, dv = a.dv, ldk = dk + 4, nx = dk + dv, ldx = nx + 8;
  const int m0 = c * kC, L = min(kC, a.M - m0);
  const size_t kc = static_cast<size_t>(c) * a.Hk + kh;
  double* Gs = reinterpret_cast<double*>(smem);  // [64] cumulative log-decay
  float* bes = smem + 2 * kC;                    // [64] beta
  float* bgs = bes + kC;                         // [64] beta e^G
  float* Xs = smem + kPrepHead;                  // [64, ldx] [W | U]: right-hand side, then solution
  float* Qs = Xs;                                // [64, ldk] Q and K until the Gram products are done
  float* Ks = Xs + kC * ldk;
  float* Mg = Xs + kC * max(2 * ldk, ldx);  // [64, kLdM] k_t . k_s at [t][s], s < t; q_t . k_s at [s][t], s <= t
  float* As = Mg + kC * kLdM;               // [64, kLdA]

  if constexpr (KFIX > 0) {
    // The chunk's raw q and k rows of this key head into Q and K with cp.async (the launcher takes
    // this form only where every row and channel offset is 16-byte aligned), rows from L on zero;
    // then each thread convolves its channel in place. Profile run 66: the conv's raw-row loads,
    // one 4-byte load per row and thread, were the kernel's largest memory stall.
    const int per = dk / 4;
    for (int e = tid; e < 2 * kC * per; e += kPrepThreads) {
      const int r = e / per, c4 = (e - r * per) * 4;
      const bool isk = r >= kC;
      const int t = isk ? r - kC : r;
      float* dst = (isk ? Ks : Qs) + t * ldk + c4;
      if (t < L)
        cp_async16(smem_u32(dst), a.mixed + static_cast<size_t>(m0 + t) * a.C + (isk ? a.key_dim : 0) + kh * dk + c4, 16);
      else
        *reinterpret_cast<float4*>(dst) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    if (tid < 2 * dk) {
      const bool isk = tid >= dk;
      const int j = isk ? tid - dk : tid;
      conv_rows_in_place<KFIX>(a, (isk ? a.key_dim : 0) + kh * dk + j, m0, L, (isk ? Ks : Qs) + j, ldk);
    }
  } else if (tid < 2 * dk) {
    const bool isk = tid >= dk;
    const int j = isk ? tid - dk : tid;
    float* dst = (isk ? Ks : Qs) + j;
    conv_rows<KFIX>(a, (isk ? a.key_dim : 0) + kh * dk + j, m0, L, [&](int t, float u) { dst[t * ldk] = u; });
  }
  __syncthreads();
  // l2 norms
  for (int r = warp; r < 2 * kC; r += kPrepThreads / 32) {
    const bool isk = r >= kC;
    const int t = isk ? r - kC : r;
    float* p = (isk ? Ks : Qs) + t * ldk;
    float ss = 0.0f;
    for (int j = lane; j < dk; j += 32) ss = fmaf(p[j], p[j], ss);
    ss = warp_sum(ss);
    const float inv = gdn_inv_norm(ss, a.eps);
    float* dst = (isk ? a.sc.kn : a.sc.qn) + (kc * kC + t) * dk;
    for (int j = lane; j < dk; j += 32) {
      const float v = isk ? __fmul_rn(p[j], inv) : __fmul_rn(__fmul_rn(p[j], inv), a.qscale);
      p[j] = v;
      dst[j] = v;
    }
  }
  __syncthreads();
  // Gram products on the tensor cores. Warp w: product p = w / 4 (K K^T, Q K^T), the row bands
  // {0, 3} or {1, 2} (16 rows each), and the 8-column tiles of parity h = w % 2 on or below the
  // diagonal (band b has tiles 0 .. 2b + 1): b + 1 tiles per band, 5 a warp. Both bands read the
  // same B fragments (columns s of K), band bA's tiles being the first of band bB's.
  {
    const int p = warp >> 2, bA = (warp >> 1) & 1, bB = 3 - bA, h = warp & 1;
    const float* Ao = p ? Qs : Ks;
    float accA[2][4], accB[4][4];
#pragma unroll
    for (int m = 0; m < 4; m++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        accB[m][e] = 0.0f;
        if (m < 2) accA[m][e] = 0.0f;
      }
    for (int ks = 0; ks < dk / 8; ks++) {
      const float* a0 = Ao + (16 * bA + g) * ldk + 8 * ks + q;
      const float* a1 = Ao + (16 * bB + g) * ldk + 8 * ks + q;
      const FragA fA = frag_a(a0[0], a0[8 * ldk], a0[4], a0[8 * ldk + 4]);
      const FragA fB = frag_a(a1[0], a1[8 * ldk], a1[4], a1[8 * ldk + 4]);
#pragma unroll
      for (int m = 0; m < 4; m++) {
        if (m > bB) break;  // warp-uniform
        const float* sr = Ks + (8 * (h + 2 * m) + g) * ldk + 8 * ks + q;
        const FragB fb = frag_b(sr[0], sr[4]);
        mma3(accB[m], fB, fb);
        if (m < 2 && m <= bA) mma3(accA[m], fA, fb);
      }
    }
    // C fragment element e of a tile: row 16 band + g + 8 (e / 2), column 8 nt + 2q + e % 2
    auto put = [&](const float (&v)[4], int band, int nt) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int t = 16 * band + g + 8 * (e >> 1), s = 8 * nt + 2 * q + (e & 1);
        if (p == 0) {
          if (s < t) Mg[t * kLdM + s] = v[e];
        } else if (s <= t) {
          Mg[s * kLdM + t] = v[e];
        }
      }
    };
#pragma unroll
    for (int m = 0; m < 4; m++) {
      if (m <= bB) put(accB[m], bB, h + 2 * m);
      if (m < 2 && m <= bA) put(accA[m], bA, h + 2 * m);
    }
  }
  __syncthreads();

  const int tx = tid & 15, ty = tid >> 4;
  for (int r = 0; r < a.ratio; r++) {
    const int hv = kh * a.ratio + r;
    const size_t hc = static_cast<size_t>(c) * a.Hv + hv;
    if (tid < kC) {
      float gam = 0.0f, beta = 0.0f;
      if (tid < L) {
        const size_t row = static_cast<size_t>(m0 + tid) * a.Hv + hv;
        gam = gdn_log_decay(-expf(a.A_log[hv]), a.alpha[row], a.dt_bias[hv]);
        beta = sigmoid_f(a.beta_in[row]);
      }
      Gs[tid] = static_cast<double>(gam);
      bes[tid] = beta;
    }
    __syncthreads();
    if (tid == 0) {
      double s = 0.0;
#pragma unroll 8
      for (int t = 0; t < kC; t++) {
        s += Gs[t];
        Gs[t] = s;
      }
    }
    // U's right-hand side beta_t v_t into X's columns dk.., v = conv + SiLU of this head's value
    // channels: one item = a channel and 16 rows, spread over all threads
    for (int it = tid; it < dv * (kC / kBlk); it += kPrepThreads) {
      const int j = it % dv, t0 = kBlk * (it / dv);
      float* dst = Xs + dk + j;
      conv_rows_from<kBlk, KFIX>(a, 2 * a.key_dim + hv * dv + j, m0, t0, L,
                           [&](int t, float u) { dst[t * ldx] = __fmul_rn(bes[t], u); });
    }
    __syncthreads();
    if (tid < kC) {
      const float eg = tid < L ? expf(static_cast<float>(Gs[tid])) : 0.0f;
      const float er = tid < L ? expf(static_cast<float>(Gs[L - 1] - Gs[tid])) : 0.0f;
      bgs[tid] = __fmul_rn(bes[tid], eg);
      a.sc.eg[hc * kC + tid] = eg;
      a.sc.er[hc * kC + tid] = er;
    }
    // A and Aqk from the Gram values
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
      for (int b = 0; b < 4; b++) {
        const int t = ty + 16 * i, s = tx + 16 * b;
        float aqk = 0.0f, av = 0.0f;
        if (t < L && s <= t) {
          const float D = expf(static_cast<float>(Gs[t] - Gs[s]));
          aqk = __fmul_rn(D, Mg[s * kLdM + t]);
          if (s < t) av = __fmul_rn(bes[t], __fmul_rn(D, Mg[t * kLdM + s]));
        }
        As[t * kLdA + s] = av;
        a.sc.aqk[(hc * kC + t) * kC + s] = aqk;
      }
    __syncthreads();
    // W's right-hand side beta_t e^{G_t} k_t into X's columns 0..dk-1. K's shared copy is gone (X
    // overwrote it); this block wrote kn before a barrier, so the global copy is visible to it.
    {
      const float* kn = a.sc.kn + kc * kC * dk;
      for (int e = tid; e < kC * dk; e += kPrepThreads) {
        const int t = e / dk, j = e - t * dk;
        Xs[t * ldx + j] = __fmul_rn(bgs[t], kn[e]);
      }
    }
    __syncthreads();
    // Blocked forward substitution, rows r0 .. r0 + 15 per block:
    //   X_i <- X_i - A[i, <i] X[<i]   (mma; warp w owns the column tiles w, w + 8, w + 16, w + 24)
    //   then (I + A[i, i]) X_i = X_i, one thread per column, 16 rows in registers.
    // Rows at or past L have zero right-hand sides and zero rows of A, so they stay exactly 0.
    for (int i = 0; i < kC / kBlk; i++) {
      const int r0 = kBlk * i;
      if (i > 0) {
        float acc[4][4];
#pragma unroll
        for (int u = 0; u < 4; u++)
#pragma unroll
          for (int e = 0; e < 4; e++) acc[u][e] = 0.0f;
        for (int ks = 0; ks < 2 * i; ks++) {
          const float* a0 = As + (r0 + g) * kLdA + 8 * ks + q;
          const FragA fa = frag_a(a0[0], a0[8 * kLdA], a0[4], a0[8 * kLdA + 4]);
#pragma unroll
          for (int u = 0; u < 4; u++) {
            const int nt = warp + 8 * u;
            if (8 * nt >= nx) break;  // warp-uniform
            const float* dr = Xs + (8 * ks + q) * ldx + 8 * nt + g;
            mma3(acc[u], fa, frag_b(dr[0], dr[4 * ldx]));
          }
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
          const int nt = warp + 8 * u;
          if (8 * nt >= nx) break;
          float* x0 = Xs + (r0 + g) * ldx + 8 * nt + 2 * q;
          x0[0] = __fsub_rn(x0[0], acc[u][0]);
          x0[1] = __fsub_rn(x0[1], acc[u][1]);
          x0[8 * ldx] = __fsub_rn(x0[8 * ldx], acc[u][2]);
          x0[8 * ldx + 1] = __fsub_rn(x0[8 * ldx + 1], acc[u][3]);
        }
        __syncthreads();
      }
      if (tid < nx) {
        float* col = Xs + r0 * ldx + tid;
        float x[kBlk];
#pragma unroll
        for (int t = 0; t < kBlk; t++) x[t] = col[t * ldx];
#pragma unroll
        for (int t = 1; t < kBlk; t++) {
          const float* At = As + (r0 + t) * kLdA + r0;
          float acc = x[t];
#pragma unroll
          for (int s = 0; s < t; s += 4) {
            const float4 a4 = *reinterpret_cast<const float4*>(At + s);
            acc = fmaf(-a4.x, x[s], acc);
            if (s + 1 < t) acc = fmaf(-a4.y, x[s + 1], acc);
            if (s + 2 < t) acc = fmaf(-a4.z, x[s + 2], acc);
            if (s + 3 < t) acc = fmaf(-a4.w, x[s + 3], acc);
          }
          x[t] = acc;
        }
        const bool isw = tid < dk;
        float* dst = isw ? a.sc.w + (hc * kC + r0) * dk + tid : a.sc.u + (hc * kC + r0) * dv + (tid - dk);
        const int ld = isw ? dk : dv;
#pragma unroll
        for (int t = 0; t < kBlk; t++) {
          col[t * ldx] = x[t];
          dst[t * ld] = x[t];
        }
      }
      __syncthreads();
    }
  }
}

// ---- 2. conv tail ---------------------------------------------------------------------------
// tail[r] = row M - (K-1) + r of [tail | mixed]. In place: when that row is in the old tail it is
// row M + r > r, which this thread has not overwritten yet.
__global__ void gdn_chunk_tail_kernel(const float* __restrict__ mixed, float* tail, int C, int K, int M) {
  pdl_trigger();
  pdl_wait();
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  for (int r = 0; r < K - 1; r++) {
    const int q = M - (K - 1) + r;
    tail[static_cast<size_t>(r) * C + c] =
        q >= 0 ? mixed[static_cast<size_t>(q) * C + c] : tail[static_cast<size_t>(K - 1 + q) * C + c];
  }
}

// ---- 3. sequential stage --------------------------------------------------------------------

__device__ __forceinline__ void prefetch_l2(const float* p, size_t floats, int tid, int threads) {
  const char* b = reinterpret_cast<const char*>(p);
  for (size_t off = static_cast<size_t>(tid) * 128; off < floats * sizeof(float); off += static_cast<size_t>(threads) * 128)
    touch_l2(b + off);
}

// WARPS = 4 or 8. Warp w owns the 16-row band b = w % 4 of Delta and y (rows 16 b .. 16 b + 15)
// and 1 / CS of its columns (CS = WARPS / 4 warps per band), and DK / WARPS columns of S in the
// update. Each element's arithmetic is the same for either count (the same products in the same
// order), so 4 and 8 warps give the same bits (CudaGdnChunked.WarpCountsAgreeBitForBit); 8 halves
// each warp's serial instruction stream per chunk, which is what bounds this kernel (Nsight Compute,
// docs/experiments/prefill_kernels.md).
// The 8-warp form also stages each chunk's operands in shared memory (dynamic, recur_stage_floats):
// stage 1, all at once with cp.async: W and Q [64][DK + 4] and this block's columns of U
// [64][kRows + 8]; stage 2, over the same space once every warp is past phase 1: K [64][DK + 8]
// and Aqk [64][64 + 4] (row strides chosen so each fragment read hits 32 banks). The 4-warp form
// reads them from global memory (L2) inside its loops: one dependent round trip per k-step. The
// values and the arithmetic are the same.
template <int DK>
constexpr int recur_stage_floats() {
  return kC * (2 * (DK + 4) + kRows + 8) > kC * ((DK + 8) + kC + 4) ? kC * (2 * (DK + 4) + kRows + 8)
                                                                     : kC * ((DK + 8) + kC + 4);
}

// rows x cols floats from src (row stride lds) to dst (row stride ldd) with 16-byte cp.async.
__device__ __forceinline__ void stage_rows(float* dst, int ldd, const float* src, size_t lds, int rows, int cols,
                                           int tid, int threads) {
  const int per = cols / 4;
  for (int e = tid; e < rows * per; e += threads) {
    const int r = e / per, c = (e % per) * 4;
    cp_async16(smem_u32(dst + r * ldd + c), src + r * lds + c, 16);
  }
}

template <int DK, int WARPS>
__global__ void __launch_bounds__(WARPS * 32) gdn_chunk_recur_kernel(const RecArgs a) {
  static_assert(WARPS == 4 || WARPS == 8, "four 16-row bands of the chunk, one or two warps each");
  constexpr int THREADS = WARPS * 32;
  constexpr int CS = WARPS / 4;         // warps per band
  constexpr int NI = kRows / 8 / CS;    // 8-column n-tiles of Delta and y per warp
  constexpr int KS = DK / 8;   // k-steps over d_k
  constexpr int JW = DK / WARPS;  // columns of S per warp in the update
  constexpr int NJ = JW / 8;   // n-tiles of those columns
  static_assert(JW % 8 == 0, "d_k / WARPS must be a multiple of 8");
  constexpr bool STAGE = WARPS == 8;
  constexpr int LDW = STAGE ? DK + 4 : DK;  // W, Q rows: A fragments read rows g, columns q
  constexpr int LDK = STAGE ? DK + 8 : DK;  // K rows: B fragments read rows q, columns g
  constexpr int LDA = STAGE ? kC + 4 : kC;  // Aqk rows
  extern __shared__ __align__(16) float stage[];
  constexpr int LDS = DK + 4;  // row stride = 4 (mod 32): B-fragment reads of S hit 32 banks
  constexpr int LDD = kRows + 8;  // row stride = 8 (mod 32): fragment reads of Delta hit 32 banks
  __shared__ __align__(16) float Ss[kRows * LDS];  // S0 rows of this block
  __shared__ __align__(16) float Ds[kC * LDD];     // Delta [s][i]
  __shared__ float egs[kC], ers[kC];
  pdl_trigger();
  pdl_wait();
  const int h = blockIdx.x, i0 = blockIdx.y * kRows, kh = h / a.ratio;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, q = lane & 3;
  float* Sg = a.S + (static_cast<size_t>(h) * a.dv + i0) * DK;
  for (int e = tid; e < kRows * DK; e += THREADS) Ss[(e / DK) * LDS + e % DK] = Sg[e];
  __syncthreads();
  const int band = warp & 3, c0 = 8 * NI * (warp >> 2);  // this warp's rows and first column of Delta and y
  const int jw = warp * JW, s0 = 16 * band;              // its columns of S, its first row of Delta and y
  float sacc[2][NJ][4];
#pragma unroll
  for (int mt = 0; mt < 2; mt++)
#pragma unroll
    for (int nt = 0; nt < NJ; nt++) {
      const int i = 16 * mt + g, j = jw + 8 * nt + 2 * q;
      sacc[mt][nt][0] = Ss[i * LDS + j];
      sacc[mt][nt][1] = Ss[i * LDS + j + 1];
      sacc[mt][nt][2] = Ss[(i + 8) * LDS + j];
      sacc[mt][nt][3] = Ss[(i + 8) * LDS + j + 1];
    }

  for (int c = 0; c < a.nc; c++) {
    const int L = min(kC, a.M - c * kC);
    const size_t hc = static_cast<size_t>(c) * a.Hv + h, kc = static_cast<size_t>(c) * a.Hk + kh;
    const float* Wc = a.sc.w + hc * kC * DK;
    const float* Qc = a.sc.qn + kc * kC * DK;
    const float* Kc = a.sc.kn + kc * kC * DK;
    const float* Uc = a.sc.u + hc * kC * a.dv + i0;
    const float* Ac = a.sc.aqk + hc * kC * kC;
    if (tid < kC) {
      egs[tid] = a.sc.eg[hc * kC + tid];
      ers[tid] = a.sc.er[hc * kC + tid];
    }
    if (c + 1 < a.nc) {  // the next chunk's operands into L2 while this one computes
      prefetch_l2(Wc + static_cast<size_t>(a.Hv) * kC * DK, kC * DK, tid, THREADS);
      prefetch_l2(Qc + static_cast<size_t>(a.Hk) * kC * DK, kC * DK, tid, THREADS);
      prefetch_l2(Kc + static_cast<size_t>(a.Hk) * kC * DK, kC * DK, tid, THREADS);
      prefetch_l2(Ac + static_cast<size_t>(a.Hv) * kC * kC, kC * kC, tid, THREADS);
      if (tid < kC) touch_l2(Uc + static_cast<size_t>(a.Hv) * kC * a.dv + static_cast<size_t>(tid) * a.dv);
    }
    const float *Wv = Wc, *Qv = Qc, *Kv = Kc, *Uv = Uc, *Av = Ac;
    int ldu = a.dv;
    if constexpr (STAGE) {  // stage 1 (the previous chunk's readers are past the loop's last barrier)
      float* sW = stage;
      float* sQ = sW + kC * LDW;
      float* sU = sQ + kC * LDW;
      stage_rows(sW, LDW, Wc, DK, kC, DK, tid, THREADS);
      stage_rows(sQ, LDW, Qc, DK, kC, DK, tid, THREADS);
      stage_rows(sU, kRows + 8, Uc, a.dv, kC, kRows, tid, THREADS);
      cp_async_commit();
      cp_async_wait<0>();
      __syncthreads();
      Wv = sW;
      Qv = sQ;
      Uv = sU;
      ldu = kRows + 8;
    }
    // (1) Delta = U - W S0^T and P = Q S0^T for rows s0..s0+15, columns c0..c0+8 NI-1
    float dacc[NI][4], pacc[NI][4];
#pragma unroll
    for (int nt = 0; nt < NI; nt++)
#pragma unroll
      for (int e = 0; e < 4; e++) dacc[nt][e] = pacc[nt][e] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < KS; ks++) {
      const float* w0 = Wv + (s0 + g) * LDW + 8 * ks + q;
      const float* q0 = Qv + (s0 + g) * LDW + 8 * ks + q;
      const FragA fw = frag_a(w0[0], w0[8 * LDW], w0[4], w0[8 * LDW + 4]);
      const FragA fq = frag_a(q0[0], q0[8 * LDW], q0[4], q0[8 * LDW + 4]);
#pragma unroll
      for (int nt = 0; nt < NI; nt++) {
        const float* sr = Ss + (c0 + 8 * nt + g) * LDS + 8 * ks + q;
        const FragB fb = frag_b(sr[0], sr[4]);
        mma3(dacc[nt], fw, fb);
        mma3(pacc[nt], fq, fb);
      }
    }
#pragma unroll
    for (int nt = 0; nt < NI; nt++) {
      const int i = c0 + 8 * nt + 2 * q, s = s0 + g;
      Ds[s * LDD + i] = __fsub_rn(Uv[static_cast<size_t>(s) * ldu + i], dacc[nt][0]);
      Ds[s * LDD + i + 1] = __fsub_rn(Uv[static_cast<size_t>(s) * ldu + i + 1], dacc[nt][1]);
      Ds[(s + 8) * LDD + i] = __fsub_rn(Uv[static_cast<size_t>(s + 8) * ldu + i], dacc[nt][2]);
      Ds[(s + 8) * LDD + i + 1] = __fsub_rn(Uv[static_cast<size_t>(s + 8) * ldu + i + 1], dacc[nt][3]);
    }
    __syncthreads();
    if constexpr (STAGE) {  // stage 2, over stage 1's space: every warp is done with W, Q and U
      float* sK = stage;
      float* sA = sK + kC * LDK;
      stage_rows(sK, LDK, Kc, DK, kC, DK, tid, THREADS);
      stage_rows(sA, LDA, Ac, kC, kC, kC, tid, THREADS);
      cp_async_commit();
      cp_async_wait<0>();
      __syncthreads();
      Kv = sK;
      Av = sA;
    }
    // (2) y = e^G P + Aqk Delta for rows s0..s0+15; Aqk is 0 right of row s0+15, so k-steps
    //     past it are skipped
    {
      const float e0 = egs[s0 + g], e1 = egs[s0 + g + 8];
#pragma unroll
      for (int nt = 0; nt < NI; nt++) {
        pacc[nt][0] = __fmul_rn(pacc[nt][0], e0);
        pacc[nt][1] = __fmul_rn(pacc[nt][1], e0);
        pacc[nt][2] = __fmul_rn(pacc[nt][2], e1);
        pacc[nt][3] = __fmul_rn(pacc[nt][3], e1);
      }
      for (int ks = 0; ks < 2 * band + 2; ks++) {
        const float* a0 = Av + (s0 + g) * LDA + 8 * ks + q;
        const FragA fa = frag_a(a0[0], a0[8 * LDA], a0[4], a0[8 * LDA + 4]);
#pragma unroll
        for (int nt = 0; nt < NI; nt++) {
          const float* dr = Ds + (8 * ks + q) * LDD + c0 + 8 * nt + g;
          mma3(pacc[nt], fa, frag_b(dr[0], dr[4 * LDD]));
        }
      }
      float* yr = a.y + static_cast<size_t>(c) * kC * a.VD + static_cast<size_t>(h) * a.dv + i0;
#pragma unroll
      for (int nt = 0; nt < NI; nt++) {
        const int i = c0 + 8 * nt + 2 * q;
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
          const float* d0 = Ds + s * LDD + 16 * mt + g;
          fa[mt] = frag_a(__fmul_rn(d0[0], r0), __fmul_rn(d0[8], r0), __fmul_rn(d0[4 * LDD], r1),
                          __fmul_rn(d0[4 * LDD + 8], r1));
        }
#pragma unroll
        for (int nt = 0; nt < NJ; nt++) {
          const float* k0 = Kv + s * LDK + jw + 8 * nt + g;
          const FragB fb = frag_b(k0[0], k0[4 * LDK]);
#pragma unroll
          for (int mt = 0; mt < 2; mt++) mma3(sacc[mt][nt], fa[mt], fb);
        }
      }
#pragma unroll
      for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < NJ; nt++) {
          const int i = 16 * mt + g, j = jw + 8 * nt + 2 * q;
          Ss[i * LDS + j] = sacc[mt][nt][0];
          Ss[i * LDS + j + 1] = sacc[mt][nt][1];
          Ss[(i + 8) * LDS + j] = sacc[mt][nt][2];
          Ss[(i + 8) * LDS + j + 1] = sacc[mt][nt][3];
        }
    }
    __syncthreads();
  }
#pragma unroll
  for (int mt = 0; mt < 2; mt++)
#pragma unroll
    for (int nt = 0; nt < NJ; nt++) {
      const int i = 16 * mt + g, j = jw + 8 * nt + 2 * q;
      Sg[static_cast<size_t>(i) * DK + j] = sacc[mt][nt][0];
      Sg[static_cast<size_t>(i) * DK + j + 1] = sacc[mt][nt][1];
      Sg[static_cast<size_t>(i + 8) * DK + j] = sacc[mt][nt][2];
      Sg[static_cast<size_t>(i + 8) * DK + j + 1] = sacc[mt][nt][3];
    }
}

// QFLASH_GDN_WARPS=4: the recurrence in blocks of 4 warps (an A/B switch; read once per process).
int recur_warps_env() {
  static const int w = [] {
    const char* e = std::getenv("QFLASH_GDN_WARPS");
    return e && std::strcmp(e, "4") == 0 ? 4 : 8;
  }();
  return w;
}

// Shared memory: head, X (which first holds Q and K), the Gram array and A.
size_t prep_smem_bytes(int dk, int dv) {
  const int ldk = dk + 4, ldx = dk + dv + 8;
  return static_cast<size_t>(kPrepHead + kC * std::max(2 * ldk, ldx) + kC * kLdM + kC * kLdA) * sizeof(float);
}

}  // namespace

bool gdn_chunk_supported(const GdnDims& d) {
  return d.d_k > 0 && d.d_k <= kMaxD && d.d_k % 32 == 0 && d.d_v > 0 && d.d_v <= kMaxD && d.d_v % kRows == 0 &&
         d.conv_kernel >= 1 && d.conv_kernel <= kConvMax && d.n_k_heads > 0 && d.n_v_heads % d.n_k_heads == 0;
}

size_t gdn_chunk_scratch_floats(const GdnDims& d, int M) {
  const size_t rows = static_cast<size_t>((M + kC - 1) / kC) * kC;
  return rows * (2 * static_cast<size_t>(d.n_k_heads) * d.d_k +
                 static_cast<size_t>(d.n_v_heads) * (d.d_k + d.d_v + kC + 2));
}

GdnChunkScratch gdn_chunk_scratch_layout(const GdnDims& d, int M, float* p) {
  const size_t rows = static_cast<size_t>((M + kC - 1) / kC) * kC;
  GdnChunkScratch s;
  s.qn = p;
  s.kn = s.qn + rows * d.n_k_heads * d.d_k;
  s.w = s.kn + rows * d.n_k_heads * d.d_k;
  s.u = s.w + rows * d.n_v_heads * d.d_k;
  s.aqk = s.u + rows * d.n_v_heads * d.d_v;
  s.eg = s.aqk + rows * d.n_v_heads * kC;
  s.er = s.eg + rows * d.n_v_heads;
  return s;
}

void gdn_chunked(const float* mixed, const float* alpha, const float* beta_in, const float* conv_w, const float* A_log,
                 const float* dt_bias, const GdnDims& d, float* state, float* y, int M, float* scratch,
                 cudaStream_t st, int recur_warps, bool generic_conv) {
  if (M <= 0) return;
  if (recur_warps != 0 && recur_warps != 4 && recur_warps != 8)
    backend_fail("cuda gdn_chunked: %d warps per recurrence block (4 or 8)", recur_warps);
  if (!gdn_chunk_supported(d))
    backend_fail("cuda gdn_chunked: unsupported dims (k heads %d, v heads %d, d_k %d, d_v %d, conv %d): d_k and d_v "
                 "must be multiples of 32 up to %d, conv 1..%d, v heads a multiple of k heads",
                 d.n_k_heads, d.n_v_heads, d.d_k, d.d_v, d.conv_kernel, kMaxD, kConvMax);
  const int nc = (M + kC - 1) / kC;
  if (nc > 65535) backend_fail("cuda gdn_chunked: %d rows exceed %d chunks of %d", M, 65535, kC);
  const int C = d.conv_dim();
  float* tail = state + d.s_floats();
  PrepArgs pa;
  gdn_common_args(pa, d, alpha, beta_in, A_log, dt_bias, M);
  pa.mixed = mixed;
  pa.conv_w = conv_w;
  pa.tail = tail;
  pa.sc = gdn_chunk_scratch_layout(d, M, scratch);
  pa.K = d.conv_kernel;
  pa.Hk = d.n_k_heads;
  // The largest prep footprint (d_k = d_v = 128) is allowed once per device.
  static std::atomic<uint64_t> prep_set4{0}, prep_set{0};
  const dim3 pgrid(d.n_k_heads, nc);
  // The staged form of <4> copies rows of `mixed` in 16-byte pieces: rows and channel offsets
  // must be 16-byte aligned.
  const bool aligned = reinterpret_cast<uintptr_t>(mixed) % 16 == 0 && C % 4 == 0 && d.d_k % 4 == 0;
  if (d.conv_kernel == 4 && aligned && !generic_conv) {
    allow_smem(gdn_chunk_prep_kernel<4>, prep_smem_bytes(kMaxD, kMaxD), prep_set4);
    launch_k(gdn_chunk_prep_kernel<4>, pgrid, dim3(kPrepThreads), prep_smem_bytes(d.d_k, d.d_v), st, pa);
  } else {
    allow_smem(gdn_chunk_prep_kernel<0>, prep_smem_bytes(kMaxD, kMaxD), prep_set);
    launch_k(gdn_chunk_prep_kernel<0>, pgrid, dim3(kPrepThreads), prep_smem_bytes(d.d_k, d.d_v), st, pa);
  }
  QF_CUDA_LAUNCH_CHECK("gdn_chunk_prep_kernel");
  if (d.conv_kernel > 1) {
    launch_k(gdn_chunk_tail_kernel, dim3((C + 255) / 256), dim3(256), 0, st, mixed, tail, C, d.conv_kernel, M);
    QF_CUDA_LAUNCH_CHECK("gdn_chunk_tail_kernel");
  }
  RecArgs ra;
  ra.sc = pa.sc;
  ra.S = state;
  ra.y = y;
  ra.M = M;
  ra.nc = nc;
  ra.Hk = d.n_k_heads;
  ra.Hv = d.n_v_heads;
  ra.ratio = pa.ratio;
  ra.dv = d.d_v;
  ra.VD = d.value_dim();
  // 8 warps where d_k / 8 is a multiple of 8 (d_k 64, 128), else 4; QFLASH_GDN_WARPS=4 or the
  // recur_warps argument picks 4 (an A/B of the same bits).
  const int want = recur_warps ? recur_warps : recur_warps_env();
  const int warps = want == 4 || d.d_k % 64 != 0 ? 4 : 8;
  const dim3 grid(d.n_v_heads, d.d_v / kRows);
  if (warps == 8) {
    static std::atomic<uint64_t> set64{0}, set128{0};
    if (d.d_k == 64) {
      constexpr size_t smem = recur_stage_floats<64>() * sizeof(float);
      allow_smem(gdn_chunk_recur_kernel<64, 8>, smem, set64);
      launch_k(gdn_chunk_recur_kernel<64, 8>, grid, dim3(8 * 32), smem, st, ra);
    } else {
      constexpr size_t smem = recur_stage_floats<128>() * sizeof(float);
      allow_smem(gdn_chunk_recur_kernel<128, 8>, smem, set128);
      launch_k(gdn_chunk_recur_kernel<128, 8>, grid, dim3(8 * 32), smem, st, ra);
    }
  } else {
    switch (d.d_k) {
      case 32: launch_k(gdn_chunk_recur_kernel<32, 4>, grid, dim3(4 * 32), 0, st, ra); break;
      case 64: launch_k(gdn_chunk_recur_kernel<64, 4>, grid, dim3(4 * 32), 0, st, ra); break;
      case 96: launch_k(gdn_chunk_recur_kernel<96, 4>, grid, dim3(4 * 32), 0, st, ra); break;
      default: launch_k(gdn_chunk_recur_kernel<128, 4>, grid, dim3(4 * 32), 0, st, ra); break;
    }
  }
  QF_CUDA_LAUNCH_CHECK("gdn_chunk_recur_kernel");
}

}  // namespace qf::cuda
