// The prefill GEMM's host side (gemm.h): the route per weight shape, cuBLASLt with one pinned
// configuration per shape, scratch buffers.
#include "backend/cuda/gemm.h"

#include <cublasLt.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backend/cuda/cuda_util.h"
#include "backend/cuda/kernels.h"

namespace qf::cuda {

namespace {

// The row count the configuration is chosen for: a typical prefill chunk (the runtime's default
// is 4096 rows; docs/DESIGN.md "Prefill path"). Only the choice depends on it, never a result.
constexpr int kRefM = 4096;

void lt_check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) backend_fail("cuda gemm: %s failed (cublasStatus %d)", what, static_cast<int>(s));
}

bool env_is(const char* name, const char* value) {
  const char* e = std::getenv(name);
  return e && std::strcmp(e, value) == 0;
}

// QFLASH_GEMM: lt (default) or simt (the CUDA-core kernel everywhere). A third route, our own
// mma.sync GEMM on the tiled weights, was measured and rejected (docs/experiments/prefill_kernels.md).
enum class Route { Lt, Simt };
Route route_from_env() {
  static const Route r = [] {
    const char* e = std::getenv("QFLASH_GEMM");
    if (!e || !*e || std::strcmp(e, "lt") == 0) return Route::Lt;
    if (std::strcmp(e, "simt") == 0) return Route::Simt;
    std::fprintf(stderr, "qflash: warning: QFLASH_GEMM=%s is not a route (lt, simt); using lt\n", e);
    return Route::Lt;
  }();
  return r;
}
bool simt_forced() { return route_from_env() == Route::Simt; }

// QFLASH_GEMM_Q4=gemv: int4 weights leave the runner (the int4 GEMV in 32-token passes; A/B only).
bool q4_gemv_forced() {
  static const bool on = env_is("QFLASH_GEMM_Q4", "gemv");
  return on;
}


uint32_t algo_u32(const cublasLtMatmulAlgo_t& a, cublasLtMatmulAlgoConfigAttributes_t attr) {
  uint32_t v = 0;
  size_t got = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&a, attr, &v, sizeof(v), &got) != CUBLAS_STATUS_SUCCESS) return 0xffffffffu;
  return v;
}

// RAII for a matrix layout created per call.
struct Layout {
  cublasLtMatrixLayout_t l = nullptr;
  Layout(cudaDataType t, uint64_t rows, uint64_t cols, int64_t ld) {
    lt_check(cublasLtMatrixLayoutCreate(&l, t, rows, cols, ld), "cublasLtMatrixLayoutCreate");
  }
  ~Layout() {
    if (l) cublasLtMatrixLayoutDestroy(l);
  }
  Layout(const Layout&) = delete;
  Layout& operator=(const Layout&) = delete;
};

}  // namespace

// cuBLAS is column-major: with W row-major [N, K] = column-major K x N (op T) and x row-major
// [M, K] = column-major K x M (op N), D = W^T' x is column-major N x M, i.e. y row-major [M, N].
struct GemmRunner::Plan {
  int64_t N = 0, K = 0;
  bool lt = false;              // false: gemm_simt
  std::string why;              // the route's reason, for describe()
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatmulAlgo_t algo{};
  std::map<int, size_t> checked;  // M values cublasLtMatmulAlgoCheck accepted -> workspace bytes
  ~Plan() {
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

GemmRunner::GemmRunner() = default;

GemmRunner::~GemmRunner() {
  plans_.clear();
  if (lt_) cublasLtDestroy(static_cast<cublasLtHandle_t>(lt_));
  for (void* p : {xb_, wt_, yt_, xr_, ws_})
    if (p) cudaFree(p);
  for (auto& [data, c] : copies_) cudaFree(c.first);
}

namespace {
// QFLASH_PREFILL_WEIGHTS (read once): untile | auto (the default) | keep; see gemm.h.
enum class CopyMode { Untile, Auto, Keep };
CopyMode copy_mode() {
  static const CopyMode m = [] {
    const char* e = std::getenv("QFLASH_PREFILL_WEIGHTS");
    if (!e || !*e || std::strcmp(e, "auto") == 0) return CopyMode::Auto;
    if (std::strcmp(e, "keep") == 0) return CopyMode::Keep;
    if (std::strcmp(e, "untile") == 0) return CopyMode::Untile;
    std::fprintf(stderr, "qflash: warning: QFLASH_PREFILL_WEIGHTS=%s unknown (auto | keep | untile); using auto\n", e);
    return CopyMode::Auto;
  }();
  return m;
}
}  // namespace

// The row-major copy of a tiled bf16 matrix, made here at its first call when the mode and the
// budget allow (nullptr: the caller untiles into scratch, as always). A failed allocation under
// auto is not an error: that call and later ones untile.
const void* GemmRunner::kept_copy(const WeightRef& W, cudaStream_t st) {
  const CopyMode mode = copy_mode();
  if (mode == CopyMode::Untile) return nullptr;
  const auto it = copies_.find(W.data);
  if (it != copies_.end()) return it->second.first;
  const size_t bytes = static_cast<size_t>(W.rows) * W.cols * 2;
  if (mode == CopyMode::Auto && copy_bytes_ + bytes > copy_budget_) return nullptr;
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(st, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone) return nullptr;
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    if (mode == CopyMode::Keep)
      backend_fail("cuda gemm: QFLASH_PREFILL_WEIGHTS=keep: no device memory for the row-major copy of a %lld x %lld "
                   "matrix (%zu bytes; %zu bytes of copies kept so far): %s; use auto or untile",
                   (long long)W.rows, (long long)W.cols, bytes, copy_bytes_, cudaGetErrorString(e));
    return nullptr;
  }
  if (W.dtype == DType::U32)
    q4_dequant_bf16(W, p, st);
  else
    gemm_untile(W.data, p, W.rows, W.cols, st);
  copies_.emplace(W.data, std::make_pair(p, bytes));
  copy_bytes_ += bytes;
  return p;
}

void GemmRunner::forget(const void* data) {
  const auto it = copies_.find(data);
  if (it == copies_.end()) return;
  const cudaError_t e = cudaFree(it->second.first);
  if (e != cudaSuccess) {
    cudaGetLastError();
    std::fprintf(stderr, "qflash: warning: cudaFree of a prefill weight copy failed: %s\n", cudaGetErrorString(e));
  }
  copy_bytes_ -= it->second.second;
  copies_.erase(it);
}

void* GemmRunner::grow(void*& p, size_t& have, size_t need, cudaStream_t st) {
  if (need <= have) return p;
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(st, &cs) == cudaSuccess && cs != cudaStreamCaptureStatusNone)
    backend_fail("cuda gemm: a scratch buffer must grow (%zu -> %zu bytes) during graph capture", have, need);
  QF_CUDA_CHECK(cudaStreamSynchronize(st));  // queued work may still use the old buffer
  if (p) QF_CUDA_CHECK(cudaFree(p));
  p = nullptr;
  have = 0;
  const size_t want = need + need / 8 + 256;
  const cudaError_t e = cudaMalloc(&p, want);
  if (e != cudaSuccess) {
    cudaGetLastError();
    p = nullptr;
    backend_fail("cuda gemm: out of device memory for a %.1f MB scratch buffer (%s)", want / 1e6, cudaGetErrorName(e));
  }
  have = want;
  return p;
}

GemmRunner::Plan& GemmRunner::plan_for(int64_t N, int64_t K) {
  auto key = std::make_pair(N, K);
  auto it = plans_.find(key);
  if (it != plans_.end()) return *it->second;
  auto pl = std::make_unique<Plan>();
  Plan& p = *pl;
  p.N = N;
  p.K = K;
  if (simt_forced()) {
    p.why = "QFLASH_GEMM=simt";
  } else if (K % 8 != 0 || N % 4 != 0) {
    p.why = "K % 8 or N % 4 not 0 (rows not 16-byte aligned)";
  } else {
    if (!lt_) {
      cublasLtHandle_t h = nullptr;
      lt_check(cublasLtCreate(&h), "cublasLtCreate");
      lt_ = h;
    }
    cublasLtHandle_t h = static_cast<cublasLtHandle_t>(lt_);
    lt_check(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    lt_check(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "set TRANSA");
    lt_check(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), "set TRANSB");
    Layout a(CUDA_R_16BF, K, N, K), b(CUDA_R_16BF, K, kRefM, K), d(CUDA_R_32F, N, kRefM, N);
    cublasLtMatmulPreference_t pref = nullptr;
    lt_check(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    // No workspace: configurations that split K (or fix up partial tiles) need one. (Offering
    // 64 MB changes nothing: the heuristic's first answer is the same configuration on every 27B
    // shape; docs/experiments/prefill_kernels.md.)
    const uint64_t ws = 0;
    const uint32_t align = 16;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
    for (auto at : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      cublasLtMatmulPreferenceSetAttribute(pref, at, &align, sizeof(align));
    std::vector<cublasLtMatmulHeuristicResult_t> res(16);
    int n = 0;
    const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(h, p.op, a.l, b.l, d.l, d.l, pref,
                                                            static_cast<int>(res.size()), res.data(), &n);
    cublasLtMatmulPreferenceDestroy(pref);
    for (int i = 0; s == CUBLAS_STATUS_SUCCESS && i < n && !p.lt; i++) {
      if (res[i].state != CUBLAS_STATUS_SUCCESS || res[i].workspaceSize != 0) continue;
      const uint32_t splitk = algo_u32(res[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM);
      const uint32_t red = algo_u32(res[i].algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME);
      if (splitk > 1 || red != CUBLASLT_REDUCTION_SCHEME_NONE) continue;
      p.algo = res[i].algo;
      p.lt = true;
      p.why = fmt_str("cuBLASLt algo %u tile %u stages %u swizzle %u custom %u inner %u cluster %u (heuristic #%d of %d)",
                      algo_u32(p.algo, CUBLASLT_ALGO_CONFIG_ID), algo_u32(p.algo, CUBLASLT_ALGO_CONFIG_TILE_ID),
                      algo_u32(p.algo, CUBLASLT_ALGO_CONFIG_STAGES_ID),
                      algo_u32(p.algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
                      algo_u32(p.algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION),
                      algo_u32(p.algo, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID),
                      algo_u32(p.algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID), i, n);
    }
    if (!p.lt) {
      p.why = fmt_str("no cuBLASLt configuration without split-K and workspace (heuristic status %d, %d results)",
                      static_cast<int>(s), n);
      cublasLtMatmulDescDestroy(p.op);
      p.op = nullptr;
    }
  }
  if (env_is("QFLASH_GEMM_LOG", "1"))
    std::fprintf(stderr, "qflash: gemm %lld x %lld: %s\n", (long long)N, (long long)K, p.why.c_str());
  return *plans_.emplace(key, std::move(pl)).first->second;
}

bool GemmRunner::takes(const WeightRef& W) {
  if (W.dtype == DType::BF16) return true;
  return W.dtype == DType::U32 && !q4_gemv_forced() &&
         (W.layout == WeightRef::kTcQ4 || (W.layout == WeightRef::kRowMajor && W.scales && W.biases));
}

bool GemmRunner::run(const WeightRef& W, const float* x, float* y, int M, cudaStream_t st, const float** xr) {
  if (M <= 0) return true;
  if (!W.data || W.rows <= 0 || W.cols <= 0) backend_fail("cuda gemm: empty weight");
  const int64_t K = W.cols;
  const size_t nx = static_cast<size_t>(M) * K;
  if (!takes(W)) {
    float* r = static_cast<float*>(grow(xr_, xr_bytes_, nx * 4, st));
    gemm_round_f32(x, r, nx, st);
    *xr = r;
    return false;
  }
  uint16_t* xb = static_cast<uint16_t*>(grow(xb_, xb_bytes_, nx * 2, st));
  gemm_to_bf16(x, xb, nx, st);
  run_bf16(W, xb, y, M, st);
  return true;
}

void GemmRunner::run_group(const WeightRef* const* Ws, float* const* ys, int n, const float* x, int M,
                           cudaStream_t st) {
  if (M <= 0 || n <= 0) return;
  const int64_t K = Ws[0]->cols;
  for (int i = 0; i < n; i++) {
    if (!Ws[i]->data || Ws[i]->rows <= 0 || Ws[i]->cols != K || !takes(*Ws[i]))
      backend_fail("cuda gemm group: weight %d of %d is not a bf16 or int4 [*, %lld] matrix", i, n, (long long)K);
  }
  const size_t nx = static_cast<size_t>(M) * K;
  uint16_t* xb = static_cast<uint16_t*>(grow(xb_, xb_bytes_, nx * 2, st));
  gemm_to_bf16(x, xb, nx, st);  // once for the group: every weight reads the same rounded rows
  for (int i = 0; i < n; i++) run_bf16(*Ws[i], xb, ys[i], M, st);
}

void GemmRunner::run_bf16(const WeightRef& W, const uint16_t* xb, float* y, int M, cudaStream_t st) {
  const int64_t N = W.rows, K = W.cols;
  if (!takes(W)) backend_fail("cuda gemm: a %s weight (layout %d) is not for the bf16 route", dtype_name(W.dtype), W.layout);
  Plan& p = plan_for(N, K);
  const void* w = W.data;
  bool kept = false;
  if (W.dtype == DType::U32 && (w = kept_copy(W, st)) != nullptr) {
    kept = true;  // the bf16 matrix dequantized by an earlier call (or this one) and kept
  } else if (W.dtype == DType::U32) {
    void* t = grow(wt_, wt_bytes_, static_cast<size_t>(N) * K * 2, st);
    q4_dequant_bf16(W, t, st);
    w = t;
  }
  if (!p.lt) {
    WeightRef rm = W;
    if (W.dtype == DType::U32) {
      rm.dtype = DType::BF16;
      rm.layout = WeightRef::kRowMajor;
      rm.data = w;
      rm.scales = rm.biases = nullptr;
    }
    gemm_simt(rm, xb, y, M, st);
    return;
  }
  if (W.dtype == DType::U32) {
    // w is the dequantized matrix
  } else if (W.layout == WeightRef::kTc32x64 && (w = kept_copy(W, st)) != nullptr) {
    kept = true;  // the row-major copy kept from an earlier call (or made by this one)
  } else if (W.layout == WeightRef::kTc32x64) {
    void* t = grow(wt_, wt_bytes_, static_cast<size_t>(N) * K * 2, st);
    gemm_untile(W.data, t, N, K, st);
    w = t;
  } else if (reinterpret_cast<uintptr_t>(w) & 15) {
    backend_fail("cuda gemm: weight data not 16-byte aligned");
  }
  float* yd = y;
  const bool stage_y = (reinterpret_cast<uintptr_t>(y) & 15) != 0;
  if (stage_y) yd = static_cast<float*>(grow(yt_, yt_bytes_, static_cast<size_t>(M) * N * 4, st));

  cublasLtHandle_t h = static_cast<cublasLtHandle_t>(lt_);
  Layout a(CUDA_R_16BF, K, N, K), b(CUDA_R_16BF, K, M, K), d(CUDA_R_32F, N, M, N);
  auto seen = p.checked.find(M);
  if (seen == p.checked.end()) {
    cublasLtMatmulHeuristicResult_t r{};
    const cublasStatus_t s = cublasLtMatmulAlgoCheck(h, p.op, a.l, b.l, d.l, d.l, &p.algo, &r);
    // Another configuration for this M would change the bits of every row: refuse instead. The
    // pinned one has no split-K and no reduction scheme, yet at large M it can ask for a few bytes
    // of workspace (seen on the H200: 4 bytes at M = 1024 and 4096, a tile scheduler's counter);
    // that is given, bounded. Row invariance with it is what CudaGemm.RowInvariantOnPrefillShapes checks.
    constexpr size_t kMaxWorkspace = size_t(1) << 20;
    if (s != CUBLAS_STATUS_SUCCESS || r.workspaceSize > kMaxWorkspace)
      backend_fail("cuda gemm: the cuBLASLt configuration pinned for %lld x %lld does not run M = %d (status %d, "
                   "workspace %zu bytes, at most %zu allowed); QFLASH_GEMM=simt avoids cuBLASLt",
                   (long long)N, (long long)K, M, static_cast<int>(s), r.workspaceSize, kMaxWorkspace);
    seen = p.checked.emplace(M, r.workspaceSize).first;
  }
  void* ws = nullptr;
  if (seen->second) ws = grow(ws_, ws_bytes_, seen->second, st);
  const float alpha = 1.0f, beta = 0.0f;
  if (prof_on()) {
    prof_tag("%lld x %lld, M=%d%s", (long long)N, (long long)K, M,
             W.dtype == DType::U32 ? (kept ? ", int4 dequantized, kept" : ", int4 dequantized")
             : W.layout != WeightRef::kTc32x64 ? ""
             : kept                            ? ", kept copy"
                                               : ", untiled");
    prof_before(st);
  }
  lt_check(cublasLtMatmul(h, p.op, &alpha, w, a.l, xb, b.l, &beta, yd, d.l, yd, d.l, &p.algo, ws, seen->second, st),
           "cublasLtMatmul");
  if (prof_on()) prof_after(gemm_lt_marker(), 0, 0, st);
  if (stage_y)
    QF_CUDA_CHECK(cudaMemcpyAsync(y, yd, static_cast<size_t>(M) * N * 4, cudaMemcpyDeviceToDevice, st));
}

std::string GemmRunner::describe() const {
  std::string s;
  for (const auto& [k, p] : plans_)
    s += fmt_str("%lld x %lld: %s\n", (long long)k.first, (long long)k.second, p->why.c_str());
  return s;
}

}  // namespace qf::cuda
