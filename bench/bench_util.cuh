// Shared by the GEMV bench (cuda_gemv_bench.cu) and the kernel lab (lab_*.cu): event timing,
// the device's streaming ceilings, weights rotated over buffers larger than the L2, the CPU
// reference and the checks every lab version passes before it is timed.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/cuda_util.h"
#include "backend/cuda/kernels.h"

namespace qf::bench {

inline int g_reps = 30;
inline cudaStream_t g_st = nullptr;

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

namespace {
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
}  // namespace

inline void read_launch(const void* p, size_t bytes, unsigned* sink) {
  int sms = 0;
  QF_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  read_kernel<<<sms * 8, 512, 0, g_st>>>(static_cast<const uint4*>(p), bytes / 16, sink);
}

inline void* dmalloc(size_t bytes) {
  void* p = nullptr;
  QF_CUDA_CHECK(cudaMalloc(&p, bytes));
  return p;
}

// The tensor-core GEMV's split scratch (kernels.h), zero-filled once and shared by every call on
// g_st (each launch leaves it fit for the next).
inline void* gemv_scratch() {
  static void* p = [] {
    void* q = dmalloc(cuda::gemv_tc_scratch_bytes());
    QF_CUDA_CHECK(cudaMemset(q, 0, cuda::gemv_tc_scratch_bytes()));
    return q;
  }();
  return p;
}

struct Ceil {
  double copy_gbs = 0, read_gbs = 0;
};

inline Ceil ceilings() {
  const size_t bytes = size_t(2) << 30;
  void* a = dmalloc(bytes);
  void* b = dmalloc(bytes);
  unsigned* sink = static_cast<unsigned*>(dmalloc(4));
  cuda::fill_random(a, bytes / 4, DType::F32, 1, 1.0f, g_st);
  Ceil c;
  const double tc = median_us([&](int) { QF_CUDA_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, g_st)); });
  c.copy_gbs = 2.0 * bytes / (tc * 1e-6) / 1e9;
  const double tr = median_us([&](int) { read_launch(a, bytes, sink); });
  c.read_gbs = bytes / (tr * 1e-6) / 1e9;
  cudaFree(a);
  cudaFree(b);
  cudaFree(sink);
  return c;
}

// Device setup shared by the bench and the labs: device 0, one non-blocking stream; prints the
// device and the ceilings. Returns false (after a message) without a device.
inline bool bench_init(const char* prog, Ceil* ce) {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    std::fprintf(stderr, "%s: no CUDA device\n", prog);
    return false;
  }
  QF_CUDA_CHECK(cudaSetDevice(0));
  cudaDeviceProp prop;
  QF_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  QF_CUDA_CHECK(cudaStreamCreateWithFlags(&g_st, cudaStreamNonBlocking));
  std::printf("device: %s, sm_%d%d, %d SMs, L2 %.0f MB, %.0f GB; reps %d (median)\n", prop.name, prop.major,
              prop.minor, prop.multiProcessorCount, prop.l2CacheSize / 1e6, prop.totalGlobalMem / 1e9, g_reps);
  *ce = ceilings();
  std::printf("ceilings: device-to-device copy %.0f GB/s (read+write), streaming read %.0f GB/s\n\n", ce->copy_gbs,
              ce->read_gbs);
  return true;
}

// A weight in several rotating copies whose total exceeds the L2 several times, so that timed
// calls read HBM.
struct Mat {
  std::vector<WeightRef> w;  // rotating copies
  std::vector<void*> owned;
  size_t bytes = 0;          // bytes one call must read (weights + scales)
};

inline Mat make_mat(DType dt, int64_t rows, int64_t cols, int group = 64) {
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
      cuda::fill_random(q, nw, DType::F32, 10 + i, 1.0f, g_st);  // any bits are valid nibbles
      cuda::fill_random(s, ng, DType::BF16, 20 + i, 0.01f, g_st);
      cuda::fill_random(b, ng, DType::BF16, 30 + i, 0.01f, g_st);
      w.data = q;
      w.scales = s;
      w.biases = b;
      w.group = group;
      m.owned.insert(m.owned.end(), {q, s, b});
    } else {
      void* p = dmalloc(static_cast<size_t>(rows) * cols * 2);
      cuda::fill_random(p, static_cast<size_t>(rows) * cols, DType::BF16, 40 + i, 0.02f, g_st);
      w.data = p;
      m.owned.push_back(p);
    }
    m.w.push_back(w);
  }
  return m;
}

// The same weights in the tensor-core GEMV's tiled layout (WeightRef::kTc32x64), owned by `m`.
inline std::vector<WeightRef> tiled_copies(Mat& m) {
  std::vector<WeightRef> tw(m.w);
  for (WeightRef& w : tw) {
    void* p = dmalloc(cuda::gemv_tc_tiled_bytes(w.rows, w.cols));
    cuda::gemv_tc_relayout(w.data, p, w.rows, w.cols, g_st);
    w.data = p;
    w.layout = WeightRef::kTc32x64;
    m.owned.push_back(p);
  }
  return tw;
}

inline void free_mat(Mat& m) {
  for (void* p : m.owned) cudaFree(p);
  m.owned.clear();
}

// Least-squares line t = a + bytes / b over (bytes, us) points: a is the fixed cost per launch.
inline void print_fit(const std::vector<double>& xs, const std::vector<double>& t, const char* name) {
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
}

struct Sz {
  int64_t rows, cols;
};
// --sweep sizes: 10 MB .. 1.3 GB of bf16 weights.
inline const std::vector<Sz>& sweep_sizes() {
  static const std::vector<Sz> s = {{1024, 5120},  {2048, 5120},  {4096, 5120},  {5120, 6144},  {8192, 5120},
                                    {5120, 17408}, {16384, 5120}, {17408, 5120}, {34816, 5120}, {65536, 5120},
                                    {131072, 5120}};
  return s;
}

// ---- checks of the lab ------------------------------------------------------------------------

inline float bf16_to_float(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The rows the CPU reference checks: all of them up to 4096, else 2048 spread evenly plus the
// last 40 (the ragged end of the grid).
inline std::vector<int64_t> check_rows(int64_t rows) {
  std::vector<int64_t> r;
  if (rows <= 4096) {
    for (int64_t i = 0; i < rows; i++) r.push_back(i);
    return r;
  }
  for (int64_t i = 0; i < 2048; i++) r.push_back(i * (rows - 40) / 2048);
  for (int64_t i = rows - 40; i < rows; i++) r.push_back(i);
  return r;
}

// Straightforward double-precision reference of a row-major bf16 weight (downloaded once) for
// the checked rows: ref[m * rows.size() + k] = sum_c W[rows[k], c] * x[m, c].
struct CpuRef {
  std::vector<int64_t> rows;
  std::vector<double> y;
  int M = 0;
};

inline CpuRef cpu_ref(const WeightRef& W, const std::vector<float>& x, int M) {
  QF_CUDA_CHECK(cudaStreamSynchronize(g_st));  // W may still be being written on the stream
  CpuRef r;
  r.rows = check_rows(W.rows);
  r.M = M;
  std::vector<uint16_t> row(static_cast<size_t>(W.cols));
  r.y.assign(static_cast<size_t>(M) * r.rows.size(), 0.0);
  for (size_t k = 0; k < r.rows.size(); k++) {
    QF_CUDA_CHECK(cudaMemcpy(row.data(), static_cast<const uint16_t*>(W.data) + static_cast<size_t>(r.rows[k]) * W.cols,
                             row.size() * 2, cudaMemcpyDeviceToHost));
    for (int m = 0; m < M; m++) {
      double s = 0;
      for (int64_t c = 0; c < W.cols; c++) s += static_cast<double>(bf16_to_float(row[c])) * x[static_cast<size_t>(m) * W.cols + c];
      r.y[static_cast<size_t>(m) * r.rows.size() + k] = s;
    }
  }
  return r;
}

// got: [M, rows] downloaded after a call into a NaN-poisoned output. Every element must be
// finite (the call wrote it) and the checked rows within rel * max|ref| of the reference.
// Returns an empty string or what failed.
inline std::string check_against(const std::vector<float>& got, int64_t rows, const CpuRef& ref, double rel) {
  for (size_t i = 0; i < got.size(); i++)
    if (!std::isfinite(got[i]))
      return cuda::fmt_str("element %zu (row %lld, m %lld) not written or not finite", i, (long long)(i % rows),
                           (long long)(i / rows));
  double mx = 0, err = 0;
  for (double v : ref.y) mx = std::max(mx, std::fabs(v));
  for (int m = 0; m < ref.M; m++)
    for (size_t k = 0; k < ref.rows.size(); k++)
      err = std::max(err, std::fabs(got[static_cast<size_t>(m) * rows + ref.rows[k]] -
                                    ref.y[static_cast<size_t>(m) * ref.rows.size() + k]));
  if (!(err <= rel * mx)) return cuda::fmt_str("max error %.3g > %.1g x max|ref| %.3g", err, rel, mx);
  return "";
}

inline void poison(void* p, size_t bytes) { QF_CUDA_CHECK(cudaMemsetAsync(p, 0xff, bytes, g_st)); }

inline std::vector<float> download(const float* p, size_t n) {
  std::vector<float> h(n);
  QF_CUDA_CHECK(cudaStreamSynchronize(g_st));
  QF_CUDA_CHECK(cudaMemcpy(h.data(), p, n * 4, cudaMemcpyDeviceToHost));
  return h;
}

// Parses "1,8,16" (the --M option).
inline std::vector<int> parse_ints(const char* s) {
  std::vector<int> v;
  for (const char* p = s; *p;) {
    v.push_back(std::atoi(p));
    while (*p && *p != ',') p++;
    if (*p == ',') p++;
  }
  return v;
}

// The kernel labs' command line: [VERSION 1..nversions ...] [--quick] [--sweep] [--reps N] [--M a,b].
// Versions default to all; --sweep only where `sweep_ok`. Returns false (usage printed) on a bad one.
struct LabArgs {
  bool quick = false, sweep = false;
  std::vector<int> versions, Ms;
};
inline bool parse_lab_args(int argc, char** argv, int nversions, int max_m, bool sweep_ok, LabArgs& a) {
  const std::string ms_default = [&] {
    std::string s;
    for (int M : a.Ms) {
      if (!s.empty()) s.push_back(',');
      s.append(std::to_string(M));
    }
    return s;
  }();
  for (int i = 1; i < argc; i++) {
    if (!std::strcmp(argv[i], "--quick")) a.quick = true;
    else if (sweep_ok && !std::strcmp(argv[i], "--sweep")) a.sweep = true;
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) g_reps = std::max(5, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--M") && i + 1 < argc) a.Ms = parse_ints(argv[++i]);
    else if (std::atoi(argv[i]) >= 1 && std::atoi(argv[i]) <= nversions) a.versions.push_back(std::atoi(argv[i]));
    else {
      std::fprintf(stderr, "usage: %s [VERSION 1..%d ...] [--quick]%s [--reps N] [--M %s]\n", argv[0], nversions,
                   sweep_ok ? " [--sweep]" : "", ms_default.c_str());
      return false;
    }
  }
  for (int M : a.Ms)
    if (M < 1 || M > max_m) {
      std::fprintf(stderr, "%s: --M values must be 1..%d (found %d)\n", argv[0], max_m, M);
      return false;
    }
  return true;
}

// One checked call of a lab version: outputs ys[i] ([M, rows[i]]) poisoned, run(), then downloaded.
template <class Run>
std::vector<std::vector<float>> poisoned_call(const std::vector<float*>& ys, const std::vector<int64_t>& rows, int M,
                                              Run&& run) {
  for (size_t i = 0; i < ys.size(); i++) poison(ys[i], static_cast<size_t>(M) * rows[i] * 4);
  run();
  std::vector<std::vector<float>> out(ys.size());
  for (size_t i = 0; i < ys.size(); i++) out[i] = download(ys[i], static_cast<size_t>(M) * rows[i]);
  return out;
}

}  // namespace qf::bench
