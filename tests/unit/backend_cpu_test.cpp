// CPU backend ops: row-invariance (the result of row m does not depend on M), agreement with a
// float64 reference, and the tie rules of argmax / top-k.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "backend/backend.h"

namespace qf {
namespace {

std::vector<float> randv(size_t n, uint64_t seed, float s = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0, s);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

TEST(BackendCpu, MatmulRowInvariantAndAccurate) {
  auto be = make_cpu_backend();
  for (DType dt : {DType::BF16, DType::F32, DType::F16}) {
    const int rows = 37, cols = 203;  // odd sizes exercise the lane tail
    auto wf = randv(static_cast<size_t>(rows) * cols, 1);
    std::vector<uint16_t> w16(wf.size());
    for (size_t i = 0; i < wf.size(); i++) {
      w16[i] = dt == DType::BF16 ? f32_to_bf16(wf[i]) : f32_to_f16(wf[i]);
      wf[i] = dt == DType::BF16 ? bf16_to_f32(w16[i]) : dt == DType::F16 ? f16_to_f32(w16[i]) : wf[i];
    }
    WeightRef W;
    W.dtype = dt;
    W.rows = rows;
    W.cols = cols;
    W.data = dt == DType::F32 ? static_cast<const void*>(wf.data()) : static_cast<const void*>(w16.data());
    auto x = randv(16 * cols, 2);
    std::vector<float> y16(16 * rows);
    be->matmul(W, x.data(), y16.data(), 16);
    for (int M = 1; M <= 16; M++) {
      std::vector<float> y(M * rows);
      // rows shifted so row m of this call is row (16-M+m) of the 16-row call
      be->matmul(W, x.data() + static_cast<size_t>(16 - M) * cols, y.data(), M);
      ASSERT_EQ(0, std::memcmp(y.data(), y16.data() + static_cast<size_t>(16 - M) * rows, y.size() * 4))
          << "dtype " << dtype_name(dt) << " M=" << M;
    }
    for (int m = 0; m < 16; m++)
      for (int r = 0; r < rows; r++) {
        double ref = 0;
        for (int c = 0; c < cols; c++) ref += static_cast<double>(wf[r * cols + c]) * x[m * cols + c];
        ASSERT_NEAR(y16[m * rows + r], ref, 1e-4 * (1 + std::fabs(ref)));
      }
  }
}

TEST(BackendCpu, Int4MatmulMatchesDequantizedReference) {
  auto be = make_cpu_backend();
  const int rows = 5, cols = 128, group = 64;
  std::mt19937_64 rng(4);
  std::vector<uint32_t> q(rows * cols / 8);
  for (auto& w : q) w = static_cast<uint32_t>(rng());
  std::vector<uint16_t> sc(rows * cols / group), bi(rows * cols / group);
  for (size_t i = 0; i < sc.size(); i++) {
    sc[i] = f32_to_bf16(0.01f * (1 + i % 7));
    bi[i] = f32_to_bf16(-0.05f * (i % 3));
  }
  WeightRef W;
  W.dtype = DType::U32;
  W.rows = rows;
  W.cols = cols;
  W.data = q.data();
  W.scales = sc.data();
  W.biases = bi.data();
  W.group = group;
  auto x = randv(cols, 5);
  std::vector<float> y(rows);
  be->matmul(W, x.data(), y.data(), 1);
  for (int r = 0; r < rows; r++) {
    double ref = 0;
    for (int c = 0; c < cols; c++) {
      // little-endian byte k holds elements 2k (low nibble) and 2k+1 (high nibble)
      const uint8_t byte = reinterpret_cast<const uint8_t*>(q.data())[(r * cols + c) / 2];
      const int nib = c % 2 == 0 ? (byte & 0xf) : (byte >> 4);
      ref += (nib * bf16_to_f32(sc[r * 2 + c / group]) + bf16_to_f32(bi[r * 2 + c / group])) * x[c];
    }
    EXPECT_NEAR(y[r], ref, 1e-4 * (1 + std::fabs(ref)));
  }
}

TEST(BackendCpu, AttentionRowInvariantWithWindow) {
  auto be = make_cpu_backend();
  AttnParams p;
  p.n_heads = 4;
  p.n_kv_heads = 2;
  p.head_dim = 16;
  p.scale = 0.25f;
  for (bool causal : {true, false}) {
    p.causal = causal;
    p.window = 9;
    const int nk = 30, M = 8, kvw = p.n_kv_heads * p.head_dim;
    auto K = randv(nk * kvw, 6), V = randv(nk * kvw, 7), q = randv(M * p.n_heads * p.head_dim, 8);
    std::vector<float> all(M * p.n_heads * p.head_dim);
    StepMeta meta{100, 100 - 22, 22 + M, 0};  // queries at 100..107, keys at 78..107
    be->attention(q.data(), K.data(), V.data(), all.data(), M, p, &meta);
    for (int m = 0; m < M; m++) {
      std::vector<float> one(p.n_heads * p.head_dim);
      StepMeta mm{100 + m, 78, 22 + M, 0};
      be->attention(q.data() + m * p.n_heads * p.head_dim, K.data(), V.data(), one.data(), 1, p, &mm);
      ASSERT_EQ(0, std::memcmp(one.data(), all.data() + m * one.size(), one.size() * 4)) << "row " << m;
      // float64 reference for head 3 (kv group 1)
      const int h = 3, g = 1;
      std::vector<double> w;
      std::vector<int> js;
      for (int j = 0; j < 22 + M; j++) {
        const int qpos = 100 + m, kpos = 78 + j;
        bool vis = causal ? (kpos <= qpos && qpos - kpos < 9) : std::abs(qpos - kpos) < 9;
        if (!vis) continue;
        double s = 0;
        for (int d = 0; d < 16; d++) s += q[m * 64 + h * 16 + d] * K[j * kvw + g * 16 + d];
        w.push_back(s * 0.25);
        js.push_back(j);
      }
      double mx = -1e30, sum = 0;
      for (double s : w) mx = std::max(mx, s);
      for (double& s : w) sum += (s = std::exp(s - mx));
      for (int d = 0; d < 16; d++) {
        double o = 0;
        for (size_t i = 0; i < w.size(); i++) o += w[i] / sum * V[js[i] * kvw + g * 16 + d];
        ASSERT_NEAR(all[m * 64 + h * 16 + d], o, 1e-5);
      }
    }
  }
}

TEST(BackendCpu, ArgmaxAndTopkTieRules) {
  auto be = make_cpu_backend();
  std::vector<float> x = {1, 3, 3, 2, 3, -1};
  int32_t id;
  be->argmax_rows(x.data(), 1, 6, &id);
  EXPECT_EQ(id, 1);
  float vals[4];
  int32_t ids[4];
  be->topk_rows(x.data(), 1, 6, 4, vals, ids);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[1], 2);
  EXPECT_EQ(ids[2], 4);
  EXPECT_EQ(ids[3], 3);
  EXPECT_EQ(vals[3], 2.0f);
}

TEST(BackendCpu, GdnRowsEqualSingleStepsAndCaptureEachRow) {
  auto be = make_cpu_backend();
  GdnDims d;
  d.n_k_heads = 2;
  d.n_v_heads = 6;
  d.d_k = 16;
  d.d_v = 8;
  d.conv_kernel = 4;
  const int M = 5, C = d.conv_dim(), Hv = d.n_v_heads;
  auto mixed = randv(M * C, 10), alpha = randv(M * Hv, 11), beta = randv(M * Hv, 12);
  auto conv = randv(C * 4, 13, 0.5f), A = randv(Hv, 14, 0.5f), dt = randv(Hv, 15, 0.5f);
  auto init = randv(d.state_floats(), 16, 0.1f);
  std::vector<float> s_all = init, y_all(M * d.value_dim()), cap(M * d.state_floats());
  be->gdn_rows(mixed.data(), alpha.data(), beta.data(), conv.data(), A.data(), dt.data(), d, s_all.data(),
               y_all.data(), M, cap.data());
  std::vector<float> s1 = init, y1(d.value_dim());
  for (int m = 0; m < M; m++) {
    be->gdn_rows(mixed.data() + m * C, alpha.data() + m * Hv, beta.data() + m * Hv, conv.data(), A.data(), dt.data(),
                 d, s1.data(), y1.data(), 1, nullptr);
    ASSERT_EQ(0, std::memcmp(y1.data(), y_all.data() + m * d.value_dim(), y1.size() * 4)) << "row " << m;
    ASSERT_EQ(0, std::memcmp(s1.data(), cap.data() + m * d.state_floats(), s1.size() * 4)) << "capture " << m;
  }
  ASSERT_EQ(0, std::memcmp(s1.data(), s_all.data(), s1.size() * 4));
}

}  // namespace
}  // namespace qf
