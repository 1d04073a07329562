// qflash_gemv_bench: bandwidth of the CUDA backend's multi-row GEMV against the device's copy
// ceiling (and cuBLAS), plus the per-layer costs of attention and the GDN recurrence.
// Not a test: run it on the H200 (tools/device/gpu_check.sh does). Usage:
//   qflash_gemv_bench [--quick | --sweep] [--no-cublas] [--reps N]
// --sweep: fixed cost per launch and streaming rate of back-to-back M = 1 calls over a range of
// sizes, against a plain streaming read.
// Weights are rotated over several buffers whose total exceeds the L2 several times, so the
// numbers are HBM numbers; times are medians of CUDA-event-timed launches after warm-up.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/cuda_util.h"
#include "backend/cuda/kernels.h"

using namespace qf;
using namespace qf::cuda;

namespace {

int g_reps = 30;
cudaStream_t g_st;
GemvScratch g_sc;

#define CUBLAS_OK(x)                                                                 \
  do {                                                                               \
    cublasStatus_t s_ = (x);                                                         \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                               \
      std::fprintf(stderr, "%s:%d: %s failed: status %d\n", __FILE__, __LINE__, #x, (int)s_); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

// Median time in microseconds of `fn(i)` over g_reps launches (i = rep index), after 3 warm-ups.
template <class F>
double median_us(F&& fn) {
  for (int i = 0; i < 3; i++) fn(i);
  std::vector<cudaEvent_t> ev(2 * g_reps);
  for (auto& e : ev) QF_CUDA_CHECK(cudaEventCreate(&e));
  for (int i = 0; i < g_reps; i++) {
    QF_CUDA_CHECK(cudaEventRecord(ev[2 * i], g_st));
    fn(i);
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

// Back-to-back: mean microseconds per call over `n` calls between one event pair (how launches
// follow each other inside a model step), after 3 warm-ups.
template <class F>
double b2b_us(F&& fn, int n = 24) {
  for (int i = 0; i < 3; i++) fn(i);
  cudaEvent_t a, b;
  QF_CUDA_CHECK(cudaEventCreate(&a));
  QF_CUDA_CHECK(cudaEventCreate(&b));
  double best = 1e30;
  for (int rep = 0; rep < 3; rep++) {
    QF_CUDA_CHECK(cudaEventRecord(a, g_st));
    for (int i = 0; i < n; i++) fn(i);
    QF_CUDA_CHECK(cudaEventRecord(b, g_st));
    QF_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    QF_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    best = std::min(best, ms * 1e3 / n);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return best;
}

// Read-only streaming: the ceiling for a kernel that only reads (a GEMV reads its weights).
__global__ void read_kernel(const uint4* __restrict__ p, size_t n, unsigned* sink) {
  unsigned acc = 0;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p + i));
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) *sink = acc;  // keeps the loads alive
}

void* dmalloc(size_t bytes) {
  void* p = nullptr;
  QF_CUDA_CHECK(cudaMalloc(&p, bytes));
  return p;
}

struct Ceil {
  double copy_gbs = 0, read_gbs = 0;
};

Ceil ceilings() {
  const size_t bytes = size_t(2) << 30;
  void* a = dmalloc(bytes);
  void* b = dmalloc(bytes);
  unsigned* sink = static_cast<unsigned*>(dmalloc(4));
  fill_random(a, bytes / 4, DType::F32, 1, 1.0f, g_st);
  Ceil c;
  const double tc = median_us([&](int) { QF_CUDA_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, g_st)); });
  c.copy_gbs = 2.0 * bytes / (tc * 1e-6) / 1e9;
  int sms = 0;
  QF_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const double tr = median_us([&](int) {
    read_kernel<<<sms * 8, 512, 0, g_st>>>(static_cast<const uint4*>(a), bytes / 16, sink);
  });
  c.read_gbs = bytes / (tr * 1e-6) / 1e9;
  cudaFree(a);
  cudaFree(b);
  cudaFree(sink);
  return c;
}

struct Mat {
  std::vector<WeightRef> w;  // rotating copies
  std::vector<void*> owned;
  size_t bytes = 0;          // bytes one call must read (weights + scales)
};

Mat make_mat(DType dt, int64_t rows, int64_t cols, int group = 64) {
  Mat m;
  int64_t per = dt == DType::U32 ? rows * cols / 2 + 2 * 2 * rows * (cols / group) : rows * cols * 2;
  m.bytes = static_cast<size_t>(per);
  const int nbuf = std::max<int>(2, static_cast<int>((size_t(400) << 20) / m.bytes) + 1);
  for (int i = 0; i < std::min(nbuf, 64); i++) {
    WeightRef w;
    w.dtype = dt;
    w.rows = rows;
    w.cols = cols;
    if (dt == DType::U32) {
      const size_t nw = static_cast<size_t>(rows) * cols / 8, ng = static_cast<size_t>(rows) * (cols / group);
      void* q = dmalloc(nw * 4);
      void* s = dmalloc(ng * 2);
      void* b = dmalloc(ng * 2);
      fill_random(q, nw, DType::F32, 10 + i, 1.0f, g_st);  // any bits are valid nibbles
      fill_random(s, ng, DType::BF16, 20 + i, 0.01f, g_st);
      fill_random(b, ng, DType::BF16, 30 + i, 0.01f, g_st);
      w.data = q;
      w.scales = s;
      w.biases = b;
      w.group = group;
      m.owned.insert(m.owned.end(), {q, s, b});
    } else {
      void* p = dmalloc(static_cast<size_t>(rows) * cols * 2);
      fill_random(p, static_cast<size_t>(rows) * cols, DType::BF16, 40 + i, 0.02f, g_st);
      w.data = p;
      m.owned.push_back(p);
    }
    m.w.push_back(w);
  }
  return m;
}

void free_mat(Mat& m) {
  for (void* p : m.owned) cudaFree(p);
  m.owned.clear();
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, use_cublas = true, sweep = false;
  for (int i = 1; i < argc; i++) {
    if (!std::strcmp(argv[i], "--quick")) quick = true;
    else if (!std::strcmp(argv[i], "--no-cublas")) use_cublas = false;
    else if (!std::strcmp(argv[i], "--sweep")) sweep = true;
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) g_reps = std::max(5, std::atoi(argv[++i]));
    else {
      std::fprintf(stderr, "usage: %s [--quick | --sweep] [--no-cublas] [--reps N]\n", argv[0]);
      return 2;
    }
  }
  try {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
      std::fprintf(stderr, "qflash_gemv_bench: no CUDA device\n");
      return 1;
    }
    QF_CUDA_CHECK(cudaSetDevice(0));
    cudaDeviceProp prop;
    QF_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    QF_CUDA_CHECK(cudaStreamCreateWithFlags(&g_st, cudaStreamNonBlocking));
    gemv_scratch_create(g_sc);
    std::printf("device: %s, sm_%d%d, %d SMs, L2 %.0f MB, %.0f GB; reps %d (median)\n", prop.name, prop.major,
                prop.minor, prop.multiProcessorCount, prop.l2CacheSize / 1e6, prop.totalGlobalMem / 1e9, g_reps);
    const Ceil ce = ceilings();
    std::printf("ceilings: device-to-device copy %.0f GB/s (read+write), streaming read %.0f GB/s\n\n", ce.copy_gbs,
                ce.read_gbs);

    if (sweep) {
      // Fixed cost per launch: back-to-back calls (rotating buffers, several times the L2) of a
      // plain streaming read and of the M = 1 GEMV under each schedule, over a range of sizes;
      // a least-squares line t = a + bytes / b per column gives the fixed cost a and the rate b.
      int sms = 0;
      QF_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
      unsigned* sink = static_cast<unsigned*>(dmalloc(4));
      float* x = static_cast<float*>(dmalloc(size_t(16) * 32768 * 4));
      float* y = static_cast<float*>(dmalloc(size_t(16) * 262144 * 4));
      fill_random(x, size_t(16) * 32768, DType::F32, 99, 1.0f, g_st);
      struct Sz {
        int64_t rows, cols;
      };
      const std::vector<Sz> sizes = {{1024, 5120},  {2048, 5120},  {4096, 5120},  {5120, 6144},  {8192, 5120},
                                     {5120, 17408}, {16384, 5120}, {17408, 5120}, {34816, 5120}, {65536, 5120},
                                     {131072, 5120}};
      const int nsched = gemv_tc_sched_count();
      std::printf("%-14s %8s %9s %9s", "sweep rows x cols", "MB", "read_us", "read_GB/s");
      for (int v = 1; v < nsched; v++) std::printf(" %8s_us %6s", gemv_tc_sched_name(v), "GB/s");
      for (const char* n : {"t-sli", "t-skr"}) std::printf(" %8s_us %6s", n, "GB/s");
      std::printf("\n");
      std::vector<double> xs, tr;
      std::vector<std::vector<double>> tg(nsched + 2);
      for (const Sz& z : sizes) {
        Mat m = make_mat(DType::BF16, z.rows, z.cols);
        const int nb = static_cast<int>(m.w.size());
        const double r = b2b_us([&](int i) {
          read_kernel<<<sms * 8, 512, 0, g_st>>>(static_cast<const uint4*>(m.w[i % nb].data), m.bytes / 16, sink);
        });
        std::printf("%6lldx%-7lld %8.1f %9.2f %9.0f", (long long)z.rows, (long long)z.cols, m.bytes / 1e6, r,
                    m.bytes / (r * 1e-6) / 1e9);
        xs.push_back(static_cast<double>(m.bytes));
        tr.push_back(r);
        for (int v = 1; v < nsched; v++) {
          const double t = b2b_us([&](int i) { gemv_tc(m.w[i % nb], x, static_cast<int>(z.cols), y, 1, g_st, &g_sc, v); });
          tg[v].push_back(t);
          std::printf(" %11.2f %6.0f", t, m.bytes / (t * 1e-6) / 1e9);
        }
        // the same weights in the tensor-core kernel's tiled layout (WeightRef::kTc32x64)
        std::vector<WeightRef> tw(m.w);
        std::vector<void*> tbufs;
        for (WeightRef& w : tw) {
          void* p = dmalloc(gemv_tc_tiled_bytes(w.rows, w.cols));
          gemv_tc_relayout(w.data, p, w.rows, w.cols, g_st);
          w.data = p;
          w.layout = WeightRef::kTc32x64;
          tbufs.push_back(p);
        }
        for (int k = 0; k < 2; k++) {  // tiled: slices, skr
          const double t = b2b_us([&](int i) { gemv_tc(tw[i % nb], x, static_cast<int>(z.cols), y, 1, g_st, &g_sc, 1 + k); });
          tg[nsched + k].push_back(t);
          std::printf(" %11.2f %6.0f", t, m.bytes / (t * 1e-6) / 1e9);
        }
        for (void* p : tbufs) cudaFree(p);
        std::printf("\n");
        free_mat(m);
      }
      auto fit = [&](const std::vector<double>& t, const char* name) {
        const double n = static_cast<double>(t.size());
        double sx = 0, sy = 0, sxx = 0, sxy = 0;
        for (size_t i = 0; i < t.size(); i++) {
          sx += xs[i];
          sy += t[i];
          sxx += xs[i] * xs[i];
          sxy += xs[i] * t[i];
        }
        const double slope = (n * sxy - sx * sy) / (n * sxx - sx * sx), icpt = (sy - slope * sx) / n;
        std::printf("fit %-16s fixed %.2f us per launch, rate %.0f GB/s\n", name, icpt, 1e-3 / slope);
      };
      fit(tr, "read");
      for (int v = 1; v < nsched; v++) fit(tg[v], gemv_tc_sched_name(v));
      fit(tg[nsched], "tiled slices");
      fit(tg[nsched + 1], "tiled skr");
      cudaFree(sink);
      cudaFree(x);
      cudaFree(y);
      QF_CUDA_CHECK(cudaStreamSynchronize(g_st));
      return 0;
    }

    cublasHandle_t cb = nullptr;
    if (use_cublas) {
      CUBLAS_OK(cublasCreate(&cb));
      CUBLAS_OK(cublasSetStream(cb, g_st));
    }
    struct Shape {
      const char* name;
      DType dt;
      int64_t rows, cols;
    };
    std::vector<Shape> shapes = {{"mlp gate|up 34816x5120", DType::BF16, 34816, 5120},
                                 {"gdn in 16480x5120", DType::BF16, 16480, 5120},
                                 {"mlp up/gate 17408x5120", DType::BF16, 17408, 5120},
                                 {"mlp down 5120x17408", DType::BF16, 5120, 17408},
                                 {"lm_head 248320x5120", DType::BF16, 248320, 5120},
                                 {"gdn qkv 10240x5120", DType::BF16, 10240, 5120},
                                 {"attn o 5120x6144", DType::BF16, 5120, 6144},
                                 {"kv proj 1024x5120", DType::BF16, 1024, 5120},
                                 {"int4 g64 17408x5120", DType::U32, 17408, 5120},
                                 {"int4 g64 5120x17408", DType::U32, 5120, 17408}};
    if (quick) shapes.resize(7);
    const int Ms[] = {1, 2, 4, 8, 16};
    const int maxM = 16;
    std::printf("%-24s %3s %4s %10s %9s %7s %8s %11s %9s\n", "matmul", "M", "ks", "time_us", "GB/s", "%copy", "xM=1",
                "cublas_us", "cub_GB/s");
    struct Row {
      std::string line;
    };
    std::vector<std::string> summary;
    for (const Shape& s : shapes) {
      Mat m = make_mat(s.dt, s.rows, s.cols);
      float* x = static_cast<float*>(dmalloc(static_cast<size_t>(maxM) * s.cols * 4));
      float* y = static_cast<float*>(dmalloc(static_cast<size_t>(maxM) * s.rows * 4));
      fill_random(x, static_cast<size_t>(maxM) * s.cols, DType::F32, 99, 1.0f, g_st);
      void* xb = nullptr;  // bf16 activations for cuBLAS
      if (cb && s.dt == DType::BF16) {
        xb = dmalloc(static_cast<size_t>(maxM) * s.cols * 2);
        fill_random(xb, static_cast<size_t>(maxM) * s.cols, DType::BF16, 98, 1.0f, g_st);
      }
      const int nb = static_cast<int>(m.w.size());
      double t1 = 0;
      for (int M : Ms) {
        const double t = median_us([&](int i) { gemv(m.w[i % nb], x, static_cast<int>(s.cols), y, M, g_st, &g_sc); });
        if (M == 1) t1 = t;
        double tc = NAN;
        if (xb) {
          const float one = 1.0f, zero = 0.0f;
          tc = median_us([&](int i) {
            CUBLAS_OK(cublasGemmEx(cb, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(s.rows), M, static_cast<int>(s.cols),
                                   &one, m.w[i % nb].data, CUDA_R_16BF, static_cast<int>(s.cols), xb, CUDA_R_16BF,
                                   static_cast<int>(s.cols), &zero, y, CUDA_R_32F, static_cast<int>(s.rows),
                                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
          });
        }
        const double gbs = m.bytes / (t * 1e-6) / 1e9;
        char line[256];
        std::snprintf(line, sizeof line, "%-24s %3d %4d %10.1f %9.0f %6.1f%% %8.2f %11.1f %9.0f", s.name, M,
                      gemv_auto_slices(m.w[0]), t, gbs, 100.0 * gbs / ce.copy_gbs, t / t1, tc,
                      std::isnan(tc) ? NAN : m.bytes / (tc * 1e-6) / 1e9);
        std::printf("%s\n", line);
        summary.push_back(line);
      }
      // tensor-core schedules (column slices vs the stream-K variants), GB/s of weight bytes
      if (s.dt == DType::BF16 && gemv_tc_eligible(m.w[0])) {
        for (int M : Ms) {
          std::printf("  tc schedules M=%-2d:", M);
          for (int v = 1; v < gemv_tc_sched_count(); v++) {
            const double t = median_us([&](int i) {
              gemv_tc(m.w[i % nb], x, static_cast<int>(s.cols), y, M, g_st, &g_sc, v);
            });
            std::printf(" %s %.0f (%.1f%%);", gemv_tc_sched_name(v), m.bytes / (t * 1e-6) / 1e9,
                        100.0 * m.bytes / (t * 1e-6) / 1e9 / ce.copy_gbs);
          }
          std::printf("\n");
        }
      }
      // schedule variants and forced column splits (bf16): which schedule streams best
      if (!quick && s.dt == DType::BF16) {
        for (int M : {1, 8, 16}) {
          std::printf("  variants M=%d:", M);
          for (int v = 0; v < gemv_variant_count(); v++) {
            if (!gemv(m.w[0], x, static_cast<int>(s.cols), y, M, g_st, &g_sc, 0, v)) continue;  // not built at this M
            const double t = median_us([&](int i) { gemv(m.w[i % nb], x, static_cast<int>(s.cols), y, M, g_st, &g_sc, 0, v); });
            std::printf(" %s %.0f GB/s;", gemv_variant_name(v), m.bytes / (t * 1e-6) / 1e9);
          }
          std::printf("\n  forced ks M=%d:", M);
          for (int ks : {1, 2, 4, 8}) {
            const double t = median_us([&](int i) { gemv(m.w[i % nb], x, static_cast<int>(s.cols), y, M, g_st, nullptr, ks); });
            std::printf(" ks%d %.0f GB/s;", ks, m.bytes / (t * 1e-6) / 1e9);
          }
          std::printf("\n");
        }
      }
      if (xb) cudaFree(xb);
      cudaFree(x);
      cudaFree(y);
      free_mat(m);
    }

    // ---- other per-layer costs at the 27B's shapes ------------------------------------------
    std::printf("\n%-40s %3s %10s\n", "op (27B shapes)", "M", "time_us");
    {
      GdnDims d;
      d.n_k_heads = 16;
      d.n_v_heads = 48;
      d.d_k = 128;
      d.d_v = 128;
      d.conv_kernel = 4;
      const int M = 16;
      float* mixed = static_cast<float*>(dmalloc(static_cast<size_t>(M) * d.conv_dim() * 4));
      float* ab = static_cast<float*>(dmalloc(static_cast<size_t>(M) * d.n_v_heads * 4 * 2));
      float* conv = static_cast<float*>(dmalloc(static_cast<size_t>(d.conv_dim()) * 4 * 4));
      float* Ad = static_cast<float*>(dmalloc(static_cast<size_t>(d.n_v_heads) * 4 * 2));
      float* state = static_cast<float*>(dmalloc(d.state_floats() * 4));
      float* cap = static_cast<float*>(dmalloc(d.state_floats() * 4 * M));
      float* yv = static_cast<float*>(dmalloc(static_cast<size_t>(M) * d.value_dim() * 4));
      float* scr = static_cast<float*>(dmalloc(gdn_scratch_floats(d, M) * 4));
      fill_random(mixed, static_cast<size_t>(M) * d.conv_dim(), DType::F32, 1, 1.0f, g_st);
      fill_random(ab, static_cast<size_t>(M) * d.n_v_heads * 2, DType::F32, 2, 1.0f, g_st);
      fill_random(conv, static_cast<size_t>(d.conv_dim()) * 4, DType::F32, 3, 0.5f, g_st);
      fill_random(Ad, static_cast<size_t>(d.n_v_heads) * 2, DType::F32, 4, 0.5f, g_st);
      fill_random(state, d.state_floats(), DType::F32, 5, 0.1f, g_st);
      for (int Mi : {1, 8, 16})
        for (bool capture : {false, true}) {
          const double t = median_us([&](int) {
            gdn_rows(mixed, ab, ab + M * d.n_v_heads, conv, Ad, Ad + d.n_v_heads, d, state, yv, Mi,
                     capture ? cap : nullptr, scr, g_st);
          });
          std::printf("%-40s %3d %10.1f\n", capture ? "gdn_rows 16/48x128x128 + capture" : "gdn_rows 16/48x128x128", Mi, t);
        }
      for (void* p : {(void*)mixed, (void*)ab, (void*)conv, (void*)Ad, (void*)state, (void*)cap, (void*)yv, (void*)scr})
        cudaFree(p);
    }
    {
      AttnParams p;
      p.n_heads = 24;
      p.n_kv_heads = 4;
      p.head_dim = 256;
      p.scale = 1.0f / 16.0f;
      p.causal = true;
      for (int ctx : {1024, 8192, 32768}) {
        const int M = 16, kvw = p.n_kv_heads * p.head_dim;
        float* K = static_cast<float*>(dmalloc(static_cast<size_t>(ctx + M) * kvw * 4));
        float* V = static_cast<float*>(dmalloc(static_cast<size_t>(ctx + M) * kvw * 4));
        float* q = static_cast<float*>(dmalloc(static_cast<size_t>(M) * p.n_heads * p.head_dim * 4));
        float* o = static_cast<float*>(dmalloc(static_cast<size_t>(M) * p.n_heads * p.head_dim * 4));
        float* scr = static_cast<float*>(dmalloc(attention_scratch_floats(M, p.n_heads, p.head_dim) * 4));
        StepMeta* meta = static_cast<StepMeta*>(dmalloc(sizeof(StepMeta)));
        fill_random(K, static_cast<size_t>(ctx + M) * kvw, DType::F32, 6, 1.0f, g_st);
        fill_random(V, static_cast<size_t>(ctx + M) * kvw, DType::F32, 7, 1.0f, g_st);
        fill_random(q, static_cast<size_t>(M) * p.n_heads * p.head_dim, DType::F32, 8, 1.0f, g_st);
        for (int Mi : {1, 8}) {
          StepMeta hm{ctx, 0, ctx + Mi, 0};
          QF_CUDA_CHECK(cudaMemcpy(meta, &hm, sizeof hm, cudaMemcpyHostToDevice));
          const double t = median_us([&](int) { attention(q, K, V, o, Mi, p, meta, scr, g_st); });
          const double kv_bytes = 2.0 * ctx * kvw * 4;
          char name[64];
          std::snprintf(name, sizeof name, "attention 24/4x256 ctx %d", ctx);
          std::printf("%-40s %3d %10.1f   (K+V %.0f MB: %.0f GB/s)\n", name, Mi, t, kv_bytes / 1e6,
                      kv_bytes / (t * 1e-6) / 1e9);
        }
        for (void* ptr : {(void*)K, (void*)V, (void*)q, (void*)o, (void*)scr, (void*)meta}) cudaFree(ptr);
      }
    }
    {
      // norms on the 27B hidden size, alone (median) and back-to-back
      const int H = 5120;
      float* h = static_cast<float*>(dmalloc(size_t(16) * H * 4));
      float* r = static_cast<float*>(dmalloc(size_t(16) * H * 4));
      float* w = static_cast<float*>(dmalloc(size_t(H) * 4));
      float* y = static_cast<float*>(dmalloc(size_t(16) * H * 4));
      fill_random(h, size_t(16) * H, DType::F32, 11, 1.0f, g_st);
      fill_random(r, size_t(16) * H, DType::F32, 12, 1.0f, g_st);
      fill_random(w, H, DType::F32, 13, 1.0f, g_st);
      for (int Mi : {1, 8}) {
        const double ta = median_us([&](int) { add_rmsnorm(h, r, w, y, Mi, H, 1e-6f, g_st); });
        const double tb = b2b_us([&](int) { add_rmsnorm(h, r, w, y, Mi, H, 1e-6f, g_st); });
        std::printf("%-40s %3d %10.1f   (back-to-back %.2f us)\n", "add_rmsnorm 5120", Mi, ta, tb);
        const double tr = median_us([&](int) { rmsnorm(h, w, y, Mi, H, 1e-6f, g_st); });
        std::printf("%-40s %3d %10.1f\n", "rmsnorm 5120", Mi, tr);
      }
      for (void* ptr : {(void*)h, (void*)r, (void*)w, (void*)y}) cudaFree(ptr);
    }
    {
      const int V = 248320;
      float* logits = static_cast<float*>(dmalloc(static_cast<size_t>(16) * V * 4));
      int32_t* ids = static_cast<int32_t*>(dmalloc(16 * 64 * 4));
      float* vals = static_cast<float*>(dmalloc(16 * 64 * 4));
      void* scr = dmalloc(std::max(argmax_scratch_bytes(16, V), topk_scratch_bytes(16, V, 64)) + 256);
      fill_random(logits, static_cast<size_t>(16) * V, DType::F32, 9, 10.0f, g_st);
      for (int Mi : {1, 8}) {
        const double ta = median_us([&](int) { argmax_rows(logits, Mi, V, ids, scr, g_st); });
        std::printf("%-40s %3d %10.1f\n", "argmax_rows 248320", Mi, ta);
        const double tk = median_us([&](int) { topk_rows(logits, Mi, V, 16, vals, ids, scr, g_st); });
        std::printf("%-40s %3d %10.1f\n", "topk_rows 248320 k=16", Mi, tk);
      }
      for (void* ptr : {(void*)logits, (void*)ids, (void*)vals, scr}) cudaFree(ptr);
    }

    std::printf("\n==== summary: copy %.0f GB/s, read %.0f GB/s ====\n", ce.copy_gbs, ce.read_gbs);
    std::printf("%-24s %3s %4s %10s %9s %7s %8s %11s %9s\n", "matmul", "M", "ks", "time_us", "GB/s", "%copy", "xM=1",
                "cublas_us", "cub_GB/s");
    for (const auto& l : summary) std::printf("%s\n", l.c_str());
    if (cb) cublasDestroy(cb);
    QF_CUDA_CHECK(cudaStreamSynchronize(g_st));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "qflash_gemv_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
