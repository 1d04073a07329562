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
#include <memory>
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

// A stream of the test's own, for the direct kernel calls.
struct TestStream {
  cudaStream_t st = nullptr;
  TestStream() { EXPECT_EQ(cudaSuccess, cudaStreamCreate(&st)); }
  ~TestStream() {
    if (st) cudaStreamDestroy(st);
  }
};

// A tensor-core GEMV case: the group's rows, its cols, the cross-block split it should get.
struct TcCase {
  std::vector<int64_t> rows;
  int64_t cols;
  int nsplit = 1;
};

// Random bf16 weights of a tensor-core GEMV group on the device, row-major (wp) and in the tiled
// layout (wtp, gemv_tc_relayout; rows not multiples of 32 included), with a float64 reference of
// their products with x (maxM rows) and the GEMV's split scratch (zero-filled by the backend).
struct TcGroup {
  std::vector<int64_t> rows;
  int64_t cols = 0;
  std::vector<HostWeight> hw;
  std::vector<DevWeight> dw;
  std::vector<DeviceBuffer> tbuf;
  std::vector<WeightRef> wd, wt;
  std::vector<const WeightRef*> wp, wtp;
  std::vector<Ref> ref;
  DeviceBuffer dx, scratch;
};
std::unique_ptr<TcGroup> tc_group(Backend* G, const std::vector<int64_t>& rows, int64_t cols, int maxM,
                                  cudaStream_t st) {
  auto g = std::make_unique<TcGroup>();
  const int n = static_cast<int>(rows.size());
  g->rows = rows;
  g->cols = cols;
  g->wd.resize(n);
  g->wt.resize(n);
  for (int i = 0; i < n; i++) {
    g->hw.push_back(random_weight(DType::BF16, rows[i], cols, 900 + 13 * i + rows[i]));
    g->dw.push_back(upload_weight(*G, g->hw.back()));
    g->wd[i] = g->dw.back().ref;
    g->tbuf.emplace_back(G, cuda::gemv_tc_tiled_bytes(rows[i], cols));
    poison(*G, g->tbuf.back().get(), g->tbuf.back().bytes());
    G->sync();
    cuda::gemv_tc_relayout(g->wd[i].data, g->tbuf.back().get(), rows[i], cols, st);
    g->wt[i] = g->wd[i];
    g->wt[i].data = g->tbuf.back().get();
    g->wt[i].layout = WeightRef::kTc32x64;
  }
  for (int i = 0; i < n; i++) {
    g->wp.push_back(&g->wd[i]);
    g->wtp.push_back(&g->wt[i]);
  }
  const auto x = randn(static_cast<size_t>(maxM) * cols, 321);
  g->dx = to_device(*G, x);
  for (int i = 0; i < n; i++) g->ref.push_back(ref_matmul(g->hw[i], x, maxM));
  g->scratch = DeviceBuffer(G, cuda::gemv_tc_scratch_bytes());
  G->sync();
  EXPECT_EQ(cudaSuccess, cudaStreamSynchronize(st));
  return g;
}

// Rows off .. off + M - 1 of the group's x through gemv_tc_group (schedule sched), into poisoned
// outputs; the outputs downloaded, one vector a weight.
std::vector<std::vector<float>> tc_run(Backend* G, const TcGroup& g, int M, int off, bool tiled, cudaStream_t st,
                                       int sched = 0) {
  const int n = static_cast<int>(g.rows.size());
  auto [dy, yp] = group_out(G, g.rows, M);
  G->sync();
  cuda::gemv_tc_group(tiled ? g.wtp.data() : g.wp.data(), yp.data(), n, g.dx.f() + static_cast<size_t>(off) * g.cols,
                      static_cast<int>(g.cols), M, g.scratch.get(), st, sched);
  EXPECT_EQ(cudaSuccess, cudaStreamSynchronize(st));
  std::vector<std::vector<float>> out(n);
  for (int i = 0; i < n; i++) out[i] = from_device<float>(*G, dy[i].get(), static_cast<size_t>(M) * g.rows[i]);
  return out;
}

// Every production tensor-core schedule (the rejected ones live in the kernel lab): each tracks float64 and
// gives row m the same bits for every M. The shapes cover tiles cut into many column pieces (few
// rows, long rows: the cross-block split), tiles one warp covers whole (many rows, short rows), a
// single warp, and a grouped launch. The same weights in the tiled layout give the row-major bits.
TEST(CudaMatmul, TcSchedulesMatchReferenceAndRowInvariant) {
  NEED_GPU();
  const TestStream ts;
  const cudaStream_t st = ts.st;
  for (const TcCase& cs : {TcCase{{48}, 5120}, TcCase{{1000}, 4096}, TcCase{{37}, 256}, TcCase{{4100}, 128},
                           TcCase{{640, 33, 96}, 1024}, TcCase{{5}, 64}}) {
    const int n = static_cast<int>(cs.rows.size());
    const int maxM = 16;
    const auto g = tc_group(G, cs.rows, cs.cols, maxM, st);
    for (int sched = 0; sched < cuda::gemv_tc_sched_count(); sched++) {
      const std::string what = std::string(cuda::gemv_tc_sched_name(sched)) + " " + std::to_string(cs.rows[0]) + "x" +
                               std::to_string(cs.cols) + (n > 1 ? " group" : "");
      std::vector<std::vector<float>> one(n);
      for (int m = 0; m < maxM; m++) {
        auto r = tc_run(G, *g, 1, m, false, st, sched);
        for (int i = 0; i < n; i++) one[i].insert(one[i].end(), r[i].begin(), r[i].end());
      }
      for (int i = 0; i < n; i++)
        EXPECT_TRUE(within(one[i], g->ref[i].y, g->ref[i].tol, what + " weight " + std::to_string(i) + " vs float64"));
      for (int M : {2, 3, 8, 9, 16}) {
        const int off = maxM - M;
        auto r = tc_run(G, *g, M, off, false, st, sched);
        for (int i = 0; i < n; i++)
          EXPECT_TRUE(same_bits(r[i].data(), one[i].data() + static_cast<size_t>(off) * cs.rows[i], r[i].size(),
                                what + " weight " + std::to_string(i) + " M=" + std::to_string(M)));
      }
      for (int M : {1, 5, 16}) {
        const int off = maxM - M;
        auto r = tc_run(G, *g, M, off, true, st, sched);
        for (int i = 0; i < n; i++)
          EXPECT_TRUE(same_bits(r[i].data(), one[i].data() + static_cast<size_t>(off) * cs.rows[i], r[i].size(),
                                what + " tiled layout, weight " + std::to_string(i) + " M=" + std::to_string(M)));
      }
    }
  }
}

// The cross-block split's rule (gemv_tc_split_blocks, from the shape only): every GEMV shape of the
// 27B target and the drafter's large ones keep the plain grid (and the bits they had before the
// split); the drafter's small grids split. Host-only: runs without a device.
TEST(CudaMatmul, TcSplitRuleLeavesFullGridsAlone) {
  struct Shape {
    const char* name;
    int64_t tiles, cols;
    int nsplit;
  };
  for (const Shape& s : {Shape{"target gdn qkv|z|a|b", 320 + 192 + 2 + 2, 5120, 1},
                         Shape{"target attn q|k|v", 384 + 32 + 32, 5120, 1},
                         Shape{"target o / gdn out 5120x6144", 160, 6144, 1},
                         Shape{"target gate|up", 1088, 5120, 1},
                         Shape{"target down 5120x17408", 160, 17408, 1},
                         Shape{"target head 248320x5120", 7760, 5120, 1},
                         Shape{"mtp fc 5120x10240", 160, 10240, 1},
                         Shape{"drafter fc 5120x25600", 160, 25600, 1},
                         Shape{"drafter q|k|v", 128 + 32 + 32, 5120, 1},
                         Shape{"drafter o 5120x4096", 160, 4096, 1},
                         Shape{"drafter conv kernel projection 1280x5120", 40, 5120, 5},
                         Shape{"drafter context k|v", 32 + 32, 5120, 4},
                         Shape{"drafter selector 256x5120", 8, 5120, 5}})
    EXPECT_EQ(cuda::gemv_tc_split_blocks(s.tiles, s.cols), s.nsplit) << s.name;
}

// The cross-block split on grids too small for the GPU: the drafter's conv kernel projection
// (ks 8: slices added through shared memory, then 5 blocks), an odd shape with uneven slices
// (2, 2, 3 chunks), a group whose tile groups straddle weights and end past the last tile, and an
// odd shape the rule leaves unsplit. In both layouts: M = 1, 7, 8, 16 track float64; row m has the
// same bits whatever M (the M = 1 call on row m against rows of the M = 8 and M = 16 calls);
// two launches give the same bits (the partials are added in block order, whichever block
// arrives last); the tiled layout gives the row-major bits.
// The selector walk's table form (every step x predecessor x candidate score at once, then a
// one-warp walk) against the one-block sequential walk: the same drafts and the same score bits,
// with ties (a slot's best candidate twice: the first must win), at the 27B drafter's shape (R 256,
// K 16) and small ones, bf16 and f32 codebooks.
TEST(CudaSelector, TableWalkEqualsSequentialWalkBitForBit) {
  NEED_GPU();
  const TestStream ts;
  struct C { int V, R, K, k; DType dt; bool ties; };
  for (const C& c : {C{248320, 256, 16, 7, DType::BF16, false}, C{248320, 256, 16, 15, DType::BF16, true},
                     C{5000, 64, 16, 15, DType::F32, true}, C{300, 16, 4, 1, DType::BF16, false},
                     C{1000, 40, 32, 9, DType::BF16, true}, C{1000, 32, 5, 3, DType::F32, false}}) {
    const std::string what = "V" + std::to_string(c.V) + " R" + std::to_string(c.R) + " K" + std::to_string(c.K) +
                             " k" + std::to_string(c.k) + (c.ties ? " ties" : "");
    const HostWeight Epre = random_weight(c.dt, c.V, c.R, 11), Esuc = random_weight(c.dt, c.V, c.R, 12);
    const DevWeight dEpre = upload_weight(*G, Epre), dEsuc = upload_weight(*G, Esuc);
    std::vector<int32_t> ids(static_cast<size_t>(c.k) * c.K);
    uint64_t s = 7;
    for (auto& i : ids) i = static_cast<int32_t>((s = splitmix64(s)) % c.V);
    auto vals = randn(ids.size(), 8, 2.0f);
    const auto P = randn(static_cast<size_t>(c.k) * c.R, 9, 0.3f);
    if (c.ties)
      for (int j = 0; j < c.k; j += 2) {
        const size_t b = static_cast<size_t>(j) * c.K;
        ids[b + c.K - 1] = ids[b + 1];
        vals[b + 1] = vals[b + c.K - 1] = 40.0f;
      }
    const DeviceBuffer dv = to_device(*G, vals), di = to_device(*G, ids), dP = to_device(*G, P),
                       da = to_device(*G, std::vector<int32_t>{77});
    DeviceBuffer err(G, sizeof(cuda::DevError)), table(G, static_cast<size_t>(c.k) * c.K * c.K * sizeof(float));
    ASSERT_EQ(cudaSuccess, cudaMemset(err.get(), 0, sizeof(cuda::DevError)));
    std::vector<int32_t> drafts[2];
    std::vector<float> scores[2];
    for (int mode = 0; mode < 2; mode++) {
      DeviceBuffer d(G, static_cast<size_t>(c.k) * sizeof(int32_t)), sc(G, ids.size() * sizeof(float));
      poison(*G, d.get(), d.bytes());
      poison(*G, sc.get(), sc.bytes());
      poison(*G, table.get(), table.bytes());
      G->sync();
      cuda::selector_walk(dv.f(), di.i(), dP.f(), dEpre.ref, dEsuc.ref, da.i(), c.k, c.K, c.R, static_cast<int32_t*>(d.get()),
                          static_cast<float*>(sc.get()), table.get(), static_cast<cuda::DevError*>(err.get()), ts.st, mode);
      ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(ts.st));
      drafts[mode] = from_device<int32_t>(*G, d.get(), static_cast<size_t>(c.k));
      scores[mode] = from_device<float>(*G, sc.get(), ids.size());
    }
    EXPECT_EQ(drafts[1], drafts[0]) << what;
    EXPECT_TRUE(same_bits(scores[1], scores[0], what + ": scores, table vs sequential"));
    const auto e = from_device<cuda::DevError>(*G, err.get(), 1);
    EXPECT_EQ(e[0].code, 0) << what;
  }
}

TEST(CudaMatmul, TcSplitSmallGridsMatchReferenceRowInvariantAndDeterministic) {
  NEED_GPU();
  const TestStream ts;
  const cudaStream_t st = ts.st;
  for (const TcCase& cs : {TcCase{{1280}, 5120, 5}, TcCase{{72}, 448, 3}, TcCase{{990, 200, 72}, 2048, 4},
                           TcCase{{72}, 192, 1}}) {
    const int n = static_cast<int>(cs.rows.size());
    const int maxM = 16;
    std::string what = std::to_string(cs.rows[0]) + "x" + std::to_string(cs.cols) + (n > 1 ? " group" : "");
    int64_t tiles = 0;
    for (int64_t r : cs.rows) tiles += (r + 31) / 32;
    EXPECT_EQ(cuda::gemv_tc_split_blocks(tiles, cs.cols), cs.nsplit) << what;
    const auto g = tc_group(G, cs.rows, cs.cols, maxM, st);
    std::vector<std::vector<float>> base[2];  // [layout][weight]: the M = 16 call
    for (int tiled = 0; tiled < 2; tiled++) {
      const std::string wl = what + (tiled ? " tiled" : " row-major") + ", weight ";
      for (int M : {1, 7, 8, 16}) {
        const auto r = tc_run(G, *g, M, 0, tiled, st);
        for (int i = 0; i < n; i++) {
          const size_t len = static_cast<size_t>(M) * cs.rows[i];
          const std::vector<double> ry(g->ref[i].y.begin(), g->ref[i].y.begin() + len),
              rt(g->ref[i].tol.begin(), g->ref[i].tol.begin() + len);
          EXPECT_TRUE(within(r[i], ry, rt, wl + std::to_string(i) + " M=" + std::to_string(M) + " vs float64"));
        }
        if (M == 16) base[tiled] = r;
      }
      for (int m = 0; m < maxM; m++) {  // row m alone, against row m of the M = 16 call and of an M = 8 call
        const auto one = tc_run(G, *g, 1, m, tiled, st);
        const int off8 = m < 8 ? 0 : 8;
        const auto eight = tc_run(G, *g, 8, off8, tiled, st);
        for (int i = 0; i < n; i++) {
          const std::string w = wl + std::to_string(i) + " row " + std::to_string(m);
          EXPECT_TRUE(same_bits(one[i].data(), base[tiled][i].data() + static_cast<size_t>(m) * cs.rows[i],
                                one[i].size(), w + ": M=1 vs M=16"));
          EXPECT_TRUE(same_bits(one[i].data(), eight[i].data() + static_cast<size_t>(m - off8) * cs.rows[i],
                                one[i].size(), w + ": M=1 vs M=8"));
        }
      }
      const auto again = tc_run(G, *g, 16, 0, tiled, st);  // a second launch (the tickets were reset)
      for (int i = 0; i < n; i++)
        EXPECT_TRUE(same_bits(again[i], base[tiled][i], wl + std::to_string(i) + ": a second M=16 launch"));
    }
    for (int i = 0; i < n; i++)
      EXPECT_TRUE(same_bits(base[1][i], base[0][i], what + " weight " + std::to_string(i) + ": tiled vs row-major"));
  }
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
