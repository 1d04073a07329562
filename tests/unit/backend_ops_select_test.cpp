// Backend op table, selection: argmax_rows and topk_rows (exact ids and values, ties, -0 / +0,
// -inf rows, NaN, up to the 27B's 248320-entry vocabulary) and the DFlash2 selector walk
// (scores within the tolerance table, drafts exact, the first of tied candidates picked).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "support/op_harness.h"
#include "support/op_reference.h"

namespace qf::test {
namespace {

// Six rows: the max at the last index; the max tied at indices 3, 9 and n-2 with a NaN at 5;
// all equal; all -inf; negatives with -0 at n/2 and +0 at n-1; a NaN at index 0.
void check_argmax(Backend& be, int n) {
  const int M = 6;
  auto x = randn(static_cast<size_t>(M) * n, n);
  auto at = [&](int m, int i) -> float& { return x[static_cast<size_t>(m) * n + i]; };
  at(0, n - 1) = 100.0f;
  if (n > 10) {
    at(1, 9) = 50.0f;
    at(1, 3) = 50.0f;
    at(1, n - 2) = 50.0f;
    at(1, 5) = NAN;
  }
  for (int i = 0; i < n; i++) at(2, i) = 1.5f;
  for (int i = 0; i < n; i++) at(3, i) = -INFINITY;
  for (int i = 0; i < n; i++) at(4, i) = -std::fabs(at(4, i)) - 1.0f;
  at(4, n / 2) = -0.0f;
  if (n > 1) at(4, n - 1) = 0.0f;
  at(5, 0) = NAN;
  const DeviceBuffer dx = to_device(be, x);
  Out out(be, M);
  be.argmax_rows(dx.f(), M, n, out.i());
  EXPECT_EQ(out.ints("argmax"), ref_argmax(x, M, n));
}

std::vector<OpCase> argmax_cases() {
  std::vector<OpCase> cs;
  for (int n : {1, 7, 4096, 5000, 248320}) cs.push_back({cat("n", n), [n](Backend& be) { check_argmax(be, n); }});
  return cs;
}
QF_OP_SUITE(ArgmaxRows, argmax_cases);

// Five rows: random; many ties at the top (every third entry 2.5); ties everywhere (i % 7);
// -inf except every fifth entry; random again.
void check_topk(Backend& be, int n, int k) {
  const int M = 5;
  auto x = randn(static_cast<size_t>(M) * n, n + k);
  auto at = [&](int m, int i) -> float& { return x[static_cast<size_t>(m) * n + i]; };
  for (int i = 0; i < n; i += 3) at(1, i) = 2.5f;
  for (int i = 0; i < n; i++) at(2, i) = static_cast<float>(i % 7);
  for (int i = 0; i < n; i++) at(3, i) = i % 5 == 0 ? 1.0f : -INFINITY;
  const DeviceBuffer dx = to_device(be, x);
  Out vals(be, static_cast<size_t>(M) * k), ids(be, static_cast<size_t>(M) * k);
  be.topk_rows(dx.f(), M, n, k, vals.f(), ids.i());
  std::vector<float> rv;
  std::vector<int32_t> ri;
  ref_topk(x, M, n, k, &rv, &ri);
  EXPECT_EQ(ids.ints("ids"), ri);
  EXPECT_TRUE(same_bits(vals.floats("values"), rv, "values"));
}

std::vector<OpCase> topk_cases() {
  std::vector<OpCase> cs;
  for (int n : {64, 100, 4096, 5000, 70000, 248320})
    for (int k : {1, 16, 64})
      if (k <= n)
        cs.push_back({cat("n", n, "_k", k), [n, k](Backend& be) { check_topk(be, n, k); }});
  return cs;
}
QF_OP_SUITE(TopkRows, topk_cases);

// selector_walk over k slots of K candidates with rank-R codebooks. With `ties`, every other slot
// holds its best candidate twice (same id, same unary logit): the first must be picked.
void check_selector(Backend& be, int V, int R, int K, int k, bool ties) {
  const HostWeight Epre = random_weight(DType::BF16, V, R, 1), Esuc = random_weight(DType::BF16, V, R, 2);
  const DevWeight dEpre = upload_weight(be, Epre), dEsuc = upload_weight(be, Esuc);
  std::vector<int32_t> ids(static_cast<size_t>(k) * K);
  uint64_t s = 3;
  for (auto& i : ids) i = static_cast<int32_t>((s = splitmix64(s)) % V);
  auto vals = randn(static_cast<size_t>(k) * K, 4, 5.0f);
  const auto P = randn(static_cast<size_t>(k) * R, 5, 0.3f);
  if (ties)
    for (int j = 0; j < k; j += 2) {
      const size_t b = static_cast<size_t>(j) * K;
      ids[b + 9] = ids[b + 4];
      vals[b + 4] = vals[b + 9] = 40.0f;
    }
  const int32_t anchor = 123;
  const SelectorRef ref = ref_selector_walk(vals, ids, P, Epre, Esuc, anchor, k, K, R);
  ASSERT_TRUE(ref.margin_ok) << "the test data leaves a pick within tolerance of another candidate";
  const DeviceBuffer dv = to_device(be, vals), di = to_device(be, ids), dP = to_device(be, P),
                     da = to_device(be, std::vector<int32_t>{anchor});
  Out drafts(be, k), scores(be, static_cast<size_t>(k) * K);
  be.selector_walk(dv.f(), di.i(), dP.f(), dEpre.ref, dEsuc.ref, da.i(), k, K, R, drafts.i(), scores.f());
  EXPECT_EQ(drafts.ints("drafts"), ref.drafts);
  EXPECT_TRUE(within(scores.floats("scores"), ref.scores.y, ref.scores.tol, "scores vs float64"));
}

std::vector<OpCase> selector_cases() {
  return {
      {"V1000_R32_K16_k7", [](Backend& be) { check_selector(be, 1000, 32, 16, 7, false); }},
      {"V5000_R64_K16_k15_ties", [](Backend& be) { check_selector(be, 5000, 64, 16, 15, true); }},
      {"V300_R16_K4_k1", [](Backend& be) { check_selector(be, 300, 16, 4, 1, false); }},
  };
}
QF_OP_SUITE(SelectorWalk, selector_cases);

}  // namespace
}  // namespace qf::test
