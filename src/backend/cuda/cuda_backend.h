// The CUDA backend: qf::Backend on one NVIDIA GPU (built for Hopper, sm_90a). Memory is plain
// cudaMalloc (zero-filled), every op is enqueued on one stream owned by the backend, and only
// download() and sync() wait for the device. Kernels live in the .cu files beside this one
// (kernels.h lists them); docs/experiments/cuda_kernels.md describes their design.
//
// The class is defined across files by concern (docs/DESIGN.md, "CUDA backend"):
//   cuda_device.cpp    device setup and teardown, the device-side error record, memory queries
//   cuda_memory.cpp    allocation, uploads (pinned ring and staging pair), copies, scratch growth
//   cuda_graphs.cpp    graph capture and replay
//   cuda_profiler.cpp  the kernel profiler (`qflash bench --profile`)
//   cuda_backend.cpp   op dispatch: every Backend op to its kernel launcher
// Internal to the CUDA backend: only its own .cpp files include this header.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "backend/backend.h"
#include "backend/cuda/cuda_util.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/kernels.h"

namespace qf::cuda {

struct Scratch {
  void* p = nullptr;
  size_t bytes = 0;
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int dev);
  ~CudaBackend() override;

  std::string name() const override { return name_; }
  bool is_gpu() const override { return true; }

  // ---- memory (cuda_memory.cpp; sync and the memory queries in cuda_device.cpp) ---------------
  void* alloc(size_t bytes) override;
  void release(void* p) override;
  void upload(void* dst, const void* src, size_t bytes) override;
  void download(void* dst, const void* src, size_t bytes) override;
  void copy(void* dst, const void* src, size_t bytes) override;
  void fill_zero(void* dst, size_t bytes) override;
  void sync() override;
  const void* import_weight(const void* host, size_t bytes) override;
  void release_weight(const void* p) override;
  const void* relayout_matrix(const WeightRef& w, uint8_t* layout) override;
  void set_prefill_copy_budget(size_t bytes) override;
  size_t prefill_copy_bytes() const override;
  void quantize_int4(const void* bf16, int64_t rows, int64_t cols, int group, void* q, void* scales,
                     void* biases) override;
  size_t memory_peak() const override;
  void memory_peak_reset() override;
  void fill_random(void* dst, size_t n, DType dt, uint64_t seed, float scale) override;
  size_t memory_used() const override;
  size_t memory_free(size_t* total) const override;

  // ---- CUDA graphs (cuda_graphs.cpp) and the profiler (cuda_profiler.cpp) ---------------------
  bool graphs_enabled() const override;
  void profile_begin() override;
  std::string profile_end(int iters) override;
  uint64_t graph_epoch() const override;
  void capture_begin() override;
  void* capture_end() override;
  void capture_abort() override;
  void graph_launch(void* g) override;
  void graph_destroy(void* g) override;

  // ---- ops (cuda_backend.cpp) -------------------------------------------------------------------
  void matmul(const WeightRef& W, const float* x, float* y, int M) override;
  void matmul_group(const WeightRef* const* Ws, float* const* ys, int n, const float* x, int M) override;
  void gemm(const WeightRef& W, const float* x, float* y, int M) override;
  void gemm_group(const WeightRef* const* Ws, float* const* ys, int n, const float* x, int M) override;
  void swiglu_gemm(const WeightRef& W, float* gate, const float* up, float* y, int M) override;
  void add_rmsnorm_gemm_group(float* h, const float* r, const float* w, float* y, int M, int width, float eps,
                              const WeightRef* const* Ws, float* const* ys, int n) override;
  void sigmoid_mul_gemm(const WeightRef& W, float* x, const float* gate, float* y, int M) override;
  void rmsnorm_gated_gemm(const WeightRef& W, float* x, const float* gate, const float* w, float* y, int M, int n,
                          float eps) override;
  void embed(const WeightRef& E, const int32_t* ids, float* out, int M) override;
  void rmsnorm(const float* x, const float* w, float* y, int rows, int n, float eps) override;
  void rmsnorm_gated(const float* x, const float* gate, const float* w, float* y, int rows, int n,
                     float eps) override;
  void add(float* y, const float* x, size_t n) override;
  void add_rmsnorm(float* h, const float* r, const float* w, float* y, int rows, int n, float eps) override;
  void scale(float* y, float s, size_t n) override;
  void swiglu(const float* g, const float* u, float* out, size_t n) override;
  void sigmoid_mul(float* y, const float* g, size_t n) override;
  void softcap(float* y, float cap, size_t n) override;
  void copy_2d(float* dst, int dst_ld, const float* src, int src_ld, int rows, int cols) override;
  void split_qgate(const float* qg, float* q, float* gate, int M, int nh, int hd) override;
  void rope(float* x, int M, int nh, int hd, int rot, float theta, const StepMeta* meta) override;
  void kv_write(void* cache, const float* rows, int M, int width, const StepMeta* meta, DType dt) override;
  void attention(const float* q, const void* K, const void* V, float* out, int M, const AttnParams& p,
                 const StepMeta* meta) override;
  void attention_prefill(const float* q, const void* K, const void* V, float* out, int M, const AttnParams& p,
                         const StepMeta* meta) override;
  void gdn_rows(const float* mixed, const float* alpha, const float* beta_in, const float* conv_w, const float* A_log,
                const float* dt_bias, const GdnDims& d, float* state, float* y, int M, float* capture) override;
  void gdn_chunked(const float* mixed, const float* alpha, const float* beta_in, const float* conv_w, const float* A_log,
                   const float* dt_bias, const GdnDims& d, float* state, float* y, int M) override;
  void argmax_rows(const float* x, int M, int n, int32_t* out) override;
  void topk_rows(const float* x, int M, int n, int k, float* vals, int32_t* ids) override;
  void dyn_conv(const float* x, const float* base, const float* D, float* out, int L, int H, int Kc, int gs,
                int side) override;
  void selector_walk(const float* cand_vals, const int32_t* cand_ids, const float* P, const WeightRef& Epre,
                     const WeightRef& Esuc, const int32_t* anchor, int k, int K, int R, int32_t* drafts,
                     float* scores) override;

 private:
  // cuda_memory.cpp
  void* raw_alloc(size_t bytes, const char* what);
  static void free_noexcept(void* p);
  // Grows a scratch buffer (zero-filled). Waits for the stream first: queued kernels may still use
  // the old one.
  void* ensure(Scratch& s, size_t bytes);
  void h2d_staged(void* dst_v, const void* src_v, size_t bytes);
  bool ensure_ring();
  bool ensure_staging();
  void note_memory();  // peak_ = max(peak_, memory_used())
  // cuda_device.cpp
  void check_device_errors();
  // cuda_graphs.cpp
  static bool graphs_from_env();
  // cuda_backend.cpp
  const RopeFreqs& rope_freqs(float theta, int rot);

  static constexpr size_t kStageBytes = size_t(32) << 20;  // two pinned staging buffers for weight uploads
  static constexpr int kRingSlots = 64;
  static constexpr size_t kRingSlotBytes = size_t(64) << 10;

  int dev_;
  std::string name_;
  bool graphs_on_ = graphs_from_env();
  bool capturing_ = false;
  bool profiling_ = false;
  uint64_t epoch_ = 1;
  size_t peak_ = 0;  // memory_peak()
  cudaStream_t st_ = nullptr;
  DevError* err_host_ = nullptr;  // mapped pinned record (nullptr: err_dev_ is device memory)
  DevError* err_dev_ = nullptr;
  Scratch xs_, attn_, gdn_, argmax_, topk_, move_, gemv_, selwalk_;
  GemmRunner gemm_;  // the prefill GEMM: cuBLASLt handle, pinned configurations, scratch (gemm.h)
  void* stage_[2] = {nullptr, nullptr};
  cudaEvent_t stage_ev_[2] = {nullptr, nullptr};
  bool stage_failed_ = false;
  int stage_next_ = 0;  // staging buffer the next chunk uses (alternates across calls too)
  void* ring_ = nullptr;
  cudaEvent_t ring_ev_[kRingSlots] = {};
  int ring_next_ = 0;
  bool ring_failed_ = false;
  std::map<std::pair<uint32_t, int>, RopeFreqs> rope_cache_;
};

}  // namespace qf::cuda
