// int4 weights at load: the group size comes from the scales' shape and must be one the
// backends dequantize correctly (32, 64 or 128, dividing the columns); anything else is a
// Tensor error naming the tensor and the group found. A supported group computes the product a
// double-precision dequantization in this file computes.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <random>

#include "core/dtype.h"
#include "core/error.h"
#include "io/quantize.h"
#include "io/safetensors.h"
#include "model/weights.h"
#include "support/backends.h"
#include "support/test_models.h"

namespace qf {
namespace {

struct Int4Tensor {
  int64_t rows, cols, group;
  std::vector<uint32_t> q;        // [rows, cols/8]
  std::vector<uint16_t> s, b;     // [rows, cols/group] bf16
};

// Random nibbles, scales and biases (not produced by our quantizer: any values are valid int4).
Int4Tensor random_int4(int64_t rows, int64_t cols, int64_t group, uint32_t seed) {
  Int4Tensor t{rows, cols, group, {}, {}, {}};
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  t.q.resize(static_cast<size_t>(rows * cols / 8));
  for (auto& w : t.q) w = static_cast<uint32_t>(rng());
  t.s.resize(static_cast<size_t>(rows * (cols / group)));
  t.b.resize(t.s.size());
  for (auto& x : t.s) x = f32_to_bf16(0.01f + 0.05f * std::fabs(u(rng)));
  for (auto& x : t.b) x = f32_to_bf16(0.3f * u(rng));
  return t;
}

std::string write_int4(const std::string& name, const Int4Tensor& t) {
  const std::string dir = test::temp_dir("int4_" + name);
  const int64_t ng = t.cols / t.group;
  write_safetensors(dir + "/model.safetensors", {{"w.weight", DType::U32, {t.rows, t.cols / 8}, t.q.data()},
                                                 {"w.scales", DType::BF16, {t.rows, ng}, t.s.data()},
                                                 {"w.biases", DType::BF16, {t.rows, ng}, t.b.data()}});
  return dir;
}

class Int4Load : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    be = test::make_test_backend(GetParam());
    if (!be) GTEST_SKIP() << "no CUDA device";
  }
  std::unique_ptr<Backend> be;
};

TEST_P(Int4Load, UnsupportedGroupIsATensorErrorNamingTheTensor) {
  // cols 96: group 4 and 12 are not multiples of 8 (a word would straddle two groups), 16 and
  // 48 are (the CPU could read them) but the GPU GEMV reads 32 columns under one scale.
  for (int64_t group : {4, 12, 16, 48}) {
    SCOPED_TRACE(group);
    const Int4Tensor t = random_int4(8, 96, group, 1);
    const std::string dir = write_int4("bad" + std::to_string(group), t);
    const TensorStore store = TensorStore::open_dir(dir);
    WeightSet ws(be.get(), &store);
    try {
      ws.matrix("w.weight", 8, 96);
      FAIL() << "group " << group << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Tensor);
      const std::string m = e.what();
      EXPECT_NE(m.find("tensor 'w.weight'"), std::string::npos) << m;
      EXPECT_NE(m.find("expected 32, 64 or 128 dividing 96, found " + std::to_string(group)), std::string::npos) << m;
    }
  }
}

TEST_P(Int4Load, SupportedGroupsMatchADoublePrecisionDequantization) {
  for (int64_t group : {32, 64, 128}) {
    SCOPED_TRACE(group);
    const int64_t rows = 16, cols = 256;
    const Int4Tensor t = random_int4(rows, cols, group, 7);
    const std::string dir = write_int4("good" + std::to_string(group), t);
    const TensorStore store = TensorStore::open_dir(dir);
    WeightSet ws(be.get(), &store);
    const WeightRef w = ws.matrix("w.weight", rows, cols);
    EXPECT_EQ(w.group, group);
    std::vector<float> x(cols);
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0, 1);
    for (auto& v : x) v = nd(rng);
    DeviceBuffer xd(be.get(), x.size() * 4), yd(be.get(), rows * 4);
    be->upload(xd.get(), x.data(), x.size() * 4);
    be->matmul(w, xd.f(), yd.f(), 1);
    std::vector<float> y(rows);
    be->download(y.data(), yd.f(), y.size() * 4);
    for (int64_t r = 0; r < rows; r++) {
      double ref = 0, mag = 0;
      for (int64_t c = 0; c < cols; c++) {
        const uint32_t nib = (t.q[r * (cols / 8) + c / 8] >> (4 * (c % 8))) & 0xfu;
        const size_t g = static_cast<size_t>(r * (cols / group) + c / group);
        const double wv = nib * static_cast<double>(bf16_to_f32(t.s[g])) + bf16_to_f32(t.b[g]);
        ref += wv * x[c];
        mag += std::fabs(wv * x[c]);
      }
      // A float dot product of n terms is within n * eps/2 * sum|terms| of the exact sum.
      EXPECT_NEAR(y[r], ref, cols * (FLT_EPSILON / 2) * mag) << "row " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, Int4Load, ::testing::Values("cpu", "cuda"));

TEST(Int4Group, QuantizeRejectsUnsupportedGroups) {
  for (int64_t group : std::vector<int64_t>{0, -64, 8, 12, 48, 256, 4294967328LL}) {
    SCOPED_TRACE(group);
    QuantizeOptions o;
    o.group = group;
    try {
      quantize_checkpoint("/nonexistent/model", test::temp_dir("q_bad") + "/out", o);
      FAIL() << "group " << group << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Usage);
      EXPECT_EQ(std::string(e.what()), "group: expected 32, 64 or 128, found " + std::to_string(group));
    }
  }
  // The row quantizer refuses a group the loader would refuse.
  std::vector<float> w(96, 0.5f);
  std::vector<uint32_t> q(12);
  std::vector<uint16_t> s(8), b(8);
  EXPECT_THROW(int4_quantize_row(w.data(), 96, 12, q.data(), s.data(), b.data()), Error);
  EXPECT_NO_THROW(int4_quantize_row(w.data(), 96, 32, q.data(), s.data(), b.data()));
}

}  // namespace
}  // namespace qf
