// qflash_gemv_bench: bandwidth of the CUDA backend's multi-row GEMV against the device's copy
// ceiling (and cuBLAS), plus the per-layer costs of attention and the GDN recurrence.
// Not a test: run it on the H200 (tools/device/gpu_check.sh does). Usage:
//   qflash_gemv_bench [--quick | --sweep] [--no-cublas] [--reps N]
// --sweep: fixed cost per launch and streaming rate of back-to-back M = 1 calls over a range of
// sizes, against a plain streaming read.
// Weights are rotated over several buffers whose total exceeds the L2 several times, so the
// numbers are HBM numbers; times are medians of CUDA-event-timed launches after warm-up.
// It times what the backend runs; schedule experiments are in the kernel lab (lab_gemv_*.cu).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_util.cuh"

using namespace qf;
using namespace qf::cuda;
using namespace qf::bench;

namespace {

#define CUBLAS_OK(x)                                                                 \
  do {                                                                               \
    cublasStatus_t s_ = (x);                                                         \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                               \
      std::fprintf(stderr, "%s:%d: %s failed: status %d\n", __FILE__, __LINE__, #x, (int)s_); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

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
    Ceil ce;
    if (!bench_init("qflash_gemv_bench", &ce)) return 1;

    if (sweep) {
      // Fixed cost per launch: back-to-back calls (rotating buffers, several times the L2) of a
      // plain streaming read and of the M = 1 GEMV in each weight layout, over a range of sizes;
      // a least-squares line t = a + bytes / b per column gives the fixed cost a and the rate b.
      // (The kernel lab's --sweep does the same for every schedule it keeps.)
      unsigned* sink = static_cast<unsigned*>(dmalloc(4));
      float* x = static_cast<float*>(dmalloc(size_t(16) * 32768 * 4));
      float* y = static_cast<float*>(dmalloc(size_t(16) * 262144 * 4));
      fill_random(x, size_t(16) * 32768, DType::F32, 99, 1.0f, g_st);
      std::printf("%-14s %8s %9s %9s %11s %6s %11s %6s\n", "sweep rows x cols", "MB", "read_us", "read_GB/s", "row_us",
                  "GB/s", "tiled_us", "GB/s");
      std::vector<double> xs, tr, tg[2];
      for (const Sz& z : sweep_sizes()) {
        Mat m = make_mat(DType::BF16, z.rows, z.cols);
        std::vector<WeightRef> tw = tiled_copies(m);
        const int nb = static_cast<int>(m.w.size());
        const double r = b2b_us([&](int i) { read_launch(m.w[i % nb].data, m.bytes, sink); });
        std::printf("%6lldx%-7lld %8.1f %9.2f %9.0f", (long long)z.rows, (long long)z.cols, m.bytes / 1e6, r,
                    m.bytes / (r * 1e-6) / 1e9);
        xs.push_back(static_cast<double>(m.bytes));
        tr.push_back(r);
        for (int t = 0; t < 2; t++) {  // row-major, then the tiled layout (WeightRef::kTc32x64)
          const double us = b2b_us([&](int i) { gemv(t ? tw[i % nb] : m.w[i % nb], x, static_cast<int>(z.cols), y, 1, gemv_scratch(), g_st); });
          tg[t].push_back(us);
          std::printf(" %11.2f %6.0f", us, m.bytes / (us * 1e-6) / 1e9);
        }
        std::printf("\n");
        free_mat(m);
      }
      print_fit(xs, tr, "read");
      print_fit(xs, tg[0], "gemv row-major");
      print_fit(xs, tg[1], "gemv tiled");
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
                                 {"int4 g64 5120x17408", DType::U32, 5120, 17408},
                                 {"dflash2 conv 1280x5120", DType::BF16, 1280, 5120},
                                 {"selector 256x5120", DType::BF16, 256, 5120}};
    if (quick) shapes.erase(shapes.begin() + 7, shapes.begin() + 10);  // keeps the drafter's small grids
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
        const double t = median_us([&](int i) { gemv(m.w[i % nb], x, static_cast<int>(s.cols), y, M, gemv_scratch(), g_st); });
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
      // the same weights in the tensor-core GEMV's tiled layout, as the backend loads them
      if (s.dt == DType::BF16 && gemv_tc_enabled() && gemv_tc_eligible(m.w[0])) {
        std::vector<WeightRef> tw = tiled_copies(m);
        std::printf("  tiled layout:");
        for (int M : Ms) {
          const double t = median_us([&](int i) { gemv(tw[i % nb], x, static_cast<int>(s.cols), y, M, gemv_scratch(), g_st); });
          std::printf(" M=%d %.0f GB/s (%.1f%%);", M, m.bytes / (t * 1e-6) / 1e9, 100.0 * m.bytes / (t * 1e-6) / 1e9 / ce.copy_gbs);
        }
        std::printf("\n");
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
      // Attention of one 27B layer (24 q heads, 4 kv heads x 256). Decode / verify: fp32 K/V takes
      // the per-(head, row, split) kernel, bf16 K/V the grouped one (one block per kv group and
      // split). Prefill: attention_prefill over a whole prompt of N rows (bf16 K/V).
      AttnParams p;
      p.n_heads = 24;
      p.n_kv_heads = 4;
      p.head_dim = 256;
      p.scale = 1.0f / 16.0f;
      p.causal = true;
      const int kvw = p.n_kv_heads * p.head_dim;
      for (int ctx : {64, 1024, 8192, 32768}) {
        const int M = 16;
        float* K = static_cast<float*>(dmalloc(static_cast<size_t>(ctx + M) * kvw * 4));
        float* V = static_cast<float*>(dmalloc(static_cast<size_t>(ctx + M) * kvw * 4));
        float* q = static_cast<float*>(dmalloc(static_cast<size_t>(M) * p.n_heads * p.head_dim * 4));
        float* o = static_cast<float*>(dmalloc(static_cast<size_t>(M) * p.n_heads * p.head_dim * 4));
        float* scr = static_cast<float*>(dmalloc(attention_scratch_floats(M, p.n_heads, p.head_dim) * 4));
        StepMeta* meta = static_cast<StepMeta*>(dmalloc(sizeof(StepMeta)));
        fill_random(q, static_cast<size_t>(M) * p.n_heads * p.head_dim, DType::F32, 8, 1.0f, g_st);
        for (DType dt : {DType::F32, DType::BF16}) {
          p.kv_dtype = dt;
          // bf16 K/V reuse the same buffers (the first half of their bytes)
          fill_random(K, static_cast<size_t>(ctx + M) * kvw, dt, 6, 1.0f, g_st);
          fill_random(V, static_cast<size_t>(ctx + M) * kvw, dt, 7, 1.0f, g_st);
          double t1 = 0;
          for (int Mi : {1, 8}) {
            StepMeta hm{ctx, 0, ctx + Mi, 0};
            QF_CUDA_CHECK(cudaMemcpy(meta, &hm, sizeof hm, cudaMemcpyHostToDevice));
            const double t = median_us([&](int) { attention(q, K, V, o, Mi, p, meta, scr, g_st); });
            if (Mi == 1) t1 = t;
            const double kv_bytes = 2.0 * ctx * kvw * (dt == DType::BF16 ? 2 : 4);
            char name[64];
            std::snprintf(name, sizeof name, "attention %s ctx %d", dt == DType::BF16 ? "bf16 grouped" : "f32 split", ctx);
            std::printf("%-40s %3d %10.1f   (K+V %.0f MB: %.0f GB/s%s)\n", name, Mi, t, kv_bytes / 1e6,
                        kv_bytes / (t * 1e-6) / 1e9, Mi == 8 ? (std::string(", verify/decode ") + std::to_string(t / t1)).c_str() : "");
          }
        }
        for (void* ptr : {(void*)K, (void*)V, (void*)q, (void*)o, (void*)scr, (void*)meta}) cudaFree(ptr);
      }
      p.kv_dtype = DType::BF16;
      for (int N : {2048, 8192}) {
        uint16_t* K = static_cast<uint16_t*>(dmalloc(static_cast<size_t>(N) * kvw * 2));
        uint16_t* V = static_cast<uint16_t*>(dmalloc(static_cast<size_t>(N) * kvw * 2));
        float* q = static_cast<float*>(dmalloc(static_cast<size_t>(N) * p.n_heads * p.head_dim * 4));
        float* o = static_cast<float*>(dmalloc(static_cast<size_t>(N) * p.n_heads * p.head_dim * 4));
        StepMeta* meta = static_cast<StepMeta*>(dmalloc(sizeof(StepMeta)));
        fill_random(K, static_cast<size_t>(N) * kvw, DType::BF16, 6, 1.0f, g_st);
        fill_random(V, static_cast<size_t>(N) * kvw, DType::BF16, 7, 1.0f, g_st);
        fill_random(q, static_cast<size_t>(N) * p.n_heads * p.head_dim, DType::F32, 8, 1.0f, g_st);
        StepMeta hm{0, 0, N, 0};
        QF_CUDA_CHECK(cudaMemcpy(meta, &hm, sizeof hm, cudaMemcpyHostToDevice));
        const double t = median_us([&](int) { attention_prefill(q, K, V, o, N, p, meta, g_st); });
        const double flop = 4.0 * p.n_heads * p.head_dim * (static_cast<double>(N) * N / 2);  // QK and PV, causal half
        char name[64];
        std::snprintf(name, sizeof name, "attention_prefill prompt %d", N);
        std::printf("%-40s %5d %10.1f   (%.0f TFLOP/s useful; x16 layers: %.1f ms)\n", name, N, t, flop / (t * 1e-6) / 1e12,
                    16 * t / 1e3);
        for (void* ptr : {(void*)K, (void*)V, (void*)q, (void*)o, (void*)meta}) cudaFree(ptr);
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
