// bf16 KV caches and attention_prefill.
//  - CPU (always): kv_write into a bf16 cache rounds to nearest even (checked against the two
//    neighbouring bf16 values, ties to the even one); attention over bf16 K/V reads the widened
//    values, bit for bit the fp32 path on the same numbers; a float64 reference.
//  - CUDA (skipped without a GPU): bf16 kv_write bit-identical to the CPU's (NaN, inf, ties,
//    subnormals); decode/verify attention on bf16 K/V (the grouped kernel) against float64 with a
//    derived bound, verify rows of every M and decode rows bit-identical; attention_prefill against
//    float64 with the same bound, and row/split invariance: a row's bits do not depend on the rows
//    around it in the call.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"

#ifdef QFLASH_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "backend/cuda/kernels.h"
#endif

namespace qf {
namespace {

std::vector<float> randv(size_t n, uint64_t seed, float s = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0, s);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}
std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); i++) h[i] = f32_to_bf16(v[i]);
  return h;
}
std::vector<float> widen(const std::vector<uint16_t>& h) {
  std::vector<float> v(h.size());
  for (size_t i = 0; i < h.size(); i++) v[i] = bf16_to_f32(h[i]);
  return v;
}
float bits_f(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

AttnParams params(int nh, int nkv, int hd, bool causal, int window, DType kv) {
  AttnParams p;
  p.n_heads = nh;
  p.n_kv_heads = nkv;
  p.head_dim = hd;
  p.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  p.causal = causal;
  p.window = window;
  p.kv_dtype = kv;
  return p;
}

// Float64 attention of query row m (position meta.q_pos0 + m), all heads, on widened K/V.
std::vector<double> ref_row(const std::vector<float>& q, const std::vector<float>& K, const std::vector<float>& V,
                            int m, const AttnParams& p, const StepMeta& meta) {
  const int hd = p.head_dim, kvw = p.n_kv_heads * hd, group = p.n_heads / p.n_kv_heads;
  std::vector<double> o(static_cast<size_t>(p.n_heads) * hd, 0.0);
  const int64_t qpos = meta.q_pos0 + m;
  for (int h = 0; h < p.n_heads; h++) {
    const int g = h / group;
    std::vector<double> w;
    std::vector<int> js;
    for (int j = 0; j < meta.n_kv; j++) {
      const int64_t kpos = meta.kv_pos0 + j;
      const bool vis = p.causal ? (kpos <= qpos && (p.window <= 0 || qpos - kpos < p.window))
                                : (p.window <= 0 || std::llabs(qpos - kpos) < p.window);
      if (!vis) continue;
      double s = 0;
      for (int d = 0; d < hd; d++)
        s += static_cast<double>(q[(static_cast<size_t>(m) * p.n_heads + h) * hd + d]) * K[static_cast<size_t>(j) * kvw + g * hd + d];
      w.push_back(s * p.scale);
      js.push_back(j);
    }
    if (w.empty()) continue;
    double mx = -1e300, sum = 0;
    for (double s : w) mx = std::max(mx, s);
    for (double& s : w) sum += (s = std::exp(s - mx));
    for (size_t i = 0; i < w.size(); i++)
      for (int d = 0; d < hd; d++) o[static_cast<size_t>(h) * hd + d] += w[i] / sum * V[static_cast<size_t>(js[i]) * kvw + g * hd + d];
  }
  return o;
}

// ---- CPU --------------------------------------------------------------------------------------

TEST(KvBf16Cpu, KvWriteRoundsToNearestEven) {
  auto be = make_cpu_backend();
  std::vector<float> rows = randv(4 * 96, 1, 3.0f);
  // ties between two bf16 values (low 16 bits exactly 0x8000): odd and even upper halves
  rows[0] = bits_f(0x3f808000u);  // 1.00390625 + half an ulp above 1.0 -> rounds to the even 0x3f80
  rows[1] = bits_f(0x3f818000u);  // tie above an odd bf16 -> 0x3f82
  rows[2] = bits_f(0xbf818000u);
  rows[3] = bits_f(0x00008000u);  // subnormal tie
  rows[4] = bits_f(0x7f7fffffu);  // largest finite: rounds up to inf, as torch's cast does
  rows[5] = INFINITY;
  rows[6] = -0.0f;
  const int width = 96, M = 4;
  std::vector<uint16_t> cache(10 * width, 0x1234);
  StepMeta meta{13, 10, 0, 0};  // row 3 of the cache
  be->kv_write(cache.data(), rows.data(), M, width, &meta, DType::BF16);
  for (size_t i = 0; i < cache.size(); i++) {
    const size_t r = i / width;
    if (r < 3 || r >= 3 + M) {
      ASSERT_EQ(cache[i], 0x1234) << "element " << i << " outside the written rows";
      continue;
    }
    const float x = rows[i - 3 * width];
    const uint16_t h = cache[i];
    if (std::isinf(x)) {
      ASSERT_EQ(bf16_to_f32(h), x);
      continue;
    }
    // nearest of the two bf16 values around x; ties to an even mantissa
    const double got = bf16_to_f32(h);
    uint32_t u;
    std::memcpy(&u, &x, 4);
    const uint32_t down = u & 0xffff0000u, up_ = down + 0x10000u;
    const double dd = std::fabs(static_cast<double>(x) - bits_f(down));
    const double du = std::isinf(bits_f(up_)) ? INFINITY : std::fabs(bits_f(up_) - static_cast<double>(x));
    const double best = std::min(dd, du);
    if (u == 0x7f7fffffu) {
      ASSERT_TRUE(std::isinf(got));
      continue;
    }
    ASSERT_EQ(std::fabs(got - x), best) << "element " << i << " x=" << x;
    if (dd == du) {
      ASSERT_EQ(h & 1, 0) << "tie not rounded to even at " << i;
    }
    if (x == 0.0f) {
      ASSERT_EQ(std::signbit(got), std::signbit(x));
    }
  }
}

TEST(KvBf16Cpu, AttentionReadsWidenedValuesBitForBit) {
  auto be = make_cpu_backend();
  for (bool causal : {true, false}) {
    const AttnParams pb = params(6, 2, 64, causal, causal ? 0 : 9, DType::BF16);
    AttnParams pf = pb;
    pf.kv_dtype = DType::F32;
    const int nk = 150, M = 7, kvw = pb.n_kv_heads * pb.head_dim;
    const auto Kh = to_bf16(randv(static_cast<size_t>(nk) * kvw, 2)), Vh = to_bf16(randv(static_cast<size_t>(nk) * kvw, 3));
    const auto Kf = widen(Kh), Vf = widen(Vh);
    const auto q = randv(static_cast<size_t>(M) * pb.n_heads * pb.head_dim, 4);
    StepMeta meta{140, 0, nk, 0};  // rows at 140..146 see up to 147 keys
    std::vector<float> ob(q.size()), of(q.size());
    be->attention(q.data(), Kh.data(), Vh.data(), ob.data(), M, pb, &meta);
    be->attention(q.data(), Kf.data(), Vf.data(), of.data(), M, pf, &meta);
    ASSERT_EQ(0, std::memcmp(ob.data(), of.data(), ob.size() * 4)) << "causal " << causal;
    for (int m = 0; m < M; m++) {
      const auto r = ref_row(q, Kf, Vf, m, pb, meta);
      // fp32 sums of 64 products and of <= 147 weighted rows (|v| < 5): ~1e-6 typical
      for (size_t i = 0; i < r.size(); i++) ASSERT_NEAR(ob[m * r.size() + i], r[i], 1e-5) << "row " << m << " i " << i;
    }
  }
}

// ---- CUDA -------------------------------------------------------------------------------------
#ifdef QFLASH_HAVE_CUDA

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
  auto C = make_cpu_backend()

template <class T>
DeviceBuffer up(Backend* be, const std::vector<T>& h) {
  DeviceBuffer b(be, h.size() * sizeof(T));
  if (!h.empty()) be->upload(b.get(), h.data(), h.size() * sizeof(T));
  return b;
}
template <class T>
std::vector<T> down(Backend* be, const void* p, size_t n) {
  std::vector<T> h(n);
  if (n) be->download(h.data(), p, n * sizeof(T));
  return h;
}
void poison(Backend* be, void* p, size_t bytes) {
  std::vector<uint8_t> h(bytes, 0xff);  // NaN everywhere: an unwritten output fails
  be->upload(p, h.data(), bytes);
}
const StepMeta* dmeta(const DeviceBuffer& b) { return reinterpret_cast<const StepMeta*>(b.get()); }

// The whole prompt (M rows, n output floats) through each variant in turn, on a stream of its own,
// into a NaN-poisoned output; outs gets each variant's output.
void run_variants(Backend* G, std::initializer_list<int> variants, const DeviceBuffer& dq, const DeviceBuffer& dK,
                  const DeviceBuffer& dV, const DeviceBuffer& dm, int M, const AttnParams& p, size_t n,
                  const std::string& tag, std::vector<std::vector<float>>* outs) {
  for (int variant : variants) {
    DeviceBuffer dout(G, n * 4);
    poison(G, dout.get(), dout.bytes());
    G->sync();
    cudaStream_t cs = nullptr;
    ASSERT_EQ(cudaSuccess, cudaStreamCreate(&cs));
    ASSERT_TRUE(cuda::attention_prefill(static_cast<const float*>(dq.get()), dK.get(), dV.get(), dout.f(), M, p,
                                        dmeta(dm), cs, variant))
        << tag;
    ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(cs)) << tag << " variant " << variant;
    cudaStreamDestroy(cs);
    outs->push_back(down<float>(G, dout.get(), n));
  }
}

TEST(CudaKvBf16, KvWriteMatchesCpuBitForBit) {
  NEED_GPU();
  const int width = 1024, M = 9, cap = 40;
  auto rows = randv(static_cast<size_t>(M) * width, 11, 50.0f);
  const uint32_t special[] = {0x3f808000u, 0x3f818000u, 0xbf818000u, 0x00008000u, 0x00018000u, 0x7f7fffffu,
                              0x7f800000u, 0xff800000u, 0x7fc00001u, 0xffa00000u, 0x80000000u, 0x00000001u};
  for (size_t i = 0; i < sizeof(special) / 4; i++) rows[i * 37] = bits_f(special[i]);
  std::vector<uint16_t> cache(static_cast<size_t>(cap) * width, 0x5555);
  StepMeta meta{1021, 1000, 0, 0};
  std::vector<uint16_t> ref = cache;
  C->kv_write(ref.data(), rows.data(), M, width, &meta, DType::BF16);
  DeviceBuffer dc = up(G, cache), dr = up(G, rows), dm = up(G, std::vector<StepMeta>{meta});
  G->kv_write(dc.get(), dr.f(), M, width, dmeta(dm), DType::BF16);
  const auto got = down<uint16_t>(G, dc.get(), cache.size());
  ASSERT_EQ(0, std::memcmp(got.data(), ref.data(), ref.size() * 2));
}

// A = scale max_j sum_d |q_d k_jd| over a sample of rows and keys, and max|V|: the two scales of
// the bounds below.
struct BoundScales {
  double A = 0, vmax = 0;
};
BoundScales bound_scales(int nh, int nkv, int hd, int M, float scale, const std::vector<float>& q,
                         const std::vector<float>& K, const std::vector<float>& V, int nkeys) {
  const int kvw = nkv * hd, group = nh / nkv;
  BoundScales b;
  for (float v : V) b.vmax = std::max(b.vmax, std::fabs(static_cast<double>(v)));
  for (int m = 0; m < M; m += 7)  // a sample of rows and keys sets the scale of A
    for (int h = 0; h < nh; h++)
      for (int j = 0; j < nkeys; j += 3) {
        double s = 0;
        for (int d = 0; d < hd; d++)
          s += std::fabs(static_cast<double>(q[(static_cast<size_t>(m) * nh + h) * hd + d]) *
                         K[static_cast<size_t>(j) * kvw + (h / group) * hd + d]);
        b.A = std::max(b.A, s * scale);
      }
  return b;
}

// Error bound of the tensor-core attention kernels (attention_group.cu for decode / verify,
// attention_prefill.cu) against float64 on the same bf16 K/V, in max|V| units. Scores: q is
// carried as bf16 hi + lo (relative 2^-18) and the tensor cores sum hd exact products in fp32
// (each add within 2^-23 relative, truncation allowed): |ds| <= (2^-18 + hd 2^-23) A, with
// A = scale max_j sum_d |q_d k_jd|; the normalised weights move by at most 2|ds| in total; P as
// hi + lo adds 2^-17, the fp32 sums over n keys n 2^-23.
double tc_attention_bound(int nh, int nkv, int hd, int M, float scale, const std::vector<float>& q,
                          const std::vector<float>& K, const std::vector<float>& V, int nkeys) {
  const BoundScales b = bound_scales(nh, nkv, hd, M, scale, q, K, V, nkeys);
  const double ds = (std::ldexp(1.0, -18) + hd * std::ldexp(1.0, -23)) * b.A * 1.5;  // 1.5: A from a sample
  return b.vmax * (2 * ds + std::ldexp(1.0, -17) + nkeys * std::ldexp(1.0, -23));
}

// The same bound for the v4b form (q and p as one bf16 piece each), against a float64 reference that
// is given bf16(q), so q's rounding is the reference's own: the scores keep only the fp32 sums'
// term (hd 2^-23 A); p rounded to bf16 moves each weight by at most 2^-8 of itself, so the output
// by at most 2^-8 max|V| (the row sums are of the unrounded p).
double tc_attention_bound_bf16p(int nh, int nkv, int hd, int M, float scale, const std::vector<float>& qr,
                                const std::vector<float>& K, const std::vector<float>& V, int nkeys) {
  const BoundScales b = bound_scales(nh, nkv, hd, M, scale, qr, K, V, nkeys);
  const double ds = hd * std::ldexp(1.0, -23) * b.A * 1.5;
  return b.vmax * (2 * ds + std::ldexp(1.0, -8) + nkeys * std::ldexp(1.0, -23));
}

// Decode / verify attention on bf16 K/V (the grouped kernel, attention_group.cu) against float64
// and the CPU twin with the bound above; row m of any M-row call (M = 1..20, several row blocks)
// and the decode of that row alone are bit-identical.
TEST(CudaKvBf16, DecodeAttentionMatchesReferenceAndRowInvariant) {
  NEED_GPU();
  struct Case {
    int nh, nkv, hd;
    bool causal;
    int window, n_ctx;
  };
  const Case cases[] = {
      {24, 4, 256, true, 0, 2100},  // the 27B's layer
      {24, 4, 256, true, 0, 5000},  // > 64 chunks: splits walk two chunks
      {6, 2, 128, true, 0, 300},    {4, 1, 64, true, 0, 5},     {4, 2, 64, true, 40, 700},
      {8, 8, 128, false, 0, 1500},  // non-causal: every row sees every key
  };
  for (const Case& c : cases) {
    const AttnParams p = params(c.nh, c.nkv, c.hd, c.causal, c.window, DType::BF16);
    const int Mmax = 20, kvw = c.nkv * c.hd, nkeys = c.n_ctx + Mmax;
    const auto K = to_bf16(randv(static_cast<size_t>(nkeys) * kvw, 6, 1.5f));
    const auto V = to_bf16(randv(static_cast<size_t>(nkeys) * kvw, 7));
    const auto q = randv(static_cast<size_t>(Mmax) * c.nh * c.hd, 8, 1.5f);
    const auto Kf = widen(K), Vf = widen(V);
    DeviceBuffer dK = up(G, K), dV = up(G, V), dq = up(G, q);
    const size_t rowf = static_cast<size_t>(c.nh) * c.hd;
    const std::string tag = "nh=" + std::to_string(c.nh) + " hd=" + std::to_string(c.hd) + " ctx=" + std::to_string(c.n_ctx);
    StepMeta meta{c.n_ctx, 0, nkeys, 0};
    std::vector<float> cpu(Mmax * rowf);
    C->attention(q.data(), K.data(), V.data(), cpu.data(), Mmax, p, &meta);
    DeviceBuffer dm = up(G, std::vector<StepMeta>{meta}), dout(G, cpu.size() * 4);
    poison(G, dout.get(), dout.bytes());
    G->attention(dq.f(), dK.get(), dV.get(), dout.f(), Mmax, p, dmeta(dm));
    const auto all = down<float>(G, dout.get(), cpu.size());
    const double tol = tc_attention_bound(c.nh, c.nkv, c.hd, Mmax, p.scale, q, Kf, Vf, nkeys);
    double worst = 0, worst_cpu = 0;
    for (int m = 0; m < Mmax; m++) {
      const auto r = ref_row(q, Kf, Vf, m, p, meta);
      for (size_t i = 0; i < rowf; i++) {
        worst = std::max(worst, std::fabs(all[m * rowf + i] - r[i]));
        worst_cpu = std::max(worst_cpu, std::fabs(cpu[m * rowf + i] - r[i]));
      }
    }
    ASSERT_LE(worst, tol) << tag << " (CPU twin: " << worst_cpu << ")";
    for (int M = 1; M <= Mmax; M++) {  // verify blocks of every size: causal rows see the same keys
      StepMeta mm{c.n_ctx, 0, c.causal ? c.n_ctx + M : nkeys, 0};
      DeviceBuffer dmm = up(G, std::vector<StepMeta>{mm}), o(G, M * rowf * 4);
      poison(G, o.get(), o.bytes());
      G->attention(dq.f(), dK.get(), dV.get(), o.f(), M, p, dmeta(dmm));
      ASSERT_EQ(0, std::memcmp(down<float>(G, o.get(), M * rowf).data(), all.data(), M * rowf * 4)) << tag << " M=" << M;
    }
    for (int m = 0; m < Mmax; m++) {  // decode: one row at its own position
      StepMeta m1{c.n_ctx + m, 0, c.causal ? c.n_ctx + m + 1 : nkeys, 0};
      DeviceBuffer dm1 = up(G, std::vector<StepMeta>{m1}), o(G, rowf * 4);
      poison(G, o.get(), o.bytes());
      G->attention(dq.f() + m * rowf, dK.get(), dV.get(), o.f(), 1, p, dmeta(dm1));
      ASSERT_EQ(0, std::memcmp(down<float>(G, o.get(), rowf).data(), all.data() + m * rowf, rowf * 4))
          << tag << " decode row " << m;
    }
  }
}

struct PrefillCase {
  int nh, nkv, hd;
  bool causal;
  int window, past, M, kv_pos0;
};

TEST(CudaAttentionPrefill, MatchesFloat64AndCpu) {
  NEED_GPU();
  const PrefillCase cases[] = {
      {24, 4, 256, true, 0, 0, 200, 0},     // the 27B's layer, a prompt from position 0
      {24, 4, 256, true, 0, 1000, 150, 0},  // a later prompt chunk after 1000 cached keys
      {6, 2, 128, true, 0, 70, 333, 0},     // group 3, ragged tiles
      {4, 2, 64, true, 40, 500, 90, 0},     // sliding window
      {2, 1, 64, true, 0, 3, 77, 5},        // group 2, offset buffer (kv_pos0 5)
      {4, 2, 64, false, 9, 22, 30, 78},     // non-causal window, as the drafter's geometry
      {8, 8, 128, false, 0, 130, 40, 0},    // non-causal, MHA
  };
  for (const PrefillCase& c : cases) {
    const AttnParams p = params(c.nh, c.nkv, c.hd, c.causal, c.window, DType::BF16);
    const int kvw = c.nkv * c.hd, nkeys = c.past + c.M;
    const auto Kh = to_bf16(randv(static_cast<size_t>(nkeys) * kvw, 21)), Vh = to_bf16(randv(static_cast<size_t>(nkeys) * kvw, 22));
    const auto Kf = widen(Kh), Vf = widen(Vh);
    const auto q = randv(static_cast<size_t>(c.M) * c.nh * c.hd, 23);
    const StepMeta meta{c.kv_pos0 + c.past, c.kv_pos0, nkeys, 0};
    DeviceBuffer dK = up(G, Kh), dV = up(G, Vh), dq = up(G, q), dm = up(G, std::vector<StepMeta>{meta});
    DeviceBuffer dout(G, q.size() * 4);
    poison(G, dout.get(), dout.bytes());
    G->attention_prefill(dq.f(), dK.get(), dV.get(), dout.f(), c.M, p, dmeta(dm));
    const auto got = down<float>(G, dout.get(), q.size());
    std::vector<float> cpu(q.size());
    C->attention_prefill(q.data(), Kh.data(), Vh.data(), cpu.data(), c.M, p, &meta);
    // The default kernel for this shape on this device: v1/v3 and v4 carry q and p as bf16 hi + lo
    // pieces (tc_attention_bound against float64 on the fp32 q); v4b/v5b (the sm_90a default for
    // head_dim 256) carry one bf16 piece each and are held to their own bound against float64
    // given bf16(q), as in check_v4_form. The CPU twin is always held to the fp32-q bound.
    const int runs = cuda::attention_prefill_runs(p);
    const bool one_piece = runs == cuda::kPrefillV4B || runs == cuda::kPrefillV5B;
    const auto qref = one_piece ? widen(to_bf16(q)) : q;
    const double tol = tc_attention_bound(c.nh, c.nkv, c.hd, c.M, p.scale, q, Kf, Vf, nkeys);
    const double tol_gpu = one_piece ? tc_attention_bound_bf16p(c.nh, c.nkv, c.hd, c.M, p.scale, qref, Kf, Vf, nkeys) : tol;
    const std::string tag = "nh=" + std::to_string(c.nh) + " hd=" + std::to_string(c.hd) + " past=" + std::to_string(c.past) +
                            " M=" + std::to_string(c.M) + " window=" + std::to_string(c.window) + " kernel v" +
                            std::to_string(runs == cuda::kPrefillV4B ? 4 : runs == cuda::kPrefillV5B ? 5 : runs) +
                            (one_piece ? "b" : "");
    const size_t rowf = static_cast<size_t>(c.nh) * c.hd;
    double worst = 0, worst_cpu = 0;
    for (int m = 0; m < c.M; m += (c.M > 100 ? 3 : 1)) {
      const auto r = ref_row(q, Kf, Vf, m, p, meta);
      const auto rg = one_piece ? ref_row(qref, Kf, Vf, m, p, meta) : r;
      for (size_t i = 0; i < rowf; i++) {
        worst = std::max(worst, std::fabs(got[m * rowf + i] - rg[i]));
        worst_cpu = std::max(worst_cpu, std::fabs(cpu[m * rowf + i] - r[i]));
      }
    }
    EXPECT_LE(worst, tol_gpu) << tag << " (CPU twin: " << worst_cpu << ")";
    EXPECT_LE(worst_cpu, tol) << tag;
    for (size_t i = 0; i < got.size(); i++) ASSERT_FALSE(std::isnan(got[i])) << tag << " element " << i;
  }
}

// A row's bits depend only on its own query and keys: the rows of one call equal the same rows
// computed in calls that start at other rows, with other lengths, and one row at a time.
TEST(CudaAttentionPrefill, RowAndSplitInvariantBitForBit) {
  NEED_GPU();
  const PrefillCase cases[] = {
      {24, 4, 256, true, 0, 64, 300, 0},
      {6, 2, 128, true, 0, 5, 200, 0},
      {4, 2, 64, true, 50, 130, 170, 0},
      {2, 1, 64, true, 0, 0, 260, 0},
  };
  for (const PrefillCase& c : cases) {
    const AttnParams p = params(c.nh, c.nkv, c.hd, c.causal, c.window, DType::BF16);
    const int kvw = c.nkv * c.hd, nkeys = c.past + c.M;
    const auto Kh = to_bf16(randv(static_cast<size_t>(nkeys) * kvw, 31)), Vh = to_bf16(randv(static_cast<size_t>(nkeys) * kvw, 32));
    const auto q = randv(static_cast<size_t>(c.M) * c.nh * c.hd, 33, 2.0f);
    DeviceBuffer dK = up(G, Kh), dV = up(G, Vh), dq = up(G, q);
    const size_t rowf = static_cast<size_t>(c.nh) * c.hd;
    const StepMeta meta{c.past, 0, nkeys, 0};
    DeviceBuffer dm = up(G, std::vector<StepMeta>{meta}), dall(G, q.size() * 4);
    poison(G, dall.get(), dall.bytes());
    G->attention_prefill(dq.f(), dK.get(), dV.get(), dall.f(), c.M, p, dmeta(dm));
    const auto all = down<float>(G, dall.get(), q.size());
    const std::string tag = "nh=" + std::to_string(c.nh) + " hd=" + std::to_string(c.hd);
    // [a, b): a prompt split anywhere; keys of a causal call end at its last row (n_kv = past + b)
    const int splits[][2] = {{0, 1}, {1, 2}, {5, 37}, {17, c.M}, {64, 128}, {63, c.M}, {c.M - 1, c.M}, {100, 117}};
    for (const auto& s : splits) {
      const int a = s[0], b = std::min(s[1], c.M);
      if (a >= b) continue;
      const StepMeta ms{c.past + a, 0, c.causal ? c.past + b : nkeys, 0};
      DeviceBuffer dms = up(G, std::vector<StepMeta>{ms}), o(G, (b - a) * rowf * 4);
      poison(G, o.get(), o.bytes());
      G->attention_prefill(dq.f() + a * rowf, dK.get(), dV.get(), o.f(), b - a, p, dmeta(dms));
      const auto part = down<float>(G, o.get(), (b - a) * rowf);
      for (int m = a; m < b; m++)
        ASSERT_EQ(0, std::memcmp(part.data() + (m - a) * rowf, all.data() + m * rowf, rowf * 4))
            << tag << " row " << m << " of the call [" << a << ", " << b << ")";
    }
  }
}

// Two variants that must give the same bits (B computes A's operations in A's order) on each case:
// the whole prompt through each, no NaN, every element equal. need_v3: every case must have v3's own
// kernel (none falls back to v1, which would pass trivially). Inputs from seed0 + nh * seed_nh + M.
template <size_t N>
void expect_same_bits(Backend* G, const PrefillCase (&cases)[N], uint64_t seed0, uint64_t seed_nh, int va, int vb,
                      const char* na, const char* nb, bool need_v3) {
  for (const PrefillCase& c : cases) {
    const AttnParams p = params(c.nh, c.nkv, c.hd, c.causal, c.window, DType::BF16);
    const std::string tag = "nh=" + std::to_string(c.nh) + " nkv=" + std::to_string(c.nkv) +
                            " hd=" + std::to_string(c.hd) + " past=" + std::to_string(c.past) +
                            " M=" + std::to_string(c.M) + " window=" + std::to_string(c.window) + (c.causal ? "" : " non-causal");
    if (need_v3) {
      ASSERT_TRUE(cuda::attention_prefill_v3_applies(p)) << tag;
    }
    const int kvw = c.nkv * c.hd, nkeys = c.past + c.M;
    const uint64_t seed = seed0 + static_cast<uint64_t>(c.nh) * seed_nh + c.M;
    const auto Kh = to_bf16(randv(static_cast<size_t>(nkeys) * kvw, seed, 1.5f));
    const auto Vh = to_bf16(randv(static_cast<size_t>(nkeys) * kvw, seed + 1));
    // wide scores: many probabilities underflow to 0, rows with one dominant key
    const auto q = randv(static_cast<size_t>(c.M) * c.nh * c.hd, seed + 2, 2.0f);
    const StepMeta meta{c.kv_pos0 + c.past, c.kv_pos0, nkeys, 0};
    DeviceBuffer dK = up(G, Kh), dV = up(G, Vh), dq = up(G, q), dm = up(G, std::vector<StepMeta>{meta});
    std::vector<std::vector<float>> outs;
    ASSERT_NO_FATAL_FAILURE(run_variants(G, {va, vb}, dq, dK, dV, dm, c.M, p, q.size(), tag, &outs));
    const size_t rowf = static_cast<size_t>(c.nh) * c.hd;
    for (size_t i = 0; i < outs[0].size(); i++) ASSERT_FALSE(std::isnan(outs[0][i])) << tag << " " << na << " element " << i;
    for (size_t i = 0; i < outs[0].size(); i++)
      ASSERT_EQ(0, std::memcmp(&outs[1][i], &outs[0][i], 4))
          << tag << ": " << nb << " differs from " << na << " at row " << i / rowf << " element " << i % rowf << " ("
          << outs[1][i] << " vs " << outs[0][i] << ")";
  }
}

// The prefill kernel's v3 (QFLASH_ATTN_PREFILL=v3: two key tiles per double-buffered stage, see
// attention_prefill.cu) computes each element with v1's operations in v1's order, so the outputs
// must be equal byte for byte: the 27B's head_dim 256 with 6 q heads per kv head, the small models'
// shapes, calls that start mid-prompt (keys already cached, an offset buffer), row counts that are
// no multiple of a block's rows, tile counts odd and even (a stage half outside the block's keys),
// windows, non-causal. Outputs start as NaN, so a row v3 fails to write shows up as a difference.
TEST(CudaAttentionPrefill, V3MatchesV1BitForBit) {
  NEED_GPU();
  (void)C;
  const PrefillCase cases[] = {
      {24, 4, 256, true, 0, 0, 300, 0},       // the 27B's layer, a prompt from position 0
      {24, 4, 256, true, 0, 1000, 77, 0},     // a later chunk after 1000 cached keys
      {24, 4, 256, true, 0, 37, 1100, 3},     // ragged start, offset buffer, many key tiles
      {24, 4, 256, true, 0, 0, 1, 0},         // one row
      {24, 4, 256, true, 0, 31, 66, 0},       // the first row's keys end inside a stage's second tile
      {24, 4, 256, true, 96, 500, 200, 0},    // sliding window at head_dim 256: stages start mid-range
      {4, 2, 64, true, 0, 0, 150, 0},         // the tiny/demo targets' attention
      {4, 2, 64, true, 64, 300, 130, 0},      // the same with a 64-key sliding window
      {6, 2, 128, true, 0, 70, 333, 0},       // group 3, head_dim 128
      {32, 8, 128, true, 2048, 2100, 90, 0},  // group 4, head_dim 128, window edge inside the keys
      {2, 1, 64, true, 0, 3, 77, 5},          // group 2, kv_pos0 5
      {4, 2, 64, false, 9, 22, 30, 78},       // non-causal window (the drafter's geometry)
      {8, 8, 128, false, 0, 130, 40, 0},      // non-causal, MHA
  };
  ASSERT_NO_FATAL_FAILURE(expect_same_bits(G, cases, 41, 7, cuda::kPrefillV1, cuda::kPrefillV3, "v1", "v3", true));
}

// v4 (QFLASH_ATTN_PREFILL=v4: wgmma on sm_90a, attention_prefill.cu) has bits of its own: against
// float64 within the same bound as v1/v3 (tc_attention_bound), no NaN, every row written, and a
// row's bits independent of the call: the rows of one call equal the same rows from calls that start
// elsewhere (with and without cached keys before them), with other lengths, one row at a time.
// variant kPrefillV4 (q and p as hi + lo bf16 pieces) or kPrefillV4B (one piece each; reference
// given bf16(q), tc_attention_bound_bf16p).
void check_v4_form(Backend* G, int variant) {
  const PrefillCase cases[] = {
      {24, 4, 256, true, 0, 0, 300, 0},     // the 27B's layer, a prompt from position 0
      {24, 4, 256, true, 0, 1000, 150, 0},  // a later chunk after 1000 cached keys
      {24, 4, 256, true, 0, 37, 1100, 3},   // ragged start, offset buffer, many key tiles
      {24, 4, 256, true, 0, 0, 1, 0},       // one row
      {24, 4, 256, true, 96, 500, 200, 0},  // sliding window: tiles before a row's range
      {4, 2, 256, true, 0, 63, 65, 0},      // group 2, the first row's keys end inside a tile
      {8, 4, 256, false, 0, 130, 40, 0},    // non-causal, every row sees every key
  };
  for (const PrefillCase& c : cases) {
    const AttnParams p = params(c.nh, c.nkv, c.hd, c.causal, c.window, DType::BF16);
    const std::string tag = "nh=" + std::to_string(c.nh) + " nkv=" + std::to_string(c.nkv) +
                            " past=" + std::to_string(c.past) + " M=" + std::to_string(c.M) +
                            " window=" + std::to_string(c.window) + (c.causal ? "" : " non-causal");
    // v4 must run on a compute capability 9.0 device (every shape here is one it covers); on other
    // GPUs kPrefillV4 runs v3, and the same checks hold for it.
    int dev = 0;
    cudaDeviceProp prop{};
    ASSERT_EQ(cudaSuccess, cudaGetDevice(&dev));
    ASSERT_EQ(cudaSuccess, cudaGetDeviceProperties(&prop, dev));
    if (prop.major == 9 && prop.minor == 0) {
      ASSERT_TRUE(cuda::attention_prefill_v4_applies(p)) << tag;
    }
    const int kvw = c.nkv * c.hd, nkeys = c.past + c.M;
    const uint64_t seed = 71 + static_cast<uint64_t>(c.nh) * 5 + c.M;
    const auto Kh = to_bf16(randv(static_cast<size_t>(nkeys) * kvw, seed, 1.5f));
    const auto Vh = to_bf16(randv(static_cast<size_t>(nkeys) * kvw, seed + 1));
    const auto q = randv(static_cast<size_t>(c.M) * c.nh * c.hd, seed + 2, 2.0f);
    const auto Kf = widen(Kh), Vf = widen(Vh);
    DeviceBuffer dK = up(G, Kh), dV = up(G, Vh), dq = up(G, q);
    const size_t rowf = static_cast<size_t>(c.nh) * c.hd;
    G->sync();
    cudaStream_t cs = nullptr;
    ASSERT_EQ(cudaSuccess, cudaStreamCreate(&cs));
    auto run = [&](int a, int b) {  // rows [a, b) of the prompt in one call, as v4
      const StepMeta ms{c.kv_pos0 + c.past + a, c.kv_pos0, c.causal ? c.past + b : nkeys, 0};
      DeviceBuffer dms = up(G, std::vector<StepMeta>{ms}), o(G, (b - a) * rowf * 4);
      poison(G, o.get(), o.bytes());
      G->sync();
      EXPECT_TRUE(cuda::attention_prefill(dq.f() + a * rowf, dK.get(), dV.get(), o.f(), b - a, p, dmeta(dms), cs,
                                          variant));
      EXPECT_EQ(cudaSuccess, cudaStreamSynchronize(cs)) << tag << " rows [" << a << ", " << b << ")";
      return down<float>(G, o.get(), (b - a) * rowf);
    };
    const auto all = run(0, c.M);
    for (size_t i = 0; i < all.size(); i++) ASSERT_FALSE(std::isnan(all[i])) << tag << " element " << i;
    const StepMeta meta{c.kv_pos0 + c.past, c.kv_pos0, nkeys, 0};
    const bool split = variant == cuda::kPrefillV4;
    const auto qref = split ? q : widen(to_bf16(q));  // v4b's input rounding is the reference's own
    const double tol = split ? tc_attention_bound(c.nh, c.nkv, c.hd, c.M, p.scale, q, Kf, Vf, nkeys)
                             : tc_attention_bound_bf16p(c.nh, c.nkv, c.hd, c.M, p.scale, qref, Kf, Vf, nkeys);
    double worst = 0, worst_exact_q = 0;
    for (int m = 0; m < c.M; m += (c.M > 100 ? 3 : 1)) {
      const auto r = ref_row(qref, Kf, Vf, m, p, meta);
      for (size_t i = 0; i < rowf; i++) worst = std::max(worst, std::fabs(all[m * rowf + i] - r[i]));
      if (!split) {  // reported only: the distance to the fp32-q reference, q's rounding included
        const auto r32 = ref_row(q, Kf, Vf, m, p, meta);
        for (size_t i = 0; i < rowf; i++) worst_exact_q = std::max(worst_exact_q, std::fabs(all[m * rowf + i] - r32[i]));
      }
    }
    EXPECT_LE(worst, tol) << tag;
    if (const char* e = std::getenv("QFLASH_TOL_REPORT"); e && *e == '1')
      std::printf("[ tol ] attention prefill %s %s: %.3e of %.3e (fp32-q reference: %.3e)\n",
                  split ? "v4" : variant == cuda::kPrefillV4B ? "v4b" : "v5b",
                  tag.c_str(), worst, tol, split ? worst : worst_exact_q);
    const int splits[][2] = {{0, 1}, {1, 2}, {5, 37}, {17, c.M}, {64, 128}, {63, c.M}, {c.M - 1, c.M}, {100, 117}};
    for (const auto& sp : splits) {
      const int a = sp[0], b = std::min(sp[1], c.M);
      if (a >= b) continue;
      const auto part = run(a, b);
      for (int m = a; m < b; m++)
        ASSERT_EQ(0, std::memcmp(part.data() + (m - a) * rowf, all.data() + m * rowf, rowf * 4))
            << tag << " row " << m << " of the call [" << a << ", " << b << ")";
    }
    cudaStreamDestroy(cs);
  }
}

TEST(CudaAttentionPrefill, V4MatchesFloat64AndIsRowAndSplitInvariant) {
  NEED_GPU();
  (void)C;
  check_v4_form(G, cuda::kPrefillV4);
}

// v4b (QFLASH_ATTN_PREFILL=v4b): the same checks, against float64 given bf16(q), within its own bound.
TEST(CudaAttentionPrefill, V4bMatchesFloat64AndIsRowAndSplitInvariant) {
  NEED_GPU();
  (void)C;
  check_v4_form(G, cuda::kPrefillV4B);
}

// v5b (QFLASH_ATTN_PREFILL=v5b: v4b's operations with P V(t) and S(t + 1) in flight together): v4b's
// bits exactly on the 27B shapes, and v4b's float64, row and split checks.
TEST(CudaAttentionPrefill, V5bEqualsV4bBitForBit) {
  NEED_GPU();
  (void)C;
  const PrefillCase cases[] = {
      {24, 4, 256, true, 0, 0, 300, 0},     // a prompt from position 0
      {24, 4, 256, true, 0, 1000, 150, 0},  // a later chunk after 1000 cached keys
      {24, 4, 256, true, 0, 37, 1100, 3},   // ragged start, offset buffer, many key tiles
      {24, 4, 256, true, 0, 0, 1, 0},       // one row: one tile
      {24, 4, 256, true, 0, 0, 64, 0},      // exactly one tile
      {24, 4, 256, true, 96, 500, 200, 0},  // sliding window
      {8, 4, 256, false, 0, 130, 40, 0},    // non-causal
  };
  ASSERT_NO_FATAL_FAILURE(expect_same_bits(G, cases, 91, 3, cuda::kPrefillV4B, cuda::kPrefillV5B, "v4b", "v5b", false));
  check_v4_form(G, cuda::kPrefillV5B);
}

#endif  // QFLASH_HAVE_CUDA

}  // namespace
}  // namespace qf
