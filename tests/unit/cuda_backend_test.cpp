// CUDA backend: every op against the CPU twin (per-op tolerances relative to max|ref|), and
// row-invariance on the GPU itself (row m of an M-row call is bit-identical to the same row of
// any other call, M = 1..16 and beyond). Outputs are poisoned with NaN before every GPU call so
// an element the kernel forgot to write fails the comparison. Every test skips when no CUDA
// device is present, so CPU-only machines pass.
#ifdef QFLASH_HAVE_CUDA

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "model/qwen38.h"
#include "support/fixtures.h"
#include "support/test_models.h"

#if QFLASH_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "backend/cuda/kernels.h"
#endif

namespace qf {
namespace {

using test::close_rel;

// One CUDA backend for the whole suite (a context per test would only cost time).
Backend* gpu(std::string* why = nullptr) {
  static std::unique_ptr<Backend> be;
  static std::string reason;
  static bool tried = false;
  if (!tried) {
    tried = true;
    be = make_cuda_backend(&reason);
  }
  if (why) *why = reason;
  return be.get();
}

#define NEED_GPU()                                       \
  std::string why_;                                      \
  Backend* G = gpu(&why_);                               \
  if (!G) GTEST_SKIP() << "no CUDA device: " << why_;    \
  auto C = make_cpu_backend()

std::vector<float> randv(size_t n, uint64_t seed, float s = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0, s);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

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
// NaN (all-ones bytes) in every element: an unwritten output cannot pass a comparison.
void poison(Backend* be, void* p, size_t bytes) {
  std::vector<uint8_t> h(bytes, 0xff);
  be->upload(p, h.data(), bytes);
}
// Poisoned outputs of M rows for each weight of a group (rows[i] columns each), and their pointers.
struct GroupOut {
  std::vector<DeviceBuffer> dy;
  std::vector<float*> yp;
};
GroupOut group_out(Backend* be, const std::vector<int64_t>& rows, int M) {
  GroupOut o;
  for (int64_t r : rows) {
    o.dy.emplace_back(be, static_cast<size_t>(M) * r * sizeof(float));
    poison(be, o.dy.back().get(), o.dy.back().bytes());
    o.yp.push_back(o.dy.back().f());
  }
  return o;
}
bool same_bits(const std::vector<float>& a, const float* b, size_t n) {
  return a.size() >= n && std::memcmp(a.data(), b, n * sizeof(float)) == 0;
}

// A weight matrix held on the host (CPU backend reads it in place) and on the GPU.
struct TestWeight {
  DType dt = DType::BF16;
  int64_t rows = 0, cols = 0;
  int group = 0;
  std::vector<uint8_t> data;
  std::vector<uint16_t> scales, biases;
  DeviceBuffer d_data, d_scales, d_biases;
  WeightRef host() const {
    WeightRef w;
    w.dtype = dt;
    w.rows = rows;
    w.cols = cols;
    w.data = data.data();
    w.group = group;
    if (dt == DType::U32) {
      w.scales = scales.data();
      w.biases = biases.data();
    }
    return w;
  }
  WeightRef dev() const {
    WeightRef w = host();
    w.data = d_data.get();
    if (dt == DType::U32) {
      w.scales = d_scales.get();
      w.biases = d_biases.get();
    }
    return w;
  }
};

TestWeight make_weight(Backend* G, DType dt, int64_t rows, int64_t cols, uint64_t seed, int group = 64) {
  TestWeight t;
  t.dt = dt;
  t.rows = rows;
  t.cols = cols;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0, 1);
  const size_t n = static_cast<size_t>(rows) * cols;
  if (dt == DType::U32) {
    t.group = group;
    t.data.resize(n / 2);
    for (auto& b : t.data) b = static_cast<uint8_t>(rng());
    const size_t ng = static_cast<size_t>(rows) * (cols / group);
    t.scales.resize(ng);
    t.biases.resize(ng);
    for (size_t i = 0; i < ng; i++) {
      t.scales[i] = f32_to_bf16(0.02f * (1.0f + static_cast<float>(rng() % 100) / 50.0f));
      t.biases[i] = f32_to_bf16(-0.15f + 0.003f * static_cast<float>(rng() % 100));
    }
    t.d_scales = up(G, t.scales);
    t.d_biases = up(G, t.biases);
  } else if (dt == DType::F32) {
    t.data.resize(n * 4);
    for (size_t i = 0; i < n; i++) {
      const float v = nd(rng);
      std::memcpy(t.data.data() + 4 * i, &v, 4);
    }
  } else {
    t.data.resize(n * 2);
    for (size_t i = 0; i < n; i++) {
      const uint16_t h = dt == DType::BF16 ? f32_to_bf16(nd(rng)) : f32_to_f16(nd(rng));
      std::memcpy(t.data.data() + 2 * i, &h, 2);
    }
  }
  t.d_data = up(G, t.data);
  return t;
}

// ---------------------------------------------------------------------------------------------
TEST(CudaBackend, ReportsDeviceOrReason) {
  EXPECT_TRUE(cuda_compiled());
  std::string why;
  auto be = make_cuda_backend(&why);
  if (!be) {
    EXPECT_FALSE(why.empty());
    GTEST_SKIP() << "no CUDA device: " << why;
  }
  EXPECT_TRUE(be->is_gpu());
  EXPECT_EQ(be->name().rfind("cuda", 0), 0u) << be->name();
  EXPECT_GT(be->memory_used(), 0u);
}

TEST(CudaBackend, MemoryOps) {
  NEED_GPU();
  // alloc is zero-filled
  DeviceBuffer z(G, 1 << 20);
  auto zh = down<uint8_t>(G, z.get(), 1 << 20);
  EXPECT_TRUE(std::all_of(zh.begin(), zh.end(), [](uint8_t b) { return b == 0; }));
  // upload / download round trip, fill_zero
  auto v = randv(5000, 1);
  DeviceBuffer a = up(G, v);
  EXPECT_TRUE(same_bits(down<float>(G, a.get(), 5000), v.data(), 5000));
  G->fill_zero(a.f() + 100, 50 * sizeof(float));
  auto a2 = down<float>(G, a.get(), 5000);
  for (int i = 0; i < 5000; i++) ASSERT_EQ(a2[i], (i >= 100 && i < 150) ? 0.0f : v[i]) << i;
  // copy with memmove semantics, both directions
  for (int shift : {-700, -1, 1, 333, 1500, 2000}) {
    DeviceBuffer b = up(G, v);
    std::vector<float> ref = v;
    const int n = 2000, s0 = 1000, d0 = s0 + shift;
    std::memmove(ref.data() + d0, ref.data() + s0, n * sizeof(float));
    G->copy(b.f() + d0, b.f() + s0, n * sizeof(float));
    EXPECT_TRUE(same_bits(down<float>(G, b.get(), 5000), ref.data(), 5000)) << "shift " << shift;
  }
  // copy_2d between strided row sets
  {
    DeviceBuffer b = up(G, v), d(G, 5000 * sizeof(float));
    std::vector<float> ref(5000, 0.0f);
    C->copy_2d(ref.data() + 7, 300, v.data() + 3, 250, 10, 120);
    G->copy_2d(d.f() + 7, 300, b.f() + 3, 250, 10, 120);
    EXPECT_TRUE(same_bits(down<float>(G, d.get(), 5000), ref.data(), 5000));
  }
  // import_weight across several staging chunks
  std::vector<uint8_t> big((size_t(70) << 20) + 12345);
  std::mt19937_64 rng(5);
  for (size_t i = 0; i < big.size(); i += 8) {
    const uint64_t x = rng();
    std::memcpy(big.data() + i, &x, std::min<size_t>(8, big.size() - i));
  }
  const void* w = G->import_weight(big.data(), big.size());
  auto back = down<uint8_t>(G, w, big.size());
  EXPECT_EQ(0, std::memcmp(back.data(), big.data(), big.size()));
  G->release_weight(w);
  // fill_random equals the CPU twin bit for bit
  for (DType dt : {DType::BF16, DType::F32}) {
    const size_t n = 100003, bytes = n * (dt == DType::BF16 ? 2 : 4);
    DeviceBuffer g(G, bytes);
    std::vector<uint8_t> hc(bytes);
    G->fill_random(g.get(), n, dt, 1234, 0.37f);
    C->fill_random(hc.data(), n, dt, 1234, 0.37f);
    auto hg = down<uint8_t>(G, g.get(), bytes);
    EXPECT_EQ(0, std::memcmp(hg.data(), hc.data(), bytes)) << dtype_name(dt);
  }
}

TEST(CudaBackend, OutOfMemoryAndDeviceChecksThrow) {
  NEED_GPU();
  try {
    G->alloc(size_t(1) << 50);
    FAIL() << "1 PiB allocation succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Backend);
    EXPECT_NE(std::string(e.what()).find("out of device memory"), std::string::npos) << e.what();
  }
  // a token id outside the table is reported at the next sync
  auto E = make_weight(G, DType::BF16, 10, 16, 3);
  DeviceBuffer ids = up(G, std::vector<int32_t>{1, 10});
  DeviceBuffer out(G, 2 * 16 * sizeof(float));
  G->embed(E.dev(), ids.i(), out.f(), 2);
  EXPECT_THROW(G->sync(), Error);
  G->sync();  // the record was cleared
  // a KV write before the cache start
  StepMeta bad{3, 5, 8, 0};
  DeviceBuffer meta = up(G, std::vector<StepMeta>{bad});
  DeviceBuffer cache(G, 16 * 8 * sizeof(float)), rows(G, 8 * sizeof(float));
  G->kv_write(cache.f(), rows.f(), 1, 8, reinterpret_cast<const StepMeta*>(meta.get()));
  EXPECT_THROW(G->sync(), Error);
  G->sync();
}

// ---- matmul ---------------------------------------------------------------------------------
struct MmShape {
  int64_t rows, cols;
};
const MmShape kShapes[] = {{37, 203}, {64, 512}, {48, 5120}, {300, 1000}, {1024, 4096}, {5, 8}, {129, 776}};

TEST(CudaMatmul, MatchesCpuAllDtypes) {
  NEED_GPU();
  for (DType dt : {DType::BF16, DType::F16, DType::F32}) {
    for (const MmShape& s : kShapes) {
      auto W = make_weight(G, dt, s.rows, s.cols, 10 + s.rows);
      for (int M : {1, 3, 8, 16, 21}) {
        auto x = randv(static_cast<size_t>(M) * s.cols, 20 + M);
        std::vector<float> ref(static_cast<size_t>(M) * s.rows);
        C->matmul(W.host(), x.data(), ref.data(), M);
        DeviceBuffer dx = up(G, x), dy(G, ref.size() * sizeof(float));
        poison(G, dy.get(), dy.bytes());
        G->matmul(W.dev(), dx.f(), dy.f(), M);
        auto got = down<float>(G, dy.get(), ref.size());
        ASSERT_TRUE(close_rel(got, ref, 1e-5, std::string(dtype_name(dt)) + " " + std::to_string(s.rows) + "x" +
                                                  std::to_string(s.cols) + " M=" + std::to_string(M)));
      }
    }
  }
}

TEST(CudaMatmul, Int4MatchesCpu) {
  NEED_GPU();
  struct Q {
    int64_t rows, cols;
    int group;
  };
  for (const Q& q : {Q{64, 512, 64}, Q{40, 200, 40}, Q{128, 4096, 128}, Q{33, 1024, 32}, Q{300, 5120, 64}}) {
    auto W = make_weight(G, DType::U32, q.rows, q.cols, 7 + q.rows, q.group);
    for (int M : {1, 4, 9, 16}) {
      auto x = randv(static_cast<size_t>(M) * q.cols, 30 + M);
      std::vector<float> ref(static_cast<size_t>(M) * q.rows);
      C->matmul(W.host(), x.data(), ref.data(), M);
      DeviceBuffer dx = up(G, x), dy(G, ref.size() * sizeof(float));
      poison(G, dy.get(), dy.bytes());
      G->matmul(W.dev(), dx.f(), dy.f(), M);
      ASSERT_TRUE(close_rel(down<float>(G, dy.get(), ref.size()), ref, 1e-5,
                            "int4 " + std::to_string(q.rows) + "x" + std::to_string(q.cols) + " g" +
                                std::to_string(q.group) + " M=" + std::to_string(M)));
    }
  }
}

// Row m of any call equals the same input row in any other call, bit for bit.
TEST(CudaMatmul, RowInvariantOnDevice) {
  NEED_GPU();
  for (DType dt : {DType::BF16, DType::F16, DType::F32, DType::U32}) {
    for (const MmShape& s : {MmShape{37, 256}, MmShape{48, 5120}, MmShape{300, 1000}, MmShape{1024, 4096}}) {
      if (dt == DType::U32 && s.cols % 64 != 0) continue;
      auto W = make_weight(G, dt, s.rows, s.cols, 50 + s.rows);
      const int maxM = 40;
      auto x = randv(static_cast<size_t>(maxM) * s.cols, 60);
      DeviceBuffer dx = up(G, x);
      // reference: every row alone (M = 1)
      std::vector<float> one(static_cast<size_t>(maxM) * s.rows);
      DeviceBuffer dy1(G, s.rows * sizeof(float));
      for (int m = 0; m < maxM; m++) {
        poison(G, dy1.get(), dy1.bytes());
        G->matmul(W.dev(), dx.f() + static_cast<size_t>(m) * s.cols, dy1.f(), 1);
        auto r = down<float>(G, dy1.get(), s.rows);
        std::copy(r.begin(), r.end(), one.begin() + static_cast<size_t>(m) * s.rows);
      }
      for (int M = 2; M <= maxM; M++) {
        if (M > 16 && M != 17 && M != 24 && M != 33 && M != 40) continue;
        for (int off : {0, maxM - M}) {
          DeviceBuffer dy(G, static_cast<size_t>(M) * s.rows * sizeof(float));
          poison(G, dy.get(), dy.bytes());
          G->matmul(W.dev(), dx.f() + static_cast<size_t>(off) * s.cols, dy.f(), M);
          auto got = down<float>(G, dy.get(), static_cast<size_t>(M) * s.rows);
          ASSERT_EQ(0, std::memcmp(got.data(), one.data() + static_cast<size_t>(off) * s.rows, got.size() * 4))
              << dtype_name(dt) << " " << s.rows << "x" << s.cols << " M=" << M << " off=" << off;
        }
      }
      // misaligned activations take the restaging path: same bits
      if (s.cols % 4 == 0) {
        const int M = 5;
        DeviceBuffer dxm(G, (static_cast<size_t>(M) * s.cols + 1) * sizeof(float));
        G->copy(dxm.f() + 1, dx.f(), static_cast<size_t>(M) * s.cols * sizeof(float));
        DeviceBuffer dy(G, static_cast<size_t>(M) * s.rows * sizeof(float));
        poison(G, dy.get(), dy.bytes());
        G->matmul(W.dev(), dxm.f() + 1, dy.f(), M);
        auto got = down<float>(G, dy.get(), static_cast<size_t>(M) * s.rows);
        ASSERT_EQ(0, std::memcmp(got.data(), one.data(), got.size() * 4)) << dtype_name(dt) << " misaligned x";
      }
    }
  }
}

// matmul_group: several weights reading one x in one launch (the tensor-core path when every
// weight is bf16 with cols % 64 == 0, else one matmul each): each output tracks the CPU, and
// row m of every output is bit-identical whatever M is.
TEST(CudaMatmul, GroupMatchesCpuAndRowInvariant) {
  NEED_GPU();
  struct Case {
    std::vector<int64_t> rows;
    int64_t cols;
    DType dt;
  };
  for (const Case& cs : {Case{{300, 64, 48, 48}, 512, DType::BF16}, Case{{1024, 256, 256}, 4096, DType::BF16},
                         Case{{37, 5}, 256, DType::BF16}, Case{{64, 40}, 200, DType::BF16},
                         Case{{64, 64}, 512, DType::F32}}) {
    const int n = static_cast<int>(cs.rows.size());
    std::vector<TestWeight> tw;
    for (int i = 0; i < n; i++) tw.push_back(make_weight(G, cs.dt, cs.rows[i], cs.cols, 500 + 7 * i + cs.rows[i]));
    std::vector<WeightRef> wd(n);
    std::vector<const WeightRef*> wp(n);
    for (int i = 0; i < n; i++) {
      wd[i] = tw[i].dev();
      wp[i] = &wd[i];
    }
    const int maxM = 21;
    auto x = randv(static_cast<size_t>(maxM) * cs.cols, 123);
    DeviceBuffer dx = up(G, x);
    std::vector<std::vector<float>> one(n);  // every row alone
    for (int i = 0; i < n; i++) one[i].resize(static_cast<size_t>(maxM) * cs.rows[i]);
    for (int m = 0; m < maxM; m++) {
      auto [dy, yp] = group_out(G, cs.rows, 1);
      G->matmul_group(wp.data(), yp.data(), n, dx.f() + static_cast<size_t>(m) * cs.cols, 1);
      for (int i = 0; i < n; i++) {
        auto r = down<float>(G, dy[i].get(), cs.rows[i]);
        std::copy(r.begin(), r.end(), one[i].begin() + static_cast<size_t>(m) * cs.rows[i]);
      }
    }
    for (int M : {1, 2, 5, 8, 9, 16, 21}) {
      auto [dy, yp] = group_out(G, cs.rows, M);
      G->matmul_group(wp.data(), yp.data(), n, dx.f(), M);
      for (int i = 0; i < n; i++) {
        auto got = down<float>(G, dy[i].get(), static_cast<size_t>(M) * cs.rows[i]);
        ASSERT_EQ(0, std::memcmp(got.data(), one[i].data(), got.size() * 4))
            << "group weight " << i << " " << cs.rows[i] << "x" << cs.cols << " M=" << M;
        std::vector<float> ref(static_cast<size_t>(M) * cs.rows[i]);
        C->matmul(tw[i].host(), x.data(), ref.data(), M);
        ASSERT_TRUE(close_rel(got, ref, 1e-5, "group weight " + std::to_string(i) + " M=" + std::to_string(M)));
      }
    }
  }
}

// Full-size shapes: the lm_head (248320 x 5120) and the MLP down projection (5120 x 17408), made
// with fill_random so the host can recompute any row; sampled rows against float64, and the
// M = 8 call against M = 1 calls bit for bit.
TEST(CudaMatmul, FullSizeShapes) {
  NEED_GPU();
  struct S {
    int64_t rows, cols;
  };
  for (const S& s : {S{248320, 5120}, S{5120, 17408}, S{17408, 5120}}) {
    const size_t n = static_cast<size_t>(s.rows) * s.cols;
    const uint64_t seed = 77 + s.rows;
    const float wscale = 1.0f / std::sqrt(static_cast<float>(s.cols));
    DeviceBuffer w(G, n * 2);
    G->fill_random(w.get(), n, DType::BF16, seed, wscale);
    WeightRef W;
    W.dtype = DType::BF16;
    W.rows = s.rows;
    W.cols = s.cols;
    W.data = w.get();
    const int M = 8;
    auto x = randv(static_cast<size_t>(M) * s.cols, 90);
    DeviceBuffer dx = up(G, x), dy(G, static_cast<size_t>(M) * s.rows * sizeof(float)), dy1(G, s.rows * sizeof(float));
    poison(G, dy.get(), dy.bytes());
    G->matmul(W, dx.f(), dy.f(), M);
    auto all = down<float>(G, dy.get(), static_cast<size_t>(M) * s.rows);
    for (int m = 0; m < M; m++) {
      poison(G, dy1.get(), dy1.bytes());
      G->matmul(W, dx.f() + static_cast<size_t>(m) * s.cols, dy1.f(), 1);
      auto one = down<float>(G, dy1.get(), s.rows);
      ASSERT_EQ(0, std::memcmp(one.data(), all.data() + static_cast<size_t>(m) * s.rows, s.rows * 4))
          << s.rows << "x" << s.cols << " row " << m;
    }
    std::mt19937_64 rng(3);
    double maxref = 0, maxerr = 0;
    std::vector<int64_t> sample = {0, 1, s.rows - 1, s.rows - 2};
    for (int i = 0; i < 300; i++) sample.push_back(static_cast<int64_t>(rng() % s.rows));
    for (int64_t r : sample) {
      std::vector<double> wr(s.cols);
      for (int64_t c = 0; c < s.cols; c++)
        wr[c] = bf16_to_f32(f32_to_bf16(wscale * random_uniform_pm1(seed, static_cast<uint64_t>(r) * s.cols + c)));
      for (int m = 0; m < M; m++) {
        double ref = 0;
        for (int64_t c = 0; c < s.cols; c++) ref += wr[c] * x[static_cast<size_t>(m) * s.cols + c];
        maxref = std::max(maxref, std::fabs(ref));
        maxerr = std::max(maxerr, std::fabs(ref - all[static_cast<size_t>(m) * s.rows + r]));
      }
    }
    EXPECT_LE(maxerr, 1e-5 * maxref) << s.rows << "x" << s.cols << " max err " << maxerr << " max|ref| " << maxref;
  }
}

#if QFLASH_HAVE_CUDA
// Every tensor-core schedule (column slices and each stream-K variant; the backend uses one, the
// bench compares them all): each tracks the CPU and gives row m the same bits for every M. The
// shapes cover stream-K tiles cut into many pieces (few rows, long rows), tiles one warp covers
// whole (many rows, short rows), a single warp, and a grouped launch. The same weights in the
// tiled layout (gemv_tc_relayout; rows not multiples of 32 included) give the row-major bits.
TEST(CudaMatmul, TcSchedulesMatchCpuAndRowInvariant) {
  NEED_GPU();
  cuda::GemvScratch sc;
  cuda::gemv_scratch_create(sc);
  cudaStream_t st = nullptr;
  ASSERT_EQ(cudaSuccess, cudaStreamCreate(&st));
  struct Case {
    std::vector<int64_t> rows;
    int64_t cols;
  };
  for (const Case& cs : {Case{{48}, 5120}, Case{{1000}, 4096}, Case{{37}, 256}, Case{{4100}, 128},
                         Case{{640, 33, 96}, 1024}, Case{{5}, 64}}) {
    const int n = static_cast<int>(cs.rows.size());
    std::vector<TestWeight> tw;
    std::vector<WeightRef> wd(n);
    std::vector<const WeightRef*> wp(n);
    for (int i = 0; i < n; i++) tw.push_back(make_weight(G, DType::BF16, cs.rows[i], cs.cols, 900 + 13 * i + cs.rows[i]));
    for (int i = 0; i < n; i++) {
      wd[i] = tw[i].dev();
      wp[i] = &wd[i];
    }
    std::vector<DeviceBuffer> tbuf;
    std::vector<WeightRef> wt(n);
    std::vector<const WeightRef*> wtp(n);
    for (int i = 0; i < n; i++) {
      tbuf.emplace_back(G, cuda::gemv_tc_tiled_bytes(cs.rows[i], cs.cols));
      poison(G, tbuf.back().get(), tbuf.back().bytes());
      G->sync();
      cuda::gemv_tc_relayout(wd[i].data, tbuf.back().get(), cs.rows[i], cs.cols, st);
      wt[i] = wd[i];
      wt[i].data = tbuf.back().get();
      wt[i].layout = WeightRef::kTc32x64;
      wtp[i] = &wt[i];
    }
    ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(st));
    const int maxM = 16;
    auto x = randv(static_cast<size_t>(maxM) * cs.cols, 321);
    DeviceBuffer dx = up(G, x);
    std::vector<std::vector<float>> ref(n);
    for (int i = 0; i < n; i++) {
      ref[i].resize(static_cast<size_t>(maxM) * cs.rows[i]);
      C->matmul(tw[i].host(), x.data(), ref[i].data(), maxM);
    }
    for (int sched = 1; sched < cuda::gemv_tc_sched_count(); sched++) {
      const std::string what = std::string(cuda::gemv_tc_sched_name(sched)) + " " + std::to_string(cs.rows[0]) + "x" +
                               std::to_string(cs.cols) + (n > 1 ? " group" : "");
      // run(M, off): rows off .. off + M - 1 of x through the schedule, outputs downloaded
      auto run = [&](int M, int off, bool tiled = false) {
        auto [dy, yp] = group_out(G, cs.rows, M);
        G->sync();
        cuda::gemv_tc_group(tiled ? wtp.data() : wp.data(), yp.data(), n, dx.f() + static_cast<size_t>(off) * cs.cols,
                            static_cast<int>(cs.cols), M, st, &sc, sched);
        EXPECT_EQ(cudaSuccess, cudaStreamSynchronize(st));
        std::vector<std::vector<float>> out(n);
        for (int i = 0; i < n; i++) out[i] = down<float>(G, dy[i].get(), static_cast<size_t>(M) * cs.rows[i]);
        return out;
      };
      std::vector<std::vector<float>> one(n);
      for (int i = 0; i < n; i++) one[i].resize(static_cast<size_t>(maxM) * cs.rows[i]);
      for (int m = 0; m < maxM; m++) {
        auto r = run(1, m);
        for (int i = 0; i < n; i++) std::copy(r[i].begin(), r[i].end(), one[i].begin() + static_cast<size_t>(m) * cs.rows[i]);
      }
      for (int i = 0; i < n; i++)
        ASSERT_TRUE(close_rel(one[i], ref[i], 1e-5, what + " weight " + std::to_string(i) + " vs CPU"));
      for (int M : {2, 3, 8, 9, 16}) {
        const int off = maxM - M;
        auto r = run(M, off);
        for (int i = 0; i < n; i++)
          ASSERT_EQ(0, std::memcmp(r[i].data(), one[i].data() + static_cast<size_t>(off) * cs.rows[i], r[i].size() * 4))
              << what << " weight " << i << " M=" << M;
      }
      for (int M : {1, 5, 16}) {
        const int off = maxM - M;
        auto r = run(M, off, true);
        for (int i = 0; i < n; i++)
          ASSERT_EQ(0, std::memcmp(r[i].data(), one[i].data() + static_cast<size_t>(off) * cs.rows[i], r[i].size() * 4))
              << what << " tiled layout, weight " << i << " M=" << M;
      }
    }
  }
  cudaStreamDestroy(st);
  cuda::gemv_scratch_destroy(sc);
}
#endif

// ---- small ops -----------------------------------------------------------------------------
TEST(CudaOps, EmbedExact) {
  NEED_GPU();
  for (DType dt : {DType::BF16, DType::F16, DType::F32, DType::U32}) {
    const int V = 300, H = 256, M = 9;
    auto E = make_weight(G, dt, V, H, 4, 64);
    std::vector<int32_t> ids = {0, 299, 17, 17, 5, 123, 298, 1, 64};
    std::vector<float> ref(M * H);
    C->embed(E.host(), ids.data(), ref.data(), M);
    DeviceBuffer dids = up(G, ids), out(G, ref.size() * sizeof(float));
    poison(G, out.get(), out.bytes());
    G->embed(E.dev(), dids.i(), out.f(), M);
    EXPECT_TRUE(same_bits(down<float>(G, out.get(), ref.size()), ref.data(), ref.size())) << dtype_name(dt);
  }
}

TEST(CudaOps, RmsnormAndGated) {
  NEED_GPU();
  for (int n : {16, 128, 203, 256, 1500, 5120}) {
    for (bool with_w : {true, false}) {
      const int rows = 19;
      auto x = randv(static_cast<size_t>(rows) * n, n, 2.0f), gt = randv(static_cast<size_t>(rows) * n, n + 1);
      auto w = randv(n, n + 2);
      const float* hw = with_w ? w.data() : nullptr;
      DeviceBuffer dx = up(G, x), dg = up(G, gt), dw = up(G, w), dy(G, x.size() * 4);
      const float* gw = with_w ? dw.f() : nullptr;
      for (bool gated : {false, true}) {
        std::vector<float> ref(x.size());
        if (gated) C->rmsnorm_gated(x.data(), gt.data(), hw, ref.data(), rows, n, 1e-6f);
        else C->rmsnorm(x.data(), hw, ref.data(), rows, n, 1e-6f);
        poison(G, dy.get(), dy.bytes());
        if (gated) G->rmsnorm_gated(dx.f(), dg.f(), gw, dy.f(), rows, n, 1e-6f);
        else G->rmsnorm(dx.f(), gw, dy.f(), rows, n, 1e-6f);
        auto all = down<float>(G, dy.get(), x.size());
        ASSERT_TRUE(close_rel(all, ref, 2e-6, "rmsnorm n=" + std::to_string(n) + (gated ? " gated" : "")));
        // rows are independent of the row count, and in place gives the same bits
        for (int r0 : {0, 7, 18}) {
          DeviceBuffer d1(G, static_cast<size_t>(n) * 4);
          G->copy(d1.get(), dx.f() + static_cast<size_t>(r0) * n, static_cast<size_t>(n) * 4);
          if (gated) G->rmsnorm_gated(d1.f(), dg.f() + static_cast<size_t>(r0) * n, gw, d1.f(), 1, n, 1e-6f);
          else G->rmsnorm(d1.f(), gw, d1.f(), 1, n, 1e-6f);
          auto one = down<float>(G, d1.get(), n);
          ASSERT_TRUE(same_bits(one, all.data() + static_cast<size_t>(r0) * n, n)) << "n=" << n << " row " << r0;
        }
      }
    }
  }
}

TEST(CudaOps, Elementwise) {
  NEED_GPU();
  const size_t n = 100001;
  auto a = randv(n, 1, 3.0f), b = randv(n, 2, 3.0f);
  DeviceBuffer da = up(G, a), db = up(G, b), dy(G, n * 4);
  auto check = [&](const char* what, auto cpu_op, auto gpu_op, double tol) {
    std::vector<float> ref = a;
    cpu_op(ref.data());
    G->copy(dy.get(), da.get(), n * 4);
    gpu_op(dy.f());
    EXPECT_TRUE(close_rel(down<float>(G, dy.get(), n), ref, tol, what));
  };
  check("add", [&](float* y) { C->add(y, b.data(), n); }, [&](float* y) { G->add(y, db.f(), n); }, 0);
  check("scale", [&](float* y) { C->scale(y, 0.37f, n); }, [&](float* y) { G->scale(y, 0.37f, n); }, 0);
  check("sigmoid_mul", [&](float* y) { C->sigmoid_mul(y, b.data(), n); }, [&](float* y) { G->sigmoid_mul(y, db.f(), n); },
        1e-6);
  check("softcap 30", [&](float* y) { C->softcap(y, 30.0f, n); }, [&](float* y) { G->softcap(y, 30.0f, n); }, 1e-6);
  check("softcap 0", [&](float* y) { C->softcap(y, 0.0f, n); }, [&](float* y) { G->softcap(y, 0.0f, n); }, 0);
  check("softcap 2", [&](float* y) { C->softcap(y, 2.0f, n); }, [&](float* y) { G->softcap(y, 2.0f, n); }, 1e-6);
  std::vector<float> ref(n);
  C->swiglu(a.data(), b.data(), ref.data(), n);
  poison(G, dy.get(), n * 4);
  G->swiglu(da.f(), db.f(), dy.f(), n);
  EXPECT_TRUE(close_rel(down<float>(G, dy.get(), n), ref, 1e-6, "swiglu"));
}

TEST(CudaOps, SplitQgateKvWriteExact) {
  NEED_GPU();
  const int M = 5, nh = 3, hd = 64;
  auto qg = randv(static_cast<size_t>(M) * nh * 2 * hd, 3);
  std::vector<float> q(M * nh * hd), g(M * nh * hd);
  C->split_qgate(qg.data(), q.data(), g.data(), M, nh, hd);
  DeviceBuffer dqg = up(G, qg), dq(G, q.size() * 4), dg(G, g.size() * 4);
  poison(G, dq.get(), dq.bytes());
  poison(G, dg.get(), dg.bytes());
  G->split_qgate(dqg.f(), dq.f(), dg.f(), M, nh, hd);
  EXPECT_TRUE(same_bits(down<float>(G, dq.get(), q.size()), q.data(), q.size()));
  EXPECT_TRUE(same_bits(down<float>(G, dg.get(), g.size()), g.data(), g.size()));
  // kv_write at row q_pos0 - kv_pos0
  const int width = 96, cap = 40;
  auto rows = randv(static_cast<size_t>(M) * width, 4);
  auto cache0 = randv(static_cast<size_t>(cap) * width, 5);
  StepMeta meta{130, 110, 0, 0};
  std::vector<float> ref = cache0;
  C->kv_write(ref.data(), rows.data(), M, width, &meta);
  DeviceBuffer dc = up(G, cache0), dr = up(G, rows), dm = up(G, std::vector<StepMeta>{meta});
  G->kv_write(dc.f(), dr.f(), M, width, reinterpret_cast<const StepMeta*>(dm.get()));
  EXPECT_TRUE(same_bits(down<float>(G, dc.get(), ref.size()), ref.data(), ref.size()));
}

TEST(CudaOps, RopeMatchesCpuAndRowInvariant) {
  NEED_GPU();
  struct R {
    int nh, hd, rot;
    float theta;
    int pos0;
  };
  for (const R& c : {R{3, 256, 64, 1e7f, 1000}, R{4, 64, 64, 10000.0f, 100000}, R{2, 128, 128, 1e6f, 5},
                     R{1, 16, 8, 500000.0f, 262000}}) {
    const int M = 9;
    auto x = randv(static_cast<size_t>(M) * c.nh * c.hd, c.hd);
    StepMeta meta{c.pos0, 0, c.pos0 + M, 0};
    std::vector<float> ref = x;
    C->rope(ref.data(), M, c.nh, c.hd, c.rot, c.theta, &meta);
    DeviceBuffer dx = up(G, x), dm = up(G, std::vector<StepMeta>{meta});
    G->rope(dx.f(), M, c.nh, c.hd, c.rot, c.theta, reinterpret_cast<const StepMeta*>(dm.get()));
    auto all = down<float>(G, dx.get(), x.size());
    ASSERT_TRUE(close_rel(all, ref, 2e-6, "rope hd=" + std::to_string(c.hd)));
    const size_t row = static_cast<size_t>(c.nh) * c.hd;
    for (int m = 0; m < M; m++) {
      std::vector<float> x1(x.begin() + m * row, x.begin() + (m + 1) * row);
      StepMeta m1{c.pos0 + m, 0, c.pos0 + m + 1, 0};
      DeviceBuffer d1 = up(G, x1), dm1 = up(G, std::vector<StepMeta>{m1});
      G->rope(d1.f(), 1, c.nh, c.hd, c.rot, c.theta, reinterpret_cast<const StepMeta*>(dm1.get()));
      ASSERT_TRUE(same_bits(down<float>(G, d1.get(), row), all.data() + m * row, row)) << "row " << m;
    }
  }
}

TEST(CudaOps, DynConv) {
  NEED_GPU();
  const int L = 8, H = 256, Kc = 2, gs = 16, G_ = H / gs;
  auto x = randv(static_cast<size_t>(L) * H, 1), base = randv(static_cast<size_t>(2) * Kc * H, 2, 0.5f);
  auto D = randv(static_cast<size_t>(L) * 2 * Kc * G_, 3, 0.5f);
  DeviceBuffer dx = up(G, x), db = up(G, base), dD = up(G, D), dout(G, x.size() * 4);
  for (int side : {0, 1}) {
    std::vector<float> ref(x.size());
    C->dyn_conv(x.data(), base.data() + side * Kc * H, D.data(), ref.data(), L, H, Kc, gs, side);
    poison(G, dout.get(), dout.bytes());
    G->dyn_conv(dx.f(), db.f() + side * Kc * H, dD.f(), dout.f(), L, H, Kc, gs, side);
    EXPECT_TRUE(close_rel(down<float>(G, dout.get(), x.size()), ref, 1e-6, "dyn_conv side " + std::to_string(side)));
  }
}

// ---- attention -------------------------------------------------------------------------------
struct AttnCase {
  int nh, nkv, hd;
  bool causal;
  int window, n_ctx, kv_pos0;
};

TEST(CudaAttention, MatchesCpuAndRowInvariant) {
  NEED_GPU();
  const AttnCase cases[] = {
      {6, 2, 256, true, 0, 300, 0},     // target-like heads, several chunks
      {4, 2, 128, false, 9, 22, 78},    // drafter-like: bidirectional window, offset buffer
      {4, 1, 64, true, 40, 5000, 0},    // long context: many chunks per split, sliding window
      {4, 2, 16, true, 0, 3, 0},        // tiny, fewer keys than a chunk
      {8, 8, 128, false, 0, 1500, 10},  // non-causal, no window, MHA
      {24, 4, 256, true, 0, 2100, 0},   // the 27B's attention layer geometry
  };
  for (const AttnCase& c : cases) {
    AttnParams p;
    p.n_heads = c.nh;
    p.n_kv_heads = c.nkv;
    p.head_dim = c.hd;
    p.scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
    p.causal = c.causal;
    p.window = c.window;
    const int Mmax = 16, kvw = c.nkv * c.hd;
    const int nkeys = c.n_ctx + Mmax;
    auto K = randv(static_cast<size_t>(nkeys) * kvw, 6, 1.5f), V = randv(static_cast<size_t>(nkeys) * kvw, 7);
    auto q = randv(static_cast<size_t>(Mmax) * c.nh * c.hd, 8, 1.5f);
    DeviceBuffer dK = up(G, K), dV = up(G, V), dq = up(G, q);
    const int P = c.kv_pos0 + c.n_ctx;  // position of query row 0
    const size_t rowf = static_cast<size_t>(c.nh) * c.hd;
    // the 16-row call, against the CPU
    StepMeta meta{P, c.kv_pos0, nkeys, 0};
    std::vector<float> ref(Mmax * rowf);
    C->attention(q.data(), K.data(), V.data(), ref.data(), Mmax, p, &meta);
    DeviceBuffer dm = up(G, std::vector<StepMeta>{meta}), dout(G, ref.size() * 4);
    poison(G, dout.get(), dout.bytes());
    G->attention(dq.f(), dK.f(), dV.f(), dout.f(), Mmax, p, reinterpret_cast<const StepMeta*>(dm.get()));
    auto all = down<float>(G, dout.get(), ref.size());
    const std::string tag = "nh=" + std::to_string(c.nh) + " hd=" + std::to_string(c.hd) + " ctx=" + std::to_string(c.n_ctx);
    ASSERT_TRUE(close_rel(all, ref, 1e-5, tag));
    // M = 1..16 with the keys a decode / verify of that size would have: causal rows see the
    // same keys whatever n_kv is, so they must match the 16-row call bit for bit.
    for (int M = 1; M <= Mmax; M++) {
      StepMeta mm{P, c.kv_pos0, c.causal ? c.n_ctx + M : nkeys, 0};
      DeviceBuffer dmm = up(G, std::vector<StepMeta>{mm}), o(G, M * rowf * 4);
      poison(G, o.get(), o.bytes());
      G->attention(dq.f(), dK.f(), dV.f(), o.f(), M, p, reinterpret_cast<const StepMeta*>(dmm.get()));
      ASSERT_TRUE(same_bits(down<float>(G, o.get(), M * rowf), all.data(), M * rowf)) << tag << " M=" << M;
    }
    // decode style: one row at a time at its own position
    for (int m = 0; m < Mmax; m++) {
      StepMeta m1{P + m, c.kv_pos0, c.causal ? c.n_ctx + m + 1 : nkeys, 0};
      DeviceBuffer dm1 = up(G, std::vector<StepMeta>{m1}), o(G, rowf * 4);
      poison(G, o.get(), o.bytes());
      G->attention(dq.f() + m * rowf, dK.f(), dV.f(), o.f(), 1, p, reinterpret_cast<const StepMeta*>(dm1.get()));
      ASSERT_TRUE(same_bits(down<float>(G, o.get(), rowf), all.data() + m * rowf, rowf)) << tag << " decode row " << m;
    }
  }
}

// ---- gated DeltaNet --------------------------------------------------------------------------
TEST(CudaGdn, MatchesCpuAndRowInvariantWithCapture) {
  NEED_GPU();
  struct D {
    int nk, nv, dk, dv, conv;
  };
  for (const D& dd : {D{16, 48, 128, 128, 4}, D{2, 6, 16, 8, 4}, D{2, 6, 64, 64, 4}, D{1, 2, 32, 64, 2},
                      D{3, 3, 96, 40, 3}}) {
    GdnDims d;
    d.n_k_heads = dd.nk;
    d.n_v_heads = dd.nv;
    d.d_k = dd.dk;
    d.d_v = dd.dv;
    d.conv_kernel = dd.conv;
    const int M = 9, Cd = d.conv_dim(), Hv = d.n_v_heads;
    const size_t SF = d.state_floats(), VD = d.value_dim();
    auto mixed = randv(static_cast<size_t>(M) * Cd, 10), alpha = randv(M * Hv, 11), beta = randv(M * Hv, 12);
    auto conv = randv(static_cast<size_t>(Cd) * d.conv_kernel, 13, 0.5f), A = randv(Hv, 14, 0.5f),
         dt = randv(Hv, 15, 0.5f);
    auto init = randv(SF, 16, 0.1f);
    // CPU reference
    std::vector<float> s_cpu = init, y_cpu(M * VD), cap_cpu(M * SF);
    C->gdn_rows(mixed.data(), alpha.data(), beta.data(), conv.data(), A.data(), dt.data(), d, s_cpu.data(),
                y_cpu.data(), M, cap_cpu.data());
    DeviceBuffer dmix = up(G, mixed), dal = up(G, alpha), dbe = up(G, beta), dconv = up(G, conv), dA = up(G, A),
                 ddt = up(G, dt);
    DeviceBuffer ds = up(G, init), dy(G, y_cpu.size() * 4), dcap(G, cap_cpu.size() * 4);
    poison(G, dy.get(), dy.bytes());
    poison(G, dcap.get(), dcap.bytes());
    G->gdn_rows(dmix.f(), dal.f(), dbe.f(), dconv.f(), dA.f(), ddt.f(), d, ds.f(), dy.f(), M, dcap.f());
    auto y_all = down<float>(G, dy.get(), y_cpu.size());
    auto s_all = down<float>(G, ds.get(), SF);
    auto cap_all = down<float>(G, dcap.get(), cap_cpu.size());
    const std::string tag = "dk=" + std::to_string(dd.dk) + " dv=" + std::to_string(dd.dv);
    ASSERT_TRUE(close_rel(y_all, y_cpu, 1e-5, "gdn y " + tag));
    ASSERT_TRUE(close_rel(s_all, s_cpu, 1e-5, "gdn state " + tag));
    ASSERT_TRUE(close_rel(cap_all, cap_cpu, 1e-5, "gdn capture " + tag));
    // one row at a time on the device: identical y, captures and final state
    DeviceBuffer ds1 = up(G, init), dy1(G, VD * 4);
    for (int m = 0; m < M; m++) {
      poison(G, dy1.get(), dy1.bytes());
      G->gdn_rows(dmix.f() + m * Cd, dal.f() + m * Hv, dbe.f() + m * Hv, dconv.f(), dA.f(), ddt.f(), d, ds1.f(),
                  dy1.f(), 1, nullptr);
      ASSERT_TRUE(same_bits(down<float>(G, dy1.get(), VD), y_all.data() + m * VD, VD)) << tag << " y row " << m;
      ASSERT_TRUE(same_bits(down<float>(G, ds1.get(), SF), cap_all.data() + m * SF, SF)) << tag << " capture " << m;
    }
    ASSERT_TRUE(same_bits(down<float>(G, ds1.get(), SF), s_all.data(), SF)) << tag << " final state";
  }
}

// ---- selection -------------------------------------------------------------------------------
TEST(CudaSelect, ArgmaxExactWithTies) {
  NEED_GPU();
  for (int n : {1, 7, 4096, 5000, 248320}) {
    const int M = 6;
    auto x = randv(static_cast<size_t>(M) * n, n);
    auto at = [&](int m, int i) -> float& { return x[static_cast<size_t>(m) * n + i]; };
    at(0, n - 1) = 100.0f;  // max at the end
    if (n > 10) {
      at(1, 9) = 50.0f;  // tie: the lower index wins
      at(1, 3) = 50.0f;
      at(1, n - 2) = 50.0f;
    }
    for (int i = 0; i < n; i++) at(2, i) = 1.5f;  // all equal: 0
    for (int i = 0; i < n; i++) at(3, i) = -INFINITY;
    at(4, n / 2) = -0.0f;  // a row of negatives with -0 and +0 tied at the top
    for (int i = 0; i < n; i++)
      if (i != n / 2) at(4, i) = -std::fabs(at(4, i)) - 1.0f;
    if (n > 1) at(4, n - 1) = 0.0f;
    // NaN: never picked after index 0 (row 1), but a NaN at index 0 is never beaten (row 5)
    if (n > 10) at(1, 5) = NAN;
    at(5, 0) = NAN;
    std::vector<int32_t> ref(M);
    C->argmax_rows(x.data(), M, n, ref.data());
    DeviceBuffer dx = up(G, x), dout(G, M * 4);
    poison(G, dout.get(), dout.bytes());
    G->argmax_rows(dx.f(), M, n, dout.i());
    EXPECT_EQ(down<int32_t>(G, dout.get(), M), ref) << "n=" << n;
  }
}

TEST(CudaSelect, TopkExactWithTies) {
  NEED_GPU();
  for (int n : {64, 100, 4096, 5000, 70000, 248320}) {
    for (int k : {1, 16, 64}) {
      if (k > n) continue;
      const int M = 5;
      auto x = randv(static_cast<size_t>(M) * n, n + k);
      auto at = [&](int m, int i) -> float& { return x[static_cast<size_t>(m) * n + i]; };
      for (int i = 0; i < n; i += 3) at(1, i) = 2.5f;  // many ties at the top
      for (int i = 0; i < n; i++) at(2, i) = static_cast<float>(i % 7);  // ties everywhere
      for (int i = 0; i < n; i++) at(3, i) = -INFINITY;
      for (int i = 0; i < n; i += 5) at(3, i) = 1.0f;
      std::vector<float> rv(M * k);
      std::vector<int32_t> ri(M * k);
      C->topk_rows(x.data(), M, n, k, rv.data(), ri.data());
      DeviceBuffer dx = up(G, x), dv(G, rv.size() * 4), di(G, ri.size() * 4);
      poison(G, dv.get(), dv.bytes());
      poison(G, di.get(), di.bytes());
      G->topk_rows(dx.f(), M, n, k, dv.f(), di.i());
      EXPECT_EQ(down<int32_t>(G, di.get(), ri.size()), ri) << "n=" << n << " k=" << k;
      EXPECT_TRUE(same_bits(down<float>(G, dv.get(), rv.size()), rv.data(), rv.size())) << "n=" << n << " k=" << k;
    }
  }
}

TEST(CudaSelect, SelectorWalkMatchesCpu) {
  NEED_GPU();
  const int V = 1000, R = 32, K = 16, k = 7;
  auto Epre = make_weight(G, DType::BF16, V, R, 1), Esuc = make_weight(G, DType::BF16, V, R, 2);
  std::mt19937_64 rng(3);
  std::vector<int32_t> ids(k * K);
  for (auto& i : ids) i = static_cast<int32_t>(rng() % V);
  auto vals = randv(k * K, 4, 5.0f), P = randv(k * R, 5, 0.3f);
  std::vector<int32_t> anchor = {123};
  std::vector<int32_t> rd(k);
  std::vector<float> rs(k * K);
  C->selector_walk(vals.data(), ids.data(), P.data(), Epre.host(), Esuc.host(), anchor.data(), k, K, R, rd.data(),
                   rs.data());
  DeviceBuffer dv = up(G, vals), di = up(G, ids), dP = up(G, P), da = up(G, anchor), dd(G, k * 4), ds(G, k * K * 4);
  poison(G, dd.get(), dd.bytes());
  poison(G, ds.get(), ds.bytes());
  G->selector_walk(dv.f(), di.i(), dP.f(), Epre.dev(), Esuc.dev(), da.i(), k, K, R, dd.i(), ds.f());
  EXPECT_EQ(down<int32_t>(G, dd.get(), k), rd);
  EXPECT_TRUE(close_rel(down<float>(G, ds.get(), rs.size()), rs, 1e-5, "selector scores"));
}

// ---- a whole model ---------------------------------------------------------------------------
// The tiny random target: CUDA logits track the CPU's through prefill and decode.
TEST(CudaModel, TinyTargetLogitsTrackCpu) {
  NEED_GPU();
  test::TinyTarget t;
  t.mtp = false;
  const std::string dir = test::write_tiny_target(test::temp_dir("cuda_model"), t);
  auto mc = Qwen38Model::load(dir, C.get(), 16);
  auto mg = Qwen38Model::load(dir, G, 16);
  auto sc = mc->new_state(64, 0), sg = mg->new_state(64, 0);
  std::vector<int32_t> prompt = {5, 900, 17, 4000, 8000, 3, 77, 1234, 42, 999, 7, 8191, 0};
  ForwardOpts fo;
  const int V = t.vocab;
  std::vector<int32_t> toks = prompt;
  int M = static_cast<int>(prompt.size());
  for (int step = 0; step < 6; step++) {
    mc->forward(*sc, toks.data(), M, fo);
    mg->forward(*sg, toks.data(), M, fo);
    std::vector<float> lc(static_cast<size_t>(M) * V);
    C->download(lc.data(), mc->logits(), lc.size() * 4);
    auto lg = down<float>(G, mg->logits(), lc.size());
    ASSERT_TRUE(close_rel(lg, lc, 2e-4, "logits step " + std::to_string(step)));
    int32_t next = 0;
    C->download(&next, mc->argmax_ids() + (M - 1), 4);
    toks = {next};
    M = 1;
  }
}

}  // namespace
}  // namespace qf

#endif  // QFLASH_HAVE_CUDA
