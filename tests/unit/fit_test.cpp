// The "does the model fit?" guard: the estimate from headers and config, and the error text.
#include <gtest/gtest.h>

#include <algorithm>

#include "core/error.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "runtime/engine.h"
#include "runtime/fit.h"
#include "support/fixtures.h"

namespace qf {
namespace {

TEST(Fit, EstimateCountsEveryLoadedTensorOfTheDemoPair) {
  const std::string dir = test::source_path("models/demo");
  const TargetConfig c = load_target_config(dir);
  const TensorStore st = TensorStore::open_dir(dir);
  const TensorStore dr = TensorStore::open_dir(dir + "/drafter");
  size_t files = 0, vec_bytes = 0;
  for (const auto& n : st.names()) {
    const TensorInfo* t = st.find(n);
    files += t->nbytes;
    if (t->shape.size() == 1) vec_bytes += t->nbytes;
  }
  const MemoryEstimate e = estimate_memory(c, st, &dr, 4096, 64, 17);
  EXPECT_GE(e.target_weights, files);  // 1-D tensors grow to f32, nothing is dropped
  EXPECT_LE(e.target_weights, files + vec_bytes);
  EXPECT_GT(e.drafter_weights, 0u);
  const MemoryEstimate no_drafter = estimate_memory(c, st, nullptr, 4096, 64, 17);
  EXPECT_EQ(no_drafter.drafter_weights, 0u);
  // The KV cache grows with the context; the work buffers with the rows.
  const MemoryEstimate longer = estimate_memory(c, st, &dr, 8192, 64, 17);
  EXPECT_GT(longer.cache, e.cache);
  EXPECT_EQ(longer.target_weights, e.target_weights);
  EXPECT_GT(estimate_memory(c, st, &dr, 4096, 128, 17).work, e.work);
  // Prefill buffers: ~0.6 MB per row at 27B, growing with the chunk.
  const size_t p1 = estimate_memory(c, st, &dr, 4096, 64, 17, 1024).work;
  EXPECT_GT(p1, e.work);
  EXPECT_GT(estimate_memory(c, st, &dr, 4096, 64, 17, 4096).work, p1);
}

// --prefill-chunk auto at 27B (the synthetic config of the benches): the largest chunk whose
// buffers fit beside the rest with the margin, computed here independently from the estimate's
// own parts.
TEST(Fit, AutoPrefillRowsTakesTheLargestChunkThatFits) {
  const TargetConfig c = load_target_config(test::source_path("tests/fixtures/configs/qwen38_27b"));
  const size_t G = size_t(1) << 30;
  // The parts estimate_memory adds up are the helpers' (no second formula to drift apart).
  const TensorStore st = TensorStore::open_dir(test::source_path("models/demo"));
  const TargetConfig demo = load_target_config(test::source_path("models/demo"));
  for (int r : {0, 64, 1024, 8192}) {
    const MemoryEstimate e = estimate_memory(demo, st, nullptr, 4096, 64, 17, r);
    EXPECT_EQ(e.cache, cache_bytes(demo, 4096, 17));
    EXPECT_EQ(e.work, 64 * work_row_bytes(demo) + prefill_work_bytes(demo, r)) << r;
  }
  EXPECT_EQ(prefill_work_bytes(c, 0), 0u);
  // Growing with the chunk; an upper bound of ~1.3 MB a row at 27B (measured ~0.6): head_dim 256
  // runs the prefill attention kernels, so the decode kernel's split partials are not counted
  const size_t w8 = prefill_work_bytes(c, 8192), w4 = prefill_work_bytes(c, 4096), w2 = prefill_work_bytes(c, 2048),
               w1 = prefill_work_bytes(c, 1024);
  EXPECT_GT(w8, w4);
  EXPECT_GT(w4, w2);
  EXPECT_GT(w2, w1);
  EXPECT_GT(w4, size_t(4096) * 1000000);
  EXPECT_LT(w4, size_t(4096) * 1600000);
  // A head dim the prefill kernels do not cover: the partials (heads x 64 splits x (head_dim + 2)
  // floats a row) are counted.
  TargetConfig odd = c;
  odd.head_dim = 96;
  const size_t part96 = static_cast<size_t>(c.num_attention_heads) * 64 * (96 + 2) * 4;
  EXPECT_GE(prefill_work_bytes(odd, 1024), size_t(1024) * part96);
  // H200-like: 141 GB, 60 GB still to allocate (bf16 27B target + drafter + cache): 8192 rows; int4
  // weights: 4096 at most. An 80 GB card with the same load: 8192 too (run 38 measured ~59.5 GB
  // at its peak with 8,192-row chunks).
  const size_t total = size_t(141) * 1000 * 1000 * 1000, other = 60 * G;
  EXPECT_EQ(auto_prefill_rows(true, false, total, total, other, c), 8192);
  EXPECT_EQ(auto_prefill_rows(true, true, total, total, other, c), 4096);
  EXPECT_EQ(auto_prefill_rows(true, false, 79 * G, 80 * G, other, c), 8192);
  // The CPU, or a device that does not report its memory: the fixed chunk.
  EXPECT_EQ(auto_prefill_rows(false, false, total, total, other, c), kAutoPrefillRowsCpu);
  EXPECT_EQ(auto_prefill_rows(true, false, 0, 0, other, c), kAutoPrefillRowsCpu);
  // Just enough for a chunk (with the 5% / 2 GiB margin), one byte short of the next larger one.
  const size_t margin = std::max(total / 20, 2 * G);
  for (int r : {4096, 2048, 1024}) {
    const size_t need_larger = other + prefill_work_bytes(c, r * 2) + margin;
    EXPECT_EQ(auto_prefill_rows(true, false, need_larger - 1, total, other, c), r) << r;
    EXPECT_EQ(auto_prefill_rows(true, false, other + prefill_work_bytes(c, r) + margin, total, other, c), r) << r;
  }
  EXPECT_EQ(auto_prefill_rows(true, false, other + w8 + margin, total, other, c), 8192);
  // Nothing fits: the smallest candidate (the load's fit check reports the shortfall).
  EXPECT_EQ(auto_prefill_rows(true, false, other, total, other, c), 1024);
  EXPECT_EQ(auto_prefill_rows(true, true, 1, total, other, c), 1024);
}

// The prefill GEMM's weight-copy budget: what is free less what is still to come and the same
// 5% / 2 GiB margin as auto_prefill_rows; never negative.
TEST(Fit, PrefillCopyBudgetLeavesThePendingBytesAndTheMargin) {
  const size_t G = size_t(1) << 30, total = size_t(141) * 1000 * 1000 * 1000;
  const size_t margin = std::max(total / 20, 2 * G);
  EXPECT_EQ(prefill_copy_budget(100 * G, total, 10 * G), 100 * G - 10 * G - margin);
  EXPECT_EQ(prefill_copy_budget(10 * G + margin, total, 10 * G), 0u);
  EXPECT_EQ(prefill_copy_budget(10 * G + margin + 1, total, 10 * G), 1u);
  EXPECT_EQ(prefill_copy_budget(5 * G, total, 10 * G), 0u);
  EXPECT_EQ(prefill_copy_budget(0, 0, 0), 0u);  // a device that reports nothing: no copies
  // A small device: the 2 GiB floor of the margin.
  EXPECT_EQ(prefill_copy_budget(8 * G, 16 * G, 1 * G), 5 * G);
  // More pending, less budget, one byte for one byte.
  EXPECT_EQ(prefill_copy_budget(100 * G, total, 10 * G) - prefill_copy_budget(100 * G, total, 10 * G + 7), 7u);
}

TEST(Fit, VisionTowerTensorsAreNotCounted) {
  EXPECT_TRUE(tensor_not_loaded("model.visual.blocks.0.attn.qkv.weight"));
  EXPECT_FALSE(tensor_not_loaded("model.language_model.layers.0.mlp.up_proj.weight"));
  EXPECT_FALSE(tensor_not_loaded("mtp.fc.weight"));
}

TEST(Fit, ErrorNamesTheDeviceAndTheBytes) {
  MemoryEstimate e;
  e.target_weights = size_t(54) << 30;
  e.cache = size_t(1) << 30;
  const size_t free_b = size_t(22) << 30;
  try {
    check_fits(e, free_b, size_t(24) << 30, "cuda:0 (RTX 4090)", "/models/qwen");
    FAIL() << "expected a Backend error";
  } catch (const Error& err) {
    EXPECT_EQ(err.kind(), ErrorKind::Backend);
    const std::string m = err.what();
    EXPECT_NE(m.find("does not fit on cuda:0 (RTX 4090)"), std::string::npos) << m;
    EXPECT_NE(m.find("/models/qwen"), std::string::npos) << m;
    EXPECT_NE(m.find("59.06 GB"), std::string::npos) << m;  // 55 GiB needed
    EXPECT_NE(m.find("23.62 GB"), std::string::npos) << m;  // 22 GiB free
    EXPECT_NE(m.find("--weights int4"), std::string::npos) << m;  // the advice names the flag
  }
  // Enough room: no error. Unknown free memory (0): no check.
  EXPECT_NO_THROW(check_fits(e, size_t(140) << 30, size_t(141) << 30, "cuda:0", "m"));
  EXPECT_NO_THROW(check_fits(e, 0, 0, "cpu", "m"));
  // The margin counts: exactly the bytes needed is not enough.
  EXPECT_THROW(check_fits(e, e.total(), e.total(), "cuda:0", "m"), Error);
}

}  // namespace
}  // namespace qf

namespace qf {
namespace {

// A GPU load checks the drafter's pairing from config.json before the fit estimate opens the
// drafter's weight files: a mismatched drafter folder (config only, no weights) must give the
// mismatch message, and the fit step, which here fails on purpose, must not have run.
TEST(Fit, DrafterPairGuardRunsBeforeTheFitCheckOpensItsFiles) {
  EngineOptions opt;
  opt.draft = test::source_path("tests/fixtures/configs/mismatch_vocab");
  int fit_calls = 0;
  const auto failing_fit = [&](const MemoryEstimate&) {
    fit_calls++;
    fail(ErrorKind::Backend, "fake fit: the model does not fit");
  };
  try {
    check_before_upload(test::source_path("models/demo"), opt, failing_fit);
    FAIL() << "a mismatched drafter passed";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Config) << e.what();
    EXPECT_NE(std::string(e.what()).find("vocab_size 4096"), std::string::npos) << e.what();
  }
  EXPECT_EQ(fit_calls, 0);

  // A matching drafter reaches the fit step, with its weights counted.
  opt.draft = test::source_path("models/demo/drafter");
  size_t drafter_bytes = 0;
  check_before_upload(test::source_path("models/demo"), opt, [&](const MemoryEstimate& est) {
    fit_calls++;
    drafter_bytes = est.drafter_weights;
  });
  EXPECT_EQ(fit_calls, 1);
  EXPECT_GT(drafter_bytes, 0u);
}

}  // namespace
}  // namespace qf
