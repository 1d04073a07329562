// Backend op table, norms and elementwise ops: rmsnorm, rmsnorm_gated, add_rmsnorm, add, scale,
// swiglu, sigmoid_mul, softcap, copy_2d, split_qgate, rope, kv_write, dyn_conv. Float64
// references and the tolerance table as in backend_ops_dense_test.cpp; pure data movement and
// single correctly rounded operations (add, scale) are compared bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "support/op_harness.h"
#include "support/op_reference.h"
#include "support/tolerance.h"

namespace qf::test {
namespace {

const StepMeta* meta_ptr(const DeviceBuffer& b) { return reinterpret_cast<const StepMeta*>(b.get()); }

// ---- rmsnorm / rmsnorm_gated ----------------------------------------------------------------
// 19 rows against float64; rows 0, 7 and 18 alone and in place (y == x) give the same bits.
void check_rmsnorm(Backend& be, int n, bool with_w, bool gated) {
  const int rows = 19;
  const float eps = 1e-6f;
  const auto x = randn(static_cast<size_t>(rows) * n, n, 2.0f), g = randn(static_cast<size_t>(rows) * n, n + 1);
  const auto w = randn(n, n + 2);
  const DeviceBuffer dx = to_device(be, x), dg = to_device(be, g), dw = to_device(be, w);
  const float* bw = with_w ? dw.f() : nullptr;
  Out y(be, x.size());
  if (gated) be.rmsnorm_gated(dx.f(), dg.f(), bw, y.f(), rows, n, eps);
  else be.rmsnorm(dx.f(), bw, y.f(), rows, n, eps);
  const auto all = y.floats("rmsnorm");
  const Ref ref = ref_rmsnorm(x, gated ? g.data() : nullptr, with_w ? w.data() : nullptr, rows, n, eps);
  EXPECT_TRUE(within(all, ref.y, ref.tol, "rmsnorm vs float64"));
  for (int r0 : {0, 7, 18}) {
    DeviceBuffer d1(&be, static_cast<size_t>(n) * 4);
    be.copy(d1.get(), dx.f() + static_cast<size_t>(r0) * n, static_cast<size_t>(n) * 4);
    if (gated) be.rmsnorm_gated(d1.f(), dg.f() + static_cast<size_t>(r0) * n, bw, d1.f(), 1, n, eps);
    else be.rmsnorm(d1.f(), bw, d1.f(), 1, n, eps);
    EXPECT_TRUE(same_bits(from_device<float>(be, d1.get(), n).data(), all.data() + static_cast<size_t>(r0) * n, n,
                          "row " + std::to_string(r0) + " alone, in place"));
  }
}

// n: a warp's width, odd widths, the 27B's hidden size, and a width past 8192 (a GPU's register
// path ends there).
const std::vector<int> kNormWidths = {16, 128, 203, 256, 1500, 5120, 10000};

std::vector<OpCase> rmsnorm_cases(bool gated) {
  std::vector<OpCase> cs;
  for (int n : kNormWidths)
    for (bool w : {true, false})
      cs.push_back({cat("n", n, w ? "_w" : "_ones"), [=](Backend& be) { check_rmsnorm(be, n, w, gated); }});
  return cs;
}
std::vector<OpCase> rmsnorm_plain_cases() { return rmsnorm_cases(false); }
std::vector<OpCase> rmsnorm_gated_cases() { return rmsnorm_cases(true); }
QF_OP_SUITE(Rmsnorm, rmsnorm_plain_cases);
QF_OP_SUITE(RmsnormGated, rmsnorm_gated_cases);

// add_rmsnorm: h += r exactly (one fp32 add per element), y = rmsnorm(h) w against float64, the
// same bits as add() then rmsnorm() on the same backend (the contract), and per-row invariance.
void check_add_rmsnorm(Backend& be, int n, bool with_w) {
  const int rows = 11;
  const float eps = 1e-6f;
  const auto h0 = randn(static_cast<size_t>(rows) * n, 3 * n, 2.0f), r = randn(h0.size(), 3 * n + 1);
  const auto w = randn(n, 3 * n + 2);
  const DeviceBuffer dr = to_device(be, r), dw = to_device(be, w);
  const float* bw = with_w ? dw.f() : nullptr;
  DeviceBuffer dh = to_device(be, h0);
  Out y(be, h0.size());
  be.add_rmsnorm(dh.f(), dr.f(), bw, y.f(), rows, n, eps);
  const auto h = from_device<float>(be, dh.get(), h0.size());
  const auto all = y.floats("add_rmsnorm");
  std::vector<float> hsum(h0.size());
  for (size_t i = 0; i < h0.size(); i++) hsum[i] = static_cast<float>(static_cast<double>(h0[i]) + r[i]);
  EXPECT_TRUE(same_bits(h, hsum, "h + r"));
  const Ref ref = ref_rmsnorm(hsum, nullptr, with_w ? w.data() : nullptr, rows, n, eps);
  EXPECT_TRUE(within(all, ref.y, ref.tol, "rmsnorm(h + r) vs float64"));
  DeviceBuffer dh2 = to_device(be, h0);
  Out y2(be, h0.size());
  be.add(dh2.f(), dr.f(), h0.size());
  be.rmsnorm(dh2.f(), bw, y2.f(), rows, n, eps);
  EXPECT_TRUE(same_bits(all, y2.floats("add then rmsnorm"), "add_rmsnorm vs add() then rmsnorm()"));
  for (int r0 : {0, rows - 1}) {
    DeviceBuffer d1 = to_device(be, std::vector<float>(h0.begin() + static_cast<size_t>(r0) * n,
                                                       h0.begin() + static_cast<size_t>(r0 + 1) * n));
    Out y1(be, n);
    be.add_rmsnorm(d1.f(), dr.f() + static_cast<size_t>(r0) * n, bw, y1.f(), 1, n, eps);
    EXPECT_TRUE(same_bits(y1.floats("row alone").data(), all.data() + static_cast<size_t>(r0) * n, n,
                          "row " + std::to_string(r0) + " alone"));
  }
}

std::vector<OpCase> add_rmsnorm_cases() {
  std::vector<OpCase> cs;
  for (int n : kNormWidths)
    for (bool w : {true, false})
      cs.push_back({cat("n", n, w ? "_w" : "_ones"), [=](Backend& be) { check_add_rmsnorm(be, n, w); }});
  return cs;
}
QF_OP_SUITE(AddRmsnorm, add_rmsnorm_cases);

// ---- elementwise ----------------------------------------------------------------------------
// Each op on n = 100001 elements and, at an address one float past an allocation's start, on
// n = 1003 (odd tails, unaligned pointers).
enum class Ew { Add, Scale, Swiglu, SigmoidMul, Softcap30, Softcap2, Softcap0 };

void check_elementwise(Backend& be, Ew op, size_t n, size_t off) {
  const auto a = randn(n, 1, 3.0f), b = randn(n, 2, 3.0f);
  Out ya(be, n + off), out(be, n + off);  // ya: the input a, updated in place by all but swiglu
  DeviceBuffer db(&be, (n + off) * 4);
  be.upload(ya.f() + off, a.data(), n * 4);
  be.upload(db.f() + off, b.data(), n * 4);
  float* y = ya.f() + off;
  std::vector<double> want(n), tol(n, 0.0);
  switch (op) {
    case Ew::Add: be.add(y, db.f() + off, n); break;
    case Ew::Scale: be.scale(y, 0.37f, n); break;
    case Ew::Swiglu: be.swiglu(y, db.f() + off, out.f() + off, n); break;
    case Ew::SigmoidMul: be.sigmoid_mul(y, db.f() + off, n); break;
    case Ew::Softcap30: be.softcap(y, 30.0f, n); break;
    case Ew::Softcap2: be.softcap(y, 2.0f, n); break;
    case Ew::Softcap0: be.softcap(y, 0.0f, n); break;
  }
  for (size_t i = 0; i < n; i++) {
    const double x = a[i], g = b[i];
    switch (op) {
      case Ew::Add: want[i] = static_cast<float>(x + g); break;  // the one fp32 rounding of the sum
      case Ew::Scale: want[i] = static_cast<float>(x * 0.37f); break;
      case Ew::Swiglu: want[i] = x / (1 + std::exp(-x)) * g; break;
      case Ew::SigmoidMul: want[i] = x / (1 + std::exp(-g)); break;
      case Ew::Softcap30: want[i] = std::tanh(x / 30) * 30; break;
      case Ew::Softcap2: want[i] = std::tanh(x / 2) * 2; break;
      case Ew::Softcap0: want[i] = x; break;  // cap <= 0: unchanged
    }
    if (op == Ew::Swiglu || op == Ew::SigmoidMul || op == Ew::Softcap30 || op == Ew::Softcap2)
      tol[i] = tol::kActivation * std::fabs(want[i]);
  }
  auto all = (op == Ew::Swiglu ? out : ya).floats("output");
  const std::vector<float> got(all.begin() + off, all.end());
  EXPECT_TRUE(within(got, want, tol, "vs float64"));
}

std::vector<OpCase> elementwise_cases() {
  const std::vector<std::pair<Ew, const char*>> ops = {
      {Ew::Add, "add"},           {Ew::Scale, "scale"},         {Ew::Swiglu, "swiglu"},     {Ew::SigmoidMul, "sigmoid_mul"},
      {Ew::Softcap30, "softcap30"}, {Ew::Softcap2, "softcap2"}, {Ew::Softcap0, "softcap0"}};
  std::vector<OpCase> cs;
  for (auto [op, name] : ops) {
    cs.push_back({cat(name, "_n100001"), [op = op](Backend& be) { check_elementwise(be, op, 100001, 0); }});
    cs.push_back({cat(name, "_n1003_off1"), [op = op](Backend& be) { check_elementwise(be, op, 1003, 1); }});
  }
  return cs;
}
QF_OP_SUITE(Elementwise, elementwise_cases);

// ---- data movement --------------------------------------------------------------------------
// copy_2d between strided row sets: the rows land, every other element of dst keeps its bytes.
void check_copy_2d(Backend& be, int dst_ld, int src_ld, int rows, int cols) {
  const size_t n = 5000;
  const auto v = randn(n, 1);
  const DeviceBuffer src = to_device(be, v);
  Out dst(be, n);
  be.copy_2d(dst.f() + 7, dst_ld, src.f() + 3, src_ld, rows, cols);
  std::vector<float> want(n);
  std::memset(want.data(), 0xff, n * 4);
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < cols; c++) want[7 + static_cast<size_t>(r) * dst_ld + c] = v[3 + static_cast<size_t>(r) * src_ld + c];
  EXPECT_TRUE(same_bits(dst.floats("copy_2d"), want, "copy_2d"));
}

// split_qgate: [M, nh, 2, hd] -> q, gate [M, nh, hd], bit for bit.
void check_split_qgate(Backend& be, int M, int nh, int hd) {
  const auto qg = randn(static_cast<size_t>(M) * nh * 2 * hd, 3);
  const DeviceBuffer dqg = to_device(be, qg);
  Out q(be, static_cast<size_t>(M) * nh * hd), g(be, static_cast<size_t>(M) * nh * hd);
  be.split_qgate(dqg.f(), q.f(), g.f(), M, nh, hd);
  std::vector<float> wq(q.size()), wg(g.size());
  for (size_t mh = 0; mh < static_cast<size_t>(M) * nh; mh++)
    for (int d = 0; d < hd; d++) {
      wq[mh * hd + d] = qg[mh * 2 * hd + d];
      wg[mh * hd + d] = qg[mh * 2 * hd + hd + d];
    }
  EXPECT_TRUE(same_bits(q.floats("q"), wq, "q"));
  EXPECT_TRUE(same_bits(g.floats("gate"), wg, "gate"));
}

// kv_write: rows land at q_pos0 - kv_pos0, the rest of the cache keeps its bytes.
void check_kv_write(Backend& be, int M, int width, int cap, StepMeta meta) {
  const auto rows = randn(static_cast<size_t>(M) * width, 4), cache0 = randn(static_cast<size_t>(cap) * width, 5);
  DeviceBuffer dc = to_device(be, cache0);
  const DeviceBuffer dr = to_device(be, rows), dm = to_device(be, std::vector<StepMeta>{meta});
  be.kv_write(dc.f(), dr.f(), M, width, meta_ptr(dm));
  std::vector<float> want = cache0;
  std::copy(rows.begin(), rows.end(), want.begin() + static_cast<size_t>(meta.q_pos0 - meta.kv_pos0) * width);
  EXPECT_TRUE(same_bits(from_device<float>(be, dc.get(), want.size()), want, "cache"));
}

std::vector<OpCase> movement_cases() {
  return {
      {"copy_2d_R10_C120", [](Backend& be) { check_copy_2d(be, 300, 250, 10, 120); }},
      {"copy_2d_R1_C4000", [](Backend& be) { check_copy_2d(be, 4000, 4000, 1, 4000); }},
      {"copy_2d_R37_C5", [](Backend& be) { check_copy_2d(be, 7, 9, 37, 5); }},
      {"split_qgate_M5_H3_D64", [](Backend& be) { check_split_qgate(be, 5, 3, 64); }},
      {"split_qgate_M17_H24_D256", [](Backend& be) { check_split_qgate(be, 17, 24, 256); }},
      {"kv_write_M5_W96", [](Backend& be) { check_kv_write(be, 5, 96, 40, StepMeta{130, 110, 0, 0}); }},
      {"kv_write_M1_W1024_row0", [](Backend& be) { check_kv_write(be, 1, 1024, 8, StepMeta{500, 500, 0, 0}); }},
      {"kv_write_M16_W33_last", [](Backend& be) { check_kv_write(be, 16, 33, 64, StepMeta{48, 0, 0, 0}); }},
  };
}
QF_OP_SUITE(DataMovement, movement_cases);

// ---- rope -----------------------------------------------------------------------------------
// 9 rows against float64 (the angle in fp32 as the contract defines it), then each row alone at
// its own position gives the same bits.
void check_rope(Backend& be, int nh, int hd, int rot, float theta, int pos0) {
  const int M = 9;
  const auto x = randn(static_cast<size_t>(M) * nh * hd, hd);
  const StepMeta meta{pos0, 0, pos0 + M, 0};
  DeviceBuffer dx = to_device(be, x);
  const DeviceBuffer dm = to_device(be, std::vector<StepMeta>{meta});
  be.rope(dx.f(), M, nh, hd, rot, theta, meta_ptr(dm));
  const auto all = from_device<float>(be, dx.get(), x.size());
  const Ref ref = ref_rope(x, M, nh, hd, rot, theta, pos0);
  EXPECT_TRUE(within(all, ref.y, ref.tol, "rope vs float64"));
  const size_t row = static_cast<size_t>(nh) * hd;
  for (int m = 0; m < M; m++) {
    DeviceBuffer d1 = to_device(be, std::vector<float>(x.begin() + m * row, x.begin() + (m + 1) * row));
    const DeviceBuffer dm1 = to_device(be, std::vector<StepMeta>{StepMeta{pos0 + m, 0, pos0 + m + 1, 0}});
    be.rope(d1.f(), 1, nh, hd, rot, theta, meta_ptr(dm1));
    EXPECT_TRUE(same_bits(from_device<float>(be, d1.get(), row).data(), all.data() + m * row, row,
                          "row " + std::to_string(m) + " alone"));
  }
}

std::vector<OpCase> rope_cases() {
  return {
      // the 27B's partial rope (64 of 256 dims, theta 1e7), full rope at large positions, small heads
      {"H3_D256_R64_theta1e7_pos1000", [](Backend& be) { check_rope(be, 3, 256, 64, 1e7f, 1000); }},
      {"H4_D64_R64_theta1e4_pos100000", [](Backend& be) { check_rope(be, 4, 64, 64, 10000.0f, 100000); }},
      {"H2_D128_R128_theta1e6_pos5", [](Backend& be) { check_rope(be, 2, 128, 128, 1e6f, 5); }},
      {"H1_D16_R8_theta5e5_pos262000", [](Backend& be) { check_rope(be, 1, 16, 8, 500000.0f, 262000); }},
  };
}
QF_OP_SUITE(Rope, rope_cases);

// ---- dyn_conv -------------------------------------------------------------------------------
void check_dyn_conv(Backend& be, int L, int H, int Kc, int gs, int side) {
  const int G = H / gs;
  const auto x = randn(static_cast<size_t>(L) * H, 1), base = randn(static_cast<size_t>(2) * Kc * H, 2, 0.5f);
  const auto D = randn(static_cast<size_t>(L) * 2 * Kc * G, 3, 0.5f);
  const DeviceBuffer dx = to_device(be, x), db = to_device(be, base), dD = to_device(be, D);
  Out out(be, x.size());
  be.dyn_conv(dx.f(), db.f() + static_cast<size_t>(side) * Kc * H, dD.f(), out.f(), L, H, Kc, gs, side);
  const Ref ref = ref_dyn_conv(x, base.data() + static_cast<size_t>(side) * Kc * H, D, L, H, Kc, gs, side);
  EXPECT_TRUE(within(out.floats("dyn_conv"), ref.y, ref.tol, "dyn_conv vs float64"));
}

std::vector<OpCase> dyn_conv_cases() {
  std::vector<OpCase> cs;
  struct C {
    int L, H, Kc, gs;
  };
  for (const C& c : {C{8, 256, 2, 16}, C{16, 512, 4, 32}, C{3, 64, 4, 64}})
    for (int side : {0, 1})
      cs.push_back({cat("L", c.L, "_H", c.H, "_Kc", c.Kc, "_gs", c.gs, "_side", side),
                    [=](Backend& be) { check_dyn_conv(be, c.L, c.H, c.Kc, c.gs, side); }});
  return cs;
}
QF_OP_SUITE(DynConv, dyn_conv_cases);

}  // namespace
}  // namespace qf::test
