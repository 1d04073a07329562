// Chunk-parallel gated delta rule, fp32 (CPU twin of Backend::gdn_chunked; the CUDA kernels in
// backend/cuda/gdn_chunk.cu compute the same formulas).
//
// Per value head, a chunk of L <= 64 rows t = 0..L-1 (normalised q_t, k_t, value v_t, beta_t)
// and the incoming state S0 [dv, dk]:
//   gamma_t = -exp(A_log) * softplus(alpha_t + dt_bias)      log of the decay g_t (as gdn_rows)
//   G_t     = gamma_0 + ... + gamma_t                          summed in double
//   D_ts    = exp(G_t - G_s), s <= t                           always <= 1: no overflow
//   A_ts    = beta_t D_ts (k_t . k_s), s < t                   strictly lower
//   (I + A) W = diag(beta e^G) K,   (I + A) U = diag(beta) V   forward substitution
//   Delta   = U - W S0^T            [L, dv]: row t's delta-rule update beta_t (v_t - g_t S_{t-1} k_t)
//   y_t     = e^{G_t} S0 q_t + sum_{s<=t} D_ts (q_t . k_s) Delta_s
//   S       = e^{G_{L-1}} S0 + sum_s e^{G_{L-1} - G_s} Delta_s k_s^T
// Every exponent is a difference of cumulative log-decays inside one chunk and is <= 0, so strong
// decay underflows to 0 instead of overflowing. The sums G are double so that a difference of two
// large sums keeps fp32 accuracy (|G| reaches thousands under strong decay).
//
// Conv, SiLU, l2 norms and gates use gdn_rows' expressions, so this op differs from gdn_rows
// only in the recurrence's rounding. Each head is computed by one thread in a fixed order: the
// result does not depend on the thread count.
#include "backend/cpu/gdn_chunked.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace qf::cpu {
namespace {

constexpr int kC = Backend::kPrefillChunk;

// The CPU backend's expressions (cpu_backend.cpp): keep them identical.
inline float silu(float x) { return x / (1.0f + std::exp(-x)); }
inline float sigmoidf(float x) { return 1.0f / (1.0f + std::exp(-x)); }
inline float softplusf(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

inline float dot(const float* a, const float* b, int n) {
  float s = 0;
  for (int i = 0; i < n; i++) s += a[i] * b[i];
  return s;
}

// Per-thread work buffers for one (head, chunk).
struct Work {
  std::vector<double> G;          // [kC] cumulative log-decay
  std::vector<float> eg, er, be;  // [kC] e^{G_t}, e^{G_{L-1} - G_t}, beta_t
  std::vector<float> A, Aqk;      // [kC, kC]
  std::vector<float> W, U;        // [kC, dk], [kC, dv]; U becomes Delta
  Work(int dk, int dv)
      : G(kC), eg(kC), er(kC), be(kC), A(kC * kC), Aqk(kC * kC), W(static_cast<size_t>(kC) * dk),
        U(static_cast<size_t>(kC) * dv) {}
};

struct HeadArgs {
  const float* u;  // [L, C]: conv + SiLU of the chunk's rows, q and k normalised in place
  int C, L, dk, dv, Hv;
  const float* q;  // u + the key head's q offset (row stride C)
  const float* k;
  const float* v;      // u + this value head's v offset
  const float* alpha;  // the chunk's first row, this head (row stride Hv)
  const float* beta_in;
  float negA, dtb;
  float* S;  // [dv, dk] this head's state
  float* y;  // the chunk's first output row, this head (row stride value_dim)
  int ldy;
};

void chunk_head(const HeadArgs& a, Work& w) {
  const int L = a.L, dk = a.dk, dv = a.dv;
  const size_t C = a.C;
  double G = 0;
  for (int t = 0; t < L; t++) {
    const float al = a.alpha[static_cast<size_t>(t) * a.Hv] + a.dtb;
    G += static_cast<double>(a.negA * softplusf(al));
    w.G[t] = G;
    w.be[t] = sigmoidf(a.beta_in[static_cast<size_t>(t) * a.Hv]);
  }
  for (int t = 0; t < L; t++) {
    w.eg[t] = std::exp(static_cast<float>(w.G[t]));
    w.er[t] = std::exp(static_cast<float>(w.G[L - 1] - w.G[t]));
  }
  for (int t = 0; t < L; t++)
    for (int s = 0; s <= t; s++) {
      const float D = std::exp(static_cast<float>(w.G[t] - w.G[s]));
      w.Aqk[t * kC + s] = D * dot(a.q + t * C, a.k + s * C, dk);
      if (s < t) w.A[t * kC + s] = w.be[t] * (D * dot(a.k + t * C, a.k + s * C, dk));
    }
  // (I + A) W = diag(beta e^G) K and (I + A) U = diag(beta) V, row by row.
  for (int t = 0; t < L; t++) {
    float* Wt = w.W.data() + static_cast<size_t>(t) * dk;
    float* Ut = w.U.data() + static_cast<size_t>(t) * dv;
    const float bg = w.be[t] * w.eg[t];
    for (int j = 0; j < dk; j++) Wt[j] = bg * a.k[t * C + j];
    for (int i = 0; i < dv; i++) Ut[i] = w.be[t] * a.v[t * C + i];
    for (int s = 0; s < t; s++) {
      const float f = w.A[t * kC + s];
      const float* Ws = w.W.data() + static_cast<size_t>(s) * dk;
      const float* Us = w.U.data() + static_cast<size_t>(s) * dv;
      for (int j = 0; j < dk; j++) Wt[j] -= f * Ws[j];
      for (int i = 0; i < dv; i++) Ut[i] -= f * Us[i];
    }
  }
  // Delta = U - W S0^T, in U.
  for (int t = 0; t < L; t++)
    for (int i = 0; i < dv; i++)
      w.U[static_cast<size_t>(t) * dv + i] -= dot(w.W.data() + static_cast<size_t>(t) * dk, a.S + static_cast<size_t>(i) * dk, dk);
  for (int t = 0; t < L; t++) {
    float* yt = a.y + static_cast<size_t>(t) * a.ldy;
    for (int i = 0; i < dv; i++) {
      float o = w.eg[t] * dot(a.q + t * C, a.S + static_cast<size_t>(i) * dk, dk);
      for (int s = 0; s <= t; s++) o += w.Aqk[t * kC + s] * w.U[static_cast<size_t>(s) * dv + i];
      yt[i] = o;
    }
  }
  const float gL = w.eg[L - 1];
  for (int i = 0; i < dv; i++) {
    float* Si = a.S + static_cast<size_t>(i) * dk;
    for (int j = 0; j < dk; j++) Si[j] *= gL;
    for (int s = 0; s < L; s++) {
      const float f = w.U[static_cast<size_t>(s) * dv + i] * w.er[s];
      const float* ks = a.k + s * C;
      for (int j = 0; j < dk; j++) Si[j] += f * ks[j];
    }
  }
}

}  // namespace

void gdn_chunked(const float* mixed, const float* alpha, const float* beta_in, const float* conv_w,
                 const float* A_log, const float* dt_bias, const GdnDims& d, float* state, float* y, int M) {
  if (M <= 0) return;
  const int C = d.conv_dim(), K = d.conv_kernel, Hv = d.n_v_heads, dk = d.d_k, dv = d.d_v, KD = d.key_dim();
  const int ratio = d.n_v_heads / d.n_k_heads;
  const float qscale = 1.0f / std::sqrt(static_cast<float>(dk));
  float* tail = state + d.s_floats();  // [K-1, C], read-only until the end of the call
  // Raw conv input of row m of the virtual sequence [tail | mixed].
  auto raw = [&](int m, int c) {
    return m >= 0 ? mixed[static_cast<size_t>(m) * C + c] : tail[static_cast<size_t>(K - 1 + m) * C + c];
  };
  std::vector<float> u(static_cast<size_t>(kC) * C);
  std::vector<Work> work(static_cast<size_t>(omp_get_max_threads()), Work(dk, dv));
  const bool par = static_cast<int64_t>(Hv) * dv * dk > 16384;
  for (int c0 = 0; c0 < M; c0 += kC) {
    const int L = std::min(kC, M - c0);
#pragma omp parallel for schedule(static) if (par)
    for (int c = 0; c < C; c++) {
      const float* w = conv_w + static_cast<size_t>(c) * K;
      for (int t = 0; t < L; t++) {
        const int m = c0 + t;
        float acc = 0;
        for (int j = 0; j < K - 1; j++) acc += w[j] * raw(m - (K - 1) + j, c);
        acc += w[K - 1] * mixed[static_cast<size_t>(m) * C + c];
        u[static_cast<size_t>(t) * C + c] = silu(acc);
      }
    }
    for (int t = 0; t < L; t++)
      for (int kh = 0; kh < d.n_k_heads; kh++) {
        float* qs = u.data() + static_cast<size_t>(t) * C + kh * dk;
        float* ks = qs + KD;
        float sq = 0, sk = 0;
        for (int i = 0; i < dk; i++) { sq += qs[i] * qs[i]; sk += ks[i] * ks[i]; }
        const float iq = 1.0f / std::sqrt(sq + d.eps), ik = 1.0f / std::sqrt(sk + d.eps);
        for (int i = 0; i < dk; i++) {
          qs[i] = qs[i] * iq * qscale;
          ks[i] = ks[i] * ik;
        }
      }
#pragma omp parallel for schedule(static) if (par)
    for (int h = 0; h < Hv; h++) {
      HeadArgs a;
      a.u = u.data();
      a.C = C;
      a.L = L;
      a.dk = dk;
      a.dv = dv;
      a.Hv = Hv;
      a.q = u.data() + (h / ratio) * dk;
      a.k = a.q + KD;
      a.v = u.data() + 2 * KD + h * dv;
      a.alpha = alpha + static_cast<size_t>(c0) * Hv + h;
      a.beta_in = beta_in + static_cast<size_t>(c0) * Hv + h;
      a.negA = -std::exp(A_log[h]);
      a.dtb = dt_bias[h];
      a.S = state + static_cast<size_t>(h) * dv * dk;
      a.y = y + static_cast<size_t>(c0) * d.value_dim() + static_cast<size_t>(h) * dv;
      a.ldy = d.value_dim();
      chunk_head(a, work[omp_get_thread_num()]);
    }
  }
  // New tail: the last K-1 rows of [tail | mixed].
  if (K > 1) {
    std::vector<float> nt(static_cast<size_t>(K - 1) * C);
    for (int r = 0; r < K - 1; r++)
      for (int c = 0; c < C; c++) nt[static_cast<size_t>(r) * C + c] = raw(M - (K - 1) + r, c);
    std::memcpy(tail, nt.data(), nt.size() * sizeof(float));
  }
}

}  // namespace qf::cpu
