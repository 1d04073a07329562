// Kernel lab: the tensor-core GEMV (src/backend/cuda/gemv_tc_impl.cuh). Every version is checked
// before it is timed: against a double-precision CPU reference (rows sampled on the big shapes,
// every output element must be written), and for row-invariance (each row of an M = 1 call has
// the bits of the same row in the M = 16 call), in the row-major and the tiled layout. Then it
// is timed with CUDA events over weights rotated past the L2 (GB/s of weight bytes).
//   qflash_lab_gemv_tc [VERSION ...] [--quick] [--sweep] [--reps N] [--M 1,8,16]
// Versions (docs/experiments/cuda_kernels.md has the measurements):
//   1 slices       the production entry point, gemv_tc_group: column slices, ks from the shape
//   2 skr          stream-K with register loads (rejected: slower decode in the model)
//   3 hyb          skr where the slice grid's last wave is ragged and ranges are long, else slices
//                  (rejected with skr)
//   4-7 ks1..ks8   column slices with the split forced to 1, 2, 4, 8, no cross-block split (ks8 is
//                  the schedule of 1280x5120 and 256x5120 before the cross-block split)
// --sweep: fixed cost per launch of back-to-back M = 1 calls over 10 MB .. 1.3 GB, each version in
// both layouts, against a plain streaming read. Exit status 1 when a version fails a check.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/gemv_tc_impl.cuh"
#include "bench_util.cuh"

namespace qf::cuda {

namespace {

constexpr int kSkSlotFloats = 2 * 2 * 4 * 32;  // one piece of one 32-row tile, up to 16 tokens

// ---- stream-K schedule ----------------------------------------------------------------------
// The work is the list of (tile, chunk) items in tile-major order, N = tiles * nchunks, split into
// W equal contiguous ranges, one per warp: warp w takes items [floor(w N / W), floor((w+1) N / W)).
// Every warp streams the same number of bytes (+-1 chunk) whatever the shape, so no SM waits on a
// last partial wave. W depends on the shape and the device only (never on M), so the pieces a tile
// is cut into, and with them the reduction order, are the same for every M: row-invariant.
//
// The loads and the arithmetic are the column-slice kernel's (gemv_skr_kernel below). A cp.async
// shared-memory pipeline (3-6 stages per warp) was tried and streamed at half the speed; see
// docs/experiments/cuda_kernels.md.
//
// A tile that one warp covers completely is written to y directly. A tile cut into pieces: each
// piece's sum goes to a scratch slot (slot 0 = the warp's first tile, 1 = its last), then a fence
// and a per-tile counter; the warp that arrives last adds the pieces in piece order (a fixed
// order, whoever arrives last), writes y and resets the counter for the next launch.
struct SkParams {
  const uint16_t* w[kTcMaxSeg];
  float* y[kTcMaxSeg];
  int rows[kTcMaxSeg];
  int tile0[kTcMaxSeg + 1];
  int nseg;
  const float* x;
  int cols, x_ld, M, nch;
  long long N;  // items
  int W;        // warps sharing the items
  float* part;  // [W][2][kSkSlotFloats]
  int* cnt;     // [tiles], zero between launches
};

__device__ __forceinline__ int sk_warp_of(long long i, long long N, int W) {
  return static_cast<int>(((i + 1) * W + N - 1) / N - 1);
}

template <int NT>
__device__ __forceinline__ void sk_write_y(const SkParams& P, int tile, int g, int t, const float (&v)[2][NT][4]) {
  const int seg = tc_seg_of<kTcMaxSeg>(P, tile);
  const int rows_s = P.rows[seg];
  tc_write_tile<NT>(P.y[seg], rows_s, P.M, (tile - P.tile0[seg]) * 32, g, t, v);
}

// End of a tile's piece (chunks cs..cc of tile ct): written directly when the piece is the whole
// tile, else through the scratch slot and the tile's arrival counter (the last piece adds all).
template <int NT>
__device__ __forceinline__ void sk_flush(const SkParams& P, int ct, int cs, int cc, int first_tile, int gw, int g,
                                         int t, int lane, const float (&acc)[2][NT][4]) {
  const int nch = P.nch;
  if (cs == 0 && cc == nch - 1) {
    sk_write_y<NT>(P, ct, g, t, acc);
  } else {
    float* slot = P.part + (static_cast<size_t>(gw) * 2 + (ct == first_tile ? 0 : 1)) * kSkSlotFloats;
#pragma unroll
    for (int a = 0; a < 2; a++)
#pragma unroll
      for (int j = 0; j < NT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) slot[((a * NT + j) * 4 + e) * 32 + lane] = acc[a][j][e];
    __threadfence();
    __syncwarp();
    int old = 0;
    if (lane == 0) old = atomicAdd(P.cnt + ct, 1);
    old = __shfl_sync(kFull, old, 0);
    const long long tb = static_cast<long long>(ct) * nch;
    const int wlo = sk_warp_of(tb, P.N, P.W), whi = sk_warp_of(tb + nch - 1, P.N, P.W);
    if (old == whi - wlo) {  // last piece in: add the pieces in piece order
      __threadfence();
      float sum[2][NT][4];
#pragma unroll
      for (int a = 0; a < 2; a++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
          for (int e = 0; e < 4; e++) sum[a][j][e] = 0.0f;
      for (int w = wlo; w <= whi; w++) {
        const int ft = static_cast<int>(static_cast<long long>(w) * P.N / P.W / nch);
        const float* sl = P.part + (static_cast<size_t>(w) * 2 + (ct == ft ? 0 : 1)) * kSkSlotFloats;
#pragma unroll
        for (int a = 0; a < 2; a++)
#pragma unroll
          for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
              sum[a][j][e] = __fadd_rn(sum[a][j][e], __ldcg(sl + ((a * NT + j) * 4 + e) * 32 + lane));
      }
      sk_write_y<NT>(P, ct, g, t, sum);
      if (lane == 0) P.cnt[ct] = 0;
    }
  }
}

// The stream-K split with the column-slice kernel's load path: weights straight into registers
// (ld.global.nc, L2 256-byte prefetch), the next chunk in flight while this one is multiplied,
// activations read per chunk. 8 warps per block. Same pieces, same flush as gemv_sk_kernel.
constexpr int kSkrWarps = 8;
template <int NT, bool TL>
__global__ void __launch_bounds__(kSkrWarps * 32, NT == 1 ? 2 : 1) gemv_skr_kernel(const SkParams P) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int gw = blockIdx.x * kSkrWarps + warp;
  if (gw >= P.W) return;
  const int nch = P.nch;
  const long long i0 = static_cast<long long>(gw) * P.N / P.W, i1 = static_cast<long long>(gw + 1) * P.N / P.W;
  bool xv[NT];
  const float* xp[NT];
#pragma unroll
  for (int j = 0; j < NT; j++) {
    xv[j] = j * 8 + g < P.M;
    xp[j] = P.x + static_cast<size_t>(xv[j] ? j * 8 + g : 0) * P.x_ld + 16 * t;
  }
  long long ip = i0;
  int pt = static_cast<int>(i0 / nch), pc = static_cast<int>(i0 - static_cast<long long>(pt) * nch);
  const char* pw[4];
  bool pv[4];
  auto set_rows = [&](int tile) {
    const int seg = tc_seg_of<kTcMaxSeg>(P, tile);
    if constexpr (TL) {  // pw[0]: the tile's contiguous run of 4 KB chunk blocks
      pw[0] = reinterpret_cast<const char*>(P.w[seg]) +
              static_cast<size_t>(tile - P.tile0[seg]) * nch * 4096 + lane * 16;
      return;
    }
    const int nrows = P.rows[seg];
    const int row0 = (tile - P.tile0[seg]) * 32;
    const char* base = reinterpret_cast<const char*>(P.w[seg]) + 32 * t;
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const int r = row0 + 16 * (i >> 1) + g + 8 * (i & 1);
      pv[i] = r < nrows;
      pw[i] = base + static_cast<size_t>(pv[i] ? r : 0) * P.cols * 2;
    }
  };
  set_rows(pt);
  const uint4 z4 = make_uint4(0u, 0u, 0u, 0u);
  auto load_w = [&](uint4 (&dst)[8]) {
    if constexpr (TL) {
      const char* p = pw[0] + static_cast<size_t>(pc) * 4096;
#pragma unroll
      for (int v = 0; v < 8; v++) dst[v] = ld_stream16(p + 512 * v);
    } else {
      const size_t wo = static_cast<size_t>(pc) * 128;
#pragma unroll
      for (int i = 0; i < 4; i++) {
        dst[2 * i] = pv[i] ? ld_stream16(pw[i] + wo) : z4;
        dst[2 * i + 1] = pv[i] ? ld_stream16(pw[i] + wo + 16) : z4;
      }
    }
    ip++;
    if (++pc == nch) {
      pc = 0;
      pt++;
      if (ip < i1) set_rows(pt);
    }
  };
  uint4 wcur[8], wnxt[8];
  if (ip < i1) load_w(wcur);  // weights never depend on an earlier kernel
  pdl_wait();
  pdl_trigger();

  float acc[2][NT][4];
#pragma unroll
  for (int a = 0; a < 2; a++)
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) acc[a][j][e] = 0.0f;
  int ct = static_cast<int>(i0 / nch), cc = static_cast<int>(i0 - static_cast<long long>(ct) * nch), cs = cc;
  const int first_tile = ct;
  for (long long i = i0; i < i1; i++) {
    if (ip < i1) load_w(wnxt);
    tc_chunk<NT>(wcur, xp, xv, cc * 64, acc);
    if (cc == nch - 1 || i == i1 - 1) {
      sk_flush<NT>(P, ct, cs, cc, first_tile, gw, g, t, lane, acc);
#pragma unroll
      for (int a = 0; a < 2; a++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
          for (int e = 0; e < 4; e++) acc[a][j][e] = 0.0f;
    }
    if (++cc == nch) {
      cc = 0;
      cs = 0;
      ct++;
    }
#pragma unroll
    for (int v = 0; v < 8; v++) wcur[v] = wnxt[v];
  }
}

template <int NT, bool TL>
void skr_launch(const SkParams& P, cudaStream_t st) {
  launch_k(gemv_skr_kernel<NT, TL>, dim3(static_cast<unsigned>((P.W + kSkrWarps - 1) / kSkrWarps)), dim3(kSkrWarps * 32), 0,
           st, P);
}

// Stream-K scratch: per-piece partial sums and per-tile arrival counters (zero between launches).
struct SkScratch {
  float* part = nullptr;
  int* cnt = nullptr;
  int max_tiles = 0;
  int warps = 0;  // resident warps of the stream-K kernel on this device (the split's W cap)
};

void sk_scratch_create(SkScratch& s) {
  int dev = 0, sms = 0;
  QF_CUDA_CHECK(cudaGetDevice(&dev));
  QF_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  int nb = 0;
  QF_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, gemv_skr_kernel<1, false>, kSkrWarps * 32, 0));
  s.warps = (nb > 0 ? nb : 1) * kSkrWarps * sms;
  s.max_tiles = 1 << 17;
  const size_t pb = static_cast<size_t>(s.warps) * 2 * kSkSlotFloats * sizeof(float);
  const size_t cb = static_cast<size_t>(s.max_tiles) * sizeof(int);
  QF_CUDA_CHECK(cudaMalloc(&s.part, pb));
  QF_CUDA_CHECK(cudaMalloc(&s.cnt, cb));
  QF_CUDA_CHECK(cudaMemset(s.cnt, 0, cb));
  QF_CUDA_CHECK(cudaDeviceSynchronize());
}

// A stream-K warp gets at least this many chunks (a shorter range is mostly pipeline fill).
constexpr long long kSkMinItems = 8;

int64_t tiles_of(const WeightRef* const* Ws, int n) {
  int64_t tiles = 0;
  for (int i = 0; i < n; i++) tiles += (Ws[i]->rows + 31) / 32;
  return tiles;
}

void skr_run(const WeightRef* const* Ws, float* const* ys, int n, const float* x, int x_ld, int M, const SkScratch& sc,
             cudaStream_t st) {
  const int64_t tiles = tiles_of(Ws, n);
  const bool tiled = Ws[0]->layout == WeightRef::kTc32x64;
  if (tiles > sc.max_tiles) backend_fail("lab skr: %lld tiles exceed the scratch's %d", (long long)tiles, sc.max_tiles);
  SkParams P{};
  P.nseg = n;
  P.cols = static_cast<int>(Ws[0]->cols);
  P.x_ld = x_ld;
  int64_t t0 = 0;
  for (int i = 0; i < n; i++) {
    P.w[i] = static_cast<const uint16_t*>(Ws[i]->data);
    P.rows[i] = static_cast<int>(Ws[i]->rows);
    P.tile0[i] = static_cast<int>(t0);
    t0 += (Ws[i]->rows + 31) / 32;
  }
  P.tile0[n] = static_cast<int>(tiles);
  P.nch = P.cols / 64;
  P.N = static_cast<long long>(tiles) * P.nch;
  long long W = P.N / kSkMinItems;
  if (W < 1) W = 1;
  if (W > sc.warps) W = sc.warps;
  P.W = static_cast<int>(W);
  P.part = sc.part;
  P.cnt = sc.cnt;
  for (int g0 = 0; g0 < M; g0 += 16) {
    const int mg = M - g0 < 16 ? M - g0 : 16;
    P.M = mg;
    P.x = x + static_cast<size_t>(g0) * x_ld;
    for (int i = 0; i < n; i++) P.y[i] = ys[i] + static_cast<size_t>(g0) * Ws[i]->rows;
    if (mg <= 8)
      tiled ? skr_launch<1, true>(P, st) : skr_launch<1, false>(P, st);
    else
      tiled ? skr_launch<2, true>(P, st) : skr_launch<2, false>(P, st);
    QF_CUDA_LAUNCH_CHECK("gemv_skr_kernel");
  }
}

// hyb's shape-only choice: the register stream-K kernel where the column-slice grid fills its last
// wave of blocks badly (< 90%) and every stream-K warp still gets a long range (>= 16 chunks, so
// its pipeline start is amortised); column slices everywhere else.
bool hyb_takes_skr(const WeightRef* const* Ws, int n, const SkScratch& sc) {
  const int64_t tiles = tiles_of(Ws, n);
  const long long items = tiles * (Ws[0]->cols / 64);
  const int ks = gemv_tc_slices(tiles, Ws[0]->cols);
  const double waves = std::ceil(static_cast<double>(tiles) * ks / kTcWarps) / kTcConcurrentBlocks;
  const bool ragged = waves / std::ceil(waves) < 0.9;
  return tiles <= sc.max_tiles && ragged && items >= 16LL * sc.warps;
}

}  // namespace

}  // namespace qf::cuda

using namespace qf;
using namespace qf::bench;

namespace {

constexpr int kVersions = 7;
const char* const kNames[kVersions + 1] = {"?", "slices", "skr", "hyb", "ks1", "ks2", "ks4", "ks8"};
cuda::SkScratch g_sk;

void run_version(int v, const WeightRef* const* Ws, float* const* ys, int n, const float* x, int x_ld, int M) {
  switch (v) {
    case 1: cuda::gemv_tc_group(Ws, ys, n, x, x_ld, M, gemv_scratch(), g_st); return;
    case 2: cuda::skr_run(Ws, ys, n, x, x_ld, M, g_sk, g_st); return;
    case 3:
      if (cuda::hyb_takes_skr(Ws, n, g_sk)) cuda::skr_run(Ws, ys, n, x, x_ld, M, g_sk, g_st);
      else cuda::gemv_tc_group(Ws, ys, n, x, x_ld, M, gemv_scratch(), g_st);
      return;
    default:
      cuda::tc_slices_run(Ws, ys, n, x, x_ld, M, cuda::tiles_of(Ws, n), 1 << (v - 4), 1, nullptr,
                          Ws[0]->layout == WeightRef::kTc32x64, g_st, [](int) {});
  }
}

// A group of weights with the same cols (one weight for the timed shapes), row-major and tiled.
struct Case {
  std::string name;
  std::vector<int64_t> rows;
  int64_t cols;
};

struct Loaded {
  std::vector<Mat> mats;
  std::vector<std::vector<WeightRef>> tiled;
};

Loaded load(const Case& c) {
  Loaded l;
  for (int64_t r : c.rows) {
    l.mats.push_back(make_mat(DType::BF16, r, c.cols));
    l.tiled.push_back(tiled_copies(l.mats.back()));
  }
  QF_CUDA_CHECK(cudaStreamSynchronize(g_st));
  return l;
}

// Weight i of copy k, in either layout.
std::vector<const WeightRef*> group(const Loaded& l, int k, bool tiled) {
  std::vector<const WeightRef*> p;
  for (size_t i = 0; i < l.mats.size(); i++) {
    const auto& v = tiled ? l.tiled[i] : l.mats[i].w;
    p.push_back(&v[k % v.size()]);
  }
  return p;
}

// Checks version v on the case: M = 16 against the CPU in both layouts, the tiled bits equal to
// the row-major bits, and rows of M = 1 and M = 9 calls equal to the same rows of the M = 16 call.
std::string check(int v, const Case& c, const Loaded& l, const float* dx, const std::vector<CpuRef>& refs) {
  const int n = static_cast<int>(c.rows.size()), cols = static_cast<int>(c.cols);
  std::vector<float*> ys(n);
  for (int i = 0; i < n; i++) ys[i] = static_cast<float*>(dmalloc(static_cast<size_t>(16) * c.rows[i] * 4));
  auto call = [&](bool tiled, int M, int off) {
    const auto ws = group(l, 0, tiled);
    return poisoned_call(ys, c.rows, M, [&] { run_version(v, ws.data(), ys.data(), n, dx + static_cast<size_t>(off) * cols, cols, M); });
  };
  std::string err;
  std::vector<std::vector<float>> full[2];
  for (int t = 0; t < 2 && err.empty(); t++) {
    full[t] = call(t == 1, 16, 0);
    for (int i = 0; i < n && err.empty(); i++) {
      err = check_against(full[t][i], c.rows[i], refs[i], 1e-5);
      if (!err.empty()) err = cuda::fmt_str("%s, weight %d vs CPU: ", t ? "tiled" : "row-major", i) + err;
      if (err.empty() && t == 1 && std::memcmp(full[1][i].data(), full[0][i].data(), full[0][i].size() * 4) != 0)
        err = cuda::fmt_str("tiled, weight %d: bits differ from row-major", i);
    }
    const int probes[][2] = {{1, 0}, {1, 5}, {1, 8}, {1, 15}, {9, 7}};  // {M, first row}
    for (const auto& pr : probes) {
      if (!err.empty()) break;
      const auto part = call(t == 1, pr[0], pr[1]);
      for (int i = 0; i < n && err.empty(); i++)
        if (std::memcmp(part[i].data(), full[t][i].data() + static_cast<size_t>(pr[1]) * c.rows[i], part[i].size() * 4))
          err = cuda::fmt_str("%s, weight %d: rows %d..%d of an M = %d call differ from the M = 16 call (row-invariance)",
                              t ? "tiled" : "row-major", i, pr[1], pr[1] + pr[0] - 1, pr[0]);
    }
  }
  for (float* y : ys) cudaFree(y);
  return err;
}

}  // namespace

int main(int argc, char** argv) {
  LabArgs args;
  args.Ms = {1, 8, 16};
  if (!parse_lab_args(argc, argv, kVersions, 64, true, args)) return 2;
  const bool quick = args.quick, sweep = args.sweep;
  std::vector<int> versions = args.versions, Ms = args.Ms;
  if (versions.empty()) {
    if (sweep) versions = {1, 2};
    else
      for (int v = 1; v <= kVersions; v++) versions.push_back(v);
  }
  try {
    Ceil ce;
    if (!bench_init("qflash_lab_gemv_tc", &ce)) return 1;
    cuda::sk_scratch_create(g_sk);

    if (sweep) {
      unsigned* sink = static_cast<unsigned*>(dmalloc(4));
      float* x = static_cast<float*>(dmalloc(size_t(16) * 32768 * 4));
      float* y = static_cast<float*>(dmalloc(size_t(16) * 262144 * 4));
      cuda::fill_random(x, size_t(16) * 32768, DType::F32, 99, 1.0f, g_st);
      std::printf("%-14s %8s %9s %9s", "sweep rows x cols", "MB", "read_us", "read_GB/s");
      for (int v : versions) std::printf(" %9s_us %6s %9s_us %6s", kNames[v], "GB/s", (std::string("t-") + kNames[v]).c_str(), "GB/s");
      std::printf("\n");
      std::vector<double> xs, tr;
      std::vector<std::vector<double>> tg(2 * versions.size());
      for (const Sz& z : sweep_sizes()) {
        Mat m = make_mat(DType::BF16, z.rows, z.cols);
        std::vector<WeightRef> tw = tiled_copies(m);
        const int nb = static_cast<int>(m.w.size());
        const double r = b2b_us([&](int i) { read_launch(m.w[i % nb].data, m.bytes, sink); });
        std::printf("%6lldx%-7lld %8.1f %9.2f %9.0f", (long long)z.rows, (long long)z.cols, m.bytes / 1e6, r,
                    m.bytes / (r * 1e-6) / 1e9);
        xs.push_back(static_cast<double>(m.bytes));
        tr.push_back(r);
        for (size_t k = 0; k < versions.size(); k++)
          for (int t = 0; t < 2; t++) {
            const double us = b2b_us([&](int i) {
              const WeightRef* w = t ? &tw[i % nb] : &m.w[i % nb];
              run_version(versions[k], &w, &y, 1, x, static_cast<int>(z.cols), 1);
            });
            tg[2 * k + t].push_back(us);
            std::printf(" %12.2f %6.0f", us, m.bytes / (us * 1e-6) / 1e9);
          }
        std::printf("\n");
        free_mat(m);
      }
      print_fit(xs, tr, "read");
      for (size_t k = 0; k < versions.size(); k++) {
        print_fit(xs, tg[2 * k], kNames[versions[k]]);
        print_fit(xs, tg[2 * k + 1], (std::string("tiled ") + kNames[versions[k]]).c_str());
      }
      cudaFree(sink);
      cudaFree(x);
      cudaFree(y);
      QF_CUDA_CHECK(cudaStreamSynchronize(g_st));
      return 0;
    }

    // Checked only (small, odd shapes: ragged tiles, one warp, a group); then checked and timed.
    std::vector<Case> cases = {{"37x256", {37}, 256},       {"4100x128", {4100}, 128}, {"5x64", {5}, 64},
                               {"group 640+33+96 x 1024", {640, 33, 96}, 1024}, {"72x192", {72}, 192}};
    const size_t n_small = cases.size();
    std::vector<Case> timed = {{"mlp gate|up 34816x5120", {34816}, 5120}, {"gdn in 16480x5120", {16480}, 5120},
                               {"mlp up/gate 17408x5120", {17408}, 5120}, {"mlp down 5120x17408", {5120}, 17408},
                               {"lm_head 248320x5120", {248320}, 5120},   {"gdn qkv 10240x5120", {10240}, 5120},
                               {"attn o 5120x6144", {5120}, 6144},        {"kv proj 1024x5120", {1024}, 5120},
                               {"dflash2 conv 1280x5120", {1280}, 5120},  {"selector 256x5120", {256}, 5120}};
    if (quick) timed = {timed[0], timed[3], timed[6], timed[7], timed[8], timed[9]};
    cases.insert(cases.end(), timed.begin(), timed.end());
    int maxM = 16;
    for (int M : Ms) maxM = std::max(maxM, M);
    int64_t maxcols = 0, maxrows = 0;
    for (const Case& c : cases) {
      maxcols = std::max(maxcols, c.cols);
      for (int64_t r : c.rows) maxrows = std::max(maxrows, r);
    }
    std::vector<float> hx(static_cast<size_t>(maxM) * maxcols);
    {
      float* dxr = static_cast<float*>(dmalloc(hx.size() * 4));
      cuda::fill_random(dxr, hx.size(), DType::F32, 77, 1.0f, g_st);
      hx = download(dxr, hx.size());
      cudaFree(dxr);
    }
    float* dx = static_cast<float*>(dmalloc(hx.size() * 4));
    float* dy = static_cast<float*>(dmalloc(static_cast<size_t>(maxM) * maxrows * 4));
    bool failed = false;
    std::printf("%-24s %3s %-7s %10s %7s %6s   %10s %7s %6s\n", "matmul", "M", "version", "row_us", "GB/s", "%copy",
                "tiled_us", "GB/s", "%copy");
    for (size_t ci = 0; ci < cases.size(); ci++) {
      const Case& c = cases[ci];
      Loaded l = load(c);
      // x as rows of this case's width (the first cols of each of the host rows' values)
      std::vector<float> xc(static_cast<size_t>(maxM) * c.cols);
      for (int m = 0; m < maxM; m++)
        std::memcpy(xc.data() + static_cast<size_t>(m) * c.cols, hx.data() + static_cast<size_t>(m) * maxcols, c.cols * 4);
      QF_CUDA_CHECK(cudaMemcpy(dx, xc.data(), xc.size() * 4, cudaMemcpyHostToDevice));
      std::vector<CpuRef> refs;
      for (const Mat& m : l.mats) refs.push_back(cpu_ref(m.w[0], xc, 16));
      std::vector<int> ok;
      for (int v : versions) {
        const std::string err = check(v, c, l, dx, refs);
        if (err.empty()) {
          ok.push_back(v);
        } else {
          failed = true;
          std::printf("FAIL %s %s: %s\n", kNames[v], c.name.c_str(), err.c_str());
        }
      }
      std::printf("checked %-22s %zu of %zu versions pass\n", c.name.c_str(), ok.size(), versions.size());
      if (ci >= n_small) {
        const Mat& m = l.mats[0];
        const int nb = static_cast<int>(m.w.size());
        for (int M : Ms)
          for (int v : ok) {
            double us[2];
            for (int t = 0; t < 2; t++)
              us[t] = median_us([&](int i) {
                const auto ws = group(l, i % nb, t == 1);
                run_version(v, ws.data(), &dy, 1, dx, static_cast<int>(c.cols), M);
              });
            const double g0 = m.bytes / (us[0] * 1e-6) / 1e9, g1 = m.bytes / (us[1] * 1e-6) / 1e9;
            std::printf("%-24s %3d %-7s %10.1f %7.0f %5.1f%%   %10.1f %7.0f %5.1f%%\n", c.name.c_str(), M, kNames[v],
                        us[0], g0, 100.0 * g0 / ce.copy_gbs, us[1], g1, 100.0 * g1 / ce.copy_gbs);
          }
      }
      for (Mat& m : l.mats) free_mat(m);
    }
    cudaFree(dx);
    cudaFree(dy);
    std::printf("%s\n", failed ? "lab: a version FAILED its checks" : "lab: every version passed its checks");
    return failed ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "qflash_lab_gemv_tc: %s\n", e.what());
    return 1;
  }
}
