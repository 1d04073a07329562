// Backend op table, dense ops: matmul (bf16 / f16 / f32 / int4 weights, and the backend's own
// GEMV layout where it has one), matmul_group, gemm (the prefill GEMM), the model-size shapes,
// and embed. Every result is checked against a float64 reference (support/op_reference.h) within
// the tolerance table (support/tolerance.h), and each op's row-invariance on the backend itself:
// row m of an M-row call is bit-identical to that row computed alone. Naming and filters:
// support/op_harness.h.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "support/op_harness.h"
#include "support/op_reference.h"
#include "support/tolerance.h"

namespace qf::test {
namespace {

std::string shape_name(DType dt, int64_t N, int64_t K, int group = 0) {
  return dt == DType::U32 ? cat(dtype_tag(dt), "_N", N, "_K", K, "_g", group) : cat(dtype_tag(dt), "_N", N, "_K", K);
}

// Row counts of the invariance sweep: every M of one and two 8-token tiles, then several passes
// (support/op_harness.h, sweep()).
const std::vector<int> kRowCounts = {2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 21, 24, 33, 40};
const std::vector<int> kRowCountsSparse = {2, 5, 8, 9, 16, 17};

// Runs `mm` (a matmul-like call y = f(x) of `rows` outputs per input row) on every input row alone
// and returns the [maxM, rows] results.
template <class F>
std::vector<float> rows_alone(Backend& be, F mm, const DeviceBuffer& dx, int64_t K, int64_t rows, int maxM) {
  std::vector<float> one(static_cast<size_t>(maxM) * rows);
  Out y(be, rows);
  for (int m = 0; m < maxM; m++) {
    y.repoison();
    mm(dx.f() + static_cast<size_t>(m) * K, y.f(), 1);
    const auto r = y.floats("row " + std::to_string(m) + " alone");
    std::copy(r.begin(), r.end(), one.begin() + static_cast<size_t>(m) * rows);
  }
  return one;
}

// For each M: rows [off, off + M) in one call equal the same rows computed alone, bit for bit
// (off = 0 and off = maxM - M, so every row position is exercised).
template <class F>
void expect_row_invariant(Backend& be, F mm, const DeviceBuffer& dx, int64_t K, int64_t rows,
                          const std::vector<float>& one, const std::vector<int>& Ms, const std::string& what) {
  const int maxM = static_cast<int>(one.size() / rows);
  for (int M : Ms) {
    if (M > maxM) continue;
    for (int off : {0, maxM - M}) {
      Out y(be, static_cast<size_t>(M) * rows);
      mm(dx.f() + static_cast<size_t>(off) * K, y.f(), M);
      const std::string tag = what + " M=" + std::to_string(M) + " rows " + std::to_string(off) + "..";
      EXPECT_TRUE(same_bits(y.floats(tag).data(), one.data() + static_cast<size_t>(off) * rows,
                            static_cast<size_t>(M) * rows, tag + " vs each row alone"));
      if (off == maxM - M) break;
    }
  }
}

// matmul: the M = 1 results against float64, every other M against them bit for bit, and
// activations at an address that is not 16-byte aligned (a GPU restages them) too.
void check_matmul(Backend& be, DType dt, int64_t N, int64_t K, int group) {
  const HostWeight W = random_weight(dt, N, K, 10 + N + K, group);
  const DevWeight dw = upload_weight(be, W);
  const std::vector<int> Ms = sweep(be, kRowCounts, kRowCountsSparse);
  const int maxM = Ms.back();
  const auto x = randn(static_cast<size_t>(maxM) * K, 20 + K);
  const DeviceBuffer dx = to_device(be, x);
  auto mm = [&](const float* xp, float* yp, int M) { be.matmul(dw.ref, xp, yp, M); };
  const auto one = rows_alone(be, mm, dx, K, N, maxM);
  const Ref ref = ref_matmul(W, x, maxM);
  EXPECT_TRUE(within(one, ref.y, ref.tol, "matmul rows vs float64"));
  expect_row_invariant(be, mm, dx, K, N, one, Ms, "matmul");
  const int M = 5;
  DeviceBuffer odd(&be, (static_cast<size_t>(M) * K + 1) * sizeof(float));
  be.copy(odd.f() + 1, dx.f(), static_cast<size_t>(M) * K * sizeof(float));
  Out y(be, static_cast<size_t>(M) * N);
  be.matmul(dw.ref, odd.f() + 1, y.f(), M);
  EXPECT_TRUE(same_bits(y.floats("misaligned x").data(), one.data(), static_cast<size_t>(M) * N, "misaligned x"));
}

std::vector<OpCase> matmul_cases() {
  struct S {
    int64_t N, K;
  };
  std::vector<OpCase> cs;
  // odd sizes (lane tails), one 64-column chunk, the 27B's widths, a 1024-row weight
  const std::vector<S> dense = {{37, 203}, {64, 512}, {48, 5120}, {300, 1000}, {1024, 4096}, {5, 8}, {129, 776}, {37, 256}};
  for (DType dt : {DType::BF16, DType::F16, DType::F32})
    for (const S& s : dense)
      cs.push_back({shape_name(dt, s.N, s.K), [=](Backend& be) { check_matmul(be, dt, s.N, s.K, 0); }});
  struct Q {
    int64_t N, K;
    int group;
  };
  for (const Q& q : {Q{64, 512, 64}, Q{40, 200, 40}, Q{128, 4096, 128}, Q{33, 1024, 32}, Q{300, 5120, 64}, Q{37, 256, 64},
                     Q{48, 5120, 64}, Q{1024, 4096, 64}})
    cs.push_back({shape_name(DType::U32, q.N, q.K, q.group),
                  [=](Backend& be) { check_matmul(be, DType::U32, q.N, q.K, q.group); }});
  return cs;
}
QF_OP_SUITE(Matmul, matmul_cases);

// The backend's own GEMV layout (Backend::relayout_matrix; CUDA: kTc32x64 for tensor-core
// eligible bf16 weights): the same bits as the row-major weight for every M, and so the same
// accuracy. Accelerator backends only (the CPU reads row-major weights).
void check_matmul_relayout(Backend& be, int64_t N, int64_t K) {
  const HostWeight W = random_weight(DType::BF16, N, K, 300 + N, 0);
  const DevWeight dw = upload_weight(be, W);
  WeightRef wt = dw.ref;
  const void* tiled = be.relayout_matrix(dw.ref, &wt.layout);
  ASSERT_NE(tiled, nullptr) << "backend " << be.name() << " kept row-major weights for " << N << "x" << K;
  wt.data = tiled;
  EXPECT_NE(wt.layout, WeightRef::kRowMajor);
  const int maxM = 16;
  const auto x = randn(static_cast<size_t>(maxM) * K, 31);
  const DeviceBuffer dx = to_device(be, x);
  auto row_major = [&](const float* xp, float* yp, int M) { be.matmul(dw.ref, xp, yp, M); };
  auto relaid = [&](const float* xp, float* yp, int M) { be.matmul(wt, xp, yp, M); };
  const auto one = rows_alone(be, row_major, dx, K, N, maxM);
  const Ref ref = ref_matmul(W, x, maxM);
  EXPECT_TRUE(within(one, ref.y, ref.tol, "row-major rows vs float64"));
  expect_row_invariant(be, relaid, dx, K, N, one, {1, 2, 5, 8, 9, 16}, "relaid weight");
  be.release_weight(tiled);
}

// bf16 pieces per activation of the int4 tensor-core GEMV (QFLASH_TC_Q4_PIECES, read by the
// kernel too: 3 is exact, else 2).
int int4_tc_pieces() {
  const char* e = std::getenv("QFLASH_TC_Q4_PIECES");
  return e && std::strcmp(e, "3") == 0 ? 3 : 2;
}

// int4 in the backend's own layout (CUDA: kTcQ4, the int4 tensor-core GEMV): every row alone
// against float64 within that form's bound (tol::matmul_int4_tc), and each row's bits the same
// for every M of one and two token tiles and several passes, misaligned activations included.
void check_matmul_relayout_int4(Backend& be, int64_t N, int64_t K, int group) {
  const HostWeight W = random_weight(DType::U32, N, K, 900 + N + K, group);
  const DevWeight dw = upload_weight(be, W);
  WeightRef wt = dw.ref;
  const void* tiled = be.relayout_matrix(dw.ref, &wt.layout);
  ASSERT_NE(tiled, nullptr) << "backend " << be.name() << " kept row-major int4 weights for " << N << "x" << K;
  wt.data = tiled;
  wt.scales = wt.biases = nullptr;  // the tiles hold them (WeightRef::kTcQ4)
  EXPECT_NE(wt.layout, WeightRef::kRowMajor);
  const int maxM = 40;
  const auto x = randn(static_cast<size_t>(maxM) * K, 37 + K);
  const DeviceBuffer dx = to_device(be, x);
  auto relaid = [&](const float* xp, float* yp, int M) { be.matmul(wt, xp, yp, M); };
  const auto one = rows_alone(be, relaid, dx, K, N, maxM);
  const Ref ref = ref_matmul_int4_tc(W, x, maxM, int4_tc_pieces());
  EXPECT_TRUE(within(one, ref.y, ref.tol, "int4 tiles, rows vs float64"));
  expect_row_invariant(be, relaid, dx, K, N, one, kRowCounts, "int4 tiles");
  const int M = 5;
  DeviceBuffer odd(&be, (static_cast<size_t>(M) * K + 1) * sizeof(float));
  be.copy(odd.f() + 1, dx.f(), static_cast<size_t>(M) * K * sizeof(float));
  Out y(be, static_cast<size_t>(M) * N);
  be.matmul(wt, odd.f() + 1, y.f(), M);
  EXPECT_TRUE(same_bits(y.floats("misaligned x").data(), one.data(), static_cast<size_t>(M) * N, "int4 tiles, misaligned x"));
  be.release_weight(tiled);
}

std::vector<OpCase> relayout_cases() {
  std::vector<OpCase> cs;
  // rows not multiples of 32 are padded in the tiled layout; 4100 x 128: many tiles, one chunk
  for (auto [N, K] : std::vector<std::pair<int64_t, int64_t>>{{48, 5120}, {1000, 4096}, {37, 256}, {4100, 128}, {5, 64}})
    cs.push_back({shape_name(DType::BF16, N, K), [=](Backend& be) { check_matmul_relayout(be, N, K); }, false, true});
  // int4: each group size, padded row tiles, one unit (K = 64 or G), the 27B's widths
  struct Q {
    int64_t N, K;
    int group;
  };
  for (const Q& q : {Q{64, 512, 64}, Q{37, 256, 64}, Q{33, 1024, 32}, Q{300, 1024, 128}, Q{5, 64, 64}, Q{48, 5120, 64},
                     Q{1000, 4096, 64}, Q{130, 128, 128}})
    cs.push_back({shape_name(DType::U32, q.N, q.K, q.group),
                  [=](Backend& be) { check_matmul_relayout_int4(be, q.N, q.K, q.group); }, false, true});
  return cs;
}
QF_OP_SUITE(MatmulRelayout, relayout_cases);

// matmul_group: several weights reading one x (a GPU runs eligible groups as one launch): each
// output against float64, and row-invariance of every output. With `relaid`, the weights first
// take the backend's own layout where it has one.
void check_matmul_group(Backend& be, const std::vector<int64_t>& rows, int64_t K, DType dt, bool relaid) {
  const int n = static_cast<int>(rows.size());
  std::vector<HostWeight> hw;
  std::vector<DevWeight> dw;
  std::vector<WeightRef> refs(n);
  std::vector<const void*> tiled(n, nullptr);
  for (int i = 0; i < n; i++) {
    hw.push_back(random_weight(dt, rows[i], K, 500 + 7 * i + rows[i], 64));
    dw.push_back(upload_weight(be, hw.back()));
    refs[i] = dw.back().ref;
    if (relaid) {
      tiled[i] = be.relayout_matrix(dw.back().ref, &refs[i].layout);
      if (!tiled[i]) {
        for (const void* t : tiled)
          if (t) be.release_weight(t);
        FAIL() << "backend " << be.name() << " kept row-major weights for this group";
      }
      refs[i].data = tiled[i];
      if (refs[i].layout == WeightRef::kTcQ4) refs[i].scales = refs[i].biases = nullptr;
    }
  }
  std::vector<const WeightRef*> wp(n);
  for (int i = 0; i < n; i++) wp[i] = &refs[i];
  const int maxM = 21;
  const auto x = randn(static_cast<size_t>(maxM) * K, 123);
  const DeviceBuffer dx = to_device(be, x);
  // run(M, off): rows off .. off + M - 1 through the group; one output vector per weight
  auto run = [&](int M, int off) {
    std::vector<Out> outs;
    std::vector<float*> yp;
    for (int i = 0; i < n; i++) outs.emplace_back(be, static_cast<size_t>(M) * rows[i]);
    for (auto& o : outs) yp.push_back(o.f());
    be.matmul_group(wp.data(), yp.data(), n, dx.f() + static_cast<size_t>(off) * K, M);
    std::vector<std::vector<float>> r;
    for (int i = 0; i < n; i++) r.push_back(outs[i].floats("group weight " + std::to_string(i)));
    return r;
  };
  std::vector<std::vector<float>> one(n);
  for (int m = 0; m < maxM; m++) {
    auto r = run(1, m);
    for (int i = 0; i < n; i++) one[i].insert(one[i].end(), r[i].begin(), r[i].end());
  }
  for (int i = 0; i < n; i++) {
    const Ref ref = relaid && dt == DType::U32 ? ref_matmul_int4_tc(hw[i], x, maxM, int4_tc_pieces())
                                               : ref_matmul(hw[i], x, maxM);
    EXPECT_TRUE(within(one[i], ref.y, ref.tol, "group weight " + std::to_string(i) + " vs float64"));
  }
  for (int M : {2, 5, 8, 9, 16, 21}) {
    const int off = maxM - M;
    auto r = run(M, off);
    for (int i = 0; i < n; i++)
      EXPECT_TRUE(same_bits(r[i].data(), one[i].data() + static_cast<size_t>(off) * rows[i], r[i].size(),
                            "group weight " + std::to_string(i) + " M=" + std::to_string(M) + " vs rows alone"));
  }
  for (const void* t : tiled)
    if (t) be.release_weight(t);
}

std::vector<OpCase> group_cases() {
  struct G {
    const char* name;
    std::vector<int64_t> rows;
    int64_t K;
    DType dt;
  };
  // qkv-like and MLP-like bf16 groups, a 2-weight group, cols % 64 != 0 (one matmul each), f32
  const std::vector<G> gs = {{"bf16_qkvz_K512", {300, 64, 48, 48}, 512, DType::BF16},
                             {"bf16_mlp_K4096", {1024, 256, 256}, 4096, DType::BF16},
                             {"bf16_pair_K256", {37, 5}, 256, DType::BF16},
                             {"bf16_pair_K200", {64, 40}, 200, DType::BF16},
                             {"f32_pair_K512", {64, 64}, 512, DType::F32},
                             {"int4_pair_K512", {64, 32}, 512, DType::U32},
                             {"int4_qkv_K1024", {300, 64, 40}, 1024, DType::U32}};
  std::vector<OpCase> cs;
  for (const G& g : gs) {
    cs.push_back({g.name, [=](Backend& be) { check_matmul_group(be, g.rows, g.K, g.dt, false); }});
    if ((g.dt == DType::BF16 || g.dt == DType::U32) && g.K % 64 == 0)
      cs.push_back({cat(g.name, "_relaid"), [=](Backend& be) { check_matmul_group(be, g.rows, g.K, g.dt, true); }, false, true});
  }
  return cs;
}
QF_OP_SUITE(MatmulGroup, group_cases);

// The weight gemm multiplies (backend.h): int4 as bf16_rn(fl(q * scale) + bias), in fp32 mul
// then add like the contract says, computed here from the raw words; other dtypes unchanged.
HostWeight gemm_operand(const HostWeight& W) {
  if (W.dt != DType::U32) return W;
  HostWeight b = W;
  const int64_t ng = W.cols / W.group;
  const auto* q = reinterpret_cast<const uint32_t*>(W.data.data());
  for (int64_t r = 0; r < W.rows; r++)
    for (int64_t c = 0; c < W.cols; c++) {
      const uint32_t nib = (q[(r * W.cols + c) / 8] >> (4 * (c % 8))) & 15u;
      const volatile float prod = static_cast<float>(nib) * static_cast<float>(bf16_value(W.scales[r * ng + c / W.group]));
      const volatile float sum = prod + static_cast<float>(bf16_value(W.biases[r * ng + c / W.group]));
      b.value[static_cast<size_t>(r) * W.cols + c] = bf16_value(bf16_round(sum));
    }
  return b;
}

// gemm, the prefill GEMM: y = bf16(x) W^T with fp32 accumulation (int4: W rounded to bf16, see
// gemm_operand), row-invariant for any M (prefill-sized M included). A backend still on the
// default (gemm = matmul, activations not rounded) gives exactly matmul's bits; that case skips
// the bf16 check and says so, while any other result must meet the bf16 contract.
void check_gemm(Backend& be, DType dt, int64_t N, int64_t K, int group) {
  const HostWeight W = random_weight(dt, N, K, 700 + N + K, group);
  const DevWeight dw = upload_weight(be, W);
  const int maxM = 150;
  const auto x = randn(static_cast<size_t>(maxM) * K, 41 + K);
  const DeviceBuffer dx = to_device(be, x);
  auto gm = [&](const float* xp, float* yp, int M) { be.gemm(dw.ref, xp, yp, M); };
  const auto one = rows_alone(be, gm, dx, K, N, maxM);
  expect_row_invariant(be, gm, dx, K, N, one, {2, 7, 16, 63, 64, 65, 100, 150}, "gemm");
  const Ref ref = ref_matmul(gemm_operand(W), x, maxM, /*bf16_x=*/true);
  const auto verdict = within(one, ref.y, ref.tol, "gemm rows vs float64 of bf16(x) W^T");
  if (!verdict) {
    auto mm = [&](const float* xp, float* yp, int M) { be.matmul(dw.ref, xp, yp, M); };
    const auto mm_one = rows_alone(be, mm, dx, K, N, maxM);
    if (same_bits(one, mm_one, "gemm vs matmul"))
      ADD_FAILURE() << "gemm on " << be.name() << " is the matmul fallback (activations not rounded to bf16)";
  }
  EXPECT_TRUE(verdict);
}

// gemm on int4 in the backend's own layout (CUDA: the tiles dequantized to bf16, then the bf16
// GEMM): row-invariant, within float64 of bf16(x) bf16(W)^T, and the bits of gemm on the same
// matrix in row-major form (the tiled dequantization reproduces the row-major one exactly).
void check_gemm_int4_relaid(Backend& be, int64_t N, int64_t K, int group) {
  const HostWeight W = random_weight(DType::U32, N, K, 950 + N + K, group);
  const DevWeight dw = upload_weight(be, W);
  WeightRef wt = dw.ref;
  const void* tiled = be.relayout_matrix(dw.ref, &wt.layout);
  ASSERT_NE(tiled, nullptr) << "backend " << be.name() << " kept row-major int4 weights for " << N << "x" << K;
  wt.data = tiled;
  wt.scales = wt.biases = nullptr;
  const int maxM = 150;
  const auto x = randn(static_cast<size_t>(maxM) * K, 43 + K);
  const DeviceBuffer dx = to_device(be, x);
  auto gm = [&](const float* xp, float* yp, int M) { be.gemm(wt, xp, yp, M); };
  const auto one = rows_alone(be, gm, dx, K, N, maxM);
  expect_row_invariant(be, gm, dx, K, N, one, {2, 7, 16, 17, 31, 32, 33, 63, 64, 65, 100, 150}, "int4 gemm");
  const Ref ref = ref_matmul(gemm_operand(W), x, maxM, /*bf16_x=*/true);
  EXPECT_TRUE(within(one, ref.y, ref.tol, "int4 gemm rows vs float64 of bf16(x) bf16(W)^T"));
  Out y(be, static_cast<size_t>(maxM) * N);
  be.gemm(dw.ref, dx.f(), y.f(), maxM);
  EXPECT_TRUE(same_bits(y.floats("gemm, row-major int4"), one, "int4 gemm: tiles vs row-major"));
  be.release_weight(tiled);
}

std::vector<OpCase> gemm_cases() {
  std::vector<OpCase> cs;
  for (auto [N, K] : std::vector<std::pair<int64_t, int64_t>>{{64, 512}, {300, 1000}, {48, 5120}, {37, 203}, {129, 776}})
    cs.push_back({shape_name(DType::BF16, N, K), [=](Backend& be) { check_gemm(be, DType::BF16, N, K, 0); }});
  cs.push_back({shape_name(DType::F32, 37, 203), [](Backend& be) { check_gemm(be, DType::F32, 37, 203, 0); }});
  cs.push_back({shape_name(DType::U32, 64, 512, 64), [](Backend& be) { check_gemm(be, DType::U32, 64, 512, 64); }});
  for (auto [N, K, g] : std::vector<std::tuple<int64_t, int64_t, int>>{{64, 512, 64}, {300, 1024, 128}, {37, 2048, 32}})
    cs.push_back({cat(shape_name(DType::U32, N, K, g), "_relaid"), [=](Backend& be) { check_gemm_int4_relaid(be, N, K, g); },
                  false, true});
  return cs;
}
QF_OP_SUITE(Gemm, gemm_cases);

// gemm_group: n weights on one input (a layer's projections, the backend's own layout where it
// has one) give the bits of n gemm calls; a group with a non-bf16 member too.
// A projection group's weights [rows_i, K] of the given dtypes, random (seed + 7 i + K), uploaded
// and, with `relaid`, in the backend's own layout where it has one (the copies are released at
// the end of the holder's life).
struct GroupWeights {
  Backend& be;
  std::vector<DevWeight> dws;
  std::vector<WeightRef> refs;
  std::vector<const void*> relaid_copies;
  GroupWeights(Backend& b, const std::vector<std::pair<DType, int64_t>>& members, int64_t K, bool relaid, uint64_t seed)
      : be(b) {
    for (size_t i = 0; i < members.size(); i++) {
      dws.push_back(upload_weight(be, random_weight(members[i].first, members[i].second, K, seed + 7 * i + K)));
      WeightRef w = dws.back().ref;
      if (relaid) {
        WeightRef t = w;
        if (const void* c = be.relayout_matrix(w, &t.layout)) {
          t.data = c;
          if (t.layout == WeightRef::kTcQ4) t.scales = t.biases = nullptr;
          relaid_copies.push_back(c);
          w = t;
        }
      }
      refs.push_back(w);
    }
  }
  ~GroupWeights() {
    for (const void* c : relaid_copies) be.release_weight(c);
  }
  GroupWeights(const GroupWeights&) = delete;
  GroupWeights& operator=(const GroupWeights&) = delete;
};

void check_gemm_group(Backend& be, const std::vector<std::pair<DType, int64_t>>& members, int64_t K, bool relaid) {
  const int M = 150, n = static_cast<int>(members.size());
  const auto x = randn(static_cast<size_t>(M) * K, 61 + K);
  const DeviceBuffer dx = to_device(be, x);
  GroupWeights gw(be, members, K, relaid, 880);
  const std::vector<WeightRef>& refs = gw.refs;
  std::vector<std::unique_ptr<Out>> grouped, single;
  std::vector<const WeightRef*> ws;
  std::vector<float*> ys;
  for (int i = 0; i < n; i++) {
    grouped.push_back(std::make_unique<Out>(be, static_cast<size_t>(M) * members[i].second));
    single.push_back(std::make_unique<Out>(be, static_cast<size_t>(M) * members[i].second));
    ws.push_back(&refs[i]);
    ys.push_back(grouped.back()->f());
  }
  be.gemm_group(ws.data(), ys.data(), n, dx.f(), M);
  for (int i = 0; i < n; i++) be.gemm(refs[i], dx.f(), single[i]->f(), M);
  for (int i = 0; i < n; i++)
    EXPECT_TRUE(same_bits(grouped[i]->floats("grouped"), single[i]->floats("single"),
                          cat("gemm_group member ", i, " vs its own gemm")));
}

std::vector<OpCase> gemm_group_cases() {
  using V = std::vector<std::pair<DType, int64_t>>;
  return {{"bf16_x3_k512", [](Backend& be) { check_gemm_group(be, V{{DType::BF16, 64}, {DType::BF16, 300}, {DType::BF16, 48}}, 512, false); }},
          {"bf16_x2_k1024_relaid", [](Backend& be) { check_gemm_group(be, V{{DType::BF16, 128}, {DType::BF16, 96}}, 1024, true); }},
          {"mixed_bf16_f32_k512", [](Backend& be) { check_gemm_group(be, V{{DType::BF16, 64}, {DType::F32, 37}}, 512, false); }},
          {"mixed_bf16_int4_k1024_relaid", [](Backend& be) { check_gemm_group(be, V{{DType::BF16, 128}, {DType::U32, 96}}, 1024, true); }}};
}
QF_OP_SUITE(GemmGroup, gemm_group_cases);

// The prefill fusions (swiglu_gemm, rmsnorm_gated_gemm): the bits of the elementwise op followed
// by gemm, on the same backend (tiled weights too, where the backend relays them out).
// kind: 0 swiglu_gemm, 1 rmsnorm_gated_gemm, 2 sigmoid_mul_gemm.
void check_fused_gemm(Backend& be, int kind, int64_t N, int64_t K, int n, bool relaid, DType dt = DType::BF16) {
  const int M = 130;
  const size_t nx = static_cast<size_t>(M) * K;
  const HostWeight W = random_weight(dt, N, K, 990 + N + K);
  const DevWeight dw = upload_weight(be, W);
  WeightRef w = dw.ref;
  const void* copy = relaid ? be.relayout_matrix(dw.ref, &w.layout) : nullptr;
  if (copy) w.data = copy;
  if (copy && w.layout == WeightRef::kTcQ4) w.scales = w.biases = nullptr;
  const auto a = randn(nx, 71 + K), b = randn(nx, 72 + K), nw = randn(static_cast<size_t>(n), 73 + n);
  const DeviceBuffer da1 = to_device(be, a), da2 = to_device(be, a), db = to_device(be, b), dnw = to_device(be, nw);
  Out fused(be, static_cast<size_t>(M) * N), ref(be, static_cast<size_t>(M) * N);
  const char* what = "swiglu_gemm vs swiglu + gemm";
  if (kind == 1) {
    be.rmsnorm_gated_gemm(w, da1.f(), db.f(), dnw.f(), fused.f(), M, n, 1e-6f);
    be.rmsnorm_gated(da2.f(), db.f(), dnw.f(), da2.f(), static_cast<int>(nx / n), n, 1e-6f);
    what = "rmsnorm_gated_gemm vs rmsnorm_gated + gemm";
  } else if (kind == 2) {
    be.sigmoid_mul_gemm(w, da1.f(), db.f(), fused.f(), M);
    be.sigmoid_mul(da2.f(), db.f(), nx);
    what = "sigmoid_mul_gemm vs sigmoid_mul + gemm";
  } else {
    be.swiglu_gemm(w, da1.f(), db.f(), fused.f(), M);
    be.swiglu(da2.f(), db.f(), da2.f(), nx);
  }
  be.gemm(w, da2.f(), ref.f(), M);
  EXPECT_TRUE(same_bits(fused.floats("fused"), ref.floats("op then gemm"), what));
  if (copy) be.release_weight(copy);
}

std::vector<OpCase> fused_gemm_cases() {
  return {{"swiglu_n300_k1024", [](Backend& be) { check_fused_gemm(be, 0, 300, 1024, 0, false); }},
          {"swiglu_n128_k1024_relaid", [](Backend& be) { check_fused_gemm(be, 0, 128, 1024, 0, true); }},
          {"swiglu_n37_k203", [](Backend& be) { check_fused_gemm(be, 0, 37, 203, 0, false); }},
          {"rmsnorm_gated_n64_k768_d128", [](Backend& be) { check_fused_gemm(be, 1, 64, 768, 128, false); }},
          {"rmsnorm_gated_n96_k1024_d128_relaid", [](Backend& be) { check_fused_gemm(be, 1, 96, 1024, 128, true); }},
          {"rmsnorm_gated_n40_k192_d64", [](Backend& be) { check_fused_gemm(be, 1, 40, 192, 64, false); }},
          {"swiglu_int4_n128_k1024_relaid", [](Backend& be) { check_fused_gemm(be, 0, 128, 1024, 0, true, DType::U32); }},
          {"rmsnorm_gated_int4_n96_k1024_d128", [](Backend& be) { check_fused_gemm(be, 1, 96, 1024, 128, false, DType::U32); }},
          {"sigmoid_mul_n300_k1024", [](Backend& be) { check_fused_gemm(be, 2, 300, 1024, 0, false); }},
          {"sigmoid_mul_n128_k1024_relaid", [](Backend& be) { check_fused_gemm(be, 2, 128, 1024, 0, true); }},
          {"sigmoid_mul_n37_k203", [](Backend& be) { check_fused_gemm(be, 2, 37, 203, 0, false); }},
          {"sigmoid_mul_int4_n128_k1024_relaid", [](Backend& be) { check_fused_gemm(be, 2, 128, 1024, 0, true, DType::U32); }},
          {"sigmoid_mul_f32_n37_k203", [](Backend& be) { check_fused_gemm(be, 2, 37, 203, 0, false, DType::F32); }}};
}
QF_OP_SUITE(FusedGemm, fused_gemm_cases);

// add_rmsnorm_gemm_group (the layer norms in front of a projection group): h and every output
// bit for bit add_rmsnorm (or rmsnorm, r = null) followed by gemm_group, on the same backend;
// members in the backend's own layout, int4 and f32 members (the fallback), rows the bf16 norm
// kernels do not take (> 8192), norm weights or none.
void check_add_rmsnorm_gemm_group(Backend& be, const std::vector<std::pair<DType, int64_t>>& members, int64_t K,
                                  bool add, bool relaid, bool with_w) {
  const int M = 70, n = static_cast<int>(members.size());
  const size_t nx = static_cast<size_t>(M) * K;
  GroupWeights gw(be, members, K, relaid, 510);
  const std::vector<WeightRef>& refs = gw.refs;
  const auto h0 = randn(nx, 81 + K), r = randn(nx, 82 + K), nw = randn(static_cast<size_t>(K), 83 + K);
  const DeviceBuffer dh1 = to_device(be, h0), dh2 = to_device(be, h0), dr = to_device(be, r), dnw = to_device(be, nw);
  Out y1(be, nx), y2(be, nx);
  std::vector<std::unique_ptr<Out>> fused, ref;
  std::vector<const WeightRef*> ws;
  std::vector<float*> ys1, ys2;
  for (int i = 0; i < n; i++) {
    fused.push_back(std::make_unique<Out>(be, static_cast<size_t>(M) * members[i].second));
    ref.push_back(std::make_unique<Out>(be, static_cast<size_t>(M) * members[i].second));
    ws.push_back(&refs[i]);
    ys1.push_back(fused.back()->f());
    ys2.push_back(ref.back()->f());
  }
  const float* wp = with_w ? dnw.f() : nullptr;
  be.add_rmsnorm_gemm_group(dh1.f(), add ? dr.f() : nullptr, wp, y1.f(), M, static_cast<int>(K), 1e-6f, ws.data(),
                            ys1.data(), n);
  if (add)
    be.add_rmsnorm(dh2.f(), dr.f(), wp, y2.f(), M, static_cast<int>(K), 1e-6f);
  else
    be.rmsnorm(dh2.f(), wp, y2.f(), M, static_cast<int>(K), 1e-6f);
  be.gemm_group(ws.data(), ys2.data(), n, y2.f(), M);
  const std::vector<float> hf = from_device<float>(be, dh1.get(), nx), hr = from_device<float>(be, dh2.get(), nx);
  EXPECT_TRUE(same_bits(hf, hr, "h after add_rmsnorm_gemm_group vs add_rmsnorm"));
  if (add) {  // h really took r: h = fl(h0 + r) element by element
    size_t bad = 0;
    for (size_t i = 0; i < nx; i++) bad += hf[i] != h0[i] + r[i];
    EXPECT_EQ(bad, 0u) << "elements of h that are not fl(h0 + r)";
  }
  for (int i = 0; i < n; i++)
    EXPECT_TRUE(same_bits(fused[i]->floats("fused"), ref[i]->floats("norm then gemm_group"),
                          cat("add_rmsnorm_gemm_group member ", i, " vs the norm then gemm_group")));
}

std::vector<OpCase> add_rmsnorm_gemm_group_cases() {
  using V = std::vector<std::pair<DType, int64_t>>;
  std::vector<OpCase> cs;
  for (bool add : {true, false}) {
    const std::string a = add ? "add_" : "norm_";
    cs.push_back({a + "bf16_x3_k512", [=](Backend& be) { check_add_rmsnorm_gemm_group(be, V{{DType::BF16, 64}, {DType::BF16, 300}, {DType::BF16, 48}}, 512, add, false, true); }});
    cs.push_back({a + "bf16_x4_k1024_relaid", [=](Backend& be) { check_add_rmsnorm_gemm_group(be, V{{DType::BF16, 128}, {DType::BF16, 96}, {DType::BF16, 16}, {DType::BF16, 16}}, 1024, add, true, true); }});
    cs.push_back({a + "bf16_x2_k5120_relaid", [=](Backend& be) { check_add_rmsnorm_gemm_group(be, V{{DType::BF16, 64}, {DType::BF16, 64}}, 5120, add, true, true); }});
    cs.push_back({a + "bf16_x1_k200_ones", [=](Backend& be) { check_add_rmsnorm_gemm_group(be, V{{DType::BF16, 37}}, 200, add, false, false); }});
    cs.push_back({a + "int4_bf16_k1024_relaid", [=](Backend& be) { check_add_rmsnorm_gemm_group(be, V{{DType::U32, 96}, {DType::BF16, 64}}, 1024, add, true, true); }});
    cs.push_back({a + "bf16_f32_k512", [=](Backend& be) { check_add_rmsnorm_gemm_group(be, V{{DType::BF16, 64}, {DType::F32, 37}}, 512, add, false, true); }});
    cs.push_back({a + "bf16_x2_k8320", [=](Backend& be) { check_add_rmsnorm_gemm_group(be, V{{DType::BF16, 32}, {DType::BF16, 16}}, 8320, add, false, true); }});
  }
  return cs;
}
QF_OP_SUITE(AddRmsnormGemmGroup, add_rmsnorm_gemm_group_cases);

// Model-size shapes (accelerators only): the lm_head (248320 x 5120) and the MLP projections,
// weights made with fill_random so the host can recompute any row: 300 sampled rows (and the
// first and last two) against float64, and the M = 8 call against M = 1 calls bit for bit.
void check_matmul_full_size(Backend& be, int64_t N, int64_t K) {
  const size_t n = static_cast<size_t>(N) * K;
  const uint64_t seed = 77 + N;
  const float wscale = 1.0f / std::sqrt(static_cast<float>(K));
  DeviceBuffer w(&be, n * 2);
  be.fill_random(w.get(), n, DType::BF16, seed, wscale);
  WeightRef W;
  W.dtype = DType::BF16;
  W.rows = N;
  W.cols = K;
  W.data = w.get();
  const int M = 8;
  const auto x = randn(static_cast<size_t>(M) * K, 90);
  const DeviceBuffer dx = to_device(be, x);
  Out y(be, static_cast<size_t>(M) * N);
  be.matmul(W, dx.f(), y.f(), M);
  const auto all = y.floats("M=8");
  Out y1(be, N);
  for (int m = 0; m < M; m++) {
    y1.repoison();
    be.matmul(W, dx.f() + static_cast<size_t>(m) * K, y1.f(), 1);
    EXPECT_TRUE(same_bits(y1.floats("M=1").data(), all.data() + static_cast<size_t>(m) * N, N,
                          "row " + std::to_string(m) + " alone vs the M=8 call"));
  }
  std::vector<int64_t> sample = {0, 1, N - 1, N - 2};
  uint64_t s = 3;
  for (int i = 0; i < 300; i++) sample.push_back(static_cast<int64_t>((s = splitmix64(s)) % N));
  std::vector<float> got;
  std::vector<double> ref, tol;
  const double c = tol::matmul(K);
  for (int64_t r : sample) {
    const auto bytes = ref_fill_random(static_cast<size_t>(r) * K, K, DType::BF16, seed, wscale);
    for (int m = 0; m < M; m++) {
      double acc = 0, ss = 0;
      for (int64_t k = 0; k < K; k++) {
        uint16_t h;
        std::memcpy(&h, bytes.data() + 2 * k, 2);
        const double t = bf16_value(h) * x[static_cast<size_t>(m) * K + k];
        acc += t;
        ss += t * t;
      }
      got.push_back(all[static_cast<size_t>(m) * N + r]);
      ref.push_back(acc);
      tol.push_back(c * std::sqrt(ss));
    }
  }
  EXPECT_TRUE(within(got, ref, tol, "sampled rows vs float64"));
}

std::vector<OpCase> full_size_cases() {
  std::vector<OpCase> cs;
  for (auto [N, K] : std::vector<std::pair<int64_t, int64_t>>{{248320, 5120}, {5120, 17408}, {17408, 5120}})
    cs.push_back({shape_name(DType::BF16, N, K), [=](Backend& be) { check_matmul_full_size(be, N, K); }, true});
  return cs;
}
QF_OP_SUITE(MatmulFullSize, full_size_cases);

// embed: rows of the table as f32, bit for bit (int4: q * s + b rounded once to fp32, which is
// what fp32 arithmetic gives since q * s is exact).
void check_embed(Backend& be, DType dt) {
  const int V = 300, H = 256;
  const HostWeight E = random_weight(dt, V, H, 4, 64);
  const DevWeight dE = upload_weight(be, E);
  const std::vector<int32_t> ids = {0, 299, 17, 17, 5, 123, 298, 1, 64};
  const int M = static_cast<int>(ids.size());
  const DeviceBuffer dids = to_device(be, ids);
  Out out(be, static_cast<size_t>(M) * H);
  be.embed(dE.ref, dids.i(), out.f(), M);
  std::vector<float> want(static_cast<size_t>(M) * H);
  for (int m = 0; m < M; m++)
    for (int c = 0; c < H; c++) want[static_cast<size_t>(m) * H + c] = static_cast<float>(E.at(ids[m], c));
  EXPECT_TRUE(same_bits(out.floats("embed"), want, "embed rows"));
}

std::vector<OpCase> embed_cases() {
  std::vector<OpCase> cs;
  for (DType dt : {DType::BF16, DType::F16, DType::F32, DType::U32})
    cs.push_back({dtype_tag(dt), [=](Backend& be) { check_embed(be, dt); }});
  return cs;
}
QF_OP_SUITE(Embed, embed_cases);

}  // namespace
}  // namespace qf::test
