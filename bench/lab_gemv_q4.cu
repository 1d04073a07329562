// Kernel lab: the int4 tensor-core GEMV (src/backend/cuda/gemv_tc_q4_impl.cuh). Issue 14 wants int4
// decode at >= 240 tok/s on the 27B (the kernel streamed 1.41 TB/s in run 23, 33% of the copy
// ceiling); this lab tells where its time goes and tries the fixes, each against production:
//   - every non-diagnostic version is checked before it is timed: against a double-precision CPU
//     dequantization (rows sampled on the big shapes; every output element must be written), for
//     row-invariance (rows of M = 1 and M = 9 calls have the bits of the same rows of the M = 16
//     call) and, where it claims production's arithmetic, bit for bit against production;
//   - then timed with CUDA events over weights rotated past the L2 (GB/s of weight bytes, % of the
//     device's copy ceiling), on the 27B's int4 (group 64) projections.
//   qflash_lab_gemv_q4 [VERSION ...] [--quick] [--reps N] [--M 1,2,8,16]
//   qflash_lab_gemv_q4 --chain KIND:LAYERS[,...] [--M 1,8] [--reps N] [--pf G] [--timeout-ms T]
//     chain mode (lab_gemv_q4_chain.cuh): a 27B layer's int4 GEMVs in order (KIND gdn | attn | mix),
//     version 22 as separate launches (a: plain, a_pdl: PDL, a_graph: PDL in a CUDA graph, as
//     production replays a step) against one persistent launch that walks every stage with device
//     counters (b: a stage waits for all of the previous one, first weights requested before the
//     wait; b_late: requested after it; b_pf: b plus G groups a warp prefetched into L2 while
//     waiting; b_slice: each warp waits only for its own column slice's x, so stages overlap;
//     b_dyn: b with units from an atomic ticket instead of round-robin; b_sdyn: both); all checked
//     (CPU, version 22's bits, every variant == a bit for bit) and timed per chain
// Versions:
//   1 prod     the production entry point (gemv_tc_q4_group)
//   2 x2       two activations per bf16 conversion (cvt.rn.bf16x2.f32): production's bits, fewer
//              instructions per k-step
//   3 prex     activation pieces and group sums made once per launch by q4_prepare_x_kernel
//              instead of once per 32-row tile; timed with that extra launch (production's bits)
//   4 x2d6     x2 with 6 units in flight per warp instead of 4 (production's bits)
//   5-8 ks1..ks8  production's arithmetic with the column split forced to 1, 2, 4, 8 slices
//              (other shapes of the grid; bits differ from production where its ks differs)
//   9 noalu    diagnostic, not checked: the weight words and raw activation bits go straight into
//              the MMAs (no split, no dequant, no token sums): the kernel's speed without its ALU
//              work, i.e. what a cheaper dequant could reach at best
//   10 nomma   diagnostic, not checked: every MMA input computed and added into the accumulator's
//              bits as an integer, no MMA issued (fixed 2026-12-06: run 33's version let ptxas
//              drop the nibble loads, dequant and split, so it timed a kernel that read 11% of
//              the bytes)
//   11 xpf     production's arithmetic with the activations loaded one unit ahead (a register
//              ring, 3 units in flight instead of 4 for the registers): production's bits
//   12 v2      pieces in columns (gemv_tc_q4_pc_kernel, bench/lab_gemv_q4_pc.cuh; tried in production in run 34 and removed): the two
//              bf16 pieces of an activation in two n-columns of one mma, 4 tokens per token tile,
//              x one unit ahead: half the mmas at M <= 4, its own bits (checked against the CPU
//              and for row-invariance)
//   13 v2nx    v2 loading x per unit as production does (v2's bits): what the prefetch is worth
//   14 v2nomma diagnostic, not checked: v2 with q4_nomma instead of the mma
//   15 v2d3    v2 with 3 units in flight at every token-tile count (production v2: 4 at M <= 4,
//              2 at M 5..8, where 3 spills 20 bytes): what the shallower ring costs verify
//   16 v2o3    v2 at 24 warps a SM (3 blocks, <= 80 registers): 2 units in flight, x per unit (no
//              spill at M <= 4; spills at M 5..8): occupancy against depth
// Versions 17+ (bench/lab_gemv_q4_more.cuh, gemv_q4lab_kernel): production's arithmetic and column
// split, so production's bits (memcmp'd), with more weight loads in flight:
//   17 pf      production's geometry plus prefetch.global.L2 of the unit 4 beyond the ring
//   18 o3      24 warps a SM (3 blocks, <= 80 registers), 2 units in flight
//   19 rh      row halves: two warps per tile-slice (one per 16 rows), 16-warp blocks, 32 warps a
//              SM (<= 64 registers), 3 half-units in flight
//   20 rhpf    rh with 2 half-units in flight and prefetch.global.L2 6 units ahead (no spill)
// Version 21 (bench/lab_gemv_q4_ix.cuh): its own arithmetic, checked against the CPU and for
// row-invariance:
//   21 ix      exact integer group products: x in per-group fixed point (three int8 digits),
//              mma.sync m16n8k32 s8 on row-major nibbles, fp32 fold per group; timed with its
//              x-preparation launch
//   22 ixt     ix on tiled nibbles (per 32-row tile and group, 1 KB in the order the lanes load it:
//              two 512-byte coalesced loads a warp) with the column split whose last wave is
//              fullest: the bits of 23
//   23 ixs     ix (row-major nibbles) with 22's column split
//   24 ixtnp   diagnostic, not checked: 22 without its x-preparation launch (the digits of the
//              previous call): what that launch costs
// Exit status 1 when a checked version fails a check. docs/experiments/cuda_kernels.md has the
// reasoning and, once it has run on the H200, the numbers.
#include <cuda_runtime.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/gemv_tc_q4_impl.cuh"
#include "bench_util.cuh"
#include "lab_gemv_q4_chain.cuh"
#include "lab_gemv_q4_ix.cuh"
#include "lab_gemv_q4_more.cuh"
#include "lab_gemv_q4_pc.cuh"

namespace qf::cuda {
namespace {

struct RecipeX2 : Q4Recipe {
  static constexpr bool split_x2 = true;
};
struct RecipePre : Q4Recipe {
  static constexpr bool pre_x = true;
};
struct RecipeX2D6 : Q4Recipe {
  static constexpr bool split_x2 = true;
  static constexpr int depth = 6;
};
struct RecipeNoAlu : Q4Recipe {
  static constexpr bool diag_no_alu = true;
};
struct RecipeNoMma : Q4Recipe {
  static constexpr bool diag_no_mma = true;
};
struct RecipeXpf : Q4Recipe {
  static constexpr bool x_prefetch = true;
  static constexpr int depth = 3;
};
struct RecipePcNx : Q4PcRecipe {
  static constexpr bool x_prefetch = false;
};
struct RecipePcNoMma : Q4PcRecipe {
  static constexpr bool diag_no_mma = true;
};
struct RecipePcD3 : Q4PcRecipe {
  static constexpr int depth = 3;
};
struct RecipePcO3 : Q4PcRecipe {
  static constexpr int min_blocks = 3;
  static constexpr int depth = 2;
  static constexpr bool x_prefetch = false;
};
// Versions 17+ (lab_gemv_q4_more.cuh); the M 9..16 kernels keep production's 4 units and 1 block.
struct LabPf : Q4LabRecipe {
  static constexpr int pf = 4;
};
struct LabO3 : Q4LabRecipe {
  static constexpr int depth = 2;
  static constexpr int min_blocks = 3;
};
struct LabRh : Q4LabRecipe {
  static constexpr bool row_halves = true;
  static constexpr int depth = 3;
};
struct LabRhPf : Q4LabRecipe {
  static constexpr bool row_halves = true;
  static constexpr int depth = 2;
  static constexpr int pf = 6;
};

}  // namespace
}  // namespace qf::cuda

using namespace qf;
using namespace qf::bench;

namespace {

constexpr int kVersions = 24;
const char* const kNames[kVersions + 1] = {"",      "prod",  "x2",    "prex", "x2d6", "ks1",     "ks2",  "ks4", "ks8",
                                           "noalu", "nomma", "xpf",   "v2",   "v2nx", "v2nomma", "v2d3", "v2o3",
                                           "pf",    "o3",    "rh",    "rhpf",  "ix",    "ixt",   "ixs",   "ixtnp"};
// The version whose bits a version claims (0: none beyond the CPU and row-invariance checks).
int same_bits_as(int v) { return (v >= 2 && v <= 4) || v == 11 || (v >= 17 && v <= 20) ? 1 : v == 13 || v == 15 || v == 16 ? 12 : v == 22 ? 23 : 0; }
bool diagnostic(int v) { return v == 9 || v == 10 || v == 14 || v == 24; }

// Two device buffers that grow with the columns of the widest case (freed and reallocated).
struct Scratch2 {
  void* a = nullptr;
  void* b = nullptr;
  int64_t cols = 0;
  void ensure(int64_t c, size_t bytes_a, size_t bytes_b) {
    if (c <= cols) return;
    if (a) cudaFree(a);
    if (b) cudaFree(b);
    a = dmalloc(bytes_a);
    b = dmalloc(bytes_b);
    cols = c;
  }
};
// pre_x recipe: pieces of 16 tokens x (cols / 16) k-steps x 4 lanes, sums of (cols / 32) groups
// (the smallest group) x 16 tokens.
Scratch2 g_prex;
// Versions 21+: x digits of 16 tokens (3 bytes a column) and (xs, pow2) per group and token.
Scratch2 g_ix;

void ensure_scratch(int64_t cols) {
  g_prex.ensure(cols, static_cast<size_t>(16) * (cols / 16) * 4 * sizeof(uint4),
                static_cast<size_t>(cols / 32) * 16 * sizeof(float));
}
void ensure_ix_scratch(int64_t cols) {
  g_ix.ensure(cols, static_cast<size_t>(16) * cols * 3, static_cast<size_t>(cols / 64) * 16 * 2 * sizeof(float));
}

void run_version(int v, const WeightRef* const* Ws, float* const* ys, int n, const float* x, int x_ld, int M) {
  cuda::Q4RunOpts o;
  switch (v) {
    case 1: cuda::gemv_tc_q4_group(Ws, ys, n, x, x_ld, M, g_st); return;
    case 2: cuda::q4_run<cuda::RecipeX2>(Ws, ys, n, x, x_ld, M, g_st, false, o); return;
    case 3:
      ensure_scratch(Ws[0]->cols);
      o.np = 2;
      o.xq = static_cast<uint4*>(g_prex.a);
      o.xs = static_cast<float*>(g_prex.b);
      cuda::q4_run<cuda::RecipePre>(Ws, ys, n, x, x_ld, M, g_st, false, o);
      return;
    case 4: cuda::q4_run<cuda::RecipeX2D6>(Ws, ys, n, x, x_ld, M, g_st, false, o); return;
    case 9: cuda::q4_run<cuda::RecipeNoAlu>(Ws, ys, n, x, x_ld, M, g_st, false, o); return;
    case 10: cuda::q4_run<cuda::RecipeNoMma>(Ws, ys, n, x, x_ld, M, g_st, false, o); return;
    case 11: cuda::q4_run<cuda::RecipeXpf>(Ws, ys, n, x, x_ld, M, g_st, false, o); return;
    case 12: cuda::q4_run_pc<cuda::Q4PcRecipe>(Ws, ys, n, x, x_ld, M, g_st, o); return;
    case 13: cuda::q4_run_pc<cuda::RecipePcNx>(Ws, ys, n, x, x_ld, M, g_st, o); return;
    case 14: cuda::q4_run_pc<cuda::RecipePcNoMma>(Ws, ys, n, x, x_ld, M, g_st, o); return;
    case 15: cuda::q4_run_pc<cuda::RecipePcD3>(Ws, ys, n, x, x_ld, M, g_st, o); return;
    case 16: cuda::q4_run_pc<cuda::RecipePcO3>(Ws, ys, n, x, x_ld, M, g_st, o); return;
    case 17: cuda::q4lab_run<cuda::LabPf>(Ws, ys, n, x, x_ld, M, g_st); return;
    case 18: cuda::q4lab_run<cuda::LabO3>(Ws, ys, n, x, x_ld, M, g_st); return;
    case 19: cuda::q4lab_run<cuda::LabRh>(Ws, ys, n, x, x_ld, M, g_st); return;
    case 20: cuda::q4lab_run<cuda::LabRhPf>(Ws, ys, n, x, x_ld, M, g_st); return;
    case 21:
      ensure_ix_scratch(Ws[0]->cols);
      cuda::q4ix_run(Ws, ys, n, x, x_ld, M, g_st, static_cast<uint8_t*>(g_ix.a), static_cast<float*>(g_ix.b));
      return;
    case 22:
    case 23:
    case 24:
      ensure_ix_scratch(Ws[0]->cols);
      cuda::q4ix_run(Ws, ys, n, x, x_ld, M, g_st, static_cast<uint8_t*>(g_ix.a), static_cast<float*>(g_ix.b), v != 23, true, v != 24);
      return;
    default:
      o.ks = 1 << (v - 5);
      cuda::q4_run<cuda::Q4Recipe>(Ws, ys, n, x, x_ld, M, g_st, false, o);
  }
}

// A group of int4 weights with the same cols (group 64), row-major (for the CPU) and relaid.
struct Case {
  std::string name;
  std::vector<int64_t> rows;
  int64_t cols;
};

// The 27B's int4 projections as the model groups them (gate|up, GDN qkv|z|a|b, attention q|k|v);
// the chain mode builds its layers from these (indices below).
enum { kCaseGateUp, kCaseDown, kCaseGdnIn, kCaseAttnQkv, kCaseOut, kCaseHead };
std::vector<Case> timed_cases() {
  return {{"mlp gate|up 2x17408x5120", {17408, 17408}, 5120},
          {"mlp down 5120x17408", {5120}, 17408},
          {"gdn in 10240+6144+48+48", {10240, 6144, 48, 48}, 5120},
          {"attn q|k|v 12288+1024+1024", {12288, 1024, 1024}, 5120},
          {"gdn out / attn o 5120x6144", {5120}, 6144},
          {"lm_head 248320x5120", {248320}, 5120}};
}


struct Loaded {
  std::vector<Mat> mats;                       // row-major mlx int4 (q, scales, biases)
  std::vector<std::vector<WeightRef>> tiled;   // the same in kTcQ4, one per rotation copy
  std::vector<std::vector<WeightRef>> ix;      // row-major nibbles + packed scales (versions 21, 23)
  std::vector<std::vector<WeightRef>> ixt;     // tiled nibbles + packed scales (versions 22, 24)
};

Loaded load(const Case& c) {
  Loaded l;
  for (int64_t r : c.rows) {
    l.mats.push_back(make_mat(DType::U32, r, c.cols, 64));
    Mat& m = l.mats.back();
    std::vector<WeightRef> tw(m.w);
    for (WeightRef& w : tw) {
      void* p = dmalloc(cuda::gemv_tc_q4_bytes(w.rows, w.cols, w.group));
      cuda::gemv_tc_q4_relayout(w, p, g_st);
      w.data = p;
      w.scales = nullptr;
      w.biases = nullptr;
      w.layout = WeightRef::kTcQ4;
      m.owned.push_back(p);
    }
    l.tiled.push_back(std::move(tw));
    std::vector<WeightRef> xw(m.w);
    for (WeightRef& w : xw) {
      const int ng = static_cast<int>(w.cols / 64);
      const int64_t nsb = (w.rows + 31) / 32 * ng * 8;
      void* p = dmalloc(static_cast<size_t>(nsb) * 16);
      cuda::q4ix_pack_sb_kernel<<<256, 256, 0, g_st>>>(static_cast<const uint16_t*>(w.scales),
                                                       static_cast<const uint16_t*>(w.biases), static_cast<uint4*>(p),
                                                       w.rows, ng, nsb);
      QF_CUDA_CHECK(cudaGetLastError());
      w.scales = p;
      w.biases = nullptr;
      m.owned.push_back(p);
    }
    std::vector<WeightRef> tw2(xw);
    for (WeightRef& w : tw2) {
      const int64_t nv = (w.rows + 31) / 32 * (w.cols / 64) * 64;
      void* p = dmalloc(static_cast<size_t>(nv) * 16);
      cuda::q4ix_tile_kernel<<<512, 256, 0, g_st>>>(static_cast<const uint32_t*>(w.data), static_cast<uint4*>(p), w.rows,
                                                    w.cols, nv);
      QF_CUDA_CHECK(cudaGetLastError());
      w.data = p;
      m.owned.push_back(p);
    }
    l.ix.push_back(std::move(xw));
    l.ixt.push_back(std::move(tw2));
  }
  QF_CUDA_CHECK(cudaStreamSynchronize(g_st));
  return l;
}

std::vector<const WeightRef*> group(const Loaded& l, int k, int ver) {
  std::vector<const WeightRef*> p;
  for (const auto& v : ver == 21 || ver == 23 ? l.ix : ver == 22 || ver == 24 ? l.ixt : l.tiled)
    p.push_back(&v[k % v.size()]);
  return p;
}

// Double-precision reference of a row-major int4 weight on the checked rows:
// w[r, c] = q[r, c] * scale[r, c / G] + bias[r, c / G] (bf16 scale and bias), y = sum_c w x; each
// row dequantized once for all M tokens.
CpuRef cpu_ref_q4(const WeightRef& W, const std::vector<float>& x, int M) {
  QF_CUDA_CHECK(cudaStreamSynchronize(g_st));
  CpuRef r;
  r.rows = check_rows(W.rows);
  r.M = M;
  const int64_t ng = W.cols / W.group;
  std::vector<uint32_t> q(static_cast<size_t>(W.cols / 8));
  std::vector<uint16_t> s(static_cast<size_t>(ng)), b(static_cast<size_t>(ng));
  std::vector<double> w(static_cast<size_t>(W.cols));
  r.y.assign(static_cast<size_t>(M) * r.rows.size(), 0.0);
  for (size_t k = 0; k < r.rows.size(); k++) {
    const int64_t row = r.rows[k];
    QF_CUDA_CHECK(cudaMemcpy(q.data(), static_cast<const uint32_t*>(W.data) + row * (W.cols / 8), q.size() * 4,
                             cudaMemcpyDeviceToHost));
    QF_CUDA_CHECK(cudaMemcpy(s.data(), static_cast<const uint16_t*>(W.scales) + row * ng, s.size() * 2, cudaMemcpyDeviceToHost));
    QF_CUDA_CHECK(cudaMemcpy(b.data(), static_cast<const uint16_t*>(W.biases) + row * ng, b.size() * 2, cudaMemcpyDeviceToHost));
    for (int64_t c = 0; c < W.cols; c++)
      w[c] = static_cast<double>((q[c / 8] >> (4 * (c % 8))) & 15u) * bf16_to_float(s[c / W.group]) +
             bf16_to_float(b[c / W.group]);
    for (int m = 0; m < M; m++) {
      double acc = 0;
      const float* xm = x.data() + static_cast<size_t>(m) * W.cols;
      for (int64_t c = 0; c < W.cols; c++) acc += w[c] * xm[c];
      r.y[static_cast<size_t>(m) * r.rows.size() + k] = acc;
    }
  }
  return r;
}

// M = 16 against the CPU; rows of M = 1, 4, 5 and 9 calls against the same rows of the M = 16 call
// (every token-tile count of both kernels); for versions that claim another version's arithmetic
// (production's, or v2's), every bit against it at M = 1, 8, 16.
std::string check(int v, const Case& c, const Loaded& l, const float* dx, const std::vector<CpuRef>& refs) {
  const int n = static_cast<int>(c.rows.size()), cols = static_cast<int>(c.cols);
  std::vector<float*> ys(n);
  for (int i = 0; i < n; i++) ys[i] = static_cast<float*>(dmalloc(static_cast<size_t>(16) * c.rows[i] * 4));
  auto call = [&](int ver, int M, int off) {
    const auto ws = group(l, 0, ver);
    return poisoned_call(ys, c.rows, M, [&] { run_version(ver, ws.data(), ys.data(), n, dx + static_cast<size_t>(off) * cols, cols, M); });
  };
  std::string err;
  const auto full = call(v, 16, 0);
  // Bound: the 2-piece split leaves <= 2^-17 |x| per activation and the tensor core's fp32 sums
  // of one group truncate; 1e-5 of the largest reference value is far above both and far below
  // any real mistake (a wrong nibble, scale or token moves a result by ~1e-2 of it).
  for (int i = 0; i < n && err.empty(); i++) {
    err = check_against(full[i], c.rows[i], refs[i], 1e-5);
    if (!err.empty()) err = cuda::fmt_str("weight %d vs CPU: ", i) + err;
  }
  const int probes[][2] = {{1, 0}, {1, 5}, {1, 8}, {1, 15}, {4, 12}, {5, 2}, {9, 7}};  // {M, first row}
  for (const auto& pr : probes) {
    if (!err.empty()) break;
    const auto part = call(v, pr[0], pr[1]);
    for (int i = 0; i < n && err.empty(); i++)
      if (std::memcmp(part[i].data(), full[i].data() + static_cast<size_t>(pr[1]) * c.rows[i], part[i].size() * 4))
        err = cuda::fmt_str("weight %d: rows %d..%d of an M = %d call differ from the M = 16 call (row-invariance)", i,
                            pr[1], pr[1] + pr[0] - 1, pr[0]);
  }
  if (err.empty() && same_bits_as(v))
    for (int M : {1, 8, 16}) {
      const auto mine = call(v, M, 0), ref = call(same_bits_as(v), M, 0);
      for (int i = 0; i < n && err.empty(); i++)
        if (std::memcmp(mine[i].data(), ref[i].data(), mine[i].size() * 4))
          err = cuda::fmt_str("weight %d, M = %d: bits differ from %s", i, M, kNames[same_bits_as(v)]);
      if (!err.empty()) break;
    }
  for (float* y : ys) cudaFree(y);
  return err;
}

// ---- chain mode (--chain; lab_gemv_q4_chain.cuh) -------------------------------------------------
// A chain is L layers of the 27B, each 4 int4 GEMV stages: GDN (in 10240+6144+48+48 x 5120, out
// 5120 x 6144, gate|up, down) or attention (q|k|v 12288+1024+1024 x 5120, o 5120 x 6144, gate|up,
// down), with the stand-in transforms of the header between stages. Layer l of a call with
// rotation offset o uses weight copy (o + l) % nc of every matrix (nc: the fewest copies any used
// matrix has), so the layers of a chain read distinct weights and repeated calls rotate past the L2.
constexpr int kChainVariants = 9, kB = 3;  // 0..2: separate launches, 3..8: persistent (modes below)
const char* const kChainNames[kChainVariants] = {"a",    "a_pdl",  "a_graph", "b",     "b_late",
                                                 "b_pf", "b_slice", "b_dyn",  "b_sdyn"};
const int kChainMode[kChainVariants] = {0, 0, 0, 0, 1, 2, 4, 8, 12};

struct ChainOpts {
  std::vector<std::pair<std::string, int>> chains;  // (gdn | attn | mix, layers)
  int pf = 8;
  long long timeout_ms = 200;
};

struct Chain {
  std::string name;
  std::vector<int> shape, layer;      // case id and layer of each stage
  std::vector<bool> attn_layer;       // per layer
  int ns = 0, nlayers = 0, ncnt = 0, launches = 0;
  std::vector<std::array<float*, 4>> y;
  std::vector<uint8_t*> xq;
  std::vector<float*> xsp, xout;
  unsigned* cnt = nullptr;  // 2 sets of ncnt
  int* err = nullptr;
  cuda::Q4cStage* dtab = nullptr;  // [nc][ns] for the current M
  size_t bytes = 0;          // weight bytes one call reads (nibbles + packed scales)
};

void qc_launch_cfg(cudaLaunchConfig_t& cfg, cudaLaunchAttribute* attr, bool pdl, int grid) {
  cfg = cudaLaunchConfig_t{};
  cfg.gridDim = dim3(static_cast<unsigned>(grid));
  cfg.blockDim = dim3(256);
  cfg.stream = g_st;
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
}

struct ChainLab {
  std::vector<Case> cases = timed_cases();
  std::vector<Loaded> loaded;  // by case id (empty Loaded where unused)
  std::vector<bool> have;
  const float* x0 = nullptr;
  int nc = 64, sms = 0, grid1 = 0, grid2 = 0;

  explicit ChainLab(const std::vector<Chain>& chains) : loaded(cases.size()), have(cases.size(), false) {
    for (const Chain& ch : chains)
      for (int id : ch.shape)
        if (!have[id]) {
          loaded[id] = load(cases[id]);
          have[id] = true;
        }
    for (size_t id = 0; id < cases.size(); id++)
      if (have[id])
        for (const auto& v : loaded[id].ixt) nc = std::min(nc, static_cast<int>(v.size()));
    QF_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    // Every block resident: the persistent grid is the occupancy limit times the SMs.
    int bps = 0;
    QF_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&bps, cuda::q4c_persist_kernel<1>, 256, 0));
    grid1 = bps * sms;
    QF_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&bps, cuda::q4c_persist_kernel<2>, 256, 0));
    grid2 = bps * sms;
  }
  ~ChainLab() {
    for (size_t id = 0; id < cases.size(); id++)
      if (have[id])
        for (Mat& m : loaded[id].mats) free_mat(m);
  }

  static int ntiles(const Case& c) {
    int t = 0;
    for (int64_t r : c.rows) t += static_cast<int>((r + 31) / 32);
    return t;
  }

  // Stage tables for M tokens, rotation offset off; xout: (a) writes the x values (the checks).
  std::vector<cuda::Q4cStage> table(const Chain& ch, int M, int off, bool xout) const {
    std::vector<cuda::Q4cStage> st(ch.ns);
    int base = 0, cnt = 0;
    for (int s = 0; s < ch.ns; s++) {
      cuda::Q4cStage& P = st[s];
      P = cuda::Q4cStage{};
      const Case& c = cases[ch.shape[s]];
      const Loaded& L = loaded[ch.shape[s]];
      P.n = static_cast<int>(c.rows.size());
      P.cols = static_cast<int>(c.cols);
      P.ng = P.cols / 64;
      int tiles = 0;
      for (int i = 0; i < P.n; i++) {
        const WeightRef& w = L.ixt[i][(off + ch.layer[s]) % nc];
        P.q[i] = static_cast<const uint4*>(w.data);
        P.sb[i] = static_cast<const uint4*>(w.scales);
        P.y[i] = ch.y[s][i];
        P.rows[i] = static_cast<int>(c.rows[i]);
        P.tile0[i] = tiles;
        tiles += static_cast<int>((c.rows[i] + 31) / 32);
      }
      P.tile0[P.n] = tiles;
      P.S = cuda::q4ix_split(tiles, P.ng, true);
      P.units = (tiles + 8 / P.S - 1) / (8 / P.S);
      P.dep_aw = P.dep_bw = -1;
      if (s == 0) {
        P.xa = x0;
        P.lda = P.cols;
        P.xscale = 1.0f;
      } else {
        const cuda::Q4cStage& Q = st[s - 1];
        const int prev = ch.shape[s - 1];
        P.xa = Q.y[0];
        P.lda = Q.rows[0];
        P.dep_aw = 0;
        P.dep_at0 = 0;
        if (prev == kCaseGdnIn || prev == kCaseAttnQkv || prev == kCaseGateUp) {
          // gated: gdn qkv * sigmoid(z); attn q * sigmoid(its gate half); gate * sigmoid(up)
          P.dep_bw = prev == kCaseAttnQkv ? 0 : 1;
          P.dep_bt0 = prev == kCaseAttnQkv ? P.cols / 32 : 0;
          P.xb = Q.y[P.dep_bw] + static_cast<int64_t>(P.dep_bt0) * 32;
          P.ldb = Q.rows[P.dep_bw];
          P.xscale = 0.5f;
        } else {
          P.xscale = prev == kCaseDown ? 0.125f : 0.25f;
        }
      }
      P.need = P.xb ? 4 : 2;
      P.xq = ch.xq[s];
      P.xsp = ch.xsp[s];
      P.xout = xout ? ch.xout[s] : nullptr;
      P.base = base;
      P.pre = s == 0 ? (M * P.ng + 7) / 8 : 0;
      base += P.pre + P.units;
      P.cnt = cnt;
      cnt += 9 + P.ng;
    }
    return st;
  }

  static Chain make(const std::string& kind, int layers) {
    Chain ch;
    ch.name = cuda::fmt_str("%s x%d", kind.c_str(), layers);
    ch.nlayers = layers;
    for (int l = 0; l < layers; l++) {
      const bool attn = kind == "attn" || (kind == "mix" && l % 4 == 3);
      ch.attn_layer.push_back(attn);
      for (int id : {attn ? static_cast<int>(kCaseAttnQkv) : static_cast<int>(kCaseGdnIn), static_cast<int>(kCaseOut),
                     static_cast<int>(kCaseGateUp), static_cast<int>(kCaseDown)}) {
        ch.shape.push_back(id);
        ch.layer.push_back(l);
      }
    }
    ch.ns = static_cast<int>(ch.shape.size());
    return ch;
  }

  void alloc(Chain& ch) const {
    ch.y.resize(ch.ns);
    for (int s = 0; s < ch.ns; s++) {
      const Case& c = cases[ch.shape[s]];
      for (int i = 0; i < 4; i++)
        ch.y[s][i] = i < static_cast<int>(c.rows.size()) ? static_cast<float*>(dmalloc(static_cast<size_t>(16) * c.rows[i] * 4))
                                                         : nullptr;
      ch.xq.push_back(static_cast<uint8_t*>(dmalloc(static_cast<size_t>(16) * c.cols * 3)));
      ch.xsp.push_back(static_cast<float*>(dmalloc(static_cast<size_t>(c.cols / 64) * 16 * 2 * 4)));
      ch.xout.push_back(static_cast<float*>(dmalloc(static_cast<size_t>(16) * c.cols * 4)));
      ch.ncnt += 9 + static_cast<int>(c.cols / 64);
      ch.bytes += static_cast<size_t>(ntiles(c)) * (c.cols / 64) * (1024 + 128);
    }
    ch.ncnt += 1;  // the unit ticket (mode 8)
    ch.cnt = static_cast<unsigned*>(dmalloc(static_cast<size_t>(2) * ch.ncnt * 4));
    QF_CUDA_CHECK(cudaMemset(ch.cnt, 0, static_cast<size_t>(2) * ch.ncnt * 4));
    ch.err = static_cast<int*>(dmalloc(2 * sizeof(int)));
    QF_CUDA_CHECK(cudaMemset(ch.err, 0, 2 * sizeof(int)));
    ch.dtab = static_cast<cuda::Q4cStage*>(dmalloc(static_cast<size_t>(nc) * ch.ns * sizeof(cuda::Q4cStage)));
  }
  static void release(Chain& ch) {
    for (auto& a : ch.y)
      for (float* p : a)
        if (p) cudaFree(p);
    for (auto* p : ch.xq) cudaFree(p);
    for (auto* p : ch.xsp) cudaFree(p);
    for (auto* p : ch.xout) cudaFree(p);
    cudaFree(ch.cnt);
    cudaFree(ch.err);
    cudaFree(ch.dtab);
  }

  // The persistent kernel's tables for M (every rotation offset), in device memory.
  void upload(Chain& ch, int M) const {
    for (int o = 0; o < nc; o++) {
      const auto st = table(ch, M, o, false);
      QF_CUDA_CHECK(cudaMemcpy(ch.dtab + static_cast<size_t>(o) * ch.ns, st.data(), st.size() * sizeof(cuda::Q4cStage),
                               cudaMemcpyHostToDevice));
    }
  }

  // (a): per stage one x-preparation launch and one version-22 GEMV launch, plain or PDL.
  static void run_a(const std::vector<cuda::Q4cStage>& st, int M, bool pdl) {
    cudaLaunchConfig_t cfg;
    cudaLaunchAttribute attr[1];
    for (const cuda::Q4cStage& P : st) {
      qc_launch_cfg(cfg, attr, pdl, (M * P.ng + 7) / 8);
      QF_CUDA_CHECK(cudaLaunchKernelEx(&cfg, cuda::q4c_prep_kernel, P, M));
      qc_launch_cfg(cfg, attr, pdl, P.units);
      if (M <= 8)
        QF_CUDA_CHECK(cudaLaunchKernelEx(&cfg, cuda::q4c_gemv_kernel<1>, P, M));
      else
        QF_CUDA_CHECK(cudaLaunchKernelEx(&cfg, cuda::q4c_gemv_kernel<2>, P, M));
    }
  }

  int persist_grid(int M) const { return M <= 8 ? grid1 : grid2; }

  // (a) with PDL captured into one CUDA graph per rotation offset (how production replays a step).
  std::vector<cudaGraphExec_t> graphs(const Chain& ch, int M) const {
    std::vector<cudaGraphExec_t> ex;
    for (int off = 0; off < nc; off++) {
      const auto st = table(ch, M, off, false);
      cudaGraph_t gr = nullptr;
      QF_CUDA_CHECK(cudaStreamBeginCapture(g_st, cudaStreamCaptureModeThreadLocal));
      run_a(st, M, true);
      QF_CUDA_CHECK(cudaStreamEndCapture(g_st, &gr));
      cudaGraphExec_t e = nullptr;
      QF_CUDA_CHECK(cudaGraphInstantiate(&e, gr, 0));
      QF_CUDA_CHECK(cudaGraphDestroy(gr));
      ex.push_back(e);
    }
    return ex;
  }

  // (b): the whole chain in one persistent launch (tables uploaded for this M).
  void run_b(Chain& ch, int M, int off, int mode, const ChainOpts& o, int total) const {
    cuda::Q4cPersist K{};
    K.st = ch.dtab + static_cast<size_t>(off % nc) * ch.ns;
    K.ns = ch.ns;
    K.M = M;
    K.total = total;
    const int par = ch.launches++ & 1;
    K.cnt = ch.cnt + static_cast<size_t>(par) * ch.ncnt;
    K.cnt_zero = ch.cnt + static_cast<size_t>(1 - par) * ch.ncnt;
    K.ncnt = ch.ncnt;
    K.err = ch.err;
    K.timeout_ns = o.timeout_ms * 1000000LL;
    K.mode = mode;
    K.pf = o.pf;
    if (M <= 8)
      cuda::q4c_persist_kernel<1><<<grid1, 256, 0, g_st>>>(K);
    else
      cuda::q4c_persist_kernel<2><<<grid2, 256, 0, g_st>>>(K);
    QF_CUDA_CHECK(cudaGetLastError());
  }

  // Watchdog record of the persistent kernel; resets the counters after an abort.
  static std::string err_of(Chain& ch) {
    int e[2] = {0, 0};
    QF_CUDA_CHECK(cudaStreamSynchronize(g_st));
    QF_CUDA_CHECK(cudaMemcpy(e, ch.err, sizeof(e), cudaMemcpyDeviceToHost));
    if (!e[0] && !e[1]) return "";
    QF_CUDA_CHECK(cudaMemset(ch.err, 0, sizeof(e)));
    QF_CUDA_CHECK(cudaMemset(ch.cnt, 0, static_cast<size_t>(2) * ch.ncnt * 4));
    return cuda::fmt_str("watchdog: stage %d unit %d waited past the timeout (abort flag %d)", e[0] ? (e[0] - 1) / 65536 : -1,
                         e[0] ? (e[0] - 1) % 65536 : -1, e[1]);
  }

  std::vector<std::vector<std::vector<float>>> outputs(const Chain& ch, int M) const {
    std::vector<std::vector<std::vector<float>>> r(ch.ns);
    for (int s = 0; s < ch.ns; s++)
      for (size_t i = 0; i < cases[ch.shape[s]].rows.size(); i++)
        r[s].push_back(download(ch.y[s][i], static_cast<size_t>(M) * cases[ch.shape[s]].rows[i]));
    return r;
  }
  void poison_all(const Chain& ch, int M) const {
    for (int s = 0; s < ch.ns; s++)
      for (size_t i = 0; i < cases[ch.shape[s]].rows.size(); i++)
        poison(ch.y[s][i], static_cast<size_t>(M) * cases[ch.shape[s]].rows[i] * 4);
  }

  // Every check of one chain at M; empty when all pass.
  std::string check(Chain& ch, int M, const ChainOpts& o, int total) const {
    // (a) plain, with the x values written out: the reference bits.
    const auto st = table(ch, M, 0, true);
    poison_all(ch, M);
    run_a(st, M, false);
    const auto ya = outputs(ch, M);
    std::vector<std::vector<float>> xs(ch.ns);
    for (int s = 0; s < ch.ns; s++) xs[s] = download(ch.xout[s], static_cast<size_t>(M) * cases[ch.shape[s]].cols);
    // CPU on the first and last layer (every weight of their stages); every element written.
    for (int s = 0; s < ch.ns; s++) {
      const Case& c = cases[ch.shape[s]];
      const bool cpu = ch.layer[s] == 0 || ch.layer[s] == ch.nlayers - 1;
      for (size_t i = 0; i < c.rows.size(); i++) {
        std::string e;
        if (cpu) {
          e = check_against(ya[s][i], c.rows[i], cpu_ref_q4(loaded[ch.shape[s]].mats[i].w[(0 + ch.layer[s]) % nc], xs[s], M), 1e-5);
        } else {
          for (size_t k = 0; k < ya[s][i].size() && e.empty(); k++)
            if (!std::isfinite(ya[s][i][k])) e = cuda::fmt_str("element %zu not written or not finite", k);
        }
        if (!e.empty()) return cuda::fmt_str("(a) stage %d (%s, layer %d) weight %zu vs CPU: ", s, c.name.c_str(), ch.layer[s], i) + e;
      }
    }
    // Version 22 itself (q4ix_run: its prep and GEMV launches) on the same x: the same bits.
    {
      std::vector<float*> tmp(4);
      for (int s = 0; s < ch.ns; s++) {
        const Case& c = cases[ch.shape[s]];
        const int n = static_cast<int>(c.rows.size());
        for (int i = 0; i < n; i++) tmp[i] = static_cast<float*>(dmalloc(static_cast<size_t>(M) * c.rows[i] * 4));
        std::vector<const WeightRef*> ws;
        for (int i = 0; i < n; i++) ws.push_back(&loaded[ch.shape[s]].ixt[i][ch.layer[s] % nc]);
        ensure_ix_scratch(c.cols);
        cuda::q4ix_run(ws.data(), tmp.data(), n, ch.xout[s], static_cast<int>(c.cols), M, g_st, static_cast<uint8_t*>(g_ix.a),
                       static_cast<float*>(g_ix.b), true, true, true);
        QF_CUDA_CHECK(cudaGetLastError());
        std::string e;
        for (int i = 0; i < n; i++) {
          const auto v = download(tmp[i], static_cast<size_t>(M) * c.rows[i]);
          if (e.empty() && std::memcmp(v.data(), ya[s][i].data(), v.size() * 4))
            e = cuda::fmt_str("stage %d (%s) weight %d: chain (a) bits differ from version 22 (q4ix_run)", s, c.name.c_str(), i);
          cudaFree(tmp[i]);
        }
        if (!e.empty()) return e;
      }
    }
    auto same = [&](const char* what) -> std::string {
      const auto yb = outputs(ch, M);
      for (int s = 0; s < ch.ns; s++)
        for (size_t i = 0; i < yb[s].size(); i++)
          if (std::memcmp(yb[s][i].data(), ya[s][i].data(), yb[s][i].size() * 4))
            return cuda::fmt_str("%s: stage %d (%s, layer %d) weight %zu differs from (a) bit for bit", what, s,
                                 cases[ch.shape[s]].name.c_str(), ch.layer[s], i);
      return "";
    };
    poison_all(ch, M);
    run_a(table(ch, M, 0, false), M, true);
    std::string e = same("(a) pdl");
    if (!e.empty()) return e;
    {
      const auto ex = graphs(ch, M);
      poison_all(ch, M);
      QF_CUDA_CHECK(cudaGraphLaunch(ex[0], g_st));
      for (auto x : ex) cudaGraphExecDestroy(x);
      e = same("(a) graph");
      if (!e.empty()) return e;
    }
    for (int v = kB; v < kChainVariants; v++)
      for (int rep = 0; rep < 2; rep++) {  // twice: both counter sets
        poison_all(ch, M);
        run_b(ch, M, 0, kChainMode[v], o, total);
        e = err_of(ch);
        if (e.empty()) e = same(cuda::fmt_str("%s launch %d", kChainNames[v], rep).c_str());
        if (!e.empty()) return e;
      }
    return "";
  }
};

// --chain SPEC: comma-separated KIND:LAYERS (KIND gdn | attn | mix; mix = gdn, gdn, gdn, attn, ...).
bool parse_chains(const std::string& spec, ChainOpts& o) {
  size_t p = 0;
  while (p < spec.size()) {
    size_t q = spec.find(',', p);
    if (q == std::string::npos) q = spec.size();
    const std::string item = spec.substr(p, q - p);
    const size_t c = item.find(':');
    const std::string kind = item.substr(0, c);
    const int layers = c == std::string::npos ? 1 : std::atoi(item.c_str() + c + 1);
    if ((kind != "gdn" && kind != "attn" && kind != "mix") || layers < 1 || layers > 16) return false;
    o.chains.emplace_back(kind, layers);
    p = q + 1;
  }
  return !o.chains.empty();
}


int run_chain_mode(const ChainOpts& o, const std::vector<int>& Ms, const Ceil& ce) {
  const size_t nx = static_cast<size_t>(16) * 5120;
  float* dx = static_cast<float*>(dmalloc(nx * 4));
  cuda::fill_random(dx, nx, DType::F32, 77, 1.0f, g_st);
  std::vector<Chain> chains;
  for (const auto& [kind, layers] : o.chains) chains.push_back(ChainLab::make(kind, layers));
  ChainLab lab(chains);
  lab.x0 = dx;
  for (Chain& ch : chains) lab.alloc(ch);
  std::printf("chain mode: %d weight copies a matrix (layer l of rotation o uses copy (o + l) %% %d); persistent grid "
              "%d blocks at M <= 8, %d at M 9..16 (%d SMs); watchdog %lld ms; b_pf prefetches %d groups a warp\n",
              lab.nc, lab.nc, lab.persist_grid(1), lab.persist_grid(9), lab.sms, o.timeout_ms, o.pf);
  for (const Chain& ch : chains) {
    const auto st = lab.table(ch, 1, 0, false);
    std::string sp;
    for (int s = 0; s < std::min(ch.ns, 4); s++)
      sp += cuda::fmt_str("%s%s: S %d, %d units", s ? "; " : "", lab.cases[ch.shape[s]].name.c_str(), st[s].S, st[s].units);
    std::printf("chain %-10s %2d stages, %.1f MB of weights a call; layer 0: %s\n", ch.name.c_str(), ch.ns, ch.bytes / 1e6,
                sp.c_str());
  }
  bool failed = false;
  std::vector<std::string> summary;  // the step lines, printed again last (session.sh shows a log's last lines)
  // per M, kind -> per-layer us of each variant from the chain with the most layers of that kind
  for (int M : Ms) {
    std::printf("\n%-12s %3s %-7s %10s %9s %7s %6s %8s %9s\n", "chain", "M", "variant", "us/chain", "us/layer", "GB/s",
                "%copy", "vs graph", "us/stage");
    double best_layer[3][kChainVariants] = {};  // gdn, attn, mix: per-layer us
    int best_layers[3] = {0, 0, 0};
    for (Chain& ch : chains) {
      lab.upload(ch, M);
      int total = 0;
      {
        const auto st = lab.table(ch, M, 0, false);
        total = st.back().base + st.back().pre + st.back().units;
      }
      const std::string err = lab.check(ch, M, o, total);
      if (!err.empty()) {
        failed = true;
        std::printf("FAIL chain %s M = %d: %s\n", ch.name.c_str(), M, err.c_str());
        continue;
      }
      std::printf("checked chain %s M = %d: (a) vs CPU (layers 0 and %d), (a) == version 22 bits (%d stages), "
                  "a_pdl, a_graph and the 6 persistent variants == (a) bit for bit\n",
                  ch.name.c_str(), M, ch.nlayers - 1, ch.ns);
      std::vector<std::vector<cuda::Q4cStage>> tabs;
      for (int off = 0; off < lab.nc; off++) tabs.push_back(lab.table(ch, M, off, false));
      const auto ex = lab.graphs(ch, M);
      double us[kChainVariants];
      for (int v = 0; v < kChainVariants; v++) {
        us[v] = median_us([&](int i) {
          if (v < 2)
            ChainLab::run_a(tabs[i % lab.nc], M, v == 1);
          else if (v == 2)
            QF_CUDA_CHECK(cudaGraphLaunch(ex[i % lab.nc], g_st));
          else
            lab.run_b(ch, M, i, kChainMode[v], o, total);
        });
        if (v >= kB) {
          const std::string e = ChainLab::err_of(ch);
          if (!e.empty()) {
            failed = true;
            std::printf("FAIL chain %s M = %d %s (timed): %s\n", ch.name.c_str(), M, kChainNames[v], e.c_str());
          }
        }
      }
      for (auto x : ex) cudaGraphExecDestroy(x);
      for (int v = 0; v < kChainVariants; v++) {
        const double gbs = ch.bytes / (us[v] * 1e-6) / 1e9;
        std::printf("%-12s %3d %-7s %10.1f %9.1f %7.0f %5.1f%% %8.3f %9.2f\n", ch.name.c_str(), M, kChainNames[v], us[v],
                    us[v] / ch.nlayers, gbs, 100.0 * gbs / ce.copy_gbs, us[2] / us[v], us[v] / ch.ns);
      }
      const double bb = *std::min_element(us + kB, us + kChainVariants);
      std::printf("%-12s %3d saving  best b vs a_graph %.1f us a chain = %.2f us a stage (vs a_pdl %.2f, vs a %.2f us a "
                  "stage)\n",
                  ch.name.c_str(), M, us[2] - bb, (us[2] - bb) / ch.ns, (us[1] - bb) / ch.ns, (us[0] - bb) / ch.ns);
      const int kind = ch.name.rfind("gdn", 0) == 0 ? 0 : ch.name.rfind("attn", 0) == 0 ? 1 : 2;
      if (ch.nlayers >= best_layers[kind]) {
        best_layers[kind] = ch.nlayers;
        for (int v = 0; v < kChainVariants; v++) best_layer[kind][v] = us[v] / ch.nlayers;
      }
    }
    // The 27B step's int4 layer GEMVs: 48 GDN + 16 attention layers (lm_head and the rest not counted).
    double step[kChainVariants];
    bool have = false;
    if (best_layers[0] && best_layers[1]) {
      for (int v = 0; v < kChainVariants; v++) step[v] = 48 * best_layer[0][v] + 16 * best_layer[1][v];
      have = true;
    } else if (best_layers[2]) {
      for (int v = 0; v < kChainVariants; v++) step[v] = 64 * best_layer[2][v];
      have = true;
    }
    if (have) {
      int vb = kB;
      for (int v = kB; v < kChainVariants; v++)
        if (step[v] < step[vb]) vb = v;
      std::string all;
      for (int v = 0; v < kChainVariants; v++) all += cuda::fmt_str("%s%s %.3f", v ? ", " : "", kChainNames[v], step[v] / 1e3);
      summary.push_back(cuda::fmt_str(
          "step M = %d: 64 layers' GEMVs in ms (48 gdn + 16 attn, per-layer times of the longest chains): %s; "
          "best persistent (%s) saves %.3f ms a decode step against a_graph (%.3f against a_pdl)",
          M, all.c_str(), kChainNames[vb], (step[2] - step[vb]) / 1e3, (step[1] - step[vb]) / 1e3));
      std::printf("%s\n", summary.back().c_str());
    }
  }
  for (Chain& ch : chains) ChainLab::release(ch);
  cudaFree(dx);
  std::printf("\n");
  for (const std::string& l : summary) std::printf("%s\n", l.c_str());
  std::printf("%s\n", failed ? "lab: a chain FAILED its checks" : "lab: every chain passed its checks");
  return failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  LabArgs args;
  args.Ms = {1, 2, 8, 16};
  // Chain mode's own options (lab_gemv_q4_chain.cuh); the rest goes to the labs' common parser.
  ChainOpts copts;
  bool chain = false, have_m = false;
  std::vector<char*> rest = {argv[0]};
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    if (a == "--chain" && i + 1 < argc) {
      chain = true;
      if (!parse_chains(argv[++i], copts)) {
        std::fprintf(stderr, "%s: --chain KIND:LAYERS[,...] with KIND gdn | attn | mix and 1..16 layers\n", argv[0]);
        return 2;
      }
    } else if (a == "--pf" && i + 1 < argc) {
      copts.pf = std::max(0, std::atoi(argv[++i]));
    } else if (a == "--timeout-ms" && i + 1 < argc) {
      copts.timeout_ms = std::max(1, std::atoi(argv[++i]));
    } else {
      if (a == "--M") have_m = true;
      rest.push_back(argv[i]);
    }
  }
  if (!parse_lab_args(static_cast<int>(rest.size()), rest.data(), kVersions, 16, false, args)) return 2;
  if (chain) {
    if (!args.versions.empty()) {
      std::fprintf(stderr, "%s: --chain times its own variants (a, a_pdl, a_graph, b, b_late, b_pf); give no versions\n", argv[0]);
      return 2;
    }
    try {
      Ceil ce;
      if (!bench_init("qflash_lab_gemv_q4", &ce)) return 1;
      return run_chain_mode(copts, have_m ? args.Ms : std::vector<int>{1, 8}, ce);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "qflash_lab_gemv_q4: %s\n", e.what());
      return 1;
    }
  }
  const bool quick = args.quick;
  std::vector<int> versions = args.versions, Ms = args.Ms;
  if (versions.empty())
    for (int v = 1; v <= kVersions; v++) versions.push_back(v);
  try {
    Ceil ce;
    if (!bench_init("qflash_lab_gemv_q4", &ce)) return 1;
    // Checked only (ragged tiles, one warp, a group with a short member); then the 27B shapes,
    // as the model groups them (gate|up, GDN qkv|z|a|b, attention q|k|v), checked and timed.
    std::vector<Case> cases = {{"37x256", {37}, 256}, {"4100x128", {4100}, 128}, {"group 640+33+96 x 1024", {640, 33, 96}, 1024}};
    const size_t n_small = cases.size();
    std::vector<Case> timed = timed_cases();
    if (quick) timed = {timed[0], timed[1], timed[4]};
    cases.insert(cases.end(), timed.begin(), timed.end());
    int64_t maxcols = 0, maxrows = 0;
    for (const Case& c : cases) {
      maxcols = std::max(maxcols, c.cols);
      for (int64_t r : c.rows) maxrows = std::max(maxrows, r);
    }
    std::vector<float> hx(static_cast<size_t>(16) * maxcols);
    {
      float* dxr = static_cast<float*>(dmalloc(hx.size() * 4));
      cuda::fill_random(dxr, hx.size(), DType::F32, 77, 1.0f, g_st);
      hx = download(dxr, hx.size());
      cudaFree(dxr);
    }
    float* dx = static_cast<float*>(dmalloc(hx.size() * 4));
    float* dy[4];
    for (float*& p : dy) p = static_cast<float*>(dmalloc(static_cast<size_t>(16) * maxrows * 4));
    bool failed = false;
    std::printf("%-28s %3s %-7s %10s %7s %6s %8s\n", "matmul (int4 g64, tiled)", "M", "version", "time_us", "GB/s", "%copy",
                "vs prod");
    for (size_t ci = 0; ci < cases.size(); ci++) {
      const Case& c = cases[ci];
      Loaded l = load(c);
      std::vector<float> xc(static_cast<size_t>(16) * c.cols);
      for (int m = 0; m < 16; m++)
        std::memcpy(xc.data() + static_cast<size_t>(m) * c.cols, hx.data() + static_cast<size_t>(m) * maxcols, c.cols * 4);
      QF_CUDA_CHECK(cudaMemcpy(dx, xc.data(), xc.size() * 4, cudaMemcpyHostToDevice));
      std::vector<CpuRef> refs;
      for (const Mat& m : l.mats) refs.push_back(cpu_ref_q4(m.w[0], xc, 16));
      std::vector<int> ok;
      for (int v : versions) {
        if (diagnostic(v)) {
          ok.push_back(v);
          continue;
        }
        const std::string err = check(v, c, l, dx, refs);
        if (err.empty()) {
          ok.push_back(v);
        } else {
          failed = true;
          std::printf("FAIL %s %s: %s\n", kNames[v], c.name.c_str(), err.c_str());
        }
      }
      std::printf("checked %-26s %zu of %zu versions pass (diagnostics not checked)\n", c.name.c_str(), ok.size(),
                  versions.size());
      if (ci < n_small) {
        for (Mat& m : l.mats) free_mat(m);
        continue;
      }
      size_t bytes = 0;
      for (size_t i = 0; i < c.rows.size(); i++) bytes += cuda::gemv_tc_q4_bytes(c.rows[i], c.cols, 64);
      const int nb = static_cast<int>(l.tiled[0].size());
      for (int M : Ms) {
        double t_prod = 0;
        for (int v : ok) {
          const double us = median_us([&](int i) {
            const auto ws = group(l, i % nb, v);
            run_version(v, ws.data(), dy, static_cast<int>(c.rows.size()), dx, static_cast<int>(c.cols), M);
          });
          if (v == 1) t_prod = us;
          const double gbs = bytes / (us * 1e-6) / 1e9;
          std::printf("%-28s %3d %-7s %10.1f %7.0f %5.1f%% %8s\n", c.name.c_str(), M, kNames[v], us, gbs,
                      100.0 * gbs / ce.copy_gbs, t_prod > 0 ? cuda::fmt_str("%.3f", t_prod / us).c_str() : "-");
        }
      }
      for (Mat& m : l.mats) free_mat(m);
    }
    cudaFree(dx);
    for (float* p : dy) cudaFree(p);
    std::printf("%s\n", failed ? "lab: a version FAILED its checks" : "lab: every checked version passed its checks");
    return failed ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "qflash_lab_gemv_q4: %s\n", e.what());
    return 1;
  }
}
