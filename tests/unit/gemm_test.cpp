// Backend::gemm, the prefill GEMM: y[m, r] = sum_c bf16(x[m, c]) * W[r, c] in fp32.
//
// Tolerance. A product of two bf16 values is exact in fp32, so an implementation differs from
// the exact sum only by its additions: whatever their order, |fl(sum p_c) - sum p_c| <=
// gamma_{K-1} * sum |p_c| with gamma_n = n u / (1 - n u). u = 2^-24 for round-to-nearest (the
// CPU); u = 2^-23 covers tensor cores that truncate inside their fp32 accumulation. Two
// implementations then differ by at most the sum of their bounds. A wrong pairing of x and W
// (a layout or transpose bug) errs by about |y| ~ sum|p| / sqrt(K), far above these bounds for
// the K used here; so does skipping the bf16 rounding at small K (checked below).
//
// CUDA tests (CudaGemm.*) skip when no GPU is present; on the H200 they also check that a row's
// bits do not depend on M or on the row's place in the batch, for the 27B shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"

#if QFLASH_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "backend/cuda/gemm.h"
#include "backend/cuda/kernels.h"
#endif

namespace qf {
namespace {

double gamma_n(int64_t n, double u) { return n * u / (1.0 - n * u); }

std::vector<float> randn(size_t n, uint64_t seed, float s = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0, s);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

std::vector<uint16_t> rand_bf16(size_t n, uint64_t seed, float s) {
  auto f = randn(n, seed, s);
  std::vector<uint16_t> w(n);
  for (size_t i = 0; i < n; i++) w[i] = f32_to_bf16(f[i]);
  return w;
}

WeightRef bf16_ref(const std::vector<uint16_t>& w, int64_t rows, int64_t cols) {
  WeightRef r;
  r.dtype = DType::BF16;
  r.rows = rows;
  r.cols = cols;
  r.data = w.data();
  return r;
}

// Exact (double) sums of the products and of their magnitudes; `round` applies bf16 to x first.
struct Ref {
  std::vector<double> y, mag;
};
Ref reference(const std::vector<uint16_t>& w, const std::vector<float>& x, int64_t N, int64_t K, int M, bool round) {
  Ref r;
  r.y.resize(static_cast<size_t>(M) * N);
  r.mag.resize(r.y.size());
  for (int m = 0; m < M; m++)
    for (int64_t n = 0; n < N; n++) {
      double s = 0, a = 0;
      for (int64_t c = 0; c < K; c++) {
        const float xv = x[m * K + c];
        const double xd = round ? bf16_to_f32(f32_to_bf16(xv)) : xv;
        const double p = xd * bf16_to_f32(w[n * K + c]);
        s += p;
        a += std::fabs(p);
      }
      r.y[m * N + n] = s;
      r.mag[m * N + n] = a;
    }
  return r;
}

// Elements of `got` outside bound(i) = g * mag[i] of ref.y (NaN counts as outside).
size_t outside(const std::vector<float>& got, const Ref& ref, double g) {
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); i++)
    if (!(std::fabs(got[i] - ref.y[i]) <= g * ref.mag[i])) bad++;
  return bad;
}

TEST(CpuGemm, MatchesExactSumOfRoundedActivations) {
  auto be = make_cpu_backend();
  struct Shape {
    int64_t N, K;
    int M;
  };
  for (const Shape s : {Shape{37, 96, 5}, Shape{64, 1024, 3}, Shape{5, 8, 9}, Shape{130, 200, 17}}) {
    auto w = rand_bf16(s.N * s.K, 11 + s.K, 0.05f);
    auto x = randn(static_cast<size_t>(s.M) * s.K, 7 + s.N);
    std::vector<float> y(static_cast<size_t>(s.M) * s.N);
    be->gemm(bf16_ref(w, s.N, s.K), x.data(), y.data(), s.M);
    const double g = gamma_n(s.K - 1, std::ldexp(1.0, -24));
    EXPECT_EQ(outside(y, reference(w, x, s.N, s.K, s.M, true), g), 0u) << s.N << " x " << s.K;
    // Control: the unrounded activations' exact result is out of reach at small K.
    if (s.K <= 200) {
      EXPECT_GT(outside(y, reference(w, x, s.N, s.K, s.M, false), g), y.size() / 4) << s.N << " x " << s.K;
    }
  }
}

TEST(CpuGemm, RowInvariantAndRoundedMatmulForOtherDtypes) {
  auto be = make_cpu_backend();
  const int64_t N = 48, K = 160;
  const int M = 13;
  auto w = rand_bf16(N * K, 3, 0.05f);
  auto x = randn(static_cast<size_t>(M) * K, 4);
  std::vector<float> all(M * N), one(N);
  be->gemm(bf16_ref(w, N, K), x.data(), all.data(), M);
  for (int m = 0; m < M; m++) {
    be->gemm(bf16_ref(w, N, K), x.data() + m * K, one.data(), 1);
    EXPECT_EQ(0, std::memcmp(one.data(), all.data() + m * N, N * sizeof(float))) << "row " << m;
  }
  // f32 weights: the same function through the matmul on the rounded activations (backend.h).
  std::vector<float> wf(N * K), xr(x.size());
  for (size_t i = 0; i < wf.size(); i++) wf[i] = bf16_to_f32(w[i]);
  for (size_t i = 0; i < xr.size(); i++) xr[i] = bf16_to_f32(f32_to_bf16(x[i]));
  WeightRef r;
  r.dtype = DType::F32;
  r.rows = N;
  r.cols = K;
  r.data = wf.data();
  std::vector<float> a(M * N), b(M * N), c(M * N);
  be->gemm(r, x.data(), a.data(), M);
  be->matmul(r, xr.data(), b.data(), M);
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
  be->matmul(r, x.data(), c.data(), M);  // control: the unrounded activations give other bits
  EXPECT_NE(0, std::memcmp(a.data(), c.data(), a.size() * sizeof(float)));
}

// Random int4 weights in the mlx layout (words of 8 nibbles, bf16 scales and biases per group),
// with some groups whose bias is far from q * scale (so fl(q * scale + bias) rounds in fp32).
struct HostInt4 {
  int64_t N, K;
  int group;
  std::vector<uint32_t> q;
  std::vector<uint16_t> sc, bi;
  // The CPU twin's fp32 dequantization fl(fl(q * scale) + bias), and the contract's weight
  // (backend.h): its bf16_rn.
  float weight_f32(int64_t r, int64_t c) const {
    const int64_t ng = K / group;
    const uint32_t nib = (q[(r * K + c) / 8] >> (4 * (c % 8))) & 15u;
    const volatile float prod = static_cast<float>(nib) * bf16_to_f32(sc[r * ng + c / group]);
    const volatile float sum = prod + bf16_to_f32(bi[r * ng + c / group]);
    return sum;
  }
  uint16_t weight(int64_t r, int64_t c) const { return f32_to_bf16(weight_f32(r, c)); }
};
HostInt4 rand_int4(int64_t N, int64_t K, int group, uint64_t seed) {
  HostInt4 h{N, K, group, {}, {}, {}};
  std::mt19937_64 rng(seed);
  h.q.resize(static_cast<size_t>(N * K / 8));
  for (auto& w : h.q) w = static_cast<uint32_t>(rng());
  const size_t ng = static_cast<size_t>(N * (K / group));
  std::uniform_real_distribution<float> us(0.002f, 0.05f), ub(-0.4f, 0.0f);
  for (size_t i = 0; i < ng; i++) {
    h.sc.push_back(f32_to_bf16(us(rng)));
    // every 7th group: a bias 2^12 times the scale's size, so the fp32 sum must round
    h.bi.push_back(f32_to_bf16(i % 7 == 3 ? -300.0f * us(rng) : ub(rng)));
  }
  return h;
}
WeightRef int4_ref(const HostInt4& h, const void* q, const void* sc, const void* bi) {
  WeightRef r;
  r.dtype = DType::U32;
  r.rows = h.N;
  r.cols = h.K;
  r.group = h.group;
  r.data = q;
  r.scales = sc;
  r.biases = bi;
  return r;
}

// int4 weights (backend.h): the gemm multiplies bf16(x) by bf16_rn(fl(q * scale) + bias); the
// CPU twin gives exactly the bf16 gemm of those rounded weights, and not the exact-weight result.
TEST(CpuGemm, Int4WeightsEnterAsTheirBf16Rounding) {
  auto be = make_cpu_backend();
  const int64_t N = 40, K = 256;
  const int M = 7;
  const HostInt4 h = rand_int4(N, K, 64, 23);
  const WeightRef w4 = int4_ref(h, h.q.data(), h.sc.data(), h.bi.data());
  std::vector<uint16_t> wb(N * K);
  std::vector<float> wf(N * K);
  for (int64_t r = 0; r < N; r++)
    for (int64_t c = 0; c < K; c++) {
      wb[r * K + c] = h.weight(r, c);
      wf[r * K + c] = h.weight_f32(r, c);
    }
  auto x = randn(static_cast<size_t>(M) * K, 29);
  std::vector<float> a(M * N), b(M * N), c(M * N);
  be->gemm(w4, x.data(), a.data(), M);
  be->gemm(bf16_ref(wb, N, K), x.data(), b.data(), M);
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
  WeightRef wr;  // control: the unrounded fp32 weights give other bits
  wr.dtype = DType::F32;
  wr.rows = N;
  wr.cols = K;
  wr.data = wf.data();
  be->gemm(wr, x.data(), c.data(), M);
  EXPECT_NE(0, std::memcmp(a.data(), c.data(), a.size() * sizeof(float)));
}

#if QFLASH_HAVE_CUDA

// Uniform in [-1, 1) from splitmix64: fast enough for the 4096-row inputs of the 27B shapes.
std::vector<float> randu(size_t n, uint64_t seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; i++) v[i] = random_uniform_pm1(seed, i);
  return v;
}

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
  if (!G) GTEST_SKIP() << "no CUDA device: " << why_;

template <class T>
DeviceBuffer up(Backend* be, const std::vector<T>& h) {
  DeviceBuffer b(be, h.size() * sizeof(T));
  be->upload(b.get(), h.data(), h.size() * sizeof(T));
  return b;
}
template <class T>
std::vector<T> down(Backend* be, const void* p, size_t n) {
  std::vector<T> h(n);
  be->download(h.data(), p, n * sizeof(T));
  return h;
}
void poison(Backend* be, void* p, size_t bytes) {
  std::vector<uint8_t> h(bytes, 0xff);
  be->upload(p, h.data(), bytes);
}

// A bf16 matrix on the GPU, row-major and (when the backend relays it) in the GEMV's tiled layout.
struct GpuWeight {
  Backend* be;
  DeviceBuffer row;
  const void* tiled = nullptr;
  WeightRef ref_row, ref_tiled;
  GpuWeight(Backend* G, const std::vector<uint16_t>& w, int64_t N, int64_t K) : be(G), row(up(G, w)) {
    ref_row = bf16_ref(w, N, K);
    ref_row.data = row.get();
    uint8_t layout = 0;
    tiled = G->relayout_matrix(ref_row, &layout);
    if (tiled) {
      ref_tiled = ref_row;
      ref_tiled.data = tiled;
      ref_tiled.layout = layout;
    }
  }
  ~GpuWeight() {
    if (tiled) be->release_weight(tiled);
  }
  GpuWeight(const GpuWeight&) = delete;
  GpuWeight& operator=(const GpuWeight&) = delete;
};

std::vector<float> gpu_gemm(Backend* G, const WeightRef& W, const DeviceBuffer& x, int M, size_t x_off = 0) {
  DeviceBuffer y(G, static_cast<size_t>(M) * W.rows * sizeof(float));
  poison(G, y.get(), y.bytes());
  G->gemm(W, x.f() + x_off * W.cols, y.f(), M);
  return down<float>(G, y.get(), static_cast<size_t>(M) * W.rows);
}

TEST(CudaGemm, Bf16RoundingMatchesCpuBitForBit) {
  NEED_GPU();
  std::vector<float> v = randn(1001, 5, 3.0f);
  const float specials[] = {1.0f + std::ldexp(1.0f, -8), 1.0f + 3 * std::ldexp(1.0f, -8), -(1.0f + std::ldexp(1.0f, -8)),
                            std::ldexp(1.0f, -130), -std::ldexp(3.0f, -140), 3.3895314e38f, INFINITY, -INFINITY,
                            NAN, 0.0f, -0.0f, 65504.0f};
  for (size_t i = 0; i < sizeof(specials) / sizeof(specials[0]); i++) v[3 * i + 1] = specials[i];
  auto d = up(G, v);
  DeviceBuffer out(G, (v.size() + 8) * 2);
  cudaStream_t st = nullptr;
  ASSERT_EQ(cudaSuccess, cudaStreamCreate(&st));
  G->sync();  // the uploads ran on the backend's stream
  for (size_t off : {size_t(0), size_t(1)}) {  // aligned (vector path) and misaligned (scalar path)
    const size_t n = v.size() - off;
    cuda::gemm_to_bf16(d.f() + off, static_cast<uint16_t*>(out.get()), n, st);
    cudaStreamSynchronize(st);
    auto got = down<uint16_t>(G, out.get(), n);
    for (size_t i = 0; i < n; i++) ASSERT_EQ(got[i], f32_to_bf16(v[i + off])) << "element " << i + off << " = " << v[i + off];
  }
  cudaStreamDestroy(st);
}

TEST(CudaGemm, UntileInvertsTheGemvLayout) {
  NEED_GPU();
  for (auto [N, K] : {std::pair<int64_t, int64_t>{70, 128}, {32, 64}, {97, 320}}) {
    auto w = rand_bf16(N * K, 9, 1.0f);
    auto d = up(G, w);
    DeviceBuffer t(G, cuda::gemv_tc_tiled_bytes(N, K)), back(G, N * K * 2);
    cudaStream_t st = nullptr;
    ASSERT_EQ(cudaSuccess, cudaStreamCreate(&st));
    G->sync();
    cuda::gemv_tc_relayout(d.get(), t.get(), N, K, st);
    cuda::gemm_untile(t.get(), back.get(), N, K, st);
    ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(st));
    cudaStreamDestroy(st);
    EXPECT_EQ(down<uint16_t>(G, back.get(), N * K), w) << N << " x " << K;
  }
}

// The int4 route's dequantization (q4_dequant_bf16), from the row-major mlx layout and from the
// GEMV's kTcQ4 tiles (rows not a multiple of 32, every group size), is the host formula bit for bit.
TEST(CudaGemm, Int4DequantizationIsTheCpuFormulaBitForBit) {
  NEED_GPU();
  struct Shape {
    int64_t N, K;
    int group;
  };
  for (const Shape s : {Shape{70, 256, 64}, Shape{33, 128, 32}, Shape{96, 384, 128}, Shape{5, 64, 64}}) {
    const HostInt4 h = rand_int4(s.N, s.K, s.group, 17 + s.N);
    auto dq = up(G, h.q);
    auto ds = up(G, h.sc);
    auto db = up(G, h.bi);
    const WeightRef rm = int4_ref(h, dq.get(), ds.get(), db.get());
    std::vector<uint16_t> want(static_cast<size_t>(s.N * s.K));
    for (int64_t r = 0; r < s.N; r++)
      for (int64_t c = 0; c < s.K; c++) want[r * s.K + c] = h.weight(r, c);
    uint8_t layout = 0;
    const void* tiled = G->relayout_matrix(rm, &layout);
    ASSERT_NE(tiled, nullptr) << "the CUDA backend relays int4 " << s.N << " x " << s.K << " out";
    ASSERT_EQ(layout, WeightRef::kTcQ4);
    WeightRef tr = rm;
    tr.data = tiled;
    tr.layout = layout;
    tr.scales = tr.biases = nullptr;
    DeviceBuffer out(G, want.size() * 2);
    cudaStream_t st = nullptr;
    ASSERT_EQ(cudaSuccess, cudaStreamCreate(&st));
    G->sync();
    const WeightRef* both[2] = {&rm, &tr};
    for (const WeightRef* W : both) {
      poison(G, out.get(), out.bytes());
      G->sync();
      cuda::q4_dequant_bf16(*W, out.get(), st);
      ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(st));
      const auto got = down<uint16_t>(G, out.get(), want.size());
      size_t bad = 0, first = 0;
      for (size_t i = 0; i < want.size(); i++)
        if (got[i] != want[i] && bad++ == 0) first = i;
      EXPECT_EQ(bad, 0u) << s.N << " x " << s.K << " group " << s.group << (W->layout ? " tiled" : " row-major")
                         << ": first at row " << first / s.K << " col " << first % s.K;
    }
    cudaStreamDestroy(st);
    G->release_weight(tiled);
  }
}

TEST(CudaGemm, MatchesCpuTwinAndExactSum) {
  NEED_GPU();
  auto C = make_cpu_backend();
  struct Shape {
    int64_t N, K;
  };
  // cuBLASLt shapes (the 27B's a/b projection, small and odd row counts) and the CUDA-core
  // fallback's (N % 4 != 0, K % 8 != 0).
  for (const Shape s : {Shape{48, 5120}, Shape{96, 320}, Shape{100, 1024}, Shape{6, 256}, Shape{40, 100}}) {
    auto w = rand_bf16(s.N * s.K, 21 + s.N, 0.05f);
    GpuWeight gw(G, w, s.N, s.K);
    for (int M : {1, 5, 64, 300}) {
      auto x = randn(static_cast<size_t>(M) * s.K, 31 + M);
      auto dx = up(G, x);
      std::vector<float> cpu(static_cast<size_t>(M) * s.N);
      C->gemm(bf16_ref(w, s.N, s.K), x.data(), cpu.data(), M);
      const Ref ref = reference(w, x, s.N, s.K, M, true);
      const double g23 = gamma_n(s.K - 1, std::ldexp(1.0, -23)), g24 = gamma_n(s.K - 1, std::ldexp(1.0, -24));
      std::vector<const WeightRef*> layouts = {&gw.ref_row};
      if (gw.tiled) layouts.push_back(&gw.ref_tiled);
      for (const WeightRef* W : layouts) {
        auto got = gpu_gemm(G, *W, dx, M);
        const std::string what = std::to_string(s.N) + " x " + std::to_string(s.K) + " M=" + std::to_string(M) +
                                 (W->layout ? " tiled" : " row-major");
        EXPECT_EQ(outside(got, ref, g23), 0u) << what << ": GPU vs the exact sum";
        size_t far = 0;
        for (size_t i = 0; i < got.size(); i++)
          if (!(std::fabs(static_cast<double>(got[i]) - cpu[i]) <= (g23 + g24) * ref.mag[i])) far++;
        EXPECT_EQ(far, 0u) << what << ": GPU vs the CPU twin";
      }
    }
  }
}

// Row m's bits for every M and every place in the batch, on the 27B projection shapes (plus a
// small one), for both weight layouts: the contract the prefill's split invariance rests on.
TEST(CudaGemm, RowInvariantOnPrefillShapes) {
  NEED_GPU();
  struct Shape {
    int64_t N, K;
  };
  const char* route = std::getenv("QFLASH_GEMM");
  const bool lt = !route || !*route || std::strcmp(route, "lt") == 0;
  const int Mmax = 4096, shift = 37;
  for (const Shape s : {Shape{17408, 5120}, Shape{5120, 17408}, Shape{10240, 5120}, Shape{5120, 6144}, Shape{48, 5120},
                        Shape{12288, 5120}, Shape{96, 320}}) {
    std::vector<uint16_t> w(s.N * s.K);
    for (size_t i = 0; i < w.size(); i++) w[i] = f32_to_bf16(0.02f * random_uniform_pm1(41, i));
    GpuWeight gw(G, w, s.N, s.K);
    auto x = randu(static_cast<size_t>(Mmax + shift) * s.K, 43);
    auto dx = up(G, x);
    std::vector<float> row_full;
    for (const WeightRef* W : {&gw.ref_row, gw.tiled ? &gw.ref_tiled : nullptr}) {
      if (!W) continue;
      const std::string what = std::to_string(s.N) + " x " + std::to_string(s.K) + (W->layout ? " tiled" : " row-major");
      const std::vector<float> full = gpu_gemm(G, *W, dx, Mmax);
      for (int M : {1, 2, 7, 64, 127, 128, 129, 255, 256, 257, 1000, 2048}) {
        auto y = gpu_gemm(G, *W, dx, M);
        EXPECT_EQ(0, std::memcmp(y.data(), full.data(), y.size() * sizeof(float))) << what << " M=" << M;
      }
      // The same rows at another place in the batch (a different tile row for each).
      auto ys = gpu_gemm(G, *W, dx, Mmax - shift, shift);
      EXPECT_EQ(0, std::memcmp(ys.data(), full.data() + shift * s.N, ys.size() * sizeof(float))) << what << " shifted";
      for (float v : full) ASSERT_TRUE(std::isfinite(v)) << what;
      if (W->layout == 0) {
        row_full = full;
      } else if (lt) {  // cuBLASLt reads tiled weights through the untile copy: the row-major bits
        EXPECT_EQ(0, std::memcmp(full.data(), row_full.data(), full.size() * sizeof(float))) << what << " vs row-major";
      }
    }
  }
}

// The prefill GEMM's kept row-major copies (gemm.h, QFLASH_PREFILL_WEIGHTS=auto, the default): a
// tiled weight's first GEMM makes its copy only when the copies then fit in the budget, every
// GEMM with or without a copy gives the untiled bits for every M (the copy is the same matrix,
// read by the same pinned configuration), and releasing the weight releases its copy.
TEST(CudaGemm, KeptWeightCopiesGiveTheUntiledBitsWithinTheBudget) {
  NEED_GPU();
  // Under QFLASH_PREFILL_WEIGHTS=untile no copy is ever kept, under keep every one is (the budget
  // aside); the bits are the same in every mode.
  const char* mode = std::getenv("QFLASH_PREFILL_WEIGHTS");
  const bool untile = mode && std::strcmp(mode, "untile") == 0, keep_all = mode && std::strcmp(mode, "keep") == 0;
  const size_t base = G->prefill_copy_bytes();
  for (auto [N, K] : {std::pair<int64_t, int64_t>{96, 320}, {5120, 6144}, {48, 5120}}) {
    const size_t bytes = static_cast<size_t>(N) * K * 2;
    {
      auto w = rand_bf16(N * K, 51 + N, 0.05f);
      GpuWeight gw(G, w, N, K);
      ASSERT_NE(gw.tiled, nullptr) << N << " x " << K << ": not relaid for the GEMV";
      for (int M : {1, 64, 300}) {
        auto x = randn(static_cast<size_t>(M) * K, 61 + M);
        auto dx = up(G, x);
        // One byte short: at the first M no copy exists yet and none is made (untiled into scratch);
        // at the later M the copy made at the first one stays (a budget cut keeps what exists).
        const bool made = !untile && (keep_all || M != 1);
        G->set_prefill_copy_budget(base + bytes - 1);
        const auto a = gpu_gemm(G, gw.ref_tiled, dx, M);
        EXPECT_EQ(G->prefill_copy_bytes(), made ? base + bytes : base) << N << " x " << K << " M=" << M << ": over the budget";
        G->set_prefill_copy_budget(base + bytes);  // fits: the copy is made (first M) or reused
        const auto b = gpu_gemm(G, gw.ref_tiled, dx, M);
        EXPECT_EQ(G->prefill_copy_bytes(), untile ? base : base + bytes) << N << " x " << K << " M=" << M;
        G->set_prefill_copy_budget(0);  // a budget cut later keeps what exists
        const auto c = gpu_gemm(G, gw.ref_tiled, dx, M);
        EXPECT_EQ(G->prefill_copy_bytes(), untile ? base : base + bytes) << N << " x " << K << " M=" << M;
        const auto r = gpu_gemm(G, gw.ref_row, dx, M);
        for (float v : a) ASSERT_TRUE(std::isfinite(v)) << N << " x " << K << " M=" << M;
        EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << N << " x " << K << " M=" << M;
        EXPECT_EQ(0, std::memcmp(a.data(), c.data(), a.size() * sizeof(float))) << N << " x " << K << " M=" << M;
        EXPECT_EQ(0, std::memcmp(a.data(), r.data(), a.size() * sizeof(float))) << N << " x " << K << " M=" << M
                                                                                << " vs the row-major weight";
      }
    }  // gw released: its copy too
    EXPECT_EQ(G->prefill_copy_bytes(), base) << N << " x " << K << ": the copy outlived its weight";
  }
  // int4, row-major and relaid: the kept copy is the dequantized bf16 matrix (N x K x 2 bytes).
  {
    const int64_t N = 96, K = 384;
    const HostInt4 h = rand_int4(N, K, 64, 29);
    auto dq = up(G, h.q);
    auto ds = up(G, h.sc);
    auto db = up(G, h.bi);
    const WeightRef rm = int4_ref(h, dq.get(), ds.get(), db.get());
    uint8_t layout = 0;
    const void* tiled = G->relayout_matrix(rm, &layout);
    ASSERT_NE(tiled, nullptr);
    WeightRef tr = rm;
    tr.data = tiled;
    tr.layout = layout;
    tr.scales = tr.biases = nullptr;
    const size_t bytes = static_cast<size_t>(N) * K * 2;
    auto x = randn(static_cast<size_t>(70) * K, 71);
    auto dx = up(G, x);
    G->set_prefill_copy_budget(base + bytes - 1);
    const auto a = gpu_gemm(G, tr, dx, 70), a_rm = gpu_gemm(G, rm, dx, 70);
    EXPECT_EQ(G->prefill_copy_bytes(), keep_all ? base + 2 * bytes : base) << "int4: over the budget";
    G->set_prefill_copy_budget(base + 2 * bytes);
    const auto b = gpu_gemm(G, tr, dx, 70), b_rm = gpu_gemm(G, rm, dx, 70), c = gpu_gemm(G, tr, dx, 70);
    EXPECT_EQ(G->prefill_copy_bytes(), untile ? base : base + 2 * bytes) << "int4: one dequantized copy per matrix";
    for (const auto* v : {&a_rm, &b, &b_rm, &c})
      EXPECT_EQ(0, std::memcmp(a.data(), v->data(), a.size() * sizeof(float))) << "int4 kept copy vs dequantized per call";
    G->release_weight(tiled);
    EXPECT_EQ(G->prefill_copy_bytes(), untile ? base : base + bytes) << "int4: the relaid matrix's copy outlived it";
  }  // dq released (a plain buffer): the row-major int4 matrix's copy goes with it
  EXPECT_EQ(G->prefill_copy_bytes(), base) << "int4: the row-major matrix's copy outlived its buffer";
  G->set_prefill_copy_budget(0);
}

#endif  // QFLASH_HAVE_CUDA

}  // namespace
}  // namespace qf
