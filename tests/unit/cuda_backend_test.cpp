// CUDA-only checks that are not op parity (every op's parity and row-invariance on cuda runs in
// the backend op table, tests/unit/backend_ops_*_test.cpp, as Op/*_cuda): the backend starts or
// says why, its out-of-memory message, every tensor-core GEMV schedule (the backend uses one; the
// bench compares them all) in both weight layouts, scratch growth versus graph capture, and the
// tiny target's logits against the CPU's through prefill and decode. Every test skips when no
// CUDA device is present, so CPU-only machines pass.
#ifdef QFLASH_HAVE_CUDA

#include <gtest/gtest.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/kernels.h"
#include "backend/registry.h"
#include "core/error.h"
#include "model/qwen38.h"
#include "support/backends.h"
#include "support/fixtures.h"
#include "support/op_harness.h"
#include "support/op_reference.h"
#include "support/test_models.h"

namespace qf::test {
namespace {

#define NEED_GPU()                                    \
  std::string why_;                                   \
  Backend* G = shared_backend("cuda", &why_);         \
  if (!G) GTEST_SKIP() << "no CUDA device: " << why_; \
  (void)G

TEST(CudaBackend, ReportsDeviceOrReason) {
  EXPECT_TRUE(cuda_compiled());
  std::string why;
  const bool avail = backend_available("cuda", &why);
  const auto names = available_backends();
  EXPECT_EQ(avail, std::find(names.begin(), names.end(), "cuda") != names.end());
  auto be = make_cuda_backend(&why);
  EXPECT_EQ(avail, be != nullptr) << why;
  if (!be) {
    EXPECT_FALSE(why.empty());
    GTEST_SKIP() << "no CUDA device: " << why;
  }
  EXPECT_TRUE(be->is_gpu());
  EXPECT_EQ(be->name().rfind("cuda", 0), 0u) << be->name();
  EXPECT_GT(be->memory_used(), 0u);
}

TEST(CudaBackend, OutOfMemoryNamesTheDevice) {
  NEED_GPU();
  try {
    G->alloc(size_t(1) << 50);
    FAIL() << "1 PiB allocation succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Backend);
    EXPECT_NE(std::string(e.what()).find("out of device memory"), std::string::npos) << e.what();
  }
}

// Poisoned outputs of M rows for each weight of a group, and their pointers.
struct GroupOut {
  std::vector<DeviceBuffer> dy;
  std::vector<float*> yp;
};
GroupOut group_out(Backend* be, const std::vector<int64_t>& rows, int M) {
  GroupOut o;
  for (int64_t r : rows) {
    o.dy.emplace_back(be, static_cast<size_t>(M) * r * sizeof(float));
    poison(*be, o.dy.back().get(), o.dy.back().bytes());
    o.yp.push_back(o.dy.back().f());
  }
  return o;
}

// Every production tensor-core schedule (the rejected ones live in the kernel lab): each tracks float64 and
// gives row m the same bits for every M. The shapes cover stream-K tiles cut into many pieces (few
// rows, long rows), tiles one warp covers whole (many rows, short rows), a single warp, and a
// grouped launch. The same weights in the tiled layout (gemv_tc_relayout; rows not multiples of
// 32 included) give the row-major bits.
TEST(CudaMatmul, TcSchedulesMatchReferenceAndRowInvariant) {
  NEED_GPU();
  cudaStream_t st = nullptr;
  ASSERT_EQ(cudaSuccess, cudaStreamCreate(&st));
  struct Case {
    std::vector<int64_t> rows;
    int64_t cols;
  };
  for (const Case& cs : {Case{{48}, 5120}, Case{{1000}, 4096}, Case{{37}, 256}, Case{{4100}, 128},
                         Case{{640, 33, 96}, 1024}, Case{{5}, 64}}) {
    const int n = static_cast<int>(cs.rows.size());
    std::vector<HostWeight> hw;
    std::vector<DevWeight> dw;
    std::vector<WeightRef> wd(n), wt(n);
    std::vector<const WeightRef*> wp(n), wtp(n);
    std::vector<DeviceBuffer> tbuf;
    for (int i = 0; i < n; i++) {
      hw.push_back(random_weight(DType::BF16, cs.rows[i], cs.cols, 900 + 13 * i + cs.rows[i]));
      dw.push_back(upload_weight(*G, hw.back()));
    }
    for (int i = 0; i < n; i++) {
      wd[i] = dw[i].ref;
      wp[i] = &wd[i];
      tbuf.emplace_back(G, cuda::gemv_tc_tiled_bytes(cs.rows[i], cs.cols));
      poison(*G, tbuf.back().get(), tbuf.back().bytes());
      G->sync();
      cuda::gemv_tc_relayout(wd[i].data, tbuf.back().get(), cs.rows[i], cs.cols, st);
      wt[i] = wd[i];
      wt[i].data = tbuf.back().get();
      wt[i].layout = WeightRef::kTc32x64;
      wtp[i] = &wt[i];
    }
    ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(st));
    const int maxM = 16;
    const auto x = randn(static_cast<size_t>(maxM) * cs.cols, 321);
    const DeviceBuffer dx = to_device(*G, x);
    std::vector<Ref> ref;
    for (int i = 0; i < n; i++) ref.push_back(ref_matmul(hw[i], x, maxM));
    for (int sched = 0; sched < cuda::gemv_tc_sched_count(); sched++) {
      const std::string what = std::string(cuda::gemv_tc_sched_name(sched)) + " " + std::to_string(cs.rows[0]) + "x" +
                               std::to_string(cs.cols) + (n > 1 ? " group" : "");
      // run(M, off): rows off .. off + M - 1 of x through the schedule, outputs downloaded
      auto run = [&](int M, int off, bool tiled = false) {
        auto [dy, yp] = group_out(G, cs.rows, M);
        G->sync();
        cuda::gemv_tc_group(tiled ? wtp.data() : wp.data(), yp.data(), n, dx.f() + static_cast<size_t>(off) * cs.cols,
                            static_cast<int>(cs.cols), M, st, sched);
        EXPECT_EQ(cudaSuccess, cudaStreamSynchronize(st));
        std::vector<std::vector<float>> out(n);
        for (int i = 0; i < n; i++) out[i] = from_device<float>(*G, dy[i].get(), static_cast<size_t>(M) * cs.rows[i]);
        return out;
      };
      std::vector<std::vector<float>> one(n);
      for (int m = 0; m < maxM; m++) {
        auto r = run(1, m);
        for (int i = 0; i < n; i++) one[i].insert(one[i].end(), r[i].begin(), r[i].end());
      }
      for (int i = 0; i < n; i++)
        EXPECT_TRUE(within(one[i], ref[i].y, ref[i].tol, what + " weight " + std::to_string(i) + " vs float64"));
      for (int M : {2, 3, 8, 9, 16}) {
        const int off = maxM - M;
        auto r = run(M, off);
        for (int i = 0; i < n; i++)
          EXPECT_TRUE(same_bits(r[i].data(), one[i].data() + static_cast<size_t>(off) * cs.rows[i], r[i].size(),
                                what + " weight " + std::to_string(i) + " M=" + std::to_string(M)));
      }
      for (int M : {1, 5, 16}) {
        const int off = maxM - M;
        auto r = run(M, off, true);
        for (int i = 0; i < n; i++)
          EXPECT_TRUE(same_bits(r[i].data(), one[i].data() + static_cast<size_t>(off) * cs.rows[i], r[i].size(),
                                what + " tiled layout, weight " + std::to_string(i) + " M=" + std::to_string(M)));
      }
    }
  }
  cudaStreamDestroy(st);
}

// A scratch buffer that must grow moves (graph_epoch advances, so older recordings are not
// replayed); inside a capture it must not grow: the op throws, capture_abort ends the capture, and
// the backend runs the op directly afterwards. A fresh backend, so its scratch starts empty.
TEST(CudaGraphs, ScratchGrowthMovesEpochAndFailsInsideCapture) {
  std::string why;
  auto be = make_test_backend("cuda", &why);
  if (!be) GTEST_SKIP() << "no CUDA device: " << why;
  AttnParams p;
  p.n_heads = 8;
  p.n_kv_heads = 2;
  p.head_dim = 128;
  p.scale = 0.088f;
  const int nk = 256, M = 16;
  const DeviceBuffer K = to_device(*be, randn(static_cast<size_t>(nk) * 256, 1)),
                     V = to_device(*be, randn(static_cast<size_t>(nk) * 256, 2)),
                     q = to_device(*be, randn(static_cast<size_t>(M) * 8 * 128, 3)),
                     meta = to_device(*be, std::vector<StepMeta>{StepMeta{nk - M, 0, nk, 0}});
  DeviceBuffer out(be.get(), static_cast<size_t>(M) * 8 * 128 * 4);
  const auto* mp = reinterpret_cast<const StepMeta*>(meta.get());
  const uint64_t e0 = be->graph_epoch();
  be->attention(q.f(), K.f(), V.f(), out.f(), 1, p, mp);
  const uint64_t e1 = be->graph_epoch();
  EXPECT_NE(e1, e0) << "the first attention allocated its scratch without moving the epoch";
  be->capture_begin();
  try {
    be->attention(q.f(), K.f(), V.f(), out.f(), M, p, mp);
    ADD_FAILURE() << "scratch growth inside a capture did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Backend) << e.what();
  }
  be->capture_abort();
  EXPECT_EQ(be->graph_epoch(), e1);
  EXPECT_NO_THROW(be->attention(q.f(), K.f(), V.f(), out.f(), M, p, mp));
  EXPECT_NO_THROW(be->sync());
  EXPECT_NE(be->graph_epoch(), e1);
}

// The tiny random target: CUDA logits track the CPU's through prefill and decode (2e-4 of
// max|ref|: fp32 on both sides through 4 layers; the per-op bounds of the op table compound).
TEST(CudaModel, TinyTargetLogitsTrackCpu) {
  NEED_GPU();
  auto C = make_cpu_backend();
  TinyTarget t;
  t.mtp = false;
  const std::string dir = write_tiny_target(temp_dir("cuda_model"), t);
  auto mc = Qwen38Model::load(dir, C.get(), 16);
  auto mg = Qwen38Model::load(dir, G, 16);
  auto sc = mc->new_state(64, 0), sg = mg->new_state(64, 0);
  std::vector<int32_t> toks = {5, 900, 17, 4000, 8000, 3, 77, 1234, 42, 999, 7, 8191, 0};
  ForwardOpts fo;
  const int V = t.vocab;
  int M = static_cast<int>(toks.size());
  for (int step = 0; step < 6; step++) {
    mc->forward(*sc, toks.data(), M, fo);
    mg->forward(*sg, toks.data(), M, fo);
    std::vector<float> lc(static_cast<size_t>(M) * V);
    C->download(lc.data(), mc->logits(), lc.size() * 4);
    const auto lg = from_device<float>(*G, mg->logits(), lc.size());
    ASSERT_TRUE(close_rel(lg, lc, 2e-4, "logits step " + std::to_string(step)));
    int32_t next = 0;
    C->download(&next, mc->argmax_ids() + (M - 1), 4);
    toks = {next};
    M = 1;
  }
}

}  // namespace
}  // namespace qf::test

#endif  // QFLASH_HAVE_CUDA
