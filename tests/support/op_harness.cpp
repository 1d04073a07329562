#include "support/op_harness.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>

#include "backend/registry.h"
#include "support/backends.h"

namespace qf::test {

std::vector<float> randn(size_t n, uint64_t seed, float sigma) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) {
    do x = nd(rng);
    while (x == 0.0f);
  }
  return v;
}

void poison(Backend& be, void* p, size_t bytes) {
  std::vector<uint8_t> h(bytes, 0xff);
  if (bytes) be.upload(p, h.data(), bytes);
}

Out::Out(Backend& be, size_t n, size_t elem_bytes) : be_(&be), n_(n), elem_(elem_bytes), buf_(&be, n * elem_bytes + kGuardBytes) {
  repoison();
}

void Out::check_guard(const std::string& what) const {
  std::vector<uint8_t> g(kGuardBytes);
  be_->download(g.data(), static_cast<const uint8_t*>(buf_.get()) + n_ * elem_, kGuardBytes);
  const auto bad = std::find_if(g.begin(), g.end(), [](uint8_t b) { return b != 0xff; });
  EXPECT_TRUE(bad == g.end()) << what << ": the op wrote past its output (byte " << (bad - g.begin())
                              << " after the last element)";
}

std::vector<float> Out::floats(const std::string& what) const {
  check_guard(what);
  return from_device<float>(*be_, buf_.get(), n_ * elem_ / 4);
}

std::vector<int32_t> Out::ints(const std::string& what) const {
  check_guard(what);
  return from_device<int32_t>(*be_, buf_.get(), n_ * elem_ / 4);
}

// ---- weights ----------------------------------------------------------------------------------
double bf16_value(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// IEEE binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits.
double f16_value(uint16_t h) {
  const int sign = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  double v;
  if (e == 0) v = std::ldexp(m, -24);  // subnormal: m * 2^-14 / 2^10
  else if (e == 31) v = m ? NAN : INFINITY;
  else v = std::ldexp(1024 + m, e - 25);  // (1 + m / 2^10) * 2^(e - 15)
  return sign ? -v : v;
}

uint16_t bf16_round(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t lower = u & 0xffffu, upper = u >> 16;
  // round half to even on the 16 dropped bits (the inputs here are finite)
  const bool up = lower > 0x8000u || (lower == 0x8000u && (upper & 1u));
  return static_cast<uint16_t>(upper + (up ? 1u : 0u));
}

WeightRef HostWeight::host_ref() const {
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

const char* dtype_tag(DType dt) {
  switch (dt) {
    case DType::BF16: return "bf16";
    case DType::F16: return "f16";
    case DType::F32: return "f32";
    case DType::U32: return "int4";
    default: return "other";
  }
}

HostWeight random_weight(DType dt, int64_t rows, int64_t cols, uint64_t seed, int group) {
  HostWeight t;
  t.dt = dt;
  t.rows = rows;
  t.cols = cols;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0, 1);
  const size_t n = static_cast<size_t>(rows) * cols;
  t.value.resize(n);
  if (dt == DType::U32) {
    t.group = group;
    t.data.resize(n / 2);
    for (auto& b : t.data) b = static_cast<uint8_t>(rng());
    const int64_t ng = cols / group;
    t.scales.resize(static_cast<size_t>(rows) * ng);
    t.biases.resize(t.scales.size());
    for (size_t i = 0; i < t.scales.size(); i++) {
      t.scales[i] = bf16_round(0.02f * (1.0f + static_cast<float>(rng() % 100) / 50.0f));
      t.biases[i] = bf16_round(-0.15f + 0.003f * static_cast<float>(rng() % 100));
    }
    for (int64_t r = 0; r < rows; r++)
      for (int64_t c = 0; c < cols; c++) {
        // little-endian: byte k of the row's words holds columns 2k (low nibble) and 2k + 1
        const uint8_t byte = t.data[(static_cast<size_t>(r) * cols + c) / 2];
        const int q = c % 2 == 0 ? (byte & 0xf) : (byte >> 4);
        const size_t g = static_cast<size_t>(r) * ng + c / group;
        t.value[static_cast<size_t>(r) * cols + c] = q * bf16_value(t.scales[g]) + bf16_value(t.biases[g]);
      }
  } else if (dt == DType::F32) {
    t.data.resize(n * 4);
    for (size_t i = 0; i < n; i++) {
      const float v = nd(rng);
      std::memcpy(t.data.data() + 4 * i, &v, 4);
      t.value[i] = v;
    }
  } else {
    t.data.resize(n * 2);
    for (size_t i = 0; i < n; i++) {
      const uint16_t h = dt == DType::BF16 ? bf16_round(nd(rng)) : f32_to_f16(nd(rng));
      std::memcpy(t.data.data() + 2 * i, &h, 2);
      t.value[i] = dt == DType::BF16 ? bf16_value(h) : f16_value(h);
    }
  }
  return t;
}

DevWeight upload_weight(Backend& be, const HostWeight& w) {
  DevWeight d;
  d.data = to_device(be, w.data);
  d.ref = w.host_ref();
  d.ref.data = d.data.get();
  if (w.dt == DType::U32) {
    d.scales = to_device(be, w.scales);
    d.biases = to_device(be, w.biases);
    d.ref.scales = d.scales.get();
    d.ref.biases = d.biases.get();
  }
  return d;
}

// ---- comparisons ------------------------------------------------------------------------------
::testing::AssertionResult within(const std::vector<float>& got, const std::vector<double>& ref,
                                  const std::vector<double>& tol, const std::string& what) {
  if (got.size() != ref.size() || tol.size() != ref.size())
    return ::testing::AssertionFailure() << what << ": " << got.size() << " elements, reference " << ref.size()
                                         << ", tolerances " << tol.size();
  size_t bad = 0, worst = 0;
  double worst_ratio = 0;
  for (size_t i = 0; i < ref.size(); i++) {
    const double err = std::fabs(static_cast<double>(got[i]) - ref[i]);
    const double ratio = std::isnan(err) ? INFINITY : (tol[i] > 0 ? err / tol[i] : (err > 0 ? INFINITY : 0));
    if (ratio > 1) bad++;
    if (ratio > worst_ratio || (i == 0 && ratio == 0)) {
      worst_ratio = ratio;
      worst = i;
    }
  }
  static const bool report = [] {
    const char* e = std::getenv("QFLASH_TOL_REPORT");
    return e && *e && std::string(e) != "0";
  }();
  if (report) std::printf("[ tol ] %-50s worst error / tolerance %.3g (element %zu)\n", what.c_str(), worst_ratio, worst);
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << bad << " of " << ref.size() << " elements out of tolerance; worst "
                                       << worst << ": got " << got[worst] << ", reference " << ref[worst] << ", error "
                                       << std::fabs(static_cast<double>(got[worst]) - ref[worst]) << " > tolerance "
                                       << tol[worst] << " (x" << worst_ratio << ")";
}

::testing::AssertionResult within_rows_l2(const std::vector<float>& got, const std::vector<double>& ref, int row_len,
                                          const std::vector<double>& tol, const std::string& what) {
  const size_t rows = ref.size() / row_len;
  if (got.size() != ref.size() || tol.size() != rows)
    return ::testing::AssertionFailure() << what << ": " << got.size() << " elements, reference " << ref.size()
                                         << ", row tolerances " << tol.size();
  std::vector<float> norm(rows);
  std::vector<double> zero(rows, 0.0);
  for (size_t r = 0; r < rows; r++) {
    double ss = 0;
    for (int j = 0; j < row_len; j++) {
      const double e = static_cast<double>(got[r * row_len + j]) - ref[r * row_len + j];
      ss += e * e;
    }
    norm[r] = static_cast<float>(std::sqrt(ss));  // NaN stays NaN
  }
  return within(norm, zero, tol, what + " (2-norm of each row's error)");
}

::testing::AssertionResult same_bits(const float* got, const float* want, size_t n, const std::string& what) {
  size_t bad = 0, first = n;
  for (size_t i = 0; i < n; i++)
    if (std::memcmp(got + i, want + i, 4) != 0) {
      if (first == n) first = i;
      bad++;
    }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << bad << " of " << n << " elements differ in bits; first " << first
                                       << ": got " << got[first] << ", want " << want[first];
}

std::vector<float> to_f32(const std::vector<double>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); i++) f[i] = static_cast<float>(v[i]);
  return f;
}

// ---- the table --------------------------------------------------------------------------------
void PrintTo(const OpParam& p, std::ostream* os) { *os << p.op->name << " on " << p.backend; }

std::vector<OpParam> op_params(const std::vector<OpCase>& cases) {
  std::vector<OpParam> out;
  for (const std::string& b : test_backends()) {
    const BackendEntry* e = find_backend(b);
    for (const OpCase& c : cases)
      if ((!c.full_size && !c.accelerator_only) || (e && e->accelerator)) out.push_back({b, std::make_shared<const OpCase>(c)});
  }
  return out;
}

std::string op_param_name(const ::testing::TestParamInfo<OpParam>& info) {
  return info.param.op->name + "_" + info.param.backend;
}

void OpTest::run_case() {
  const OpParam& p = GetParam();
  std::string why;
  Backend* be = shared_backend(p.backend, &why);
  ASSERT_NE(be, nullptr) << "backend " << p.backend << " is registered available but did not start: " << why;
  p.op->run(*be);
  be->sync();  // a device-side check failing after the last download surfaces here
}

}  // namespace qf::test
