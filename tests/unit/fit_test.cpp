// The "does the model fit?" guard: the estimate from headers and config, and the error text.
#include <gtest/gtest.h>

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
