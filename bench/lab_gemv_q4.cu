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

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/gemv_tc_q4_impl.cuh"
#include "bench_util.cuh"
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
// w[r, c] = q[r, c] * scale[r, c / G] + bias[r, c / G] (bf16 scale and bias), y = sum_c w x.
CpuRef cpu_ref_q4(const WeightRef& W, const std::vector<float>& x, int M) {
  QF_CUDA_CHECK(cudaStreamSynchronize(g_st));
  CpuRef r;
  r.rows = check_rows(W.rows);
  r.M = M;
  const int64_t ng = W.cols / W.group;
  std::vector<uint32_t> q(static_cast<size_t>(W.cols / 8));
  std::vector<uint16_t> s(static_cast<size_t>(ng)), b(static_cast<size_t>(ng));
  r.y.assign(static_cast<size_t>(M) * r.rows.size(), 0.0);
  for (size_t k = 0; k < r.rows.size(); k++) {
    const int64_t row = r.rows[k];
    QF_CUDA_CHECK(cudaMemcpy(q.data(), static_cast<const uint32_t*>(W.data) + row * (W.cols / 8), q.size() * 4,
                             cudaMemcpyDeviceToHost));
    QF_CUDA_CHECK(cudaMemcpy(s.data(), static_cast<const uint16_t*>(W.scales) + row * ng, s.size() * 2, cudaMemcpyDeviceToHost));
    QF_CUDA_CHECK(cudaMemcpy(b.data(), static_cast<const uint16_t*>(W.biases) + row * ng, b.size() * 2, cudaMemcpyDeviceToHost));
    for (int m = 0; m < M; m++) {
      double acc = 0;
      for (int64_t c = 0; c < W.cols; c++) {
        const double qv = static_cast<double>((q[c / 8] >> (4 * (c % 8))) & 15u);
        const double w = qv * bf16_to_float(s[c / W.group]) + bf16_to_float(b[c / W.group]);
        acc += w * x[static_cast<size_t>(m) * W.cols + c];
      }
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

}  // namespace

int main(int argc, char** argv) {
  LabArgs args;
  args.Ms = {1, 2, 8, 16};
  if (!parse_lab_args(argc, argv, kVersions, 16, false, args)) return 2;
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
    std::vector<Case> timed = {{"mlp gate|up 2x17408x5120", {17408, 17408}, 5120},
                               {"mlp down 5120x17408", {5120}, 17408},
                               {"gdn in 10240+6144+48+48", {10240, 6144, 48, 48}, 5120},
                               {"attn q|k|v 12288+1024+1024", {12288, 1024, 1024}, 5120},
                               {"gdn out / attn o 5120x6144", {5120}, 6144},
                               {"lm_head 248320x5120", {248320}, 5120}};
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
