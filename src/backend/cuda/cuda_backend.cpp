// The CUDA backend: qf::Backend on one NVIDIA GPU (built for Hopper, sm_90a). Memory is plain
// cudaMalloc (zero-filled), every op is enqueued on one stream owned by the backend, and only
// download() and sync() wait for the device. Kernels live in the .cu files beside this one
// (kernels.h lists them); docs/experiments/cuda_kernels.md describes their design.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <utility>

#include "backend/backend.h"
#include "backend/cuda/cuda_util.h"
#include "backend/cuda/kernels.h"

#ifndef QFLASH_CUDA_ARCHS_STR
#define QFLASH_CUDA_ARCHS_STR "90a"
#endif

namespace qf {

namespace {

using namespace qf::cuda;

constexpr size_t kStageBytes = size_t(32) << 20;  // two pinned staging buffers for weight uploads

struct Scratch {
  void* p = nullptr;
  size_t bytes = 0;
};

bool overlaps(const void* a, const void* b, size_t n) {
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + n && y < x + n;
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int dev) : dev_(dev) {
    QF_CUDA_CHECK(cudaSetDevice(dev_));
    cudaDeviceProp prop;
    QF_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev_));
    size_t free_b = 0, total_b = 0;
    QF_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    name_ = fmt_str("cuda:%d (%s, sm_%d%d, %.0f GB)", dev_, prop.name, prop.major, prop.minor, total_b / 1e9);
    QF_CUDA_CHECK(cudaStreamCreateWithFlags(&st_, cudaStreamNonBlocking));
    // Device-side error record: mapped pinned host memory when available (read without a copy).
    void* h = nullptr;
    if (cudaHostAlloc(&h, sizeof(DevError), cudaHostAllocMapped) == cudaSuccess) {
      void* d = nullptr;
      if (cudaHostGetDevicePointer(&d, h, 0) == cudaSuccess) {
        err_host_ = static_cast<DevError*>(h);
        err_dev_ = static_cast<DevError*>(d);
        std::memset(h, 0, sizeof(DevError));
      } else {
        cudaFreeHost(h);
      }
    }
    cudaGetLastError();  // clear a failed mapped allocation, if any
    if (!err_dev_) {
      void* d = nullptr;
      QF_CUDA_CHECK(cudaMalloc(&d, sizeof(DevError)));
      QF_CUDA_CHECK(cudaMemset(d, 0, sizeof(DevError)));
      err_dev_ = static_cast<DevError*>(d);
    }
    // The kernels must exist for this device (a binary built for sm_90a runs on CC 9.0 only).
    const cudaError_t pe = probe_launch(st_);
    if (pe != cudaSuccess) {
      cudaGetLastError();
      backend_fail("the CUDA kernels of this build (architectures %s) cannot run on %s (sm_%d%d): %s (%s)",
                   QFLASH_CUDA_ARCHS_STR, prop.name, prop.major, prop.minor, cudaGetErrorName(pe),
                   cudaGetErrorString(pe));
    }
    gemv_scratch_create(gsc_);
  }

  ~CudaBackend() override {
    if (st_) cudaStreamSynchronize(st_);
    for (Scratch* s : {&xs_, &attn_, &gdn_, &argmax_, &topk_, &move_})
      if (s->p) cudaFree(s->p);
    gemv_scratch_destroy(gsc_);
    for (int i = 0; i < 2; i++) {
      if (stage_[i]) cudaFreeHost(stage_[i]);
      if (stage_ev_[i]) cudaEventDestroy(stage_ev_[i]);
    }
    for (cudaEvent_t e : ring_ev_)
      if (e) cudaEventDestroy(e);
    if (ring_) cudaFreeHost(ring_);
    if (err_host_) cudaFreeHost(err_host_);
    else if (err_dev_) cudaFree(err_dev_);
    if (st_) cudaStreamDestroy(st_);
  }

  std::string name() const override { return name_; }
  bool is_gpu() const override { return true; }

  // ---- memory ------------------------------------------------------------------------------
  void* alloc(size_t bytes) override {
    void* p = raw_alloc(bytes, "alloc");
    if (p) QF_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, st_));
    return p;
  }
  void release(void* p) override { free_noexcept(p); }
  void upload(void* dst, const void* src, size_t bytes) override {
    if (!bytes) return;
    // Small uploads (token ids, StepMeta) go through a ring of pinned slots: the host copies
    // into the slot and returns without waiting for the device, so it can keep enqueueing.
    if (bytes <= kRingSlotBytes && ensure_ring()) {
      const int i = ring_next_;
      ring_next_ = (ring_next_ + 1) % kRingSlots;
      QF_CUDA_CHECK(cudaEventSynchronize(ring_ev_[i]));  // the slot's previous copy has run
      char* slot = static_cast<char*>(ring_) + static_cast<size_t>(i) * kRingSlotBytes;
      std::memcpy(slot, src, bytes);
      QF_CUDA_CHECK(cudaMemcpyAsync(dst, slot, bytes, cudaMemcpyHostToDevice, st_));
      QF_CUDA_CHECK(cudaEventRecord(ring_ev_[i], st_));
      return;
    }
    // Larger uploads go through the pinned staging pair: the host buffer has been read when this
    // returns (the caller's buffer may die at once: f32_tensor's vector, a test's poison). The
    // runtime only says a pageable cudaMemcpyAsync "might be synchronous", so it is never relied on.
    h2d_staged(dst, src, bytes);
  }
  void download(void* dst, const void* src, size_t bytes) override {
    if (bytes) QF_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, st_));
    sync();
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (!bytes || dst == src) return;
    if (overlaps(dst, src, bytes)) {  // memmove semantics: go through a scratch buffer
      void* t = ensure(move_, bytes);
      QF_CUDA_CHECK(cudaMemcpyAsync(t, src, bytes, cudaMemcpyDeviceToDevice, st_));
      QF_CUDA_CHECK(cudaMemcpyAsync(dst, t, bytes, cudaMemcpyDeviceToDevice, st_));
    } else {
      QF_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, st_));
    }
  }
  void fill_zero(void* dst, size_t bytes) override {
    if (bytes) QF_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, st_));
  }
  void sync() override {
    QF_CUDA_CHECK(cudaStreamSynchronize(st_));
    check_device_errors();
  }
  const void* import_weight(const void* host, size_t bytes) override {
    void* d = raw_alloc(bytes, "import_weight");
    if (!d) return d;
    upload(d, host, bytes);  // ring (small) or the double-buffered pinned staging (large)
    return d;
  }
  void release_weight(const void* p) override { free_noexcept(const_cast<void*>(p)); }
  // bf16 matrices the tensor-core GEMV reads get its tiled layout (kernels.h, gemv_tc_relayout):
  // one contiguous stream per warp. QFLASH_TC_LAYOUT=row keeps them row-major (A/B runs); so does
  // a copy that does not fit next to the original (a warning, once).
  const void* relayout_matrix(const WeightRef& w, uint8_t* layout) override {
    static const bool off = [] {
      const char* e = std::getenv("QFLASH_TC_LAYOUT");
      return e && std::strcmp(e, "row") == 0;
    }();
    if (off || w.layout != WeightRef::kRowMajor || !cuda::gemv_tc_enabled() || !cuda::gemv_tc_eligible(w)) return nullptr;
    const size_t bytes = cuda::gemv_tc_tiled_bytes(w.rows, w.cols);
    void* d = nullptr;
    if (cudaMalloc(&d, bytes) != cudaSuccess) {
      cudaGetLastError();
      static bool warned = false;
      if (!warned)
        std::fprintf(stderr, "qflash: warning: no room for the GEMV layout of a %lld x %lld matrix (%.1f MB); keeping "
                             "row-major weights where it does not fit\n", (long long)w.rows, (long long)w.cols, bytes / 1e6);
      warned = true;
      return nullptr;
    }
    cuda::gemv_tc_relayout(w.data, d, w.rows, w.cols, st_);
    QF_CUDA_CHECK(cudaStreamSynchronize(st_));  // the caller frees the original next
    *layout = WeightRef::kTc32x64;
    return d;
  }
  void fill_random(void* dst, size_t n, DType dt, uint64_t seed, float scale) override {
    cuda::fill_random(dst, n, dt, seed, scale, st_);
  }
  size_t memory_used() const override {
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return total_b - free_b;
  }
  size_t memory_free(size_t* total) const override {
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
      cudaGetLastError();
      free_b = total_b = 0;
    }
    if (total) *total = total_b;
    return free_b;
  }

  // ---- CUDA graphs -------------------------------------------------------------------------
  bool graphs_enabled() const override { return graphs_on_ && !profiling_; }
  void profile_begin() override {
    QF_CUDA_CHECK(cudaStreamSynchronize(st_));
    profiling_ = true;
    cuda::prof_set(true);
  }
  std::string profile_end(int iters) override {
    QF_CUDA_CHECK(cudaStreamSynchronize(st_));
    cuda::prof_set(false);
    profiling_ = false;
    return cuda::prof_report(iters);
  }
  uint64_t graph_epoch() const override { return epoch_; }
  void capture_begin() override {
    QF_CUDA_CHECK(cudaStreamBeginCapture(st_, cudaStreamCaptureModeThreadLocal));
    capturing_ = true;
  }
  void* capture_end() override {
    capturing_ = false;
    cudaGraph_t g = nullptr;
    QF_CUDA_CHECK(cudaStreamEndCapture(st_, &g));
    cudaGraphExec_t ex = nullptr;
    const cudaError_t e = cudaGraphInstantiate(&ex, g, 0);
    cudaGraphDestroy(g);
    if (e != cudaSuccess) {
      cudaGetLastError();
      std::fprintf(stderr, "qflash: warning: CUDA graph instantiation failed (%s); running ops directly\n",
                   cudaGetErrorName(e));
      return nullptr;
    }
    return ex;
  }
  void capture_abort() override {
    if (!capturing_) return;
    capturing_ = false;
    cudaGraph_t g = nullptr;
    cudaStreamEndCapture(st_, &g);
    if (g) cudaGraphDestroy(g);
    cudaGetLastError();
  }
  void graph_launch(void* g) override { QF_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(g), st_)); }
  void graph_destroy(void* g) override {
    if (g) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(g));
  }

  // ---- dense ops ---------------------------------------------------------------------------
  void matmul(const WeightRef& W, const float* x, float* y, int M) override {
    if (M <= 0) return;
    if ((reinterpret_cast<uintptr_t>(x) & 15) == 0 && W.cols % 4 == 0) {
      gemv(W, x, static_cast<int>(W.cols), y, M, st_, &gsc_);
      return;
    }
    // The kernel reads activations as 16-byte vectors: restage x with a padded row stride.
    const int ld = static_cast<int>((W.cols + 3) / 4 * 4);
    float* t = static_cast<float*>(ensure(xs_, static_cast<size_t>(M) * ld * sizeof(float)));
    QF_CUDA_CHECK(cudaMemcpy2DAsync(t, ld * sizeof(float), x, W.cols * sizeof(float), W.cols * sizeof(float), M,
                                    cudaMemcpyDeviceToDevice, st_));
    gemv(W, t, ld, y, M, st_, &gsc_);
  }
  void matmul_group(const WeightRef* const* Ws, float* const* ys, int n, const float* x, int M) override {
    if (M <= 0 || n <= 0) return;
    bool fused = n <= 4 && gemv_tc_enabled() && (reinterpret_cast<uintptr_t>(x) & 15) == 0;
    for (int i = 0; fused && i < n; i++) fused = gemv_tc_eligible(*Ws[i]) && Ws[i]->cols == Ws[0]->cols;
    if (!fused) {
      for (int i = 0; i < n; i++) matmul(*Ws[i], x, ys[i], M);
      return;
    }
    gemv_tc_group(Ws, ys, n, x, static_cast<int>(Ws[0]->cols), M, st_, &gsc_);
  }
  void embed(const WeightRef& E, const int32_t* ids, float* out, int M) override {
    cuda::embed(E, ids, out, M, err_dev_, st_);
  }
  void rmsnorm(const float* x, const float* w, float* y, int rows, int n, float eps) override {
    cuda::rmsnorm(x, w, y, rows, n, eps, st_);
  }
  void rmsnorm_gated(const float* x, const float* gate, const float* w, float* y, int rows, int n,
                     float eps) override {
    cuda::rmsnorm_gated(x, gate, w, y, rows, n, eps, st_);
  }
  void add(float* y, const float* x, size_t n) override { cuda::add(y, x, n, st_); }
  void add_rmsnorm(float* h, const float* r, const float* w, float* y, int rows, int n, float eps) override {
    cuda::add_rmsnorm(h, r, w, y, rows, n, eps, st_);
  }
  void scale(float* y, float s, size_t n) override { cuda::scale(y, s, n, st_); }
  void swiglu(const float* g, const float* u, float* out, size_t n) override { cuda::swiglu(g, u, out, n, st_); }
  void sigmoid_mul(float* y, const float* g, size_t n) override { cuda::sigmoid_mul(y, g, n, st_); }
  void softcap(float* y, float cap, size_t n) override { cuda::softcap(y, cap, n, st_); }
  void copy_2d(float* dst, int dst_ld, const float* src, int src_ld, int rows, int cols) override {
    if (rows <= 0 || cols <= 0) return;
    const size_t span_d = (static_cast<size_t>(rows - 1) * dst_ld + cols) * sizeof(float);
    const size_t span_s = (static_cast<size_t>(rows - 1) * src_ld + cols) * sizeof(float);
    const auto d0 = reinterpret_cast<uintptr_t>(dst), s0 = reinterpret_cast<uintptr_t>(src);
    if (d0 < s0 + span_s && s0 < d0 + span_d) {  // overlapping: pack into scratch first
      float* t = static_cast<float*>(ensure(move_, static_cast<size_t>(rows) * cols * sizeof(float)));
      QF_CUDA_CHECK(cudaMemcpy2DAsync(t, cols * sizeof(float), src, src_ld * sizeof(float), cols * sizeof(float), rows,
                                      cudaMemcpyDeviceToDevice, st_));
      src = t;
      src_ld = cols;
    }
    QF_CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_ld * sizeof(float), src, src_ld * sizeof(float), cols * sizeof(float),
                                    rows, cudaMemcpyDeviceToDevice, st_));
  }

  // ---- attention ---------------------------------------------------------------------------
  void split_qgate(const float* qg, float* q, float* gate, int M, int nh, int hd) override {
    cuda::split_qgate(qg, q, gate, M, nh, hd, st_);
  }
  void rope(float* x, int M, int nh, int hd, int rot, float theta, const StepMeta* meta) override {
    cuda::rope(x, M, nh, hd, rot, rope_freqs(theta, rot), meta, st_);
  }
  void kv_write(float* cache, const float* rows, int M, int width, const StepMeta* meta) override {
    cuda::kv_write(cache, rows, M, width, meta, err_dev_, st_);
  }
  void attention(const float* q, const float* K, const float* V, float* out, int M, const AttnParams& p,
                 const StepMeta* meta) override {
    if (M <= 0) return;
    float* s = static_cast<float*>(ensure(attn_, attention_scratch_floats(M, p.n_heads, p.head_dim) * sizeof(float)));
    cuda::attention(q, K, V, out, M, p, meta, s, st_);
  }

  // ---- gated DeltaNet ----------------------------------------------------------------------
  void gdn_rows(const float* mixed, const float* alpha, const float* beta_in, const float* conv_w, const float* A_log,
                const float* dt_bias, const GdnDims& d, float* state, float* y, int M, float* capture) override {
    if (M <= 0) return;
    float* s = static_cast<float*>(ensure(gdn_, gdn_scratch_floats(d, M) * sizeof(float)));
    cuda::gdn_rows(mixed, alpha, beta_in, conv_w, A_log, dt_bias, d, state, y, M, capture, s, st_);
  }

  // ---- selection ---------------------------------------------------------------------------
  void argmax_rows(const float* x, int M, int n, int32_t* out) override {
    if (M <= 0) return;
    void* s = ensure(argmax_, argmax_scratch_bytes(M, n));
    cuda::argmax_rows(x, M, n, out, s, st_);
  }
  void topk_rows(const float* x, int M, int n, int k, float* vals, int32_t* ids) override {
    if (M <= 0 || k <= 0) return;
    void* s = ensure(topk_, topk_scratch_bytes(M, n, k));
    cuda::topk_rows(x, M, n, k, vals, ids, s, st_);
  }

  // ---- DFlash2 -----------------------------------------------------------------------------
  void dyn_conv(const float* x, const float* base, const float* D, float* out, int L, int H, int Kc, int gs,
                int side) override {
    cuda::dyn_conv(x, base, D, out, L, H, Kc, gs, side, st_);
  }
  void selector_walk(const float* cand_vals, const int32_t* cand_ids, const float* P, const WeightRef& Epre,
                     const WeightRef& Esuc, const int32_t* anchor, int k, int K, int R, int32_t* drafts,
                     float* scores) override {
    cuda::selector_walk(cand_vals, cand_ids, P, Epre, Esuc, anchor, k, K, R, drafts, scores, err_dev_, st_);
  }

 private:
  void* raw_alloc(size_t bytes, const char* what) {
    if (!bytes) return nullptr;
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      backend_fail("cuda %s: out of device memory allocating %zu bytes (%.2f GB); %.2f GB free of %.2f GB on %s", what,
                   bytes, bytes / 1e9, free_b / 1e9, total_b / 1e9, name_.c_str());
    }
    QF_CUDA_CHECK(e);
    return p;
  }

  static void free_noexcept(void* p) {
    if (!p) return;
    const cudaError_t e = cudaFree(p);
    if (e != cudaSuccess) {
      cudaGetLastError();
      std::fprintf(stderr, "qflash: warning: cudaFree failed: %s (%s)\n", cudaGetErrorName(e), cudaGetErrorString(e));
    }
  }

  // Grows a scratch buffer. Waits for the stream first: queued kernels may still use the old one.
  void* ensure(Scratch& s, size_t bytes) {
    if (bytes <= s.bytes) return s.p;
    if (capturing_)  // the caller runs every op once before recording it, so this is a bug
      backend_fail("cuda: a scratch buffer must grow (%zu -> %zu bytes) during graph capture", s.bytes, bytes);
    epoch_++;
    QF_CUDA_CHECK(cudaStreamSynchronize(st_));
    if (s.p) QF_CUDA_CHECK(cudaFree(s.p));
    s.p = nullptr;
    s.bytes = 0;
    const size_t want = bytes + bytes / 4 + 256;
    s.p = raw_alloc(want, "scratch");
    s.bytes = want;
    return s.p;
  }

  // Host -> device, double-buffered through pinned memory (the CPU fills one buffer while the
  // DMA drains the other). Returns once `src` has been read. Without staging buffers: a plain
  // copy followed by a stream sync (slow but safe).
  void h2d_staged(void* dst_v, const void* src_v, size_t bytes) {
    if (!ensure_staging()) {
      QF_CUDA_CHECK(cudaMemcpyAsync(dst_v, src_v, bytes, cudaMemcpyHostToDevice, st_));
      QF_CUDA_CHECK(cudaStreamSynchronize(st_));
      return;
    }
    const char* src = static_cast<const char*>(src_v);
    char* dst = static_cast<char*>(dst_v);
    for (size_t off = 0; off < bytes; off += kStageBytes) {
      const size_t n = bytes - off < kStageBytes ? bytes - off : kStageBytes;
      const int b = stage_next_;
      stage_next_ ^= 1;
      QF_CUDA_CHECK(cudaEventSynchronize(stage_ev_[b]));  // the buffer's previous DMA has run
      std::memcpy(stage_[b], src + off, n);
      QF_CUDA_CHECK(cudaMemcpyAsync(dst + off, stage_[b], n, cudaMemcpyHostToDevice, st_));
      QF_CUDA_CHECK(cudaEventRecord(stage_ev_[b], st_));
    }
  }

  bool ensure_ring() {
    if (ring_) return true;
    if (ring_failed_) return false;
    if (cudaHostAlloc(&ring_, kRingSlots * kRingSlotBytes, cudaHostAllocDefault) != cudaSuccess) {
      cudaGetLastError();
      ring_ = nullptr;
      ring_failed_ = true;
      return false;
    }
    for (int i = 0; i < kRingSlots; i++) QF_CUDA_CHECK(cudaEventCreateWithFlags(&ring_ev_[i], cudaEventDisableTiming));
    return true;
  }

  bool ensure_staging() {
    if (stage_[0]) return true;
    if (stage_failed_) return false;
    for (int i = 0; i < 2; i++) {
      if (cudaHostAlloc(&stage_[i], kStageBytes, cudaHostAllocDefault) != cudaSuccess ||
          cudaEventCreateWithFlags(&stage_ev_[i], cudaEventDisableTiming) != cudaSuccess) {
        cudaGetLastError();
        for (int j = 0; j <= i; j++) {
          if (stage_[j]) cudaFreeHost(stage_[j]);
          if (stage_ev_[j]) cudaEventDestroy(stage_ev_[j]);
          stage_[j] = nullptr;
          stage_ev_[j] = nullptr;
        }
        stage_failed_ = true;
        return false;
      }
    }
    return true;
  }

  // inv_freq exactly as the CPU twin computes it (host float pow), cached per (theta, rot).
  const RopeFreqs& rope_freqs(float theta, int rot) {
    uint32_t tb;
    std::memcpy(&tb, &theta, 4);
    const auto key = std::make_pair(tb, rot);
    auto it = rope_cache_.find(key);
    if (it != rope_cache_.end()) return it->second;
    RopeFreqs f{};
    const int half = rot / 2;
    if (half > kMaxRopeHalf) backend_fail("cuda rope: rot_dim %d exceeds %d", rot, 2 * kMaxRopeHalf);
    for (int i = 0; i < half; i++)
      f.inv[i] = 1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(rot));
    return rope_cache_.emplace(key, f).first->second;
  }

  void check_device_errors() {
    DevError e{};
    if (err_host_) {
      std::memcpy(&e, const_cast<const DevError*>(err_host_), sizeof(e));
      if (e.code == kErrNone) return;
      std::memset(err_host_, 0, sizeof(DevError));
    } else {
      QF_CUDA_CHECK(cudaMemcpy(&e, err_dev_, sizeof(e), cudaMemcpyDeviceToHost));
      if (e.code == kErrNone) return;
      QF_CUDA_CHECK(cudaMemset(err_dev_, 0, sizeof(DevError)));
    }
    switch (e.code) {
      case kErrEmbedId:
        throw Error(ErrorKind::Usage, fmt_str("token id %d outside the embedding's %d rows (row %d)", e.a, e.b, e.c));
      case kErrKvWrite:
        throw Error(ErrorKind::Internal,
                    fmt_str("kv_write before the cache start (q_pos0 %d, kv_pos0 %d)", e.a, e.b));
      case kErrSelectorId:
        throw Error(ErrorKind::Internal,
                    fmt_str("selector walk: token id %d outside the codebook's %d rows (slot %d)", e.a, e.b, e.c));
      default:
        throw Error(ErrorKind::Backend, fmt_str("device-side check failed (code %d: %d %d %d)", e.code, e.a, e.b, e.c));
    }
  }

  int dev_;
  std::string name_;
  bool graphs_on_ = graphs_from_env();
  bool capturing_ = false;
  bool profiling_ = false;
  uint64_t epoch_ = 1;
  static bool graphs_from_env() {
    const char* e = std::getenv("QFLASH_CUDA_GRAPHS");
    return !(e && (std::strcmp(e, "0") == 0 || std::strcmp(e, "off") == 0));
  }
  cudaStream_t st_ = nullptr;
  DevError* err_host_ = nullptr;  // mapped pinned record (nullptr: err_dev_ is device memory)
  DevError* err_dev_ = nullptr;
  Scratch xs_, attn_, gdn_, argmax_, topk_, move_;
  GemvScratch gsc_;  // stream-K partials and tile counters of the tensor-core GEMV
  void* stage_[2] = {nullptr, nullptr};
  cudaEvent_t stage_ev_[2] = {nullptr, nullptr};
  bool stage_failed_ = false;
  int stage_next_ = 0;  // staging buffer the next chunk uses (alternates across calls too)
  static constexpr int kRingSlots = 64;
  static constexpr size_t kRingSlotBytes = size_t(64) << 10;
  void* ring_ = nullptr;
  cudaEvent_t ring_ev_[kRingSlots] = {};
  int ring_next_ = 0;
  bool ring_failed_ = false;
  std::map<std::pair<uint32_t, int>, RopeFreqs> rope_cache_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    if (why)
      *why = cuda::fmt_str("no usable CUDA device (cudaGetDeviceCount: %s, %s)", cudaGetErrorName(e),
                           cudaGetErrorString(e));
    return nullptr;
  }
  if (n <= 0) {
    if (why) *why = "no CUDA device present";
    return nullptr;
  }
  int dev = 0;
  if (const char* s = std::getenv("QFLASH_CUDA_DEVICE"); s && *s) dev = std::atoi(s);
  if (dev < 0 || dev >= n) {
    if (why) *why = cuda::fmt_str("QFLASH_CUDA_DEVICE=%d but %d CUDA device(s) present", dev, n);
    return nullptr;
  }
  try {
    return std::make_unique<CudaBackend>(dev);
  } catch (const Error& err) {
    if (why) *why = err.what();
    return nullptr;
  }
}

bool cuda_compiled() { return true; }

}  // namespace qf
