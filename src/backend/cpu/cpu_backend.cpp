// CPU reference backend: plain loops, fp32 accumulation, OpenMP over independent outputs.
// Each output element is computed by exactly one thread with a fixed reduction order, so the
// results do not depend on the thread count or on the row count M (row-invariance).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/gdn_chunked.h"
#include "core/error.h"

namespace qf {
namespace {

constexpr int kLanes = 16;

// Fixed-order dot product: 16 independent lane sums, combined pairwise, then the tail.
inline float lanes_reduce(const float* acc) {
  float a[kLanes];
  std::memcpy(a, acc, sizeof(a));
  for (int w = kLanes / 2; w >= 1; w /= 2)
    for (int l = 0; l < w; l++) a[l] += a[l + w];
  return a[0];
}

// Fixed-order dot of two f32 rows: 16 lane sums, a pairwise combine, then the tail.
inline float dot_f32(const float* w, const float* x, int64_t n) {
  float acc[kLanes] = {0};
  const int64_t nmain = n - n % kLanes;
  for (int64_t c = 0; c < nmain; c += kLanes)
    for (int l = 0; l < kLanes; l++) acc[l] += w[c + l] * x[c + l];
  float s = lanes_reduce(acc);
  for (int64_t c = nmain; c < n; c++) s += w[c] * x[c];
  return s;
}

// Each weight row is widened to f32 once, then dotted with every input row: the weights are
// read once per call whatever M is, and row m's arithmetic is the same for every M.
template <DType T>
void matmul_dense(const WeightRef& W, const float* x, float* y, int M) {
  const int64_t rows = W.rows, cols = W.cols;
  const size_t esz = dtype_size(T);
#pragma omp parallel if (rows * cols * M > (1 << 18))
  {
    std::vector<float> wrow(T == DType::F32 ? 0 : static_cast<size_t>(cols));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
      const uint8_t* src = static_cast<const uint8_t*>(W.data) + static_cast<size_t>(r) * cols * esz;
      const float* wr;
      if constexpr (T == DType::F32) {
        wr = reinterpret_cast<const float*>(src);
      } else {
        const uint16_t* h = reinterpret_cast<const uint16_t*>(src);
        for (int64_t c = 0; c < cols; c++)
          wrow[c] = T == DType::BF16 ? bf16_to_f32(h[c]) : f16_to_f32(h[c]);
        wr = wrow.data();
      }
      for (int m = 0; m < M; m++) y[static_cast<size_t>(m) * rows + r] = dot_f32(wr, x + static_cast<size_t>(m) * cols, cols);
    }
  }
}

// int4 group-affine (mlx layout): word w of row r holds columns 8w..8w+7, element j at bits 4j.
inline void dequant_int4_row(const WeightRef& W, int64_t r, float* out) {
  const uint32_t* q = static_cast<const uint32_t*>(W.data) + static_cast<size_t>(r) * (W.cols / 8);
  const int64_t ng = W.cols / W.group;
  const uint16_t* sc = static_cast<const uint16_t*>(W.scales) + static_cast<size_t>(r) * ng;
  const uint16_t* bi = static_cast<const uint16_t*>(W.biases) + static_cast<size_t>(r) * ng;
  for (int64_t g = 0; g < ng; g++) {
    const float s = bf16_to_f32(sc[g]), b = bf16_to_f32(bi[g]);
    for (int64_t w = g * W.group / 8; w < (g + 1) * W.group / 8; w++) {
      const uint32_t word = q[w];
      for (int j = 0; j < 8; j++) out[w * 8 + j] = static_cast<float>((word >> (4 * j)) & 0xfu) * s + b;
    }
  }
}

// bf16_weights: each dequantized weight rounded to bf16 first (the prefill GEMM's int4 operand).
void matmul_int4(const WeightRef& W, const float* x, float* y, int M, bool bf16_weights = false) {
  const int64_t rows = W.rows, cols = W.cols;
#pragma omp parallel if (rows * cols * M > (1 << 18))
  {
    std::vector<float> wrow(static_cast<size_t>(cols));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
      dequant_int4_row(W, r, wrow.data());
      if (bf16_weights)
        for (float& v : wrow) v = bf16_to_f32(f32_to_bf16(v));
      for (int m = 0; m < M; m++) {
        const float s = dot_f32(wrow.data(), x + static_cast<size_t>(m) * cols, cols);
        y[static_cast<size_t>(m) * rows + r] = s;
      }
    }
  }
}

inline float silu(float x) { return x / (1.0f + std::exp(-x)); }
inline float sigmoidf(float x) { return 1.0f / (1.0f + std::exp(-x)); }
// torch.nn.functional.softplus with beta 1, threshold 20.
inline float softplusf(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

inline float weight_at(const WeightRef& W, int64_t r, int64_t c) {
  switch (W.dtype) {
    case DType::F32: return static_cast<const float*>(W.data)[r * W.cols + c];
    case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(W.data)[r * W.cols + c]);
    case DType::F16: return f16_to_f32(static_cast<const uint16_t*>(W.data)[r * W.cols + c]);
    case DType::U32: {
      uint32_t word = static_cast<const uint32_t*>(W.data)[r * (W.cols / 8) + c / 8];
      uint32_t nib = (word >> (4 * (c % 8))) & 0xfu;
      const int64_t ng = W.cols / W.group;
      float s = bf16_to_f32(static_cast<const uint16_t*>(W.scales)[r * ng + c / W.group]);
      float b = bf16_to_f32(static_cast<const uint16_t*>(W.biases)[r * ng + c / W.group]);
      return static_cast<float>(nib) * s + b;
    }
    default: fail(ErrorKind::Internal, "cpu backend: unsupported weight dtype %s", dtype_name(W.dtype));
  }
}

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  bool is_gpu() const override { return false; }

  void* alloc(size_t bytes) override {
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p) fail(ErrorKind::Backend, "cpu backend: out of memory allocating %zu bytes", bytes);
    std::memset(p, 0, bytes);
    return p;
  }
  void release(void* p) override { std::free(p); }
  void upload(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void download(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void copy(void* dst, const void* src, size_t bytes) override { std::memmove(dst, src, bytes); }
  void fill_zero(void* dst, size_t bytes) override { std::memset(dst, 0, bytes); }
  void sync() override {}
  const void* import_weight(const void* host, size_t) override { return host; }
  void release_weight(const void*) override {}
  void fill_random(void* dst, size_t n, DType dt, uint64_t seed, float scale) override {
#pragma omp parallel for schedule(static) if (n > (1u << 20))
    for (size_t i = 0; i < n; i++) {
      const float v = scale * random_uniform_pm1(seed, i);
      if (dt == DType::BF16)
        static_cast<uint16_t*>(dst)[i] = f32_to_bf16(v);
      else
        static_cast<float*>(dst)[i] = v;
    }
  }

  void matmul(const WeightRef& W, const float* x, float* y, int M) override {
    switch (W.dtype) {
      case DType::F32: return matmul_dense<DType::F32>(W, x, y, M);
      case DType::BF16: return matmul_dense<DType::BF16>(W, x, y, M);
      case DType::F16: return matmul_dense<DType::F16>(W, x, y, M);
      case DType::U32: return matmul_int4(W, x, y, M);
      default: fail(ErrorKind::Internal, "cpu matmul: unsupported weight dtype %s", dtype_name(W.dtype));
    }
  }
  // The prefill GEMM's twin: bf16-rounded activations (what a bf16 tensor-core GEMM multiplies),
  // then the matmul's fixed-order fp32 dot; int4 weights as bf16_rn of their fp32 dequantized
  // value (backend.h), the others as they are.
  void gemm(const WeightRef& W, const float* x, float* y, int M) override {
    std::vector<float> xr(static_cast<size_t>(M) * W.cols);
    for (size_t i = 0; i < xr.size(); i++) xr[i] = bf16_to_f32(f32_to_bf16(x[i]));
    if (W.dtype == DType::U32) return matmul_int4(W, xr.data(), y, M, /*bf16_weights=*/true);
    matmul(W, xr.data(), y, M);
  }


  void embed(const WeightRef& E, const int32_t* ids, float* out, int M) override {
    for (int m = 0; m < M; m++) {
      const int64_t id = ids[m];
      if (id < 0 || id >= E.rows)
        fail(ErrorKind::Usage, "token id %lld outside the embedding's %lld rows", (long long)id,
             (long long)E.rows);
      float* o = out + static_cast<size_t>(m) * E.cols;
      if (E.dtype == DType::U32) {
        dequant_int4_row(E, id, o);
      } else {
        for (int64_t c = 0; c < E.cols; c++) o[c] = weight_at(E, id, c);
      }
    }
  }

  void rmsnorm(const float* x, const float* w, float* y, int rows, int n, float eps) override {
    for (int r = 0; r < rows; r++) {
      const float* xr = x + static_cast<size_t>(r) * n;
      float* yr = y + static_cast<size_t>(r) * n;
      float ss = 0;
      for (int i = 0; i < n; i++) ss += xr[i] * xr[i];
      const float inv = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
      for (int i = 0; i < n; i++) yr[i] = xr[i] * inv * (w ? w[i] : 1.0f);
    }
  }

  void rmsnorm_gated(const float* x, const float* gate, const float* w, float* y, int rows, int n,
                     float eps) override {
    for (int r = 0; r < rows; r++) {
      const float* xr = x + static_cast<size_t>(r) * n;
      const float* gr = gate + static_cast<size_t>(r) * n;
      float* yr = y + static_cast<size_t>(r) * n;
      float ss = 0;
      for (int i = 0; i < n; i++) ss += xr[i] * xr[i];
      const float inv = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
      for (int i = 0; i < n; i++) yr[i] = (w ? w[i] : 1.0f) * (xr[i] * inv) * silu(gr[i]);
    }
  }

  void add(float* y, const float* x, size_t n) override {
    for (size_t i = 0; i < n; i++) y[i] += x[i];
  }
  void scale(float* y, float s, size_t n) override {
    for (size_t i = 0; i < n; i++) y[i] *= s;
  }
  void swiglu(const float* g, const float* u, float* out, size_t n) override {
    for (size_t i = 0; i < n; i++) out[i] = silu(g[i]) * u[i];
  }
  void sigmoid_mul(float* y, const float* g, size_t n) override {
    for (size_t i = 0; i < n; i++) y[i] *= sigmoidf(g[i]);
  }
  void softcap(float* y, float cap, size_t n) override {
    if (cap <= 0) return;
    for (size_t i = 0; i < n; i++) y[i] = std::tanh(y[i] / cap) * cap;
  }
  void copy_2d(float* dst, int dst_ld, const float* src, int src_ld, int rows, int cols) override {
    for (int r = 0; r < rows; r++)
      std::memmove(dst + static_cast<size_t>(r) * dst_ld, src + static_cast<size_t>(r) * src_ld,
                   static_cast<size_t>(cols) * sizeof(float));
  }

  void split_qgate(const float* qg, float* q, float* gate, int M, int nh, int hd) override {
    for (int m = 0; m < M; m++)
      for (int h = 0; h < nh; h++) {
        const float* src = qg + (static_cast<size_t>(m) * nh + h) * 2 * hd;
        std::memcpy(q + (static_cast<size_t>(m) * nh + h) * hd, src, hd * sizeof(float));
        std::memcpy(gate + (static_cast<size_t>(m) * nh + h) * hd, src + hd, hd * sizeof(float));
      }
  }

  void rope(float* x, int M, int nh, int hd, int rot, float theta, const StepMeta* meta) override {
    const int half = rot / 2;
    std::vector<float> inv(half);
    for (int i = 0; i < half; i++)
      inv[i] = 1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(rot));
    for (int m = 0; m < M; m++) {
      const float pos = static_cast<float>(meta->q_pos0 + m);
      for (int i = 0; i < half; i++) {
        const float ang = pos * inv[i];
        const float c = std::cos(ang), s = std::sin(ang);
        for (int h = 0; h < nh; h++) {
          float* xh = x + (static_cast<size_t>(m) * nh + h) * hd;
          const float a = xh[i], b = xh[i + half];
          xh[i] = a * c - b * s;
          xh[i + half] = b * c + a * s;
        }
      }
    }
  }

  void kv_write(void* cache, const float* rows, int M, int width, const StepMeta* meta, DType dt) override {
    const int64_t row0 = meta->q_pos0 - meta->kv_pos0;
    QF_CHECK(row0 >= 0, "kv_write before the cache start (q_pos0 %d, kv_pos0 %d)", meta->q_pos0,
             meta->kv_pos0);
    const size_t n = static_cast<size_t>(M) * width;
    if (dt == DType::BF16) {
      uint16_t* c = static_cast<uint16_t*>(cache) + row0 * width;
      for (size_t i = 0; i < n; i++) c[i] = f32_to_bf16(rows[i]);
      return;
    }
    QF_CHECK(dt == DType::F32, "kv_write: cache dtype %s (F32 or BF16 expected)", dtype_name(dt));
    std::memcpy(static_cast<float*>(cache) + row0 * width, rows, n * sizeof(float));
  }

  void attention(const float* q, const void* K, const void* V, float* out, int M,
                 const AttnParams& p, const StepMeta* meta) override {
    if (p.kv_dtype == DType::BF16)
      return attention_t(q, static_cast<const uint16_t*>(K), static_cast<const uint16_t*>(V), out, M, p, meta);
    QF_CHECK(p.kv_dtype == DType::F32, "attention: K/V dtype %s (F32 or BF16 expected)", dtype_name(p.kv_dtype));
    attention_t(q, static_cast<const float*>(K), static_cast<const float*>(V), out, M, p, meta);
  }

 private:
  static float kv_at(const float* c, size_t i) { return c[i]; }
  static float kv_at(const uint16_t* c, size_t i) { return bf16_to_f32(c[i]); }

  template <class T>
  void attention_t(const float* q, const T* K, const T* V, float* out, int M, const AttnParams& p,
                   const StepMeta* meta) {
    const int hd = p.head_dim, group = p.n_heads / p.n_kv_heads;
    const int kvw = p.n_kv_heads * hd;
#pragma omp parallel for collapse(2) schedule(static) if (M * p.n_heads > 1 && meta->n_kv > 64)
    for (int m = 0; m < M; m++)
      for (int h = 0; h < p.n_heads; h++) {
        const int64_t qpos = meta->q_pos0 + m;
        int64_t lo = 0, hi = meta->n_kv;  // key rows [lo, hi)
        if (p.causal) hi = std::min<int64_t>(hi, qpos - meta->kv_pos0 + 1);
        if (p.window > 0) {
          lo = std::max<int64_t>(lo, qpos - p.window + 1 - meta->kv_pos0);
          if (!p.causal) hi = std::min<int64_t>(hi, qpos + p.window - meta->kv_pos0);
        }
        const float* qh = q + (static_cast<size_t>(m) * p.n_heads + h) * hd;
        float* oh = out + (static_cast<size_t>(m) * p.n_heads + h) * hd;
        const size_t goff = static_cast<size_t>(h / group) * hd;
        std::vector<float> sc(static_cast<size_t>(std::max<int64_t>(hi - lo, 0)));
        float mx = -INFINITY;
        for (int64_t j = lo; j < hi; j++) {
          const size_t kj = static_cast<size_t>(j) * kvw + goff;
          float s = 0;
          for (int d = 0; d < hd; d++) s += qh[d] * kv_at(K, kj + d);
          s *= p.scale;
          sc[j - lo] = s;
          mx = std::max(mx, s);
        }
        float sum = 0;
        for (int64_t j = lo; j < hi; j++) {
          sc[j - lo] = std::exp(sc[j - lo] - mx);
          sum += sc[j - lo];
        }
        for (int d = 0; d < hd; d++) oh[d] = 0;
        for (int64_t j = lo; j < hi; j++) {
          const size_t vj = static_cast<size_t>(j) * kvw + goff;
          const float w = sc[j - lo] / sum;
          for (int d = 0; d < hd; d++) oh[d] += w * kv_at(V, vj + d);
        }
      }
  }

 public:
  void gdn_rows(const float* mixed, const float* alpha, const float* beta_in, const float* conv_w,
                const float* A_log, const float* dt_bias, const GdnDims& d, float* state, float* y,
                int M, float* capture) override {
    const int C = d.conv_dim(), K = d.conv_kernel, Hv = d.n_v_heads, dk = d.d_k, dv = d.d_v;
    const int ratio = d.n_v_heads / d.n_k_heads;
    float* S = state;
    float* tail = state + d.s_floats();  // [K-1, C]
    std::vector<float> u(C), qn(d.key_dim()), kn(d.key_dim());
    const float qscale = 1.0f / std::sqrt(static_cast<float>(dk));
    for (int m = 0; m < M; m++) {
      const float* raw = mixed + static_cast<size_t>(m) * C;
      for (int c = 0; c < C; c++) {
        float acc = 0;
        for (int j = 0; j < K - 1; j++) acc += conv_w[c * K + j] * tail[static_cast<size_t>(j) * C + c];
        acc += conv_w[c * K + K - 1] * raw[c];
        u[c] = silu(acc);
      }
      if (K > 1) {
        std::memmove(tail, tail + C, static_cast<size_t>(K - 2) * C * sizeof(float));
        std::memcpy(tail + static_cast<size_t>(K - 2) * C, raw, C * sizeof(float));
      }
      // l2 normalisation per key head: x * rsqrt(sum x^2 + eps)
      for (int kh = 0; kh < d.n_k_heads; kh++) {
        const float* qs = u.data() + kh * dk;
        const float* ks = u.data() + d.key_dim() + kh * dk;
        float sq = 0, sk = 0;
        for (int i = 0; i < dk; i++) { sq += qs[i] * qs[i]; sk += ks[i] * ks[i]; }
        const float iq = 1.0f / std::sqrt(sq + d.eps), ik = 1.0f / std::sqrt(sk + d.eps);
        for (int i = 0; i < dk; i++) {
          qn[kh * dk + i] = qs[i] * iq * qscale;
          kn[kh * dk + i] = ks[i] * ik;
        }
      }
      const float* v = u.data() + 2 * d.key_dim();
      float* ym = y + static_cast<size_t>(m) * d.value_dim();
#pragma omp parallel for schedule(static) if (Hv * dv * dk > 16384)
      for (int h = 0; h < Hv; h++) {
        const float a = alpha[static_cast<size_t>(m) * Hv + h] + dt_bias[h];
        const float g = std::exp(-std::exp(A_log[h]) * softplusf(a));
        const float beta = sigmoidf(beta_in[static_cast<size_t>(m) * Hv + h]);
        const float* kk = kn.data() + (h / ratio) * dk;
        const float* qq = qn.data() + (h / ratio) * dk;
        const float* vv = v + static_cast<size_t>(h) * dv;
        float* Sh = S + static_cast<size_t>(h) * dv * dk;
        for (int i = 0; i < dv; i++) {
          float* Si = Sh + static_cast<size_t>(i) * dk;
          float r = 0;
          for (int j = 0; j < dk; j++) {
            Si[j] *= g;
            r += Si[j] * kk[j];
          }
          const float delta = beta * (vv[i] - r);
          float o = 0;
          for (int j = 0; j < dk; j++) {
            Si[j] += delta * kk[j];
            o += Si[j] * qq[j];
          }
          ym[static_cast<size_t>(h) * dv + i] = o;
        }
      }
      if (capture) std::memcpy(capture + static_cast<size_t>(m) * d.state_floats(), state,
                               d.state_floats() * sizeof(float));
    }
  }

  void gdn_chunked(const float* mixed, const float* alpha, const float* beta_in, const float* conv_w,
                   const float* A_log, const float* dt_bias, const GdnDims& d, float* state, float* y,
                   int M) override {
    cpu::gdn_chunked(mixed, alpha, beta_in, conv_w, A_log, dt_bias, d, state, y, M);
  }

  void argmax_rows(const float* x, int M, int n, int32_t* out) override {
    for (int m = 0; m < M; m++) {
      const float* r = x + static_cast<size_t>(m) * n;
      int best = 0;
      for (int i = 1; i < n; i++)
        if (r[i] > r[best]) best = i;  // strict: first (lowest) index wins ties
      out[m] = best;
    }
  }

  void topk_rows(const float* x, int M, int n, int k, float* vals, int32_t* ids) override {
    std::vector<int32_t> idx(n);
    for (int m = 0; m < M; m++) {
      const float* r = x + static_cast<size_t>(m) * n;
      for (int i = 0; i < n; i++) idx[i] = i;
      std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
        return r[a] > r[b] || (r[a] == r[b] && a < b);
      });
      for (int j = 0; j < k; j++) {
        ids[m * k + j] = idx[j];
        vals[m * k + j] = r[idx[j]];
      }
    }
  }

  void dyn_conv(const float* x, const float* base, const float* D, float* out, int L, int H, int Kc,
                int gs, int side) override {
    const int G = H / gs;
    for (int i = 0; i < L; i++)
      for (int c = 0; c < H; c++) {
        float acc = 0;
        for (int t = 0; t < Kc && t <= i; t++) {
          const float coef = base[static_cast<size_t>(t) * H + c] +
                             D[static_cast<size_t>(i) * 2 * Kc * G + side * Kc * G + t * G + c / gs];
          acc += coef * x[static_cast<size_t>(i - t) * H + c];
        }
        out[static_cast<size_t>(i) * H + c] = acc;
      }
  }

  void selector_walk(const float* cand_vals, const int32_t* cand_ids, const float* P,
                     const WeightRef& Epre, const WeightRef& Esuc, const int32_t* anchor, int k, int K,
                     int R, int32_t* drafts, float* scores) override {
    int32_t pred = *anchor;
    std::vector<float> gp(R);
    for (int j = 0; j < k; j++) {
      for (int r = 0; r < R; r++) gp[r] = weight_at(Epre, pred, r) * P[static_cast<size_t>(j) * R + r];
      int best = 0;
      for (int c = 0; c < K; c++) {
        const int32_t b = cand_ids[j * K + c];
        float s = 0;
        for (int r = 0; r < R; r++) s += gp[r] * weight_at(Esuc, b, r);
        s += cand_vals[j * K + c];
        scores[j * K + c] = s;
        if (s > scores[j * K + best]) best = c;
      }
      drafts[j] = cand_ids[j * K + best];
      pred = drafts[j];
    }
  }
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace qf
