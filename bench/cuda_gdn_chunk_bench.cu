// qflash_gdn_chunk_bench: Backend::gdn_chunked's CUDA kernels (backend/cuda/gdn_chunk.h) on the
// Qwen3.8-27B DeltaNet shape (16 key heads, 48 value heads, d_k = d_v = 128, conv 4), kernel
// generations 1 and 2 side by side: time per call (prep + conv tail + recurrence), the same for
// the 48 DeltaNet layers of one prefill chunk, and whether v2's output and state equal v1's bit
// for bit (they compute the same operations on the same values). Not a test: run it on the GPU.
// Usage:
//   qflash_gdn_chunk_bench [--reps N] [--m 4096,8192]
// Times are medians of CUDA-event-timed calls after warm-up.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backend/cuda/cuda_util.h"
#include "backend/cuda/gdn_chunk.h"

using namespace qf;

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

float* dalloc(size_t n) {
  void* p = nullptr;
  QF_CUDA_CHECK(cudaMalloc(&p, n * sizeof(float)));
  return static_cast<float*>(p);
}

// Uniform values in [lo, hi) from a fixed seed, uploaded.
float* dupload_uniform(size_t n, float lo, float hi, uint64_t seed) {
  std::vector<float> h(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& v : h) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v = lo + (hi - lo) * static_cast<float>((x >> 40) * 0x1.0p-24);
  }
  float* d = dalloc(n);
  QF_CUDA_CHECK(cudaMemcpy(d, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  return d;
}

std::vector<float> download(const float* d, size_t n) {
  std::vector<float> h(n);
  QF_CUDA_CHECK(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
  return h;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> ms = {4096, 8192};
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
      std::fprintf(stderr, "usage: %s [--reps N] [--m 4096,8192]\n", argv[0]);
      return 2;
    }
  }
  QF_CUDA_CHECK(cudaStreamCreate(&g_st));
  GdnDims d;
  d.n_k_heads = 16;
  d.n_v_heads = 48;
  d.d_k = 128;
  d.d_v = 128;
  d.conv_kernel = 4;
  const int C = d.conv_dim(), Hv = d.n_v_heads;
  constexpr int kLayers = 48;  // DeltaNet layers of the 27B model
  std::printf("gdn_chunked, 27B DeltaNet shape (k heads %d, v heads %d, d_k %d, d_v %d, conv %d), median of %d\n",
              d.n_k_heads, d.n_v_heads, d.d_k, d.d_v, d.conv_kernel, g_reps);
  std::printf("%8s %12s %12s %8s %14s %14s  %s\n", "M", "v1 us", "v2 us", "speedup", "v1 ms/48 lay", "v2 ms/48 lay",
              "v2 == v1");
  for (int M : ms) {
    if (M <= 0) continue;
    float* mixed = dupload_uniform(static_cast<size_t>(M) * C, -2.0f, 2.0f, 1);
    float* alpha = dupload_uniform(static_cast<size_t>(M) * Hv, -4.0f, 2.0f, 2);
    float* beta = dupload_uniform(static_cast<size_t>(M) * Hv, -3.0f, 3.0f, 3);
    float* conv = dupload_uniform(static_cast<size_t>(C) * d.conv_kernel, -0.6f, 0.6f, 4);
    float* A_log = dupload_uniform(Hv, -1.0f, 2.5f, 5);
    float* dt = dupload_uniform(Hv, -0.5f, 0.5f, 6);
    float* state0 = dupload_uniform(d.state_floats(), -0.05f, 0.05f, 7);
    float* state = dalloc(d.state_floats());
    float* y = dalloc(static_cast<size_t>(M) * d.value_dim());
    float* scratch = dalloc(cuda::gdn_chunk_scratch_floats(d, M));
    std::vector<float> out[2], st[2];
    double us[2];
    for (int v = 1; v <= 2; v++) {
      auto call = [&] {
        cuda::gdn_chunked(mixed, alpha, beta, conv, A_log, dt, d, state, y, M, scratch, g_st, v);
      };
      QF_CUDA_CHECK(cudaMemcpyAsync(state, state0, d.state_floats() * sizeof(float), cudaMemcpyDeviceToDevice, g_st));
      call();
      QF_CUDA_CHECK(cudaStreamSynchronize(g_st));
      out[v - 1] = download(y, static_cast<size_t>(M) * d.value_dim());
      st[v - 1] = download(state, d.state_floats());
      us[v - 1] = median_us(call);  // the state keeps evolving; the work per call does not change
    }
    double dmax = 0;
    bool same = out[0].size() == out[1].size() &&
                !std::memcmp(out[0].data(), out[1].data(), out[0].size() * sizeof(float)) &&
                !std::memcmp(st[0].data(), st[1].data(), st[0].size() * sizeof(float));
    for (size_t i = 0; i < out[0].size(); i++) dmax = std::max(dmax, std::fabs(double(out[0][i]) - out[1][i]));
    for (size_t i = 0; i < st[0].size(); i++) dmax = std::max(dmax, std::fabs(double(st[0][i]) - st[1][i]));
    std::printf("%8d %12.1f %12.1f %8.2f %14.2f %14.2f  %s", M, us[0], us[1], us[0] / us[1], us[0] * kLayers / 1e3,
                us[1] * kLayers / 1e3, same ? "bit-identical" : "DIFFERENT");
    if (!same) std::printf(" (max |v2 - v1| %.3g)", dmax);
    std::printf("\n");
    for (float* p : {mixed, alpha, beta, conv, A_log, dt, state0, state, y, scratch}) cudaFree(p);
  }
  cudaStreamDestroy(g_st);
  return 0;
}
