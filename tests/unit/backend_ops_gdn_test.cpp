// Backend op table, gated DeltaNet: gdn_rows (decode / verify, with the per-row state capture)
// and gdn_chunked (prefill). Outputs, states and captures against the float64 recurrence
// (support/op_reference.h) within the tolerance table; the conv tail, a copy of raw rows, bit for
// bit. Row-invariance: gdn_rows one row at a time gives the M-row call's outputs, captures and
// final state bit for bit; gdn_chunked split at multiples of kPrefillChunk rows gives the
// unsplit call's bits.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "support/op_harness.h"
#include "support/op_reference.h"

namespace qf::test {
namespace {

struct Dims {
  int nk, nv, dk, dv, conv;
};

std::string dims_name(const Dims& d) {
  return cat("Hk", d.nk, "_Hv", d.nv, "_Dk", d.dk, "_Dv", d.dv, "_K", d.conv);
}

GdnDims gdn_dims(const Dims& dd) {
  GdnDims d;
  d.n_k_heads = dd.nk;
  d.n_v_heads = dd.nv;
  d.d_k = dd.dk;
  d.d_v = dd.dv;
  d.conv_kernel = dd.conv;
  return d;
}

// Seeded inputs of one GDN layer for M rows, on the host and on the backend.
struct GdnInputs {
  std::vector<float> mixed, alpha, beta, conv, A, dt, init;
  DeviceBuffer dmix, dal, dbe, dconv, dA, ddt;
  GdnInputs(Backend& be, const GdnDims& d, int M)
      : mixed(randn(static_cast<size_t>(M) * d.conv_dim(), 10)),
        alpha(randn(static_cast<size_t>(M) * d.n_v_heads, 11)),
        beta(randn(static_cast<size_t>(M) * d.n_v_heads, 12)),
        conv(randn(static_cast<size_t>(d.conv_dim()) * d.conv_kernel, 13, 0.5f)),
        A(randn(d.n_v_heads, 14, 0.5f)),
        dt(randn(d.n_v_heads, 15, 0.5f)),
        init(randn(d.state_floats(), 16, 0.1f)),
        dmix(to_device(be, mixed)),
        dal(to_device(be, alpha)),
        dbe(to_device(be, beta)),
        dconv(to_device(be, conv)),
        dA(to_device(be, A)),
        ddt(to_device(be, dt)) {}
};

// A state blob against the reference: each state row S_i within its 2-norm bound, the conv tail
// bit for bit.
void expect_state(const std::vector<float>& got, const std::vector<double>& want, const std::vector<double>& tol_rows,
                  const GdnDims& d, const std::string& what) {
  const size_t SF = d.s_floats();
  EXPECT_TRUE(within_rows_l2(std::vector<float>(got.begin(), got.begin() + SF),
                             std::vector<double>(want.begin(), want.begin() + SF), d.d_k, tol_rows, what + " S vs float64"));
  const std::vector<float> wt = to_f32(std::vector<double>(want.begin() + SF, want.end()));
  EXPECT_TRUE(same_bits(std::vector<float>(got.begin() + SF, got.end()), wt, what + " conv tail"));
}

void check_gdn_rows(Backend& be, const Dims& dd, int M) {
  const GdnDims d = gdn_dims(dd);
  const size_t SF = d.state_floats(), VD = d.value_dim();
  const int Cd = d.conv_dim(), Hv = d.n_v_heads;
  GdnInputs in(be, d, M);
  DeviceBuffer ds = to_device(be, in.init);
  Out y(be, M * VD), cap(be, M * SF);
  be.gdn_rows(in.dmix.f(), in.dal.f(), in.dbe.f(), in.dconv.f(), in.dA.f(), in.ddt.f(), d, ds.f(), y.f(), M, cap.f());
  const auto y_all = y.floats("y"), cap_all = cap.floats("capture");
  const auto s_all = from_device<float>(be, ds.get(), SF);
  const GdnRef ref = ref_gdn(in.mixed, in.alpha, in.beta, in.conv, in.A, in.dt, d, in.init, M);
  EXPECT_TRUE(within(y_all, ref.y, ref.tol_y, "y vs float64"));
  expect_state(s_all, ref.states[M - 1], ref.tol_rows[M - 1], d, "final state");
  for (int m = 0; m < M; m++)
    expect_state(std::vector<float>(cap_all.begin() + m * SF, cap_all.begin() + (m + 1) * SF), ref.states[m],
                 ref.tol_rows[m], d, "capture " + std::to_string(m));
  // one row at a time: identical y, captures and final state
  DeviceBuffer ds1 = to_device(be, in.init);
  Out y1(be, VD);
  for (int m = 0; m < M; m++) {
    y1.repoison();
    be.gdn_rows(in.dmix.f() + m * Cd, in.dal.f() + m * Hv, in.dbe.f() + m * Hv, in.dconv.f(), in.dA.f(), in.ddt.f(), d,
                ds1.f(), y1.f(), 1, nullptr);
    EXPECT_TRUE(same_bits(y1.floats("y row").data(), y_all.data() + m * VD, VD, "row " + std::to_string(m) + " alone: y"));
    EXPECT_TRUE(same_bits(from_device<float>(be, ds1.get(), SF).data(), cap_all.data() + m * SF, SF,
                          "row " + std::to_string(m) + " alone: state vs capture"));
  }
  EXPECT_TRUE(same_bits(from_device<float>(be, ds1.get(), SF), s_all, "rows alone: final state"));
}

const std::vector<Dims> kDims = {
    {16, 48, 128, 128, 4},  // the 27B's GDN layer
    {2, 6, 16, 8, 4},
    {2, 6, 64, 64, 4},
    {1, 2, 32, 64, 2},  // conv kernel 2
    {3, 3, 96, 40, 3},  // one value head per key head, odd d_v
};

std::vector<OpCase> gdn_rows_cases() {
  std::vector<OpCase> cs;
  for (const Dims& d : kDims) cs.push_back({cat(dims_name(d), "_M9"), [d](Backend& be) { check_gdn_rows(be, d, 9); }});
  cs.push_back({cat(dims_name(kDims[1]), "_M1"), [](Backend& be) { check_gdn_rows(be, kDims[1], 1); }});
  cs.push_back({cat(dims_name(kDims[1]), "_M17"), [](Backend& be) { check_gdn_rows(be, kDims[1], 17); }});
  return cs;
}
QF_OP_SUITE(GdnRows, gdn_rows_cases);

// gdn_chunked: y and the final state against the float64 recurrence (the chunk-parallel
// tolerance), then the same rows split at every multiple of kPrefillChunk give the same bits.
void check_gdn_chunked(Backend& be, const Dims& dd, int M) {
  const GdnDims d = gdn_dims(dd);
  const size_t SF = d.state_floats(), VD = d.value_dim();
  const int Cd = d.conv_dim(), Hv = d.n_v_heads;
  GdnInputs in(be, d, M);
  DeviceBuffer ds = to_device(be, in.init);
  Out y(be, M * VD);
  be.gdn_chunked(in.dmix.f(), in.dal.f(), in.dbe.f(), in.dconv.f(), in.dA.f(), in.ddt.f(), d, ds.f(), y.f(), M);
  const auto y_all = y.floats("y");
  const auto s_all = from_device<float>(be, ds.get(), SF);
  const GdnRef ref = ref_gdn(in.mixed, in.alpha, in.beta, in.conv, in.A, in.dt, d, in.init, M, Backend::kPrefillChunk);
  EXPECT_TRUE(within(y_all, ref.y, ref.tol_y, "y vs float64"));
  expect_state(s_all, ref.states[M - 1], ref.tol_rows[M - 1], d, "final state");
  for (int A = Backend::kPrefillChunk; A < M; A += Backend::kPrefillChunk) {
    DeviceBuffer ds2 = to_device(be, in.init);
    Out y2(be, M * VD);
    be.gdn_chunked(in.dmix.f(), in.dal.f(), in.dbe.f(), in.dconv.f(), in.dA.f(), in.ddt.f(), d, ds2.f(), y2.f(), A);
    be.gdn_chunked(in.dmix.f() + A * Cd, in.dal.f() + A * Hv, in.dbe.f() + A * Hv, in.dconv.f(), in.dA.f(), in.ddt.f(), d,
                   ds2.f(), y2.f() + A * VD, M - A);
    const std::string what = "split at row " + std::to_string(A);
    EXPECT_TRUE(same_bits(y2.floats("split y"), y_all, what + ": y"));
    EXPECT_TRUE(same_bits(from_device<float>(be, ds2.get(), SF), s_all, what + ": final state"));
  }
}

std::vector<OpCase> gdn_chunked_cases() {
  std::vector<OpCase> cs;
  const Dims small = {2, 6, 32, 16, 4};
  for (int M : {1, 63, 64, 65, 150})
    cs.push_back({cat(dims_name(small), "_M", M), [=](Backend& be) { check_gdn_chunked(be, small, M); }});
  cs.push_back({cat(dims_name(kDims[0]), "_M130"), [](Backend& be) { check_gdn_chunked(be, kDims[0], 130); }});
  cs.push_back({cat(dims_name(kDims[3]), "_M200"), [](Backend& be) { check_gdn_chunked(be, kDims[3], 200); }});
  cs.push_back({cat(dims_name(kDims[4]), "_M129"), [](Backend& be) { check_gdn_chunked(be, kDims[4], 129); }});
  return cs;
}
QF_OP_SUITE(GdnChunked, gdn_chunked_cases);

}  // namespace
}  // namespace qf::test
