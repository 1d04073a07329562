// qflash_gemm_bench: the prefill GEMM (backend/cuda/gemm.h) on the Qwen3.8-27B projection shapes:
// time per call and TFLOP/s for row-major and tiled (GEMV layout) weights, the cost of the bf16
// rounding of the activations and of the untile copy, and the GEMM time of one prefill chunk of
// the whole 27B model (64 layers: 48 DeltaNet, 16 attention). Not a test: run it on the H200
// (tools/device/session.sh, step `prefill`). Usage:
//   qflash_gemm_bench [--reps N] [--m 1024,4096,8192]
// Times are medians of CUDA-event-timed calls after warm-up.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/cuda_util.h"
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

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> ms = {1024, 4096, 8192};
  for (int i = 1; i < argc; i++) {
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) {
      g_reps = std::max(3, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--m") && i + 1 < argc) {
      ms.clear();
      for (const char* p = argv[++i]; *p;) {
        ms.push_back(std::atoi(p));
        while (*p && *p != ',') p++;
        if (*p == ',') p++;
      }
    } else {
      std::fprintf(stderr, "usage: %s [--reps N] [--m 1024,4096,8192]\n", argv[0]);
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
