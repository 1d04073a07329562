// Kernel lab: the CUDA-core multi-row GEMV (src/backend/cuda/gemv_impl.cuh), which serves
// f16/f32/int4 weights, odd shapes and QFLASH_GEMV=fma. Its schedule variants differ in R (rows
// per lane group) and U (chunks loaded per step) only: the same arithmetic per row. Every version
// is checked before it is timed: against a double-precision CPU reference (rows sampled on the
// big shapes, every output element must be written) and for row-invariance (each row of an M = 1
// call has the bits of the same row in the largest call); then timed with CUDA events over
// weights rotated past the L2 (GB/s of weight bytes).
//   qflash_lab_gemv_fma [VERSION ...] [--quick] [--reps N] [--M 1,8,16]
// Versions (bf16 weights, 16-byte aligned rows; built for row capacities 1, 8 and 16):
//   1 default   the production schedule (GemvSched: R2U4 / R4U4 / R4U2 at capacity 1 / 8 / 16)
//   2-9         R1U4, R1U8, R2U2, R2U8, R4U2, R4U1, R8U1, R8U2 (R8U2 up to capacity 8)
// A version not built at an M's row capacity is skipped there. Exit status 1 when a check fails.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/gemv_impl.cuh"
#include "bench_util.cuh"

namespace qf::cuda {

namespace {

template <int MB>
bool bf16_variant(const GemvParams& P, int v, cudaStream_t st) {
  switch (v) {
    case 2: gemv_launch<WK::BF16, MB, 1, 4, true>(P, st); return true;
    case 3: gemv_launch<WK::BF16, MB, 1, 8, true>(P, st); return true;
    case 4: gemv_launch<WK::BF16, MB, 2, 2, true>(P, st); return true;
    case 5: gemv_launch<WK::BF16, MB, 2, 8, true>(P, st); return true;
    case 6: gemv_launch<WK::BF16, MB, 4, 2, true>(P, st); return true;
    case 7: gemv_launch<WK::BF16, MB, 4, 1, true>(P, st); return true;
    case 8: gemv_launch<WK::BF16, MB, 8, 1, true>(P, st); return true;
    case 9:
      if constexpr (MB <= 8) {
        gemv_launch<WK::BF16, MB, 8, 2, true>(P, st);
        return true;
      }
      return false;
    default: return false;
  }
}

// Whether version v is built for the row capacity gemv() runs M rows with (passes of 16).
bool built(int v, int M) {
  if (v == 1) return true;
  for (int g0 = 0; g0 < M; g0 += 16) {
    const int mb = gemv_bucket(M - g0 < 16 ? M - g0 : 16);
    if ((mb != 1 && mb != 8 && mb != 16) || (v == 9 && mb == 16)) return false;
  }
  return true;
}

// gemv()'s CUDA-core path (the shape-chosen column split) with version v's schedule.
void run_fma(int v, const WeightRef& W, const float* x, int x_ld, float* y, int M, cudaStream_t st) {
  bool vec = false;
  GemvParams P = gemv_params(W, x_ld, gemv_slices_for(W.rows, W.cols, 8), &vec);
  if (v > 1 && !vec) backend_fail("lab fma: version %d needs 16-byte aligned rows", v);
  for (int g0 = 0; g0 < M; g0 += 16) {
    const int mg = M - g0 < 16 ? M - g0 : 16;
    P.M = mg;
    P.x = x + static_cast<size_t>(g0) * x_ld;
    P.y = y + static_cast<size_t>(g0) * W.rows;
    const int mb = gemv_bucket(mg);
    if (v == 1) {
      gemv_run_bf16(P, mb, vec, st);
      continue;
    }
    const bool ok = mb == 1 ? bf16_variant<1>(P, v, st) : mb == 8 ? bf16_variant<8>(P, v, st)
                                                      : mb == 16 ? bf16_variant<16>(P, v, st) : false;
    if (!ok) backend_fail("lab fma: version %d is not built for %d rows", v, mg);
  }
}

}  // namespace

}  // namespace qf::cuda

using namespace qf;
using namespace qf::bench;

namespace {

constexpr int kVersions = 9;
const char* const kNames[kVersions + 1] = {"?", "default", "R1U4", "R1U8", "R2U2", "R2U8", "R4U2", "R4U1", "R8U1", "R8U2"};

// Checks version v on W: the largest built M in {16, 8} against the CPU, and rows of M = 1 calls
// equal to the same rows of that call.
std::string check(int v, const WeightRef& W, const float* dx, const std::vector<float>& hx) {
  const int Mc = cuda::built(v, 16) ? 16 : 8;
  const CpuRef ref = cpu_ref(W, hx, Mc);
  const int cols = static_cast<int>(W.cols);
  float* y = static_cast<float*>(dmalloc(static_cast<size_t>(Mc) * W.rows * 4));
  auto call = [&](int M, int off) {
    poison(y, static_cast<size_t>(M) * W.rows * 4);
    cuda::run_fma(v, W, dx + static_cast<size_t>(off) * cols, cols, y, M, g_st);
    return download(y, static_cast<size_t>(M) * W.rows);
  };
  const std::vector<float> full = call(Mc, 0);
  std::string err = check_against(full, W.rows, ref, 1e-5);
  if (!err.empty()) err = cuda::fmt_str("M = %d vs CPU: ", Mc) + err;
  for (int off : {0, 3, Mc - 1}) {
    if (!err.empty()) break;
    const std::vector<float> one = call(1, off);
    if (std::memcmp(one.data(), full.data() + static_cast<size_t>(off) * W.rows, one.size() * 4))
      err = cuda::fmt_str("row %d of an M = 1 call differs from the M = %d call (row-invariance)", off, Mc);
  }
  cudaFree(y);
  return err;
}

}  // namespace

int main(int argc, char** argv) {
  LabArgs args;
  args.Ms = {1, 8, 16};
  if (!parse_lab_args(argc, argv, kVersions, 64, false, args)) return 2;
  const bool quick = args.quick;
  std::vector<int> versions = args.versions, Ms = args.Ms;
  if (versions.empty())
    for (int v = 1; v <= kVersions; v++) versions.push_back(v);
  try {
    Ceil ce;
    if (!bench_init("qflash_lab_gemv_fma", &ce)) return 1;
    struct Shape {
      const char* name;
      int64_t rows, cols;
      bool timed;
    };
    std::vector<Shape> shapes = {{"37x256", 37, 256, false},
                                 {"300x1000", 300, 1000, false},
                                 {"mlp up/gate 17408x5120", 17408, 5120, true},
                                 {"mlp down 5120x17408", 5120, 17408, true},
                                 {"gdn qkv 10240x5120", 10240, 5120, true},
                                 {"attn o 5120x6144", 5120, 6144, true},
                                 {"kv proj 1024x5120", 1024, 5120, true},
                                 {"lm_head 248320x5120", 248320, 5120, true}};
    if (quick) shapes.resize(5);
    int maxM = 16;
    for (int M : Ms) maxM = std::max(maxM, M);
    int64_t maxcols = 0, maxrows = 0;
    for (const Shape& s : shapes) {
      maxcols = std::max(maxcols, s.cols);
      maxrows = std::max(maxrows, s.rows);
    }
    float* dx = static_cast<float*>(dmalloc(static_cast<size_t>(maxM) * maxcols * 4));
    float* dy = static_cast<float*>(dmalloc(static_cast<size_t>(maxM) * maxrows * 4));
    bool failed = false;
    std::printf("%-24s %3s %-8s %10s %7s %6s\n", "matmul (CUDA cores)", "M", "version", "time_us", "GB/s", "%copy");
    for (const Shape& s : shapes) {
      Mat m = make_mat(DType::BF16, s.rows, s.cols);
      // x: maxM rows of s.cols, contiguous (ld = cols), the same host values the reference reads
      cuda::fill_random(dx, static_cast<size_t>(maxM) * s.cols, DType::F32, 77 + s.cols, 1.0f, g_st);
      const std::vector<float> hx = download(dx, static_cast<size_t>(maxM) * s.cols);
      std::vector<int> ok;
      for (int v : versions) {
        const std::string err = check(v, m.w[0], dx, hx);
        if (err.empty()) {
          ok.push_back(v);
        } else {
          failed = true;
          std::printf("FAIL %s %s: %s\n", kNames[v], s.name, err.c_str());
        }
      }
      std::printf("checked %-22s %zu of %zu versions pass\n", s.name, ok.size(), versions.size());
      if (s.timed) {
        const int nb = static_cast<int>(m.w.size());
        for (int M : Ms)
          for (int v : ok) {
            if (!cuda::built(v, M)) continue;
            const double us = median_us([&](int i) {
              cuda::run_fma(v, m.w[i % nb], dx, static_cast<int>(s.cols), dy, M, g_st);
            });
            const double gbs = m.bytes / (us * 1e-6) / 1e9;
            std::printf("%-24s %3d %-8s %10.1f %7.0f %5.1f%%\n", s.name, M, kNames[v], us, gbs, 100.0 * gbs / ce.copy_gbs);
          }
      }
      free_mat(m);
    }
    cudaFree(dx);
    cudaFree(dy);
    std::printf("%s\n", failed ? "lab: a version FAILED its checks" : "lab: every version passed its checks");
    return failed ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "qflash_lab_gemv_fma: %s\n", e.what());
    return 1;
  }
}
