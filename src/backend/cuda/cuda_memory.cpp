// CudaBackend memory: cudaMalloc'd buffers, host -> device uploads (a ring of pinned slots for
// small ones, a double-buffered pinned staging pair for large ones), device copies, weight
// import and relayout, and the scratch buffers the ops grow on demand.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/cuda_backend.h"

namespace qf::cuda {

namespace {

bool overlaps(const void* a, const void* b, size_t n) {
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + n && y < x + n;
}

}  // namespace

void* CudaBackend::alloc(size_t bytes) {
  void* p = raw_alloc(bytes, "alloc");
  if (p) QF_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, st_));
  return p;
}

// Any buffer may have been a weight the prefill GEMM kept a copy of (a synthetic or row-major
// matrix lives in plain backend memory): the copy goes with it, so that a later buffer at the same
// address never finds it.
void CudaBackend::release(void* p) {
  gemm_.forget(p);
  free_noexcept(p);
}

void CudaBackend::upload(void* dst, const void* src, size_t bytes) {
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

void CudaBackend::download(void* dst, const void* src, size_t bytes) {
  if (bytes) QF_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, st_));
  sync();
}

void CudaBackend::copy(void* dst, const void* src, size_t bytes) {
  if (!bytes || dst == src) return;
  if (overlaps(dst, src, bytes)) {  // memmove semantics: go through a scratch buffer
    void* t = ensure(move_, bytes);
    QF_CUDA_CHECK(cudaMemcpyAsync(t, src, bytes, cudaMemcpyDeviceToDevice, st_));
    QF_CUDA_CHECK(cudaMemcpyAsync(dst, t, bytes, cudaMemcpyDeviceToDevice, st_));
  } else {
    QF_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, st_));
  }
}

void CudaBackend::fill_zero(void* dst, size_t bytes) {
  if (bytes) QF_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, st_));
}

const void* CudaBackend::import_weight(const void* host, size_t bytes) {
  void* d = raw_alloc(bytes, "import_weight");
  if (!d) return d;
  upload(d, host, bytes);  // ring (small) or the double-buffered pinned staging (large)
  return d;
}

void CudaBackend::release_weight(const void* p) {
  gemm_.forget(p);  // the prefill GEMM's row-major copy of it, if one was kept
  free_noexcept(const_cast<void*>(p));
}

// bf16 matrices the tensor-core GEMV reads get its tiled layout (kernels.h, gemv_tc_relayout):
// one contiguous stream per warp. QFLASH_TC_LAYOUT=row keeps them row-major (A/B runs); so does
// a copy that does not fit next to the original (a warning, once).
const void* CudaBackend::relayout_matrix(const WeightRef& w, uint8_t* layout) {
  static const bool off = [] {
    const char* e = std::getenv("QFLASH_TC_LAYOUT");
    return e && std::strcmp(e, "row") == 0;
  }();
  const bool q4 = cuda::gemv_tc_enabled() && cuda::gemv_tc_q4_eligible(w);  // int4: no row-major tc kernel to keep
  if (!q4 && (off || w.layout != WeightRef::kRowMajor || !cuda::gemv_tc_enabled() || !cuda::gemv_tc_eligible(w)))
    return nullptr;
  const size_t bytes = q4 ? cuda::gemv_tc_q4_bytes(w.rows, w.cols, w.group) : cuda::gemv_tc_tiled_bytes(w.rows, w.cols);
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
  note_memory();
  if (q4)
    cuda::gemv_tc_q4_relayout(w, d, st_);
  else
    cuda::gemv_tc_relayout(w.data, d, w.rows, w.cols, st_);
  QF_CUDA_CHECK(cudaStreamSynchronize(st_));  // the caller frees the original next
  *layout = q4 ? WeightRef::kTcQ4 : WeightRef::kTc32x64;
  return d;
}

void CudaBackend::set_prefill_copy_budget(size_t bytes) { gemm_.set_copy_budget(bytes); }
size_t CudaBackend::prefill_copy_bytes() const { return gemm_.copy_bytes(); }

void CudaBackend::quantize_int4(const void* bf16, int64_t rows, int64_t cols, int group, void* q, void* scales,
                                void* biases) {
  cuda::quantize_int4(bf16, rows, cols, group, q, scales, biases, st_);
}

// Peak memory: (total - free) sampled after every allocation, where alone it can grow.
void CudaBackend::note_memory() {
  const size_t used = memory_used();
  if (used > peak_) peak_ = used;
}

size_t CudaBackend::memory_peak() const {
  const size_t used = memory_used();
  return used > peak_ ? used : peak_;
}

void CudaBackend::memory_peak_reset() { peak_ = memory_used(); }

void CudaBackend::fill_random(void* dst, size_t n, DType dt, uint64_t seed, float scale) {
  cuda::fill_random(dst, n, dt, seed, scale, st_);
}

void* CudaBackend::raw_alloc(size_t bytes, const char* what) {
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
  note_memory();
  return p;
}

void CudaBackend::free_noexcept(void* p) {
  if (!p) return;
  const cudaError_t e = cudaFree(p);
  if (e != cudaSuccess) {
    cudaGetLastError();
    std::fprintf(stderr, "qflash: warning: cudaFree failed: %s (%s)\n", cudaGetErrorName(e), cudaGetErrorString(e));
  }
}

// A growth moves the graph epoch on: graphs recorded before it hold the old buffer's address.
void* CudaBackend::ensure(Scratch& s, size_t bytes) {
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
  QF_CUDA_CHECK(cudaMemsetAsync(s.p, 0, want, st_));  // the GEMV split's tickets start at zero
  return s.p;
}

// Host -> device, double-buffered through pinned memory (the CPU fills one buffer while the
// DMA drains the other). Returns once `src` has been read. Without staging buffers: a plain
// copy followed by a stream sync (slow but safe).
void CudaBackend::h2d_staged(void* dst_v, const void* src_v, size_t bytes) {
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

bool CudaBackend::ensure_ring() {
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

bool CudaBackend::ensure_staging() {
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

}  // namespace qf::cuda
