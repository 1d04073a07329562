// Tensor-core multi-row GEMV for bf16 weights: the production entry points (kernels.h) and the
// tiled weight layout. The kernel and its design notes: gemv_tc_impl.cuh. The schedules that lost
// (stream-K, hybrid) and the forced column splits live in the kernel lab, bench/lab_gemv_tc.cu.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "backend/cuda/gemv_tc_impl.cuh"

namespace qf::cuda {

namespace {
// One 16-byte vector of the tiled layout per thread: vector d is lane d % 32 of load (d / 32) % 8
// of chunk block d / 256 = tile * nch + chunk (see kernels.h); load v = 2i + h of lane (g, t)
// holds row tile * 32 + 16 (i / 2) + g + 8 (i % 2), columns chunk * 64 + 16 t + 8 h .. + 8, as
// gemv_tc_kernel's row-major loads do.
__global__ void tc_relayout_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst, int64_t rows, int64_t cols,
                                   int64_t nvec) {
  pdl_wait();  // no early trigger: the result is a weight (see device_common.cuh)
  const int64_t nch = cols / 64;
  for (int64_t d = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; d < nvec;
       d += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int lane = static_cast<int>(d & 31), v = static_cast<int>((d >> 5) & 7);
    const int64_t blk = d >> 8, ch = blk % nch, tile = blk / nch;
    const int i = v >> 1, h = v & 1, g = lane >> 2, t = lane & 3;
    const int64_t r = tile * 32 + 16 * (i >> 1) + g + 8 * (i & 1);
    const int64_t c = ch * 64 + 16 * t + 8 * h;
    dst[d] = r < rows ? src[(r * cols + c) / 8] : make_uint4(0u, 0u, 0u, 0u);
  }
}
}  // namespace

size_t gemv_tc_tiled_bytes(int64_t rows, int64_t cols) {
  return static_cast<size_t>((rows + 31) / 32) * 32 * static_cast<size_t>(cols) * 2;
}

void gemv_tc_relayout(const void* src, void* dst, int64_t rows, int64_t cols, cudaStream_t st) {
  if (rows <= 0 || cols <= 0 || cols % 64 != 0 || (reinterpret_cast<uintptr_t>(src) & 15) || (reinterpret_cast<uintptr_t>(dst) & 15))
    backend_fail("cuda gemv relayout: %lld x %lld (cols must be a multiple of 64, buffers 16-byte aligned)",
                 (long long)rows, (long long)cols);
  const int64_t nvec = static_cast<int64_t>(gemv_tc_tiled_bytes(rows, cols) / 16);
  const int64_t blocks = std::min<int64_t>((nvec + 255) / 256, 132 * 32);
  launch_k(tc_relayout_kernel, dim3(static_cast<unsigned>(blocks)), dim3(256), 0, st, static_cast<const uint4*>(src),
           static_cast<uint4*>(dst), rows, cols, nvec);
  QF_CUDA_LAUNCH_CHECK("tc_relayout_kernel");
}

bool gemv_tc_eligible(const WeightRef& W) {
  return W.dtype == DType::BF16 && W.cols % 64 == 0 && (reinterpret_cast<uintptr_t>(W.data) & 15) == 0 &&
         W.rows > 0 && W.rows < (1 << 30) && W.cols < (1 << 30);
}

// Column slices from the shape alone (never from M), in units of 64-column chunks.
int gemv_tc_slices(int64_t tiles, int64_t cols) { return tc_column_slices(tiles, cols / 64, kTcWarps); }

// The cross-block split (gemv_tc_impl.cuh, tc_split_blocks), unless QFLASH_TC_SPLIT=off (A/B runs:
// the plain grid for every shape; one setting for the whole process, so decode and verify agree).
int gemv_tc_split_blocks(int64_t tiles, int64_t cols) {
  static const bool off = [] {
    const char* e = std::getenv("QFLASH_TC_SPLIT");
    return e && (std::strcmp(e, "off") == 0 || std::strcmp(e, "0") == 0);
  }();
  return off ? 1 : tc_split_blocks(tiles, cols / 64, gemv_tc_slices(tiles, cols));
}

size_t gemv_tc_scratch_bytes() { return kTcScratchBytes; }

// The production schedules, numbered from 0 (the default). One today: column slices (split across
// blocks where the grid is small).
int gemv_tc_sched_count() { return 1; }
const char* gemv_tc_sched_name(int v) { return v == 0 ? "slices" : "?"; }

void gemv_tc_group(const WeightRef* const* Ws, float* const* ys, int n, const float* x, int x_ld, int M,
                   void* scratch, cudaStream_t st, int sched) {
  if (n < 1 || n > kTcMaxSeg) backend_fail("cuda matmul (tc): %d weights in one group (1..%d)", n, kTcMaxSeg);
  if (sched < 0 || sched >= gemv_tc_sched_count()) backend_fail("cuda matmul (tc): no schedule %d", sched);
  int64_t tiles = 0;
  const bool tiled = Ws[0]->layout == WeightRef::kTc32x64;
  for (int i = 0; i < n; i++) {
    if (Ws[i]->cols != Ws[0]->cols) backend_fail("cuda matmul (tc): grouped weights differ in cols");
    if (Ws[i]->layout != Ws[0]->layout) backend_fail("cuda matmul (tc): grouped weights differ in layout");
    tiles += (Ws[i]->rows + 31) / 32;
  }
  const int64_t cols = Ws[0]->cols;
  const int nsplit = gemv_tc_split_blocks(tiles, cols);
  // Profiler tag (qflash bench --profile): the shape, the rows and the schedule of each launch.
  auto tag = [&](int mg) {
    if (!prof_on()) return;
    std::string r;
    for (int i = 0; i < n; i++) r += fmt_str(i ? "+%lld" : "%lld", (long long)Ws[i]->rows);
    prof_tag("%s x %lld, M=%d, %s%s%s", r.c_str(), (long long)cols, mg, gemv_tc_sched_name(sched),
             nsplit > 1 ? fmt_str(", split %d", nsplit).c_str() : "", tiled ? ", tiled" : "");
  };
  tc_slices_run(Ws, ys, n, x, x_ld, M, tiles, gemv_tc_slices(tiles, cols), nsplit, scratch, tiled, st, tag);
}

void gemv_tc(const WeightRef& W, const float* x, int x_ld, float* y, int M, void* scratch, cudaStream_t st, int sched) {
  const WeightRef* ws[1] = {&W};
  float* ys[1] = {y};
  gemv_tc_group(ws, ys, 1, x, x_ld, M, scratch, st, sched);
}

}  // namespace qf::cuda
