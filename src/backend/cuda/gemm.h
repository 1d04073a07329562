// The CUDA backend's prefill GEMM (Backend::gemm): y[m, r] = sum_c bf16(x[m, c]) * W[r, c] with
// fp32 accumulation, for bf16 weights and any row count M. Design: docs/DESIGN.md, "Prefill path".
//
// Route. The activations are rounded to bf16 (round-to-nearest-even, the CPU twin's formula bit
// for bit) into a scratch buffer, then one cuBLASLt bf16 x bf16 -> fp32 matmul computes y. Weights
// in the GEMV's tiled layout (WeightRef::kTc32x64) are first copied back to row-major into a
// second scratch buffer (one matrix at a time: a streaming copy, ~2 bytes moved per weight byte).
//
// Row-invariance. cuBLASLt's heuristic would pick a kernel per problem size, and a kernel's k
// order, tile and split-K decide the bits. So the algorithm is chosen ONCE per weight shape
// (N = rows, K = cols), from the heuristic's answer for a reference M, among configurations
// without split-K or a reduction scheme and with no workspace (so no stream-K fix-up either); it
// is then used for every M. Each output element is then one tile's fixed k loop over its own
// row of x and its own row of W, whatever M is. The GPU tests check this bit for bit over many M.
// Shapes cuBLASLt cannot take with 16-byte alignment (K % 8 or N % 4 not 0), or for which no such
// configuration exists, use a plain CUDA-core kernel with a sequential k loop (gemm_simt), chosen
// per shape too. QFLASH_GEMM=simt forces that kernel everywhere (a reference for A/B runs).
//
// int4 weights (kTcQ4 tiles or row-major mlx) take the same route: the matrix is dequantized
// into the row-major scratch (q4_dequant_bf16: each weight bf16_rn(fl(q * scale) + bias), the
// CPU twin's value), then multiplied like a bf16 weight of its shape. So an int4 prefill GEMM
// runs at the bf16 GEMM's speed for ~1 byte moved per weight byte more than a bf16 untile, and
// its function is y = sum_c bf16(x) * bf16(w) in fp32 (backend.h). QFLASH_GEMM_Q4=gemv keeps the
// older int4 route for A/B runs: the int4 GEMV in 32-token passes on bf16(x) with exact weights
// (not the CPU twin's function then; tests run the default).
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "backend/backend.h"

namespace qf::cuda {

// ---- kernels (gemm.cu) --------------------------------------------------------------------------
// xb[i] = bf16_rn(x[i]) for i < n, exactly qf::f32_to_bf16 (NaN quieted, sign and payload kept).
void gemm_to_bf16(const float* x, uint16_t* xb, size_t n, cudaStream_t st);
// xr[i] = that value widened back to fp32 (the activations of the matmul route).
void gemm_round_f32(const float* x, float* xr, size_t n, cudaStream_t st);
// The inverse of gemv_tc_relayout: tiled bf16 (kTc32x64, gemv_tc_tiled_bytes) -> row-major [rows, cols].
void gemm_untile(const void* tiled, void* row_major, int64_t rows, int64_t cols, cudaStream_t st);
// y[m, r] = sum_c xb[m, c] * W[r, c] in fp32, c = 0..cols-1 in order (one thread per output): any
// bf16 shape, either layout. The fallback and the reference of the cuBLASLt route.
void gemm_simt(const WeightRef& W, const uint16_t* xb, float* y, int M, cudaStream_t st);
// A kernel that is never launched: its name labels the cuBLASLt matmuls in the kernel profile.
const void* gemm_lt_marker();

// ---- the runner (gemm.cpp) ----------------------------------------------------------------------
class GemmRunner {
 public:
  GemmRunner();
  ~GemmRunner();
  GemmRunner(const GemmRunner&) = delete;
  GemmRunner& operator=(const GemmRunner&) = delete;
  // Whether run_bf16 takes W: bf16 in either layout, and int4 (tiled or row-major) unless
  // QFLASH_GEMM_Q4=gemv.
  static bool takes(const WeightRef& W);
  // Enqueues y = bf16(x) W^T on `st` (W as takes() says; int4: W dequantized to bf16). For any
  // other weight (f16, f32, int4 under QFLASH_GEMM_Q4=gemv) it enqueues only the rounding, into
  // an fp32 scratch [M, cols] returned in *xr, and returns false: the caller runs its matmul on
  // xr (backend.h). Grows its scratch buffers as needed (a stream sync then), so it must not run
  // inside a graph capture.
  bool run(const WeightRef& W, const float* x, float* y, int M, cudaStream_t st, const float** xr);
  // run() for n weights [*, K] that takes() and that read the same x: x is rounded to bf16 once
  // for all of them (the same bits as n run() calls).
  void run_group(const WeightRef* const* Ws, float* const* ys, int n, const float* x, int M, cudaStream_t st);
  // For the prefill fusions: the bf16 input buffer (at least n elements; grown before any work is
  // enqueued on it), then y = xb W^T for a weight that takes().
  uint16_t* input_bf16(size_t n, cudaStream_t st) { return static_cast<uint16_t*>(grow(xb_, xb_bytes_, n * 2, st)); }
  void run_bf16(const WeightRef& W, const uint16_t* xb, float* y, int M, cudaStream_t st);
  // One line per weight shape seen so far: the route and, for cuBLASLt, the pinned configuration.
  std::string describe() const;
  // Row-major bf16 copies of tiled bf16 matrices (kTc32x64) and of int4 matrices (either layout,
  // dequantized), kept between calls: a matrix's first GEMM makes its copy (the untile or the
  // dequantization, into memory of its own) when the copies then still fit in the budget, and
  // every later GEMM reads it instead of making it again; the same bytes, so the same bits. QFLASH_PREFILL_WEIGHTS: auto (the default: set_copy_budget's bytes), keep (no limit),
  // untile (none). forget(): the tiled matrix at `data` was released; its copy goes too.
  void set_copy_budget(size_t bytes) { copy_budget_ = bytes; }
  size_t copy_bytes() const { return copy_bytes_; }
  void forget(const void* data);

 private:
  struct Plan;
  Plan& plan_for(int64_t N, int64_t K);
  void* grow(void*& p, size_t& have, size_t need, cudaStream_t st);
  const void* kept_copy(const WeightRef& W, cudaStream_t st);
  std::map<const void*, std::pair<void*, size_t>> copies_;  // tiled data -> its row-major copy, bytes
  size_t copy_bytes_ = 0, copy_budget_ = 0;
  void* lt_ = nullptr;  // cublasLtHandle_t, created at the first cuBLASLt call
  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<Plan>> plans_;
  void* xb_ = nullptr;  // bf16 activations [M, K]
  size_t xb_bytes_ = 0;
  void* wt_ = nullptr;  // a tiled matrix copied back to row-major, or an int4 matrix dequantized
  size_t wt_bytes_ = 0;
  void* yt_ = nullptr;  // output staging when y is not 16-byte aligned
  size_t yt_bytes_ = 0;
  void* xr_ = nullptr;  // fp32 rounded activations [M, K] for the matmul route
  size_t xr_bytes_ = 0;
  void* ws_ = nullptr;  // cuBLASLt workspace the pinned configuration asks for at some M
  size_t ws_bytes_ = 0;
};

}  // namespace qf::cuda
