// The backend op table's harness (tests/unit/backend_ops_*_test.cpp): seeded inputs, backend
// buffers poisoned before every call, host weights with their exact values, element-wise and
// bit-exact comparisons, and the (backend x case) parameterisation.
//
// A case is a name and a function run on one backend; QF_OP_SUITE(Suite, cases) makes one gtest
// suite per op, with a test per (case, available backend) named
//   Op/<Suite>.Check/<case>_<backend>          e.g. Op/Matmul.Check/bf16_N37_K203_cuda
// so --gtest_filter='Op/Matmul.*' runs one op, 'Op/*_cuda' one backend, and a full name one case.
// Checks inside a case are EXPECTs: one failure does not hide the others.
#pragma once
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"

namespace qf::test {

// ---- seeded inputs ----------------------------------------------------------------------------
// Normal(0, sigma) floats, never exactly zero (a zero input would hide an op that skips work).
std::vector<float> randn(size_t n, uint64_t seed, float sigma = 1.0f);

// ---- backend memory ---------------------------------------------------------------------------
template <class T>
DeviceBuffer to_device(Backend& be, const std::vector<T>& h) {
  DeviceBuffer b(&be, h.size() * sizeof(T));
  if (!h.empty()) be.upload(b.get(), h.data(), h.size() * sizeof(T));
  return b;
}
template <class T>
std::vector<T> from_device(Backend& be, const void* p, size_t n) {
  std::vector<T> h(n);
  if (n) be.download(h.data(), p, n * sizeof(T));
  return h;
}
// 0xff in every byte: NaN as a float, -1 as an int32, so an element an op forgot to write fails.
void poison(Backend& be, void* p, size_t bytes);

// An op's output: n elements followed by a guard, all poisoned. get() downloads the n elements
// and fails the test when the op wrote into the guard.
class Out {
 public:
  Out(Backend& be, size_t n, size_t elem_bytes = 4);
  float* f() const { return buf_.f(); }
  int32_t* i() const { return buf_.i(); }
  void repoison() { poison(*be_, buf_.get(), buf_.bytes()); }
  std::vector<float> floats(const std::string& what) const;
  std::vector<int32_t> ints(const std::string& what) const;
  size_t size() const { return n_; }

 private:
  void check_guard(const std::string& what) const;
  static constexpr size_t kGuardBytes = 256;
  Backend* be_;
  size_t n_, elem_;
  DeviceBuffer buf_;
};

// ---- weights ----------------------------------------------------------------------------------
// Exact value of stored elements, decoded here (not with the library's converters).
double bf16_value(uint16_t h);
double f16_value(uint16_t h);
uint16_t bf16_round(float f);  // round to nearest even (the gemm contract's activation rounding)

// A random weight matrix on the host: its storage bytes and the exact value of every element.
// BF16 / F16 / F32: Normal(0, 1) rounded to the dtype. U32 (int4, mlx layout: word w of a row holds
// columns 8w..8w+7, element j at bits 4j; w = q * scale + bias per group): random nibbles, bf16
// scales in [0.02, 0.06) and biases in [-0.15, 0.15).
struct HostWeight {
  DType dt = DType::BF16;
  int64_t rows = 0, cols = 0;
  int group = 0;
  std::vector<uint8_t> data;
  std::vector<uint16_t> scales, biases;
  std::vector<double> value;  // [rows, cols]
  double at(int64_t r, int64_t c) const { return value[static_cast<size_t>(r) * cols + c]; }
  WeightRef host_ref() const;  // pointing at the host bytes (for a backend that reads host memory)
};
HostWeight random_weight(DType dt, int64_t rows, int64_t cols, uint64_t seed, int group = 64);
const char* dtype_tag(DType dt);  // "bf16", "f16", "f32", "int4"

// The same weight in a backend's memory.
struct DevWeight {
  DeviceBuffer data, scales, biases;
  WeightRef ref;
};
DevWeight upload_weight(Backend& be, const HostWeight& w);

// ---- comparisons ------------------------------------------------------------------------------
// |got[i] - ref[i]| <= tol[i] for every i; a NaN fails (an unwritten, poisoned element). The
// message names the worst element, the number of failures and the worst error / tolerance ratio.
// With QFLASH_TOL_REPORT=1 every comparison prints that ratio (how much margin a backend has).
::testing::AssertionResult within(const std::vector<float>& got, const std::vector<double>& ref,
                                  const std::vector<double>& tol, const std::string& what);
// Row by row (rows of row_len): ||got_row - ref_row||_2 <= tol[row]; a NaN fails.
::testing::AssertionResult within_rows_l2(const std::vector<float>& got, const std::vector<double>& ref, int row_len,
                                          const std::vector<double>& tol, const std::string& what);
// got == want bit for bit (floats compared as bytes: -0 != +0, NaN payloads count).
::testing::AssertionResult same_bits(const float* got, const float* want, size_t n, const std::string& what);
inline ::testing::AssertionResult same_bits(const std::vector<float>& got, const std::vector<float>& want,
                                            const std::string& what) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << what << ": " << got.size() << " elements, want " << want.size();
  return same_bits(got.data(), want.data(), got.size(), what);
}
// The float nearest to a float64 reference (for ops whose contract is one fp32 rounding).
std::vector<float> to_f32(const std::vector<double>& v);

// Row counts of an invariance sweep: `dense` on a GPU, whose kernels tile rows (8-token MMA tiles,
// 16-row passes, split counts) so every count can take another path, `sparse` on the CPU, whose
// ops run one row at a time (a dense sweep there costs minutes of CPU for no new path).
inline std::vector<int> sweep(const Backend& be, const std::vector<int>& dense, const std::vector<int>& sparse) {
  return be.is_gpu() ? dense : sparse;
}

// A case name from parts: cat("n", 203, "_w") == "n203_w".
template <class... A>
std::string cat(const A&... a) {
  std::ostringstream s;
  (s << ... << a);
  return s.str();
}

// ---- the table --------------------------------------------------------------------------------
struct OpCase {
  std::string name;                   // gtest parameter characters only: [A-Za-z0-9_]
  std::function<void(Backend&)> run;  // EXPECTs
  bool full_size = false;             // model-size shapes: instantiated on accelerator backends only
  // A feature only accelerator backends have (their own weight layout, graph recording): such a
  // case is instantiated on accelerators only, where the feature is required (no skip).
  bool accelerator_only = false;
};
struct OpParam {
  std::string backend;
  std::shared_ptr<const OpCase> op;
};
void PrintTo(const OpParam& p, std::ostream* os);
// Every case on every available backend (full-size cases on accelerators only).
std::vector<OpParam> op_params(const std::vector<OpCase>& cases);
std::string op_param_name(const ::testing::TestParamInfo<OpParam>& info);

class OpTest : public ::testing::TestWithParam<OpParam> {
 protected:
  void run_case();
};

}  // namespace qf::test

// One gtest suite for an op: Op/<Suite>.Check/<case>_<backend> over cases_fn()'s cases. A suite
// may be empty here (full-size cases without an accelerator): that is allowed, not an error.
#define QF_OP_SUITE(Suite, cases_fn)                                                           \
  class Suite : public ::qf::test::OpTest {};                                                  \
  TEST_P(Suite, Check) { run_case(); }                                                         \
  GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(Suite);                                        \
  INSTANTIATE_TEST_SUITE_P(Op, Suite, ::testing::ValuesIn(::qf::test::op_params(cases_fn())), \
                           ::qf::test::op_param_name)
