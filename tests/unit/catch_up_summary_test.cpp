// catch_up_summary (runtime/stats.h): what `qflash bench --adaptive` reports a catch-up costs, read
// from the rounds of auto runs, against values worked out here.
#include <gtest/gtest.h>

#include "runtime/stats.h"

namespace qf {
namespace {

// Rounds of a made-up machine: a plain step 10 ms, a round of depth k 12 + k ms, and a drafting
// round after j plain steps `fixed + per_row * j` ms more.
GenStats rounds(const std::vector<std::pair<int, int>>& k_and_deferred, double fixed, double per_row) {
  GenStats g;
  for (auto [k, j] : k_and_deferred) {
    const double own = k == 0 ? 10.0 : 12.0 + k;
    g.round_times.push_back({k, j, own + (k > 0 && j > 0 ? fixed + per_row * j : 0.0)});
  }
  return g;
}

TEST(CatchUpSummary, RecoversTheLineAndBucketsByPlainRun) {
  // Two requests: depths 1 and 3 run without catch-up (their medians), and after 2, 4, 7, 20, 70
  // plain steps. (The plain steps themselves are listed with their own j; only k > 0 rounds with
  // j > 0 are switches.)
  const GenStats a = rounds({{0, 0}, {3, 1}, {3, 0}, {3, 0}, {0, 0}, {0, 1}, {1, 2}, {1, 0}, {1, 0}}, 4.0, 0.25);
  const GenStats b = rounds({{0, 0}, {1, 1}, {1, 0}, {3, 4}, {3, 7}, {3, 20}, {1, 70}, {0, 0}}, 4.0, 0.25);
  const CatchUpSummary s = catch_up_summary({a, b});
  EXPECT_DOUBLE_EQ(s.plain_ms, 10.0);
  EXPECT_EQ(s.n, 7);  // j = 1, 2, 1, 4, 7, 20, 70
  EXPECT_NEAR(s.fixed_ms, 4.0, 1e-9);
  EXPECT_NEAR(s.per_row_ms, 0.25, 1e-9);
  ASSERT_EQ(s.buckets.size(), 6u);
  EXPECT_EQ(s.buckets[0].n, 4);  // j 1, 2, 1, 4
  EXPECT_NEAR(s.buckets[0].excess_ms, 4.0 + 0.25 * (1 + 2 + 1 + 4) / 4.0, 1e-9);
  EXPECT_EQ(s.buckets[1].n, 1);  // 7
  EXPECT_EQ(s.buckets[2].n, 0);
  EXPECT_EQ(s.buckets[3].n, 1);  // 20
  EXPECT_NEAR(s.buckets[3].excess_ms, 9.0, 1e-9);
  EXPECT_EQ(s.buckets[5].n, 1);  // 70
  EXPECT_NEAR(s.buckets[5].excess_ms, 4.0 + 17.5, 1e-9);
}

TEST(CatchUpSummary, ADepthThatNeverRanWithoutCatchUpIsLeftOut) {
  // Depth 2 only ever ran after plain steps: no median of its own, so no excess can be read.
  const CatchUpSummary s = catch_up_summary({rounds({{0, 0}, {2, 1}, {0, 0}, {2, 1}}, 4.0, 0.0)});
  EXPECT_EQ(s.n, 0);
  EXPECT_DOUBLE_EQ(s.fixed_ms, 0.0);
  EXPECT_DOUBLE_EQ(s.per_row_ms, 0.0);
  EXPECT_DOUBLE_EQ(catch_up_summary({}).plain_ms, 0.0);
}

}  // namespace
}  // namespace qf
