#include "support/op_reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "support/tolerance.h"

namespace qf::test {

namespace {

double silu(double x) { return x / (1.0 + std::exp(-x)); }
double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
// torch.nn.functional.softplus(x), beta 1, threshold 20
double softplus(double x) { return x > 20.0 ? x : std::log1p(std::exp(x)); }

}  // namespace

Ref ref_matmul(const HostWeight& W, const std::vector<float>& x, int M, bool bf16_x) {
  const int64_t R = W.rows, K = W.cols;
  std::vector<double> xv(x.size());
  for (size_t i = 0; i < x.size(); i++) xv[i] = bf16_x ? bf16_value(bf16_round(x[i])) : x[i];
  Ref r;
  r.y.resize(static_cast<size_t>(M) * R);
  r.tol.resize(r.y.size());
  const double c = tol::matmul(K);
  for (int64_t o = 0; o < R; o++) {
    const double* w = W.value.data() + static_cast<size_t>(o) * K;
    for (int m = 0; m < M; m++) {
      const double* xm = xv.data() + static_cast<size_t>(m) * K;
      double s = 0, ss = 0;
      for (int64_t k = 0; k < K; k++) {
        const double t = w[k] * xm[k];
        s += t;
        ss += t * t;
      }
      r.y[static_cast<size_t>(m) * R + o] = s;
      r.tol[static_cast<size_t>(m) * R + o] = c * std::sqrt(ss);
    }
  }
  return r;
}

Ref ref_matmul_int4_tc(const HostWeight& W, const std::vector<float>& x, int M, int pieces, bool bf16_x) {
  Ref r = ref_matmul(W, x, M, bf16_x);
  const int64_t R = W.rows, K = W.cols, ng = K / W.group;
  const double c = tol::matmul_int4_tc(K, W.group, bf16_x ? 1 : pieces);
  for (int64_t o = 0; o < R; o++)
    for (int m = 0; m < M; m++) {
      double ss = 0;
      for (int64_t k = 0; k < K; k++) {
        const size_t g = static_cast<size_t>(o * ng + k / W.group);
        const double xv = bf16_x ? bf16_value(bf16_round(x[static_cast<size_t>(m) * K + k])) : x[static_cast<size_t>(m) * K + k];
        const double b = bf16_value(W.biases[g]);
        const double t = (std::fabs(W.at(o, k) - b) + std::fabs(b)) * xv;  // (|s q| + |b|) x
        ss += t * t;
      }
      r.tol[static_cast<size_t>(m) * R + o] = c * std::sqrt(ss);
    }
  return r;
}

Ref ref_rmsnorm(const std::vector<float>& x, const float* gate, const float* w, int rows, int n, float eps) {
  Ref r;
  r.y.resize(static_cast<size_t>(rows) * n);
  r.tol.resize(r.y.size());
  const double c = gate ? tol::rmsnorm_gated(n) : tol::rmsnorm(n);
  for (int i = 0; i < rows; i++) {
    const float* xr = x.data() + static_cast<size_t>(i) * n;
    double ss = 0;
    for (int j = 0; j < n; j++) ss += static_cast<double>(xr[j]) * xr[j];
    const double inv = 1.0 / std::sqrt(ss / n + static_cast<double>(eps));
    for (int j = 0; j < n; j++) {
      double y = xr[j] * inv * (w ? w[j] : 1.0);
      if (gate) y *= silu(gate[static_cast<size_t>(i) * n + j]);
      r.y[static_cast<size_t>(i) * n + j] = y;
      r.tol[static_cast<size_t>(i) * n + j] = c * std::fabs(y);
    }
  }
  return r;
}

Ref ref_rope(const std::vector<float>& x, int M, int nh, int hd, int rot, float theta, int pos0) {
  Ref r;
  r.y.assign(x.begin(), x.end());
  r.tol.assign(x.size(), 0.0);  // dims past rot pass through exactly
  const int half = rot / 2;
  for (int m = 0; m < M; m++)
    for (int i = 0; i < half; i++) {
      // The contract's fp32 angle: inv_freq = 1 / powf(theta, 2i / rot), angle = pos * inv_freq.
      const float expo = static_cast<float>(2 * i) / static_cast<float>(rot);
      const float inv = 1.0f / std::pow(theta, expo);
      const float ang = static_cast<float>(pos0 + m) * inv;
      const double c = std::cos(static_cast<double>(ang)), s = std::sin(static_cast<double>(ang));
      for (int h = 0; h < nh; h++) {
        const size_t o = (static_cast<size_t>(m) * nh + h) * hd;
        const double a = x[o + i], b = x[o + i + half];
        r.y[o + i] = a * c - b * s;
        r.y[o + i + half] = b * c + a * s;
        r.tol[o + i] = r.tol[o + i + half] = tol::kRope * (std::fabs(a) + std::fabs(b));
      }
    }
  return r;
}

Ref ref_attention(const std::vector<float>& q, const std::vector<float>& K, const std::vector<float>& V, int M,
                  const AttnParams& p, const StepMeta& meta) {
  const int hd = p.head_dim, group = p.n_heads / p.n_kv_heads, kvw = p.n_kv_heads * hd;
  Ref r;
  r.y.assign(static_cast<size_t>(M) * p.n_heads * hd, 0.0);
  r.tol.assign(r.y.size(), 0.0);
  std::vector<double> s, err, pw;
  std::vector<int> js;
  for (int m = 0; m < M; m++)
    for (int h = 0; h < p.n_heads; h++) {
      const int64_t qpos = static_cast<int64_t>(meta.q_pos0) + m;
      const float* qh = q.data() + (static_cast<size_t>(m) * p.n_heads + h) * hd;
      const int g = h / group;
      s.clear();
      err.clear();
      js.clear();
      for (int j = 0; j < meta.n_kv; j++) {
        const int64_t kpos = static_cast<int64_t>(meta.kv_pos0) + j;
        bool vis;
        if (p.causal) vis = kpos <= qpos && (p.window <= 0 || qpos - kpos < p.window);
        else vis = p.window <= 0 || std::llabs(qpos - kpos) < p.window;
        if (!vis) continue;
        const float* kj = K.data() + static_cast<size_t>(j) * kvw + static_cast<size_t>(g) * hd;
        double dot = 0, l2 = 0;
        for (int d = 0; d < hd; d++) {
          const double t = static_cast<double>(qh[d]) * kj[d];
          dot += t;
          l2 += t * t;
        }
        const double sj = dot * p.scale;
        s.push_back(sj);
        err.push_back(tol::attention_score(hd, p.scale, std::sqrt(l2), sj));
        js.push_back(j);
      }
      if (js.empty()) continue;
      const double mx = *std::max_element(s.begin(), s.end());
      double sum = 0, rho = 0;
      pw.resize(s.size());
      for (size_t i = 0; i < s.size(); i++) {
        pw[i] = std::exp(s[i] - mx);
        sum += pw[i];
        rho = std::max(rho, tol::attention_weight(err[i], s[i] - mx));
      }
      const int n = static_cast<int>(js.size());
      for (int d = 0; d < hd; d++) {
        double o = 0, A = 0, B = 0;
        for (size_t i = 0; i < js.size(); i++) {
          const double v = V[static_cast<size_t>(js[i]) * kvw + static_cast<size_t>(g) * hd + d];
          const double t = pw[i] / sum * v;
          o += t;
          A += std::fabs(t);
          B += t * t;
        }
        const size_t at = (static_cast<size_t>(m) * p.n_heads + h) * hd + d;
        r.y[at] = o;
        r.tol[at] = tol::attention_out(rho, A, std::sqrt(B), n, o);
      }
    }
  return r;
}

GdnRef ref_gdn(const std::vector<float>& mixed, const std::vector<float>& alpha, const std::vector<float>& beta_in,
               const std::vector<float>& conv_w, const std::vector<float>& A_log, const std::vector<float>& dt_bias,
               const GdnDims& d, const std::vector<float>& state0, int M, int chunk_rows) {
  const int C = d.conv_dim(), Kc = d.conv_kernel, Hv = d.n_v_heads, dk = d.d_k, dv = d.d_v;
  const int kd = d.key_dim(), ratio = d.n_v_heads / d.n_k_heads;
  const size_t SF = d.s_floats();
  std::vector<double> st(state0.begin(), state0.end());  // S [Hv, dv, dk] | tail [Kc-1, C]
  std::vector<double> u(C), conv_err(C), qn(kd), kn(kd), rho_q(d.n_k_heads), rho_k(d.n_k_heads), gS(dk);
  std::vector<double> B(static_cast<size_t>(Hv) * dv, 0.0);  // error bound of each state row (2-norm)
  GdnRef out;
  out.y.resize(static_cast<size_t>(M) * d.value_dim());
  out.tol_y.resize(out.y.size());
  for (int m = 0; m < M; m++) {
    const float* raw = mixed.data() + static_cast<size_t>(m) * C;
    double* tail = st.data() + SF;
    for (int c = 0; c < C; c++) {
      double acc = 0, ab = 0;
      for (int j = 0; j < Kc; j++) {
        const double in = j < Kc - 1 ? tail[static_cast<size_t>(j) * C + c] : raw[c];
        const double t = conv_w[static_cast<size_t>(c) * Kc + j] * in;
        acc += t;
        ab += std::fabs(t);
      }
      u[c] = silu(acc);
      conv_err[c] = tol::gdn_conv(Kc, ab, u[c]);
    }
    for (int j = 0; j + 1 < Kc - 1; j++)
      for (int c = 0; c < C; c++) tail[static_cast<size_t>(j) * C + c] = tail[static_cast<size_t>(j + 1) * C + c];
    if (Kc > 1)
      for (int c = 0; c < C; c++) tail[static_cast<size_t>(Kc - 2) * C + c] = raw[c];
    // l2-normalised q (times d_k^-1/2) and k per key head, eps inside the square root
    for (int kh = 0; kh < d.n_k_heads; kh++) {
      double sq = 0, sk = 0, eq = 0, ek = 0;
      for (int i = 0; i < dk; i++) {
        const int cq = kh * dk + i, ck = kd + kh * dk + i;
        sq += u[cq] * u[cq];
        sk += u[ck] * u[ck];
        eq += conv_err[cq] * conv_err[cq];
        ek += conv_err[ck] * conv_err[ck];
      }
      const double iq = 1.0 / std::sqrt(sq + d.eps) / std::sqrt(static_cast<double>(dk)), ik = 1.0 / std::sqrt(sk + d.eps);
      for (int i = 0; i < dk; i++) {
        qn[kh * dk + i] = u[kh * dk + i] * iq;
        kn[kh * dk + i] = u[kd + kh * dk + i] * ik;
      }
      rho_q[kh] = tol::gdn_qk(dk, std::sqrt(eq), std::sqrt(sq));
      rho_k[kh] = tol::gdn_qk(dk, std::sqrt(ek), std::sqrt(sk));
    }
    for (int h = 0; h < Hv; h++) {
      const double ln_g = -std::exp(static_cast<double>(A_log[h])) *
                          softplus(static_cast<double>(alpha[static_cast<size_t>(m) * Hv + h]) + dt_bias[h]);
      const double g = std::exp(ln_g);
      const double beta = sigmoid(beta_in[static_cast<size_t>(m) * Hv + h]);
      const int kh = h / ratio;
      const double* kk = kn.data() + kh * dk;
      const double* qq = qn.data() + kh * dk;
      for (int i = 0; i < dv; i++) {
        double* Si = st.data() + (static_cast<size_t>(h) * dv + i) * dk;
        const int vc = 2 * kd + h * dv + i;
        tol::GdnRowTerms t{};
        double r = 0, gs2 = 0, gsk2 = 0;
        for (int j = 0; j < dk; j++) {
          gS[j] = g * Si[j];
          r += gS[j] * kk[j];
          gs2 += gS[j] * gS[j];
          gsk2 += gS[j] * kk[j] * gS[j] * kk[j];
        }
        const double delta = beta * (u[vc] - r);
        double o = 0, sn2 = 0, sq2 = 0;
        for (int j = 0; j < dk; j++) {
          Si[j] = gS[j] + delta * kk[j];
          o += Si[j] * qq[j];
          sn2 += Si[j] * Si[j];
          sq2 += Si[j] * qq[j] * Si[j] * qq[j];
        }
        t.gS_k_l2 = std::sqrt(gsk2);
        t.gS_l2 = std::sqrt(gs2);
        t.S_new_l2 = std::sqrt(sn2);
        t.r = r;
        t.v = u[vc];
        t.delta = delta;
        t.ln_g = ln_g;
        t.rho_k = rho_k[kh];
        t.conv_v = conv_err[vc];
        double e = tol::gdn_state_row(dk, t);
        if (chunk_rows > 0) e += tol::gdn_chunked_state_extra(dk, chunk_rows, t);
        double& b = B[static_cast<size_t>(h) * dv + i];
        b = g * b + e;
        const size_t at = static_cast<size_t>(m) * d.value_dim() + h * dv + i;
        out.y[at] = o;
        out.tol_y[at] = tol::gdn_y(dk, b, std::sqrt(sq2), t.S_new_l2, rho_q[kh]);
        if (chunk_rows > 0) out.tol_y[at] += tol::gdn_chunked_y_extra(dk, chunk_rows, t.S_new_l2, o);
      }
    }
    out.states.push_back(st);
    out.tol_rows.push_back(B);
  }
  return out;
}

Ref ref_dyn_conv(const std::vector<float>& x, const float* base, const std::vector<float>& D, int L, int H, int Kc,
                 int gs, int side) {
  const int G = H / gs;
  Ref r;
  r.y.resize(static_cast<size_t>(L) * H);
  r.tol.resize(r.y.size());
  for (int i = 0; i < L; i++)
    for (int c = 0; c < H; c++) {
      double acc = 0, ab = 0;
      for (int t = 0; t < Kc && t <= i; t++) {
        const double coef = static_cast<double>(base[static_cast<size_t>(t) * H + c]) +
                            D[static_cast<size_t>(i) * 2 * Kc * G + static_cast<size_t>(side) * Kc * G + t * G + c / gs];
        const double v = coef * x[static_cast<size_t>(i - t) * H + c];
        acc += v;
        ab += std::fabs(v);
      }
      r.y[static_cast<size_t>(i) * H + c] = acc;
      r.tol[static_cast<size_t>(i) * H + c] = tol::dyn_conv(Kc) * ab;
    }
  return r;
}

SelectorRef ref_selector_walk(const std::vector<float>& cand_vals, const std::vector<int32_t>& cand_ids,
                              const std::vector<float>& P, const HostWeight& Epre, const HostWeight& Esuc, int32_t anchor,
                              int k, int K, int R) {
  SelectorRef out;
  out.drafts.resize(k);
  out.scores.y.resize(static_cast<size_t>(k) * K);
  out.scores.tol.resize(out.scores.y.size());
  int32_t pred = anchor;
  for (int j = 0; j < k; j++) {
    int best = 0;
    for (int c = 0; c < K; c++) {
      const size_t at = static_cast<size_t>(j) * K + c;
      const int32_t b = cand_ids[at];
      double dot = 0, l2 = 0, l1 = 0;
      for (int r = 0; r < R; r++) {
        const double t = Epre.at(pred, r) * P[static_cast<size_t>(j) * R + r] * Esuc.at(b, r);
        dot += t;
        l2 += t * t;
        l1 += std::fabs(t);
      }
      const double s = cand_vals[at] + dot;
      out.scores.y[at] = s;
      out.scores.tol[at] = tol::selector_score(R, std::sqrt(l2), l1, s);
      if (s > out.scores.y[static_cast<size_t>(j) * K + best]) best = c;
    }
    const size_t b0 = static_cast<size_t>(j) * K;
    for (int c = 0; c < K; c++) {
      const bool duplicate = cand_ids[b0 + c] == cand_ids[b0 + best] && cand_vals[b0 + c] == cand_vals[b0 + best];
      if (c == best || duplicate) continue;  // an exact duplicate scores the same bits on any backend
      if (out.scores.y[b0 + best] - out.scores.y[b0 + c] <= out.scores.tol[b0 + best] + out.scores.tol[b0 + c])
        out.margin_ok = false;
    }
    out.drafts[j] = cand_ids[b0 + best];
    pred = out.drafts[j];
  }
  return out;
}

std::vector<int32_t> ref_argmax(const std::vector<float>& x, int M, int n) {
  std::vector<int32_t> out(M);
  for (int m = 0; m < M; m++) {
    const float* r = x.data() + static_cast<size_t>(m) * n;
    int best = 0;
    for (int i = 1; i < n; i++)
      if (r[i] > r[best]) best = i;
    out[m] = best;
  }
  return out;
}

void ref_topk(const std::vector<float>& x, int M, int n, int k, std::vector<float>* vals, std::vector<int32_t>* ids) {
  vals->resize(static_cast<size_t>(M) * k);
  ids->resize(static_cast<size_t>(M) * k);
  std::vector<int32_t> idx(n);
  for (int m = 0; m < M; m++) {
    const float* r = x.data() + static_cast<size_t>(m) * n;
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return r[a] > r[b]; });
    for (int j = 0; j < k; j++) {
      (*ids)[static_cast<size_t>(m) * k + j] = idx[j];
      (*vals)[static_cast<size_t>(m) * k + j] = r[idx[j]];
    }
  }
}

std::vector<uint8_t> ref_fill_random(size_t first, size_t n, DType dt, uint64_t seed, float scale) {
  const size_t esz = dt == DType::BF16 ? 2 : 4;
  std::vector<uint8_t> out(n * esz);
  for (size_t i = 0; i < n; i++) {
    // splitmix64 (Steele, Lea, Flood 2014; Vigna's constants)
    uint64_t z = seed + first + i + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const double u = static_cast<double>(z >> 40) / 16777216.0;
    // 2u - 1 is exact in fp32 (24-bit u); the product with scale rounds once
    const float v = static_cast<float>(static_cast<double>(scale) * (2.0 * u - 1.0));
    if (dt == DType::BF16) {
      const uint16_t h = bf16_round(v);
      std::memcpy(out.data() + 2 * i, &h, 2);
    } else {
      std::memcpy(out.data() + 4 * i, &v, 4);
    }
  }
  return out;
}

}  // namespace qf::test
