// qflash_gemm_bench: the prefill GEMM (backend/cuda/gemm.h) on the Qwen3.8-27B projection shapes:
// time per call and TFLOP/s for row-major and tiled (GEMV layout) weights, the cost of the bf16
// rounding of the activations and of the untile copy, and the GEMM time of one prefill chunk of
// the whole 27B model (64 layers: 48 DeltaNet, 16 attention). Not a test: run it on the H200
// (tools/device/session.sh, step `prefill`). Usage:
//   qflash_gemm_bench [--reps N] [--m 1024,4096,8192]
//   qflash_gemm_bench --overlap M[,M...]   (an experiment, issue 12: does one 27B DeltaNet layer's
//     chunked GDN, a latency-bound pair of kernels, run beside the MLP's gate/up GEMM on a second
//     stream? Prints each alone, both in sequence and both on two streams, in either launch order,
//     with and without the GDN stream at high priority; the answer decides whether a prefill that
//     pipelines two row chunks through the layers can hide the GDN under the GEMMs.)
// Times are medians of CUDA-event-timed calls after warm-up.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/cuda_util.h"
#include "backend/cuda/gdn_chunk.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/kernels.h"

using namespace qf;
using namespace qf::cuda;

namespace {

int g_reps = 10;
cudaStream_t g_st;

template <class F>
double median_us(F&& fn) {
  fn();
  fn();
  std::vector<cudaEvent_t> ev(2 * g_reps);
  for (auto& e : ev) QF_CUDA_CHECK(cudaEventCreate(&e));
  for (int i = 0; i < g_reps; i++) {
    QF_CUDA_CHECK(cudaEventRecord(ev[2 * i], g_st));
    fn();
    QF_CUDA_CHECK(cudaEventRecord(ev[2 * i + 1], g_st));
  }
  QF_CUDA_CHECK(cudaStreamSynchronize(g_st));
  std::vector<double> t(g_reps);
  for (int i = 0; i < g_reps; i++) {
    float ms = 0;
    QF_CUDA_CHECK(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]));
    t[i] = ms * 1e3;
  }
  for (auto& e : ev) cudaEventDestroy(e);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

void* dmalloc(size_t b) {
  void* p = nullptr;
  QF_CUDA_CHECK(cudaMalloc(&p, b));
  return p;
}

struct Shape {
  const char* name;
  int64_t N, K;
  int per_model;  // calls per prefill chunk of the 27B model (64 layers)
};

// --overlap: one 27B DeltaNet layer (chunked GDN, M rows) on stream a, the MLP gate/up GEMM
// (17408 x 5120, M rows, bf16, cuBLASLt) n times on stream b. Times (median of g_reps): each alone,
// both in sequence on one stream, and on two streams started together (GDN launched first / GEMM
// first), the GDN stream at default and at high priority.
int overlap(const std::vector<int>& ms) {
  GdnDims d;
  d.n_k_heads = 16;
  d.n_v_heads = 48;
  d.d_k = d.d_v = 128;
  d.conv_kernel = 4;
  int lo = 0, hi = 0;
  QF_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
  cudaStream_t sa, sb, sh;
  QF_CUDA_CHECK(cudaStreamCreateWithFlags(&sa, cudaStreamNonBlocking));
  QF_CUDA_CHECK(cudaStreamCreateWithFlags(&sb, cudaStreamNonBlocking));
  QF_CUDA_CHECK(cudaStreamCreateWithPriority(&sh, cudaStreamNonBlocking, hi));
  cudaEvent_t fork, join;
  QF_CUDA_CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  QF_CUDA_CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  GemmRunner runner;
  const int64_t N = 17408, K = 5120;
  void* w = dmalloc(static_cast<size_t>(N) * K * 2);
  fill_random(w, static_cast<size_t>(N) * K, DType::BF16, 7, 0.02f, g_st);
  WeightRef W;
  W.dtype = DType::BF16;
  W.rows = N;
  W.cols = K;
  W.data = w;
  std::printf("\noverlap: one 27B DeltaNet layer (chunked) beside the MLP gate/up GEMM (%lld x %lld, bf16)\n",
              (long long)N, (long long)K);
  std::printf("%6s %4s %9s %9s %9s %11s %11s %11s %11s\n", "M", "n", "gdn us", "gemm us", "serial", "2s gdn1st",
              "2s gemm1st", "hi gdn1st", "hi gemm1st");
  for (int M : ms) {
    const size_t C = d.conv_dim(), Hv = d.n_v_heads;
    float* mixed = static_cast<float*>(dmalloc(M * C * 4));
    float* alpha = static_cast<float*>(dmalloc(M * Hv * 4));
    float* beta = static_cast<float*>(dmalloc(M * Hv * 4));
    float* conv = static_cast<float*>(dmalloc(C * 4 * 4));
    float* A = static_cast<float*>(dmalloc(Hv * 4));
    float* dt = static_cast<float*>(dmalloc(Hv * 4));
    float* state = static_cast<float*>(dmalloc(d.state_floats() * 4));
    float* yg = static_cast<float*>(dmalloc(static_cast<size_t>(M) * d.value_dim() * 4));
    float* scratch = static_cast<float*>(dmalloc(gdn_chunk_scratch_floats(d, M) * 4));
    uint16_t* xb = static_cast<uint16_t*>(dmalloc(static_cast<size_t>(M) * K * 2));
    float* y = static_cast<float*>(dmalloc(static_cast<size_t>(M) * N * 4));
    fill_random(mixed, M * C, DType::F32, 1, 1.7f, g_st);
    fill_random(alpha, M * Hv, DType::F32, 2, 1.7f, g_st);
    fill_random(beta, M * Hv, DType::F32, 3, 3.0f, g_st);
    fill_random(conv, C * 4, DType::F32, 4, 0.8f, g_st);
    fill_random(A, Hv, DType::F32, 5, 2.0f, g_st);
    fill_random(dt, Hv, DType::F32, 6, 0.8f, g_st);
    fill_random(xb, static_cast<size_t>(M) * K, DType::BF16, 8, 1.0f, g_st);
    QF_CUDA_CHECK(cudaStreamSynchronize(g_st));
    auto gdn = [&](cudaStream_t s) { gdn_chunked(mixed, alpha, beta, conv, A, dt, d, state, yg, M, scratch, s); };
    int n = 1;
    auto gemms = [&](cudaStream_t s) {
      for (int i = 0; i < n; i++) runner.run_bf16(W, xb, y, M, s);
    };
    const double tg = median_us([&] { gdn(g_st); });
    const double t1 = median_us([&] { gemms(g_st); });
    n = std::max(1, static_cast<int>(tg / t1 + 0.5));  // about as much GEMM time as GDN time
    const double tm = median_us([&] { gemms(g_st); });
    const double ser = median_us([&] {
      gdn(g_st);
      gemms(g_st);
    });
    auto two = [&](cudaStream_t ga, bool gdn_first) {
      return median_us([&] {
        QF_CUDA_CHECK(cudaEventRecord(fork, g_st));
        QF_CUDA_CHECK(cudaStreamWaitEvent(ga, fork, 0));
        QF_CUDA_CHECK(cudaStreamWaitEvent(sb, fork, 0));
        if (gdn_first) {
          gdn(ga);
          gemms(sb);
        } else {
          gemms(sb);
          gdn(ga);
        }
        QF_CUDA_CHECK(cudaEventRecord(join, ga));
        QF_CUDA_CHECK(cudaStreamWaitEvent(g_st, join, 0));
        QF_CUDA_CHECK(cudaEventRecord(join, sb));
        QF_CUDA_CHECK(cudaStreamWaitEvent(g_st, join, 0));
      });
    };
    const double a1 = two(sa, true), a2 = two(sa, false), h1 = two(sh, true), h2 = two(sh, false);
    std::printf("%6d %4d %9.1f %9.1f %9.1f %11.1f %11.1f %11.1f %11.1f\n", M, n, tg, tm, ser, a1, a2, h1, h2);
    std::printf("       two streams / serial: %.3f %.3f %.3f %.3f (1.0 = no overlap, %.3f = perfect)\n", a1 / ser,
                a2 / ser, h1 / ser, h2 / ser, std::max(tg, tm) / ser);
    for (void* p : {static_cast<void*>(mixed), static_cast<void*>(alpha), static_cast<void*>(beta),
                    static_cast<void*>(conv), static_cast<void*>(A), static_cast<void*>(dt), static_cast<void*>(state),
                    static_cast<void*>(yg), static_cast<void*>(scratch), static_cast<void*>(xb), static_cast<void*>(y)})
      cudaFree(p);
  }
  cudaFree(w);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> ms = {1024, 4096, 8192};
  bool do_overlap = false;
  for (int i = 1; i < argc; i++) {
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) {
      g_reps = std::max(3, std::atoi(argv[++i]));
    } else if ((!std::strcmp(argv[i], "--m") || !std::strcmp(argv[i], "--overlap")) && i + 1 < argc) {
      do_overlap = do_overlap || !std::strcmp(argv[i], "--overlap");
      ms.clear();
      for (const char* p = argv[++i]; *p;) {
        ms.push_back(std::atoi(p));
        while (*p && *p != ',') p++;
        if (*p == ',') p++;
      }
    } else {
      std::fprintf(stderr, "usage: %s [--reps N] [--m 1024,4096,8192 | --overlap 4096,8192]\n", argv[0]);
      return 2;
    }
  }
  try {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
      std::fprintf(stderr, "qflash_gemm_bench: no CUDA device\n");
      return 1;
    }
    QF_CUDA_CHECK(cudaSetDevice(0));
    cudaDeviceProp prop;
    QF_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    QF_CUDA_CHECK(cudaStreamCreateWithFlags(&g_st, cudaStreamNonBlocking));
    std::printf("device: %s, %d SMs; reps %d (median)\n", prop.name, prop.multiProcessorCount, g_reps);
    if (do_overlap) return overlap(ms);
    // The 27B's projections (tests/fixtures/configs/qwen38_27b): hidden 5120, intermediate 17408,
    // DeltaNet qkv 10240 / z 6144 / a, b 48, attention q|gate 12288, k, v 1024, o from 6144.
    const Shape shapes[] = {{"mlp gate/up", 17408, 5120, 128}, {"mlp down", 5120, 17408, 64},
                            {"gdn qkv", 10240, 5120, 48},      {"gdn z", 6144, 5120, 48},
                            {"gdn a/b", 48, 5120, 96},         {"gdn out", 5120, 6144, 48},
                            {"attn q|gate", 12288, 5120, 16},  {"attn k/v", 1024, 5120, 32},
                            {"attn o", 5120, 6144, 16}};
    const int Mmax = *std::max_element(ms.begin(), ms.end());
    const int64_t Kmax = 17408, Nmax = 17408;
    float* x = static_cast<float*>(dmalloc(static_cast<size_t>(Mmax) * Kmax * 4));
    float* y = static_cast<float*>(dmalloc(static_cast<size_t>(Mmax) * Nmax * 4));
    uint16_t* xb = static_cast<uint16_t*>(dmalloc(static_cast<size_t>(Mmax) * Kmax * 2));
    fill_random(x, static_cast<size_t>(Mmax) * Kmax, DType::F32, 5, 1.0f, g_st);
    GemmRunner runner;
    std::vector<double> chunk_row(ms.size(), 0), chunk_tiled(ms.size(), 0);
    std::printf("\n%-12s %13s %6s %10s %8s %10s %8s %9s %9s\n", "shape", "N x K", "M", "row us", "TFLOP/s",
                "tiled us", "TFLOP/s", "bf16 us", "untile us");
    for (const Shape& s : shapes) {
      void* w = dmalloc(static_cast<size_t>(s.N) * s.K * 2);
      void* wt = dmalloc(gemv_tc_tiled_bytes(s.N, s.K));
      void* back = dmalloc(static_cast<size_t>(s.N) * s.K * 2);
      fill_random(w, static_cast<size_t>(s.N) * s.K, DType::BF16, 7, 0.02f, g_st);
      gemv_tc_relayout(w, wt, s.N, s.K, g_st);
      WeightRef W;
      W.dtype = DType::BF16;
      W.rows = s.N;
      W.cols = s.K;
      W.data = w;
      WeightRef T = W;
      T.data = wt;
      T.layout = WeightRef::kTc32x64;
      for (size_t i = 0; i < ms.size(); i++) {
        const int M = ms[i];
        const double flop = 2.0 * s.N * s.K * M;
        const float* xr = nullptr;  // unused: these weights are bf16
        const double row = median_us([&] { runner.run(W, x, y, M, g_st, &xr); });
        const double til = median_us([&] { runner.run(T, x, y, M, g_st, &xr); });
        const double cvt = median_us([&] { gemm_to_bf16(x, xb, static_cast<size_t>(M) * s.K, g_st); });
        const double unt = median_us([&] { gemm_untile(wt, back, s.N, s.K, g_st); });
        std::printf("%-12s %6lld x %5lld %6d %10.1f %8.1f %10.1f %8.1f %9.1f %9.1f\n", s.name, (long long)s.N,
                    (long long)s.K, M, row, flop / row * 1e-6, til, flop / til * 1e-6, cvt, unt);
        chunk_row[i] += row * s.per_model;
        chunk_tiled[i] += til * s.per_model;
      }
      QF_CUDA_CHECK(cudaStreamSynchronize(g_st));
      cudaFree(w);
      cudaFree(wt);
      cudaFree(back);
    }
    std::printf("\n27B prefill chunk, all 64 layers' projections (lm_head excluded):\n");
    for (size_t i = 0; i < ms.size(); i++) {
      const double flop = 2.0 * 24.35e9 * ms[i];
      std::printf("  M = %5d: row-major %.1f ms (%.0f TFLOP/s, %.0f tok/s), tiled %.1f ms (%.0f TFLOP/s, %.0f tok/s)\n",
                  ms[i], chunk_row[i] / 1e3, flop / chunk_row[i] * 1e-6, ms[i] / (chunk_row[i] * 1e-6),
                  chunk_tiled[i] / 1e3, flop / chunk_tiled[i] * 1e-6, ms[i] / (chunk_tiled[i] * 1e-6));
    }
    std::printf("\nroutes:\n%s", runner.describe().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "qflash_gemm_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
