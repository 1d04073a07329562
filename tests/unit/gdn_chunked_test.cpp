// Backend::gdn_chunked (the chunk-parallel gated delta rule for prompts) against an independent
// double-precision sequential reference written here from docs/spec/qwen38.md 3.3, against
// gdn_rows, and for bit-exact invariance to splitting the rows at multiples of 64.
//
// Tolerance (both gdn_rows and gdn_chunked are checked against the double reference with it):
// every output is a chain of fp32 dot products. On the chunked path the longest chain behind an
// element of y or S is a d_k-term dot (W S0^T or q S0^T), a forward substitution over up to 64
// rows, then a sum over up to 64 rows (Aqk Delta, or Delta^T K for S), so the depth is
// n = d_k + 2 * 64. The standard bound for a depth-n fp32 sum is gamma_n = n u / (1 - n u),
// u = 2^-24, relative to the sum of the terms' magnitudes, which for these random inputs is of
// the order of max|ref| (the terms are state rows times unit keys). The state carries each
// chunk's error into the next, where the delta rule and the decay contract it (every step
// multiplies S by g (I - beta k k^T), norm <= 1), so errors add at most once per chunk:
//   tol = (n_chunks + 1) * gamma_n * max|ref|.
// For 27B heads (d_k = 128) and 5 chunks that is 9.2e-5 x max|ref|; the measured error (~3e-7
// on both CPU paths) is far below, and a perturbation test shows the tolerance is not vacuous.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"

#if QFLASH_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "backend/cuda/gdn_chunk.h"
#endif

namespace qf {
namespace {

constexpr int kC = Backend::kPrefillChunk;

enum class Decay { Weak, Mixed, Strong };
const char* decay_name(Decay k) { return k == Decay::Weak ? "weak" : k == Decay::Mixed ? "mixed" : "strong"; }

// One layer's inputs for M rows, with a decay regime: weak (g close to 1, long memory), mixed
// (per-head A_log in [-4, 2.5], as trained models spread them), strong (log g ~ -40..-100 per
// row, so cumulative sums over a chunk reach -6000: exp of them must not overflow).
struct Inputs {
  GdnDims d;
  int M = 0;
  std::vector<float> mixed, alpha, beta, conv, A_log, dt, state;
};

Inputs make_inputs(const GdnDims& d, int M, Decay decay, uint64_t seed, float state_scale = 0.1f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0, 1);
  std::uniform_real_distribution<float> ud(0, 1);
  Inputs in;
  in.d = d;
  in.M = M;
  const int C = d.conv_dim(), Hv = d.n_v_heads;
  in.mixed.resize(static_cast<size_t>(M) * C);
  for (auto& x : in.mixed) x = nd(rng);
  in.conv.resize(static_cast<size_t>(C) * d.conv_kernel);
  for (auto& x : in.conv) x = 0.5f * nd(rng);
  in.A_log.resize(Hv);
  in.dt.resize(Hv);
  for (int h = 0; h < Hv; h++) {
    switch (decay) {
      case Decay::Weak: in.A_log[h] = -4.0f + 0.5f * nd(rng); break;
      case Decay::Mixed: in.A_log[h] = -4.0f + 6.5f * ud(rng); break;
      case Decay::Strong: in.A_log[h] = 2.0f + ud(rng); break;
    }
    in.dt[h] = 0.5f * nd(rng);
  }
  in.alpha.resize(static_cast<size_t>(M) * Hv);
  for (auto& x : in.alpha) x = decay == Decay::Strong ? 5.0f + 3.0f * nd(rng) : nd(rng);
  in.beta.resize(static_cast<size_t>(M) * Hv);
  for (auto& x : in.beta) x = 2.0f * nd(rng);
  in.state.assign(d.state_floats(), 0.0f);
  for (size_t i = 0; i < d.s_floats(); i++) in.state[i] = state_scale * nd(rng);
  for (size_t i = d.s_floats(); i < in.state.size(); i++) in.state[i] = nd(rng);  // conv tail: raw rows
  return in;
}

// Sequential gated delta rule in double (spec 3.3): conv over [tail | rows] + SiLU, l2 norms,
// gates, S <- g S; delta = beta (v - S k); S += delta k^T; y = S q. Updates `state` (S and tail).
void reference(const Inputs& in, int row0, int M, std::vector<double>& state, std::vector<double>& y) {
  const GdnDims& d = in.d;
  const int C = d.conv_dim(), K = d.conv_kernel, Hv = d.n_v_heads, dk = d.d_k, dv = d.d_v, KD = d.key_dim();
  const size_t SF = d.s_floats();
  y.assign(static_cast<size_t>(M) * d.value_dim(), 0.0);
  std::vector<double> u(C), q(dk), k(dk);
  for (int m = 0; m < M; m++) {
    const float* raw = in.mixed.data() + static_cast<size_t>(row0 + m) * C;
    for (int c = 0; c < C; c++) {
      double acc = in.conv[static_cast<size_t>(c) * K + K - 1] * static_cast<double>(raw[c]);
      for (int j = 0; j < K - 1; j++) acc += in.conv[static_cast<size_t>(c) * K + j] * state[SF + static_cast<size_t>(j) * C + c];
      u[c] = acc / (1.0 + std::exp(-acc));
    }
    for (int j = 0; j + 1 < K - 1; j++)
      for (int c = 0; c < C; c++) state[SF + static_cast<size_t>(j) * C + c] = state[SF + static_cast<size_t>(j + 1) * C + c];
    if (K > 1)
      for (int c = 0; c < C; c++) state[SF + static_cast<size_t>(K - 2) * C + c] = raw[c];
    for (int h = 0; h < Hv; h++) {
      const int kh = h / (Hv / d.n_k_heads);
      double sq = 0, sk = 0;
      for (int j = 0; j < dk; j++) {
        sq += u[kh * dk + j] * u[kh * dk + j];
        sk += u[KD + kh * dk + j] * u[KD + kh * dk + j];
      }
      for (int j = 0; j < dk; j++) {
        q[j] = u[kh * dk + j] / std::sqrt(sq + d.eps) / std::sqrt(static_cast<double>(dk));
        k[j] = u[KD + kh * dk + j] / std::sqrt(sk + d.eps);
      }
      const double a = static_cast<double>(in.alpha[static_cast<size_t>(row0 + m) * Hv + h]) + in.dt[h];
      const double sp = a > 20 ? a : std::log1p(std::exp(a));
      const double g = std::exp(-std::exp(static_cast<double>(in.A_log[h])) * sp);
      const double beta = 1.0 / (1.0 + std::exp(-static_cast<double>(in.beta[static_cast<size_t>(row0 + m) * Hv + h])));
      const double* v = u.data() + 2 * KD + h * dv;
      double* S = state.data() + static_cast<size_t>(h) * dv * dk;
      for (int i = 0; i < dv; i++) {
        double* Si = S + static_cast<size_t>(i) * dk;
        double r = 0;
        for (int j = 0; j < dk; j++) {
          Si[j] *= g;
          r += Si[j] * k[j];
        }
        const double delta = beta * (v[i] - r);
        double o = 0;
        for (int j = 0; j < dk; j++) {
          Si[j] += delta * k[j];
          o += Si[j] * q[j];
        }
        y[static_cast<size_t>(m) * d.value_dim() + static_cast<size_t>(h) * dv + i] = o;
      }
    }
  }
}

std::vector<double> widen(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

// max|got - ref| / max|ref| over [lo, hi).
double rel_err(const float* got, const std::vector<double>& ref, size_t lo, size_t hi) {
  double mx = 0, err = 0;
  for (size_t i = lo; i < hi; i++) {
    mx = std::max(mx, std::fabs(ref[i]));
    const double e = std::fabs(got[i - lo] - ref[i]);
    err = std::isnan(e) ? INFINITY : std::max(err, e);
  }
  return mx > 0 ? err / mx : err;
}

// (n_chunks + 1) * gamma_n * max|ref| with n = d_k + 2 * 64 (file comment); u = 2^-24 for fp32.
double tolerance(const GdnDims& d, int M, double u = std::ldexp(1.0, -24)) {
  const double n = d.d_k + 2.0 * kC;
  const int chunks = (M + kC - 1) / kC;
  return (chunks + 1) * (n * u / (1 - n * u));
}

GdnDims dims(int nk, int nv, int dk, int dv, int conv) {
  GdnDims d;
  d.n_k_heads = nk;
  d.n_v_heads = nv;
  d.d_k = dk;
  d.d_v = dv;
  d.conv_kernel = conv;
  return d;
}

std::string tag_of(const GdnDims& d, int M, Decay k) {
  return "dims " + std::to_string(d.n_k_heads) + "/" + std::to_string(d.n_v_heads) + "/" + std::to_string(d.d_k) +
         "/" + std::to_string(d.d_v) + "/K" + std::to_string(d.conv_kernel) + " M=" + std::to_string(M) + " " +
         decay_name(k);
}

// Runs `op` ("rows" or "chunked") on the CPU backend over all M rows at once.
void run_cpu(Backend* be, const Inputs& in, bool chunked, std::vector<float>& state, std::vector<float>& y) {
  state = in.state;
  y.assign(static_cast<size_t>(in.M) * in.d.value_dim(), NAN);
  if (chunked)
    be->gdn_chunked(in.mixed.data(), in.alpha.data(), in.beta.data(), in.conv.data(), in.A_log.data(), in.dt.data(),
                    in.d, state.data(), y.data(), in.M);
  else
    be->gdn_rows(in.mixed.data(), in.alpha.data(), in.beta.data(), in.conv.data(), in.A_log.data(), in.dt.data(), in.d,
                 state.data(), y.data(), in.M, nullptr);
}

// The chunk form's intermediates in double, written from the formulas (gdn_chunked.cpp header)
// without reference to either implementation: one chunk of L rows starting at row m0 of the call,
// raw rows before row 0 from the inputs' initial conv tail. Layouts as cuda::GdnChunkScratch
// for one chunk (64 rows, rows >= L zero).
struct ChunkTerms {
  int L = 0;
  std::vector<double> qn, kn;  // [Hk][64][dk]
  std::vector<double> w, u;    // [Hv][64][dk], [Hv][64][dv]
  std::vector<double> aqk;     // [Hv][64][64]
  std::vector<double> eg, er;  // [Hv][64]
};

ChunkTerms chunk_terms(const Inputs& in, int m0, int L) {
  const GdnDims& d = in.d;
  const int C = d.conv_dim(), K = d.conv_kernel, Hk = d.n_k_heads, Hv = d.n_v_heads, dk = d.d_k, dv = d.d_v;
  const int KD = d.key_dim(), ratio = Hv / Hk;
  const size_t SF = d.s_floats();
  ChunkTerms ct;
  ct.L = L;
  ct.qn.assign(static_cast<size_t>(Hk) * kC * dk, 0.0);
  ct.kn = ct.qn;
  ct.w.assign(static_cast<size_t>(Hv) * kC * dk, 0.0);
  ct.u.assign(static_cast<size_t>(Hv) * kC * dv, 0.0);
  ct.aqk.assign(static_cast<size_t>(Hv) * kC * kC, 0.0);
  ct.eg.assign(static_cast<size_t>(Hv) * kC, 0.0);
  ct.er = ct.eg;
  auto raw = [&](int m, int c) -> double {
    return m >= 0 ? in.mixed[static_cast<size_t>(m) * C + c] : in.state[SF + static_cast<size_t>(K - 1 + m) * C + c];
  };
  std::vector<double> x(static_cast<size_t>(L) * C);
  for (int t = 0; t < L; t++)
    for (int c = 0; c < C; c++) {
      double acc = 0;
      for (int j = 0; j < K; j++) acc += in.conv[static_cast<size_t>(c) * K + j] * raw(m0 + t - (K - 1) + j, c);
      x[static_cast<size_t>(t) * C + c] = acc / (1.0 + std::exp(-acc));
    }
  for (int t = 0; t < L; t++)
    for (int kh = 0; kh < Hk; kh++) {
      const double* q = x.data() + static_cast<size_t>(t) * C + kh * dk;
      const double* k = q + KD;
      double sq = 0, sk = 0;
      for (int j = 0; j < dk; j++) {
        sq += q[j] * q[j];
        sk += k[j] * k[j];
      }
      for (int j = 0; j < dk; j++) {
        ct.qn[(static_cast<size_t>(kh) * kC + t) * dk + j] = q[j] / std::sqrt(sq + d.eps) / std::sqrt(static_cast<double>(dk));
        ct.kn[(static_cast<size_t>(kh) * kC + t) * dk + j] = k[j] / std::sqrt(sk + d.eps);
      }
    }
  std::vector<double> G(L), beta(L), A(static_cast<size_t>(kC) * kC);
  for (int h = 0; h < Hv; h++) {
    const double* qn = ct.qn.data() + static_cast<size_t>(h / ratio) * kC * dk;
    const double* kn = ct.kn.data() + static_cast<size_t>(h / ratio) * kC * dk;
    double acc = 0;
    for (int t = 0; t < L; t++) {
      const double a = static_cast<double>(in.alpha[static_cast<size_t>(m0 + t) * Hv + h]) + in.dt[h];
      acc -= std::exp(static_cast<double>(in.A_log[h])) * (a > 20 ? a : std::log1p(std::exp(a)));
      G[t] = acc;
      beta[t] = 1.0 / (1.0 + std::exp(-static_cast<double>(in.beta[static_cast<size_t>(m0 + t) * Hv + h])));
    }
    auto dotk = [&](const double* a, int s) {
      double r = 0;
      for (int j = 0; j < dk; j++) r += a[j] * kn[static_cast<size_t>(s) * dk + j];
      return r;
    };
    for (int t = 0; t < L; t++) {
      ct.eg[static_cast<size_t>(h) * kC + t] = std::exp(G[t]);
      ct.er[static_cast<size_t>(h) * kC + t] = std::exp(G[L - 1] - G[t]);
      for (int s = 0; s <= t; s++) {
        const double D = std::exp(G[t] - G[s]);
        ct.aqk[(static_cast<size_t>(h) * kC + t) * kC + s] = D * dotk(qn + static_cast<size_t>(t) * dk, s);
        A[static_cast<size_t>(t) * kC + s] = s < t ? beta[t] * D * dotk(kn + static_cast<size_t>(t) * dk, s) : 0.0;
      }
    }
    // forward substitution of (I + A) W = diag(beta e^G) K and (I + A) U = diag(beta) V
    double* W = ct.w.data() + static_cast<size_t>(h) * kC * dk;
    double* U = ct.u.data() + static_cast<size_t>(h) * kC * dv;
    for (int t = 0; t < L; t++) {
      for (int j = 0; j < dk; j++) W[static_cast<size_t>(t) * dk + j] = beta[t] * std::exp(G[t]) * kn[static_cast<size_t>(t) * dk + j];
      for (int i = 0; i < dv; i++) U[static_cast<size_t>(t) * dv + i] = beta[t] * x[static_cast<size_t>(t) * C + 2 * KD + h * dv + i];
      for (int s = 0; s < t; s++) {
        const double a = A[static_cast<size_t>(t) * kC + s];
        for (int j = 0; j < dk; j++) W[static_cast<size_t>(t) * dk + j] -= a * W[static_cast<size_t>(s) * dk + j];
        for (int i = 0; i < dv; i++) U[static_cast<size_t>(t) * dv + i] -= a * U[static_cast<size_t>(s) * dv + i];
      }
    }
  }
  return ct;
}

// The chunk's effect on S (state[0, s_floats)) and its y rows (row stride value_dim), in double.
void apply_chunk(const ChunkTerms& ct, const GdnDims& d, std::vector<double>& state, double* y) {
  const int dk = d.d_k, dv = d.d_v, ratio = d.n_v_heads / d.n_k_heads, L = ct.L;
  std::vector<double> delta(static_cast<size_t>(L) * dv);
  for (int h = 0; h < d.n_v_heads; h++) {
    double* S = state.data() + static_cast<size_t>(h) * dv * dk;
    const double* qn = ct.qn.data() + static_cast<size_t>(h / ratio) * kC * dk;
    const double* kn = ct.kn.data() + static_cast<size_t>(h / ratio) * kC * dk;
    const double* W = ct.w.data() + static_cast<size_t>(h) * kC * dk;
    const double* U = ct.u.data() + static_cast<size_t>(h) * kC * dv;
    const double* eg = ct.eg.data() + static_cast<size_t>(h) * kC;
    const double* er = ct.er.data() + static_cast<size_t>(h) * kC;
    for (int t = 0; t < L; t++)
      for (int i = 0; i < dv; i++) {
        double r = 0;
        for (int j = 0; j < dk; j++) r += W[static_cast<size_t>(t) * dk + j] * S[static_cast<size_t>(i) * dk + j];
        delta[static_cast<size_t>(t) * dv + i] = U[static_cast<size_t>(t) * dv + i] - r;
      }
    for (int t = 0; t < L; t++)
      for (int i = 0; i < dv; i++) {
        double o = 0;
        for (int j = 0; j < dk; j++) o += qn[static_cast<size_t>(t) * dk + j] * S[static_cast<size_t>(i) * dk + j];
        o *= eg[t];
        for (int s = 0; s <= t; s++)
          o += ct.aqk[(static_cast<size_t>(h) * kC + t) * kC + s] * delta[static_cast<size_t>(s) * dv + i];
        y[static_cast<size_t>(t) * d.value_dim() + static_cast<size_t>(h) * dv + i] = o;
      }
    for (int i = 0; i < dv; i++)
      for (int j = 0; j < dk; j++) {
        double v = eg[L - 1] * S[static_cast<size_t>(i) * dk + j];
        for (int s = 0; s < L; s++) v += delta[static_cast<size_t>(s) * dv + i] * er[s] * kn[static_cast<size_t>(s) * dk + j];
        S[static_cast<size_t>(i) * dk + j] = v;
      }
  }
}

struct Errs {
  double y, s;
};
// Relative errors of (y, S) against the double reference; the conv tail must equal the
// reference's exactly (it is a copy of raw rows).
Errs errs_vs(const std::vector<float>& y, const std::vector<float>& st, const std::vector<double>& y_ref,
             const std::vector<double>& s_ref, const GdnDims& d, const std::string& tag) {
  for (size_t i = d.s_floats(); i < d.state_floats(); i++)
    EXPECT_EQ(static_cast<double>(st[i]), s_ref[i]) << tag << " conv tail element " << i - d.s_floats();
  return {rel_err(y.data(), y_ref, 0, y_ref.size()), rel_err(st.data(), s_ref, 0, d.s_floats())};
}

TEST(GdnChunkedCpu, MatchesDoubleReferenceLikeGdnRows) {
  auto be = make_cpu_backend();
  struct Case {
    GdnDims d;
    std::vector<int> Ms;
  };
  // tiny test model, odd shapes (d_k != d_v, conv 2 and 3, GQA ratio 1, 2, 3), 27B heads scaled down
  const std::vector<Case> cases = {{dims(2, 6, 64, 64, 4), {1, 2, 63, 64, 65, 200}},
                                   {dims(2, 6, 16, 8, 4), {3, 130}},
                                   {dims(1, 2, 32, 64, 2), {1, 64, 129}},
                                   {dims(3, 3, 96, 40, 3), {2, 100}},
                                   {dims(2, 6, 128, 128, 4), {65, 192}}};
  for (const Case& cs : cases)
    for (int M : cs.Ms)
      for (Decay k : {Decay::Weak, Decay::Mixed, Decay::Strong}) {
        const GdnDims& d = cs.d;
        const Inputs in = make_inputs(d, M, k, 1000 + M);
        std::vector<double> s_ref = widen(in.state), y_ref;
        reference(in, 0, M, s_ref, y_ref);
        std::vector<float> s_rows, y_rows, s_chunk, y_chunk;
        run_cpu(be.get(), in, false, s_rows, y_rows);
        run_cpu(be.get(), in, true, s_chunk, y_chunk);
        const std::string tag = tag_of(d, M, k);
        const double tol = tolerance(d, M);
        const Errs r = errs_vs(y_rows, s_rows, y_ref, s_ref, d, tag + " gdn_rows");
        const Errs c = errs_vs(y_chunk, s_chunk, y_ref, s_ref, d, tag + " gdn_chunked");
        const std::string msg = tag + ": rel. errors y/S gdn_rows " + std::to_string(r.y) + "/" + std::to_string(r.s) +
                                ", gdn_chunked " + std::to_string(c.y) + "/" + std::to_string(c.s) + ", tolerance " +
                                std::to_string(tol);
        EXPECT_LE(r.y, tol) << msg;
        EXPECT_LE(r.s, tol) << msg;
        EXPECT_LE(c.y, tol) << msg;
        EXPECT_LE(c.s, tol) << msg;
      }
}

// The chunk formulas themselves, in double: chunk by chunk they reproduce the sequential
// recurrence to double rounding, for every decay regime and a partial last chunk.
TEST(GdnChunkedCpu, ChunkFormulasEqualRecurrenceInDouble) {
  for (const GdnDims& d : {dims(2, 6, 64, 64, 4), dims(1, 2, 32, 64, 2)})
    for (Decay k : {Decay::Weak, Decay::Mixed, Decay::Strong}) {
      const int M = 150;
      const Inputs in = make_inputs(d, M, k, 42);
      std::vector<double> s_ref = widen(in.state), y_ref;
      reference(in, 0, M, s_ref, y_ref);
      std::vector<double> st = widen(in.state), y(y_ref.size());
      for (int m0 = 0; m0 < M; m0 += kC) {
        const ChunkTerms ct = chunk_terms(in, m0, std::min(kC, M - m0));
        apply_chunk(ct, d, st, y.data() + static_cast<size_t>(m0) * d.value_dim());
      }
      double my = 0, ey = 0, ms = 0, es = 0;
      for (size_t i = 0; i < y.size(); i++) {
        my = std::max(my, std::fabs(y_ref[i]));
        ey = std::max(ey, std::fabs(y[i] - y_ref[i]));
      }
      for (size_t i = 0; i < d.s_floats(); i++) {
        ms = std::max(ms, std::fabs(s_ref[i]));
        es = std::max(es, std::fabs(st[i] - s_ref[i]));
      }
      EXPECT_LE(ey, 1e-12 * my) << tag_of(d, M, k) << " y";
      EXPECT_LE(es, 1e-12 * ms) << tag_of(d, M, k) << " state";
    }
}

// Running rows [0, A) and then [A, N) equals running [0, N) at once, bit for bit, when A is a
// multiple of 64 (backend.h); also for several pieces and for a last piece shorter than the conv.
TEST(GdnChunkedCpu, SplitAtMultiplesOf64IsBitExact) {
  auto be = make_cpu_backend();
  for (const GdnDims& d : {dims(2, 6, 64, 64, 4), dims(1, 2, 32, 64, 2), dims(3, 3, 96, 40, 3)}) {
    const int N = 258;  // the piece after a cut at 256 is 2 rows, shorter than the conv window
    const Inputs in = make_inputs(d, N, Decay::Mixed, 77);
    std::vector<float> s_all, y_all;
    run_cpu(be.get(), in, true, s_all, y_all);
    const size_t C = d.conv_dim(), Hv = d.n_v_heads, VD = d.value_dim();
    for (const std::vector<int>& cuts : std::vector<std::vector<int>>{{64}, {128}, {256}, {64, 192}, {128, 192, 256}}) {
      std::vector<float> st = in.state, y(y_all.size(), NAN);
      int r0 = 0;
      std::vector<int> ends = cuts;
      ends.push_back(N);
      for (int r1 : ends) {
        be->gdn_chunked(in.mixed.data() + r0 * C, in.alpha.data() + r0 * Hv, in.beta.data() + r0 * Hv, in.conv.data(),
                        in.A_log.data(), in.dt.data(), d, st.data(), y.data() + r0 * VD, r1 - r0);
        r0 = r1;
      }
      std::string tag = tag_of(d, N, Decay::Mixed) + " cuts";
      for (int c : cuts) tag += " " + std::to_string(c);
      ASSERT_EQ(0, std::memcmp(y.data(), y_all.data(), y.size() * sizeof(float))) << tag << ": y";
      ASSERT_EQ(0, std::memcmp(st.data(), s_all.data(), st.size() * sizeof(float))) << tag << ": state";
    }
  }
}

// The prompt continues a state that decode steps built (nonzero S and conv tail): gdn_rows for
// the first rows, then gdn_chunked, against the double reference over all rows, and against
// gdn_rows over all rows (each within the tolerance of the reference, so within twice of each other).
TEST(GdnChunkedCpu, ContinuesStateLeftByDecodeSteps) {
  auto be = make_cpu_backend();
  for (const GdnDims& d : {dims(2, 6, 64, 64, 4), dims(1, 2, 32, 64, 2)})
    for (int pre : {1, 2, 5}) {
      const int N = pre + 130;
      const Inputs in = make_inputs(d, N, Decay::Mixed, 300 + pre, 0.5f);
      const size_t C = d.conv_dim(), Hv = d.n_v_heads, VD = d.value_dim();
      std::vector<float> st = in.state, y(static_cast<size_t>(N) * VD, NAN);
      for (int m = 0; m < pre; m++)
        be->gdn_rows(in.mixed.data() + m * C, in.alpha.data() + m * Hv, in.beta.data() + m * Hv, in.conv.data(),
                     in.A_log.data(), in.dt.data(), d, st.data(), y.data() + m * VD, 1, nullptr);
      be->gdn_chunked(in.mixed.data() + pre * C, in.alpha.data() + pre * Hv, in.beta.data() + pre * Hv, in.conv.data(),
                      in.A_log.data(), in.dt.data(), d, st.data(), y.data() + pre * VD, N - pre);
      std::vector<double> s_ref = widen(in.state), y_ref;
      reference(in, 0, N, s_ref, y_ref);
      const std::string tag = tag_of(d, N, Decay::Mixed) + " after " + std::to_string(pre) + " decode steps";
      const Errs e = errs_vs(y, st, y_ref, s_ref, d, tag);
      const double tol = tolerance(d, N - pre) + tolerance(d, pre);
      EXPECT_LE(e.y, tol) << tag << " y";
      EXPECT_LE(e.s, tol) << tag << " state";
      std::vector<float> s_rows, y_rows;
      Inputs whole = in;
      run_cpu(be.get(), whole, false, s_rows, y_rows);
      std::vector<double> yr = widen(y_rows), sr = widen(s_rows);
      EXPECT_LE(rel_err(y.data(), yr, 0, yr.size()), 2 * tol) << tag << " y vs gdn_rows";
      EXPECT_LE(rel_err(st.data(), sr, 0, d.s_floats()), 2 * tol) << tag << " state vs gdn_rows";
    }
}

// Negative control: the tolerance is below what a real mistake costs. Changing the beta input
// of one (row, head) of 1200 by 1e-2, or one head's decay rate by 0.1 %, moves y by more than it.
TEST(GdnChunkedCpu, ToleranceSeesSmallPerturbations) {
  auto be = make_cpu_backend();
  const GdnDims d = dims(2, 6, 64, 64, 4);
  const int N = 200;
  const Inputs in = make_inputs(d, N, Decay::Weak, 5);
  std::vector<float> st, y;
  run_cpu(be.get(), in, true, st, y);
  const double tol = tolerance(d, N);
  for (int which = 0; which < 2; which++) {
    Inputs p = in;
    if (which == 0) p.beta[static_cast<size_t>(70) * d.n_v_heads + 1] += 1e-2f;
    else p.A_log[4] += std::log1p(1e-3f);
    std::vector<double> s_ref = widen(p.state), y_ref;
    reference(p, 0, N, s_ref, y_ref);
    EXPECT_GT(rel_err(y.data(), y_ref, 0, y_ref.size()), tol) << (which == 0 ? "beta" : "decay") << " perturbation";
  }
}

#if QFLASH_HAVE_CUDA
// ---- CUDA (every test skips when no device is present) -----------------------------------------
// GPU tolerance: the recurrence's products run on tensor cores with each fp32 operand split into
// two tf32 parts of 11 significant bits (hi, and the rounded residual lo): a product carries up to
// 3 * 2^-22 relative error (two residual roundings and the dropped lo x lo), and the tensor core
// may truncate when it adds (2^-23). So the GPU's unit roundoff is taken as u = 2^-20 in the same
// formula (16 x the fp32 tolerance); against the CPU twin the two tolerances add.
double tolerance_gpu(const GdnDims& d, int M) { return tolerance(d, M, std::ldexp(1.0, -20)); }

Backend* gpu(std::string* why) {
  static std::unique_ptr<Backend> be;
  static std::string reason;
  static bool tried = false;
  if (!tried) {
    tried = true;
    be = make_cuda_backend(&reason);
  }
  *why = reason;
  return be.get();
}

#define NEED_GPU()                                    \
  std::string why_;                                   \
  Backend* G = gpu(&why_);                            \
  if (!G) GTEST_SKIP() << "no CUDA device: " << why_; \
  auto CPU = make_cpu_backend()

// One layer's inputs on the device.
struct DevInputs {
  DeviceBuffer mixed, alpha, beta, conv, A_log, dt;
  DevInputs(Backend* be, const Inputs& in)
      : mixed(up(be, in.mixed)), alpha(up(be, in.alpha)), beta(up(be, in.beta)), conv(up(be, in.conv)),
        A_log(up(be, in.A_log)), dt(up(be, in.dt)) {}
  static DeviceBuffer up(Backend* be, const std::vector<float>& h) {
    DeviceBuffer b(be, h.size() * sizeof(float));
    be->upload(b.get(), h.data(), h.size() * sizeof(float));
    return b;
  }
};

std::vector<float> down(Backend* be, const DeviceBuffer& b, size_t n) {
  std::vector<float> h(n);
  be->download(h.data(), b.get(), n * sizeof(float));
  return h;
}

// Rows [r0, r1) of `in` on the device: gdn_chunked, or gdn_rows one row per call (decode) when
// `rows` is set. `st` and `y` are the device state and the full [M, value_dim] output.
void run_dev(Backend* G, const Inputs& in, const DevInputs& di, DeviceBuffer& st, DeviceBuffer& y, int r0, int r1,
             bool rows = false) {
  const size_t C = in.d.conv_dim(), Hv = in.d.n_v_heads, VD = in.d.value_dim();
  auto call = [&](int a, int b) {
    if (rows)
      G->gdn_rows(di.mixed.f() + a * C, di.alpha.f() + a * Hv, di.beta.f() + a * Hv, di.conv.f(), di.A_log.f(),
                  di.dt.f(), in.d, st.f(), y.f() + a * VD, b - a, nullptr);
    else
      G->gdn_chunked(di.mixed.f() + a * C, di.alpha.f() + a * Hv, di.beta.f() + a * Hv, di.conv.f(), di.A_log.f(),
                     di.dt.f(), in.d, st.f(), y.f() + a * VD, b - a);
  };
  if (rows)
    for (int m = r0; m < r1; m++) call(m, m + 1);
  else
    call(r0, r1);
}

// Fresh device state from the inputs and a NaN-filled output (an unwritten element fails).
void fresh(Backend* G, const Inputs& in, DeviceBuffer& st, DeviceBuffer& y) {
  st = DevInputs::up(G, in.state);
  y = DevInputs::up(G, std::vector<float>(static_cast<size_t>(in.M) * in.d.value_dim(), NAN));
}

TEST(CudaGdnChunked, MatchesReferenceAndCpuTwin) {
  NEED_GPU();
  struct Case {
    GdnDims d;
    std::vector<int> Ms;
  };
  // 27B heads at full size, the tiny test model, d_k != d_v, conv 2 and 3
  const std::vector<Case> cases = {{dims(16, 48, 128, 128, 4), {300}},
                                   {dims(2, 6, 64, 64, 4), {1, 2, 63, 64, 65, 200}},
                                   {dims(1, 2, 32, 64, 2), {129}},
                                   {dims(2, 4, 96, 32, 3), {100}}};
  for (const Case& cs : cases)
    for (int M : cs.Ms)
      for (Decay k : {Decay::Weak, Decay::Mixed, Decay::Strong}) {
        const GdnDims& d = cs.d;
        ASSERT_TRUE(cuda::gdn_chunk_supported(d));
        const Inputs in = make_inputs(d, M, k, 2000 + M);
        const std::string tag = tag_of(d, M, k);
        std::vector<double> s_ref = widen(in.state), y_ref;
        reference(in, 0, M, s_ref, y_ref);
        std::vector<float> s_cpu, y_cpu;
        run_cpu(CPU.get(), in, true, s_cpu, y_cpu);
        DevInputs di(G, in);
        DeviceBuffer st, y;
        fresh(G, in, st, y);
        run_dev(G, in, di, st, y, 0, M);
        const auto s_gpu = down(G, st, d.state_floats()), y_gpu = down(G, y, y_ref.size());
        const Errs e = errs_vs(y_gpu, s_gpu, y_ref, s_ref, d, tag);
        const double tol = tolerance_gpu(d, M);
        EXPECT_LE(e.y, tol) << tag << " y vs reference";
        EXPECT_LE(e.s, tol) << tag << " state vs reference";
        const std::vector<double> yc = widen(y_cpu), sc = widen(s_cpu);
        EXPECT_LE(rel_err(y_gpu.data(), yc, 0, yc.size()), tol + tolerance(d, M)) << tag << " y vs CPU twin";
        EXPECT_LE(rel_err(s_gpu.data(), sc, 0, d.s_floats()), tol + tolerance(d, M)) << tag << " state vs CPU twin";
      }
}

// Shapes the kernels do not take run gdn_rows: the same bits as calling it.
TEST(CudaGdnChunked, UnsupportedShapeFallsBackToGdnRows) {
  NEED_GPU();
  const GdnDims d = dims(2, 6, 16, 8, 4);
  ASSERT_FALSE(cuda::gdn_chunk_supported(d));
  const Inputs in = make_inputs(d, 70, Decay::Mixed, 9);
  DevInputs di(G, in);
  DeviceBuffer s1, y1, s2, y2;
  fresh(G, in, s1, y1);
  fresh(G, in, s2, y2);
  run_dev(G, in, di, s1, y1, 0, in.M);
  G->gdn_rows(di.mixed.f(), di.alpha.f(), di.beta.f(), di.conv.f(), di.A_log.f(), di.dt.f(), d, s2.f(), y2.f(), in.M,
              nullptr);
  const size_t ny = static_cast<size_t>(in.M) * d.value_dim();
  EXPECT_EQ(down(G, y1, ny), down(G, y2, ny));
  EXPECT_EQ(down(G, s1, d.state_floats()), down(G, s2, d.state_floats()));
}

TEST(CudaGdnChunked, SplitAtMultiplesOf64IsBitExact) {
  NEED_GPU();
  struct Case {
    GdnDims d;
    int N;
    std::vector<std::vector<int>> cuts;
  };
  const std::vector<Case> cases = {
      {dims(2, 6, 64, 64, 4), 258, {{64}, {128}, {256}, {64, 192}, {128, 192, 256}}},
      {dims(1, 2, 32, 64, 2), 258, {{64}, {256}, {64, 128, 192}}},
      {dims(16, 48, 128, 128, 4), 200, {{64}, {128}, {64, 128}}}};
  for (const Case& cs : cases) {
    const Inputs in = make_inputs(cs.d, cs.N, Decay::Mixed, 78);
    DevInputs di(G, in);
    DeviceBuffer s_all, y_all;
    fresh(G, in, s_all, y_all);
    run_dev(G, in, di, s_all, y_all, 0, cs.N);
    const size_t ny = static_cast<size_t>(cs.N) * cs.d.value_dim();
    const auto ya = down(G, y_all, ny), sa = down(G, s_all, cs.d.state_floats());
    for (const auto& cuts : cs.cuts) {
      DeviceBuffer st, y;
      fresh(G, in, st, y);
      int r0 = 0;
      std::vector<int> ends = cuts;
      ends.push_back(cs.N);
      for (int r1 : ends) {
        run_dev(G, in, di, st, y, r0, r1);
        r0 = r1;
      }
      std::string tag = tag_of(cs.d, cs.N, Decay::Mixed) + " cuts";
      for (int c : cuts) tag += " " + std::to_string(c);
      const auto yb = down(G, y, ny), sb = down(G, st, cs.d.state_floats());
      ASSERT_EQ(0, std::memcmp(yb.data(), ya.data(), ny * sizeof(float))) << tag << ": y";
      ASSERT_EQ(0, std::memcmp(sb.data(), sa.data(), sa.size() * sizeof(float))) << tag << ": state";
    }
  }
}

// Decode steps (gdn_rows, one row per call) build a state, the prompt continues it with
// gdn_chunked: against gdn_rows over all rows on the GPU, and against the reference.
TEST(CudaGdnChunked, MatchesGdnRowsAfterDecodeSteps) {
  NEED_GPU();
  for (const GdnDims& d : {dims(16, 48, 128, 128, 4), dims(2, 6, 64, 64, 4)})
    for (int pre : {1, 3}) {
      const int N = pre + 200;
      const Inputs in = make_inputs(d, N, Decay::Mixed, 500 + pre, 0.5f);
      const std::string tag = tag_of(d, N, Decay::Mixed) + " after " + std::to_string(pre) + " decode steps";
      DevInputs di(G, in);
      DeviceBuffer st, y, s_rows, y_rows;
      fresh(G, in, st, y);
      run_dev(G, in, di, st, y, 0, pre, true);
      run_dev(G, in, di, st, y, pre, N);
      fresh(G, in, s_rows, y_rows);
      run_dev(G, in, di, s_rows, y_rows, 0, N, true);
      const size_t ny = static_cast<size_t>(N) * d.value_dim();
      const auto yc = down(G, y, ny), sc = down(G, st, d.state_floats());
      const std::vector<double> yr = widen(down(G, y_rows, ny)), sr = widen(down(G, s_rows, d.state_floats()));
      const double tol = tolerance_gpu(d, N - pre) + tolerance(d, N);
      EXPECT_LE(rel_err(yc.data(), yr, 0, ny), tol) << tag << " y vs gdn_rows";
      EXPECT_LE(rel_err(sc.data(), sr, 0, d.s_floats()), tol) << tag << " state vs gdn_rows";
      for (size_t i = d.s_floats(); i < d.state_floats(); i++)
        ASSERT_EQ(sc[i], static_cast<float>(sr[i])) << tag << " conv tail element " << i - d.s_floats();
      std::vector<double> s_ref = widen(in.state), y_ref;
      reference(in, 0, N, s_ref, y_ref);
      const Errs e = errs_vs(yc, sc, y_ref, s_ref, d, tag);
      EXPECT_LE(e.y, tol) << tag << " y vs reference";
      EXPECT_LE(e.s, tol) << tag << " state vs reference";
    }
}

// One gdn_chunked call on the device: y, the state
// blob and the scratch intermediates, from a fresh copy of the inputs' state (or `state0`), rows
// [r0, r1) of the inputs; warps and generic_conv as cuda::gdn_chunked takes them.
struct PrepRun {
  std::vector<float> y, state, scratch;
};
PrepRun run_prep(Backend* G, const Inputs& in, const DevInputs& di, int r0, int r1,
                 const std::vector<float>* state0 = nullptr, int warps = 0, bool generic_conv = false) {
  const GdnDims& d = in.d;
  const int M = r1 - r0;
  const size_t C = d.conv_dim(), Hv = d.n_v_heads, ny = static_cast<size_t>(M) * d.value_dim();
  const size_t nsc = cuda::gdn_chunk_scratch_floats(d, M);
  DeviceBuffer st = DevInputs::up(G, state0 ? *state0 : in.state);
  DeviceBuffer y = DevInputs::up(G, std::vector<float>(ny, NAN));
  DeviceBuffer scr = DevInputs::up(G, std::vector<float>(nsc, NAN));
  G->sync();
  cudaStream_t cs = nullptr;
  EXPECT_EQ(cudaSuccess, cudaStreamCreate(&cs));
  cuda::gdn_chunked(di.mixed.f() + r0 * C, di.alpha.f() + r0 * Hv, di.beta.f() + r0 * Hv, di.conv.f(), di.A_log.f(),
                    di.dt.f(), d, st.f(), y.f(), M, scr.f(), cs, warps, generic_conv);
  EXPECT_EQ(cudaSuccess, cudaStreamSynchronize(cs));
  cudaStreamDestroy(cs);
  return {down(G, y, ny), down(G, st, d.state_floats()), down(G, scr, nsc)};
}

// The sequential stage with 4 or 8 warps per block: the same bits (each element's products and
// their order do not depend on which warp computes them), on the 27B heads and the small shapes
// (d_k 96 always runs 4 warps: the check there is that the choice falls back), over several chunks.
TEST(CudaGdnChunked, WarpCountsAgreeBitForBit) {
  NEED_GPU();
  for (const GdnDims& d : {dims(16, 48, 128, 128, 4), dims(2, 6, 64, 64, 4), dims(2, 4, 96, 32, 3)}) {
    const int M = 259;
    const Inputs in = make_inputs(d, M, Decay::Mixed, 313);
    DevInputs di(G, in);
    const size_t ny = static_cast<size_t>(M) * d.value_dim();
    std::vector<std::vector<float>> ys, ss;
    for (int warps : {4, 8}) {
      PrepRun r = run_prep(G, in, di, 0, M, nullptr, warps);
      ys.push_back(std::move(r.y));
      ss.push_back(std::move(r.state));
    }
    const std::string tag = tag_of(d, M, Decay::Mixed);
    for (float v : ys[0]) ASSERT_FALSE(std::isnan(v)) << tag << ": an output row was not written";
    ASSERT_EQ(0, std::memcmp(ys[0].data(), ys[1].data(), ny * sizeof(float))) << tag << ": y, 4 vs 8 warps";
    ASSERT_EQ(0, std::memcmp(ss[0].data(), ss[1].data(), ss[0].size() * sizeof(float))) << tag << ": state";
  }
}

// The parallel stage's conv with the kernel size fixed at compile time (4, every Qwen3.8 checkpoint)
// against the same kernel for any size (generic_conv): the same operations in the same order, so
// every intermediate of the scratch, y and the state (conv tail included) are equal bit for bit.
// Rows not a multiple of 64, a conv tail carried in, and a second call that continues the first.
TEST(CudaGdnChunked, FixedConvSizeEqualsAnySizeBitForBit) {
  NEED_GPU();
  for (const GdnDims& d : {dims(16, 48, 128, 128, 4), dims(2, 6, 64, 64, 4), dims(2, 4, 96, 32, 4)}) {
    const int M = 259, A = 128;
    const Inputs in = make_inputs(d, M, Decay::Mixed, 717);
    DevInputs di(G, in);
    const size_t ny = static_cast<size_t>(M) * d.value_dim();
    std::vector<std::vector<float>> ys, ss, scs;
    for (bool generic : {false, true}) {  // rows [0, A), then [A, M) from the state the first left
      PrepRun r1 = run_prep(G, in, di, 0, A, nullptr, 0, generic);
      PrepRun r2 = run_prep(G, in, di, A, M, &r1.state, 0, generic);
      r1.y.insert(r1.y.end(), r2.y.begin(), r2.y.end());
      ys.push_back(std::move(r1.y));
      ss.push_back(std::move(r2.state));
      scs.push_back(std::move(r2.scratch));
    }
    const std::string tag = tag_of(d, M, Decay::Mixed);
    for (float v : ys[0]) ASSERT_FALSE(std::isnan(v)) << tag << ": an output row was not written";
    ASSERT_EQ(0, std::memcmp(ys[0].data(), ys[1].data(), ny * sizeof(float))) << tag << ": y, fixed vs any conv size";
    ASSERT_EQ(0, std::memcmp(ss[0].data(), ss[1].data(), ss[0].size() * sizeof(float))) << tag << ": state";
    // the scratch holds the second call's intermediates (rows past its last row: NaN in both or 0)
    for (size_t i = 0; i < scs[0].size(); i++) {
      if (!(std::isnan(scs[0][i]) && std::isnan(scs[1][i]))) {
        ASSERT_EQ(0, std::memcmp(&scs[0][i], &scs[1][i], sizeof(float))) << tag << ": scratch element " << i;
      }
    }
  }
}

// The parallel stage on its own (diagnoses a failure above: if this passes, look at the
// recurrence kernel): the scratch intermediates of every chunk against the formulas in double,
// rows past the call's last row and Aqk's upper triangle exactly zero. fp32 depth: a d_k-term
// dot, then a forward substitution over up to 64 rows: 2 gamma_{d_k + 64}. Errors are measured
// at the scale where a quantity enters the outputs, max(max|ref|, unit): decays, beta <= 1 and
// unit keys bound e^G, e^(G_L - G), W and k by 1, and Aqk and q by d_k^-0.5 (under strong decay
// the largest e^G of a tensor can be a float denormal, whose relative precision means nothing).
// The kernel evaluates the Gram products and most of the substitution on split-tf32 tensor cores:
// its products carry the GPU's unit roundoff u = 2^-20 of tolerance_gpu (see the CUDA section's
// first comment) in the same formula.
void parallel_stage_matches_formulas(Backend* G) {
  const double u = std::ldexp(1.0, -20);
  for (const GdnDims& d : {dims(2, 6, 64, 64, 4), dims(1, 2, 32, 64, 2), dims(16, 48, 128, 128, 4)})
    for (Decay k : {Decay::Weak, Decay::Mixed, Decay::Strong}) {
      const int M = 100, nc = (M + kC - 1) / kC;
      const Inputs in = make_inputs(d, M, k, 61);
      DevInputs di(G, in);
      DeviceBuffer st, y;
      fresh(G, in, st, y);
      const size_t nsc = cuda::gdn_chunk_scratch_floats(d, M);
      DeviceBuffer scr = DevInputs::up(G, std::vector<float>(nsc, NAN));
      G->sync();
      cudaStream_t cs = nullptr;
      ASSERT_EQ(cudaSuccess, cudaStreamCreate(&cs));
      cuda::gdn_chunked(di.mixed.f(), di.alpha.f(), di.beta.f(), di.conv.f(), di.A_log.f(), di.dt.f(), d, st.f(), y.f(),
                        M, scr.f(), cs);
      ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(cs));
      cudaStreamDestroy(cs);
      const auto h = down(G, scr, nsc);
      const cuda::GdnChunkScratch lay = cuda::gdn_chunk_scratch_layout(d, M, scr.f());
      const double n = d.d_k + kC, tol = 2 * n * u / (1 - n * u);
      const double qunit = 1.0 / std::sqrt(static_cast<double>(d.d_k));
      for (int c = 0; c < nc; c++) {
        const ChunkTerms ct = chunk_terms(in, c * kC, std::min(kC, M - c * kC));
        const std::string tag = tag_of(d, M, k) + " chunk " + std::to_string(c);
        auto check = [&](const char* what, const float* base, const std::vector<double>& ref, double unit) {
          const float* got = h.data() + (base - scr.f()) + static_cast<size_t>(c) * ref.size();
          double mx = unit, err = 0;
          for (size_t i = 0; i < ref.size(); i++) {
            mx = std::max(mx, std::fabs(ref[i]));
            const double e = std::fabs(got[i] - ref[i]);
            err = std::isnan(e) ? INFINITY : std::max(err, e);
          }
          EXPECT_LE(err, tol * mx) << tag << " " << what << ": max error " << err << ", scale " << mx;
          for (size_t i = 0; i < ref.size(); i++)
            if (ref[i] == 0.0 && got[i] != 0.0f) {
              ADD_FAILURE() << tag << " " << what << " element " << i << " should be 0, is " << got[i];
              break;
            }
        };
        check("qn", lay.qn, ct.qn, qunit);
        check("kn", lay.kn, ct.kn, 1.0);
        check("W", lay.w, ct.w, 1.0);
        check("U", lay.u, ct.u, 0.0);
        check("Aqk", lay.aqk, ct.aqk, qunit);
        check("e^G", lay.eg, ct.eg, 1.0);
        check("e^(G_L - G)", lay.er, ct.er, 1.0);
      }
    }
}

TEST(CudaGdnChunked, ParallelStageMatchesFormulas) {
  NEED_GPU();
  parallel_stage_matches_formulas(G);
}

// The whole chunked form on the 27B heads, the small test models' shapes and d_k < d_v; M not a
// multiple of 64; a nonzero state and conv tail carried in; weak, mixed and strong decay:
//  - W, U, Aqk: structural zeros (rows past the call's last row, Aqk above the diagonal) exactly 0;
//  - y and S against the double reference (tolerance_gpu) and the CPU twin (tolerance_gpu +
//    tolerance); the conv tail bit for bit against the CPU twin;
//  - split invariance: the rows in pieces cut at multiples of 64 give the same bits.
// Prints the worst error / tolerance against the reference (for the experiment log).
TEST(CudaGdnChunked, MatchesReferenceAndCpuTwinWithStateCarriedIn) {
  NEED_GPU();
  struct Case {
    GdnDims d;
    int M;
  };
  const std::vector<Case> cases = {{dims(16, 48, 128, 128, 4), 200},
                                   {dims(2, 6, 64, 64, 4), 259},
                                   {dims(1, 2, 32, 64, 2), 130},
                                   {dims(2, 4, 96, 32, 3), 100},
                                   {dims(2, 2, 32, 128, 4), 70}};
  double worst = 0;
  for (const Case& cs : cases)
    for (Decay k : {Decay::Weak, Decay::Mixed, Decay::Strong}) {
      const GdnDims& d = cs.d;
      const int M = cs.M, nc = (M + kC - 1) / kC;
      ASSERT_TRUE(cuda::gdn_chunk_supported(d));
      const Inputs in = make_inputs(d, M, k, 4000 + M, 0.5f);
      const std::string tag = tag_of(d, M, k);
      DevInputs di(G, in);
      const PrepRun r = run_prep(G, in, di, 0, M);
      for (float v : r.y) ASSERT_FALSE(std::isnan(v)) << tag << ": an output was left unwritten";
      // structural zeros of the intermediates (offsets of the scratch parts over the host copy)
      float* base = const_cast<float*>(r.scratch.data());
      const cuda::GdnChunkScratch lay = cuda::gdn_chunk_scratch_layout(d, M, base);
      auto at = [&](const float* p) { return static_cast<size_t>(p - base); };
      const size_t Hv = d.n_v_heads;
      struct Mat {
        const char* what;
        size_t off;
        int cols;    // per (chunk, value head) a [64][cols] matrix
        bool lower;  // zero above the diagonal
      };
      for (const Mat& mt : {Mat{"W", at(lay.w), d.d_k, false}, Mat{"U", at(lay.u), d.d_v, false},
                            Mat{"Aqk", at(lay.aqk), kC, true}})
        for (int c = 0; c < nc; c++) {
          const int L = std::min(kC, M - c * kC);
          const size_t cb = mt.off + static_cast<size_t>(c) * Hv * kC * mt.cols;
          for (size_t h = 0; h < Hv; h++)
            for (int t = 0; t < kC; t++)
              for (int s = 0; s < mt.cols; s++)
                if (t >= L || (mt.lower && s > t))
                  ASSERT_EQ(0.0f, r.scratch[cb + (h * kC + t) * mt.cols + s])
                      << tag << " " << mt.what << " chunk " << c << " head " << h << " (" << t << ", " << s
                      << ") must be 0";
        }
      // outputs
      std::vector<double> s_ref = widen(in.state), y_ref;
      reference(in, 0, M, s_ref, y_ref);
      std::vector<float> s_cpu, y_cpu;
      run_cpu(CPU.get(), in, true, s_cpu, y_cpu);
      const double tg = tolerance_gpu(d, M), tc = tolerance(d, M);
      const Errs e = errs_vs(r.y, r.state, y_ref, s_ref, d, tag);
      worst = std::max({worst, e.y / tg, e.s / tg});
      EXPECT_LE(e.y, tg) << tag << " y vs reference";
      EXPECT_LE(e.s, tg) << tag << " state vs reference";
      const std::vector<double> yc = widen(y_cpu), sc = widen(s_cpu);
      EXPECT_LE(rel_err(r.y.data(), yc, 0, yc.size()), tg + tc) << tag << " y vs CPU twin";
      EXPECT_LE(rel_err(r.state.data(), sc, 0, d.s_floats()), tg + tc) << tag << " state vs CPU twin";
      ASSERT_EQ(0, std::memcmp(s_cpu.data() + d.s_floats(), r.state.data() + d.s_floats(),
                               (d.state_floats() - d.s_floats()) * sizeof(float)))
          << tag << ": conv tail vs CPU twin";
      // split invariance: [0, 64) then [64, M), and [0, 128) then [128, M) where M > 128
      for (int cut : {64, 128}) {
        if (cut >= M) continue;
        const PrepRun a = run_prep(G, in, di, 0, cut);
        const PrepRun b = run_prep(G, in, di, cut, M, &a.state);
        const size_t VD = d.value_dim();
        ASSERT_EQ(0, std::memcmp(a.y.data(), r.y.data(), a.y.size() * sizeof(float))) << tag << " cut " << cut << ": y";
        ASSERT_EQ(0, std::memcmp(b.y.data(), r.y.data() + cut * VD, b.y.size() * sizeof(float)))
            << tag << " cut " << cut << ": y after the cut";
        ASSERT_EQ(0, std::memcmp(b.state.data(), r.state.data(), b.state.size() * sizeof(float)))
            << tag << " cut " << cut << ": state";
      }
    }
  std::printf("[ GdnChunked ] worst error / tolerance_gpu vs the double reference over y and S: %.3g\n", worst);
}

#endif  // QFLASH_HAVE_CUDA

}  // namespace
}  // namespace qf
