// CudaBackend op dispatch: every Backend op to its kernel launcher (kernels.h), with the scratch
// and staging each launcher needs. The rest of the class: cuda_backend.h lists where it lives.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <utility>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/gdn_chunk.h"

namespace qf::cuda {

// ---- dense ops ---------------------------------------------------------------------------------
// The tensor-core GEMV's split scratch (kernels.h): one size for every shape, so it grows once,
// at the first matmul (never inside a recorded pass: each is run directly first).
void CudaBackend::matmul(const WeightRef& W, const float* x, float* y, int M) {
  if (M <= 0) return;
  void* gs = ensure(gemv_, gemv_tc_scratch_bytes());
  if ((reinterpret_cast<uintptr_t>(x) & 15) == 0 && W.cols % 4 == 0) {
    gemv(W, x, static_cast<int>(W.cols), y, M, gs, st_);
    return;
  }
  // The kernel reads activations as 16-byte vectors: restage x with a padded row stride.
  const int ld = static_cast<int>((W.cols + 3) / 4 * 4);
  float* t = static_cast<float*>(ensure(xs_, static_cast<size_t>(M) * ld * sizeof(float)));
  QF_CUDA_CHECK(cudaMemcpy2DAsync(t, ld * sizeof(float), x, W.cols * sizeof(float), W.cols * sizeof(float), M,
                                  cudaMemcpyDeviceToDevice, st_));
  gemv(W, t, ld, y, M, gs, st_);
}

void CudaBackend::matmul_group(const WeightRef* const* Ws, float* const* ys, int n, const float* x, int M) {
  if (M <= 0 || n <= 0) return;
  bool q4 = n <= 4 && (reinterpret_cast<uintptr_t>(x) & 15) == 0 && Ws[0]->cols % 4 == 0;
  for (int i = 0; q4 && i < n; i++)
    q4 = Ws[i]->layout == WeightRef::kTcQ4 && Ws[i]->cols == Ws[0]->cols && Ws[i]->group == Ws[0]->group;
  if (q4) {
    gemv_tc_q4_group(Ws, ys, n, x, static_cast<int>(Ws[0]->cols), M, st_);
    return;
  }
  bool fused = n <= 4 && gemv_tc_enabled() && (reinterpret_cast<uintptr_t>(x) & 15) == 0;
  for (int i = 0; fused && i < n; i++) fused = gemv_tc_eligible(*Ws[i]) && Ws[i]->cols == Ws[0]->cols;
  if (!fused) {
    for (int i = 0; i < n; i++) matmul(*Ws[i], x, ys[i], M);
    return;
  }
  gemv_tc_group(Ws, ys, n, x, static_cast<int>(Ws[0]->cols), M, ensure(gemv_, gemv_tc_scratch_bytes()), st_);
}

// Prefill GEMM (gemm.h): cuBLASLt pinned per shape, for bf16 weights and int4 weights (dequantized
// to bf16 first); f16/f32 weights, and int4 under QFLASH_GEMM_Q4=gemv, run matmul on the rounded
// activations the runner leaves in xr (int4 tiles: the int4 tensor-core kernel in 32-token passes).
void CudaBackend::gemm(const WeightRef& W, const float* x, float* y, int M) {
  const float* xr = nullptr;
  if (gemm_.run(W, x, y, M, st_, &xr)) return;
  if (W.layout == WeightRef::kTcQ4 && M > 16)
    cuda::gemm_tc_q4(W, xr, static_cast<int>(W.cols), y, M, st_);
  else
    matmul(W, xr, y, M);
}

// A projection group (one layer's weights on the same input): the input is rounded once when
// every weight takes the cuBLASLt route (bf16 or int4); otherwise each weight runs as gemm().
void CudaBackend::gemm_group(const WeightRef* const* Ws, float* const* ys, int n, const float* x, int M) {
  bool bf16 = n > 0;
  for (int i = 0; i < n; i++) bf16 = bf16 && cuda::GemmRunner::takes(*Ws[i]) && Ws[i]->cols == Ws[0]->cols;
  if (!bf16) {
    Backend::gemm_group(Ws, ys, n, x, M);
    return;
  }
  gemm_.run_group(Ws, ys, n, x, M, st_);
}

// The prefill fusions (backend.h): the producer writes the bf16 GEMM input directly (the same
// values gemm's rounding of its fp32 output would give); weights off the cuBLASLt route run the two ops.
void CudaBackend::swiglu_gemm(const WeightRef& W, float* gate, const float* up, float* y, int M) {
  if (!cuda::GemmRunner::takes(W) || M <= 0) {
    Backend::swiglu_gemm(W, gate, up, y, M);
    return;
  }
  const size_t n = static_cast<size_t>(M) * W.cols;
  uint16_t* xb = gemm_.input_bf16(n, st_);
  cuda::swiglu_bf16(gate, up, xb, n, st_);
  gemm_.run_bf16(W, xb, y, M, st_);
}

void CudaBackend::rmsnorm_gated_gemm(const WeightRef& W, float* x, const float* gate, const float* w, float* y, int M,
                                     int n, float eps) {
  const int64_t total = static_cast<int64_t>(M) * W.cols;
  if (!cuda::GemmRunner::takes(W) || M <= 0 || n <= 0 || total % n != 0) {
    Backend::rmsnorm_gated_gemm(W, x, gate, w, y, M, n, eps);
    return;
  }
  uint16_t* xb = gemm_.input_bf16(static_cast<size_t>(total), st_);
  if (!cuda::rmsnorm_gated_bf16(x, gate, w, xb, static_cast<int>(total / n), n, eps, st_)) {
    Backend::rmsnorm_gated_gemm(W, x, gate, w, y, M, n, eps);
    return;
  }
  gemm_.run_bf16(W, xb, y, M, st_);
}

// The norms in front of a projection group: the norm kernel stores the group's bf16 input (h
// updated in fp32 as add_rmsnorm does), then each weight's GEMM reads it; the two ops otherwise.
void CudaBackend::add_rmsnorm_gemm_group(float* h, const float* r, const float* w, float* y, int M, int width,
                                         float eps, const WeightRef* const* Ws, float* const* ys, int n) {
  bool lt = n > 0 && M > 0 && width > 0;
  for (int i = 0; lt && i < n; i++) lt = cuda::GemmRunner::takes(*Ws[i]) && Ws[i]->cols == width;
  if (lt) {
    uint16_t* xb = gemm_.input_bf16(static_cast<size_t>(M) * width, st_);
    if (r ? cuda::add_rmsnorm_bf16(h, r, w, xb, M, width, eps, st_) : cuda::rmsnorm_bf16(h, w, xb, M, width, eps, st_)) {
      for (int i = 0; i < n; i++) gemm_.run_bf16(*Ws[i], xb, ys[i], M, st_);
      return;
    }
  }
  Backend::add_rmsnorm_gemm_group(h, r, w, y, M, width, eps, Ws, ys, n);
}

void CudaBackend::sigmoid_mul_gemm(const WeightRef& W, float* x, const float* gate, float* y, int M) {
  if (!cuda::GemmRunner::takes(W) || M <= 0) {
    Backend::sigmoid_mul_gemm(W, x, gate, y, M);
    return;
  }
  const size_t n = static_cast<size_t>(M) * W.cols;
  uint16_t* xb = gemm_.input_bf16(n, st_);
  cuda::sigmoid_mul_bf16(x, gate, xb, n, st_);
  gemm_.run_bf16(W, xb, y, M, st_);
}

void CudaBackend::embed(const WeightRef& E, const int32_t* ids, float* out, int M) {
  cuda::embed(E, ids, out, M, err_dev_, st_);
}

void CudaBackend::rmsnorm(const float* x, const float* w, float* y, int rows, int n, float eps) {
  cuda::rmsnorm(x, w, y, rows, n, eps, st_);
}

void CudaBackend::rmsnorm_gated(const float* x, const float* gate, const float* w, float* y, int rows, int n,
                                float eps) {
  cuda::rmsnorm_gated(x, gate, w, y, rows, n, eps, st_);
}

void CudaBackend::add(float* y, const float* x, size_t n) { cuda::add(y, x, n, st_); }

void CudaBackend::add_rmsnorm(float* h, const float* r, const float* w, float* y, int rows, int n, float eps) {
  cuda::add_rmsnorm(h, r, w, y, rows, n, eps, st_);
}

void CudaBackend::scale(float* y, float s, size_t n) { cuda::scale(y, s, n, st_); }
void CudaBackend::swiglu(const float* g, const float* u, float* out, size_t n) { cuda::swiglu(g, u, out, n, st_); }
void CudaBackend::sigmoid_mul(float* y, const float* g, size_t n) { cuda::sigmoid_mul(y, g, n, st_); }
void CudaBackend::softcap(float* y, float cap, size_t n) { cuda::softcap(y, cap, n, st_); }

void CudaBackend::copy_2d(float* dst, int dst_ld, const float* src, int src_ld, int rows, int cols) {
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

// ---- attention ---------------------------------------------------------------------------------
void CudaBackend::split_qgate(const float* qg, float* q, float* gate, int M, int nh, int hd) {
  cuda::split_qgate(qg, q, gate, M, nh, hd, st_);
}

void CudaBackend::rope(float* x, int M, int nh, int hd, int rot, float theta, const StepMeta* meta) {
  cuda::rope(x, M, nh, hd, rot, rope_freqs(theta, rot), meta, st_);
}

void CudaBackend::kv_write(void* cache, const float* rows, int M, int width, const StepMeta* meta, DType dt) {
  cuda::kv_write(cache, dt, rows, M, width, meta, err_dev_, st_);
}

void CudaBackend::attention(const float* q, const void* K, const void* V, float* out, int M, const AttnParams& p,
                            const StepMeta* meta) {
  if (M <= 0) return;
  float* s = static_cast<float*>(ensure(attn_, attention_scratch_floats(M, p.n_heads, p.head_dim) * sizeof(float)));
  cuda::attention(q, K, V, out, M, p, meta, s, st_);
}

void CudaBackend::attention_prefill(const float* q, const void* K, const void* V, float* out, int M,
                                    const AttnParams& p, const StepMeta* meta) {
  if (M > 0 && !cuda::attention_prefill(q, K, V, out, M, p, meta, st_)) attention(q, K, V, out, M, p, meta);
}

// inv_freq exactly as the CPU twin computes it (host float pow), cached per (theta, rot).
const RopeFreqs& CudaBackend::rope_freqs(float theta, int rot) {
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

// ---- gated DeltaNet ----------------------------------------------------------------------------
void CudaBackend::gdn_rows(const float* mixed, const float* alpha, const float* beta_in, const float* conv_w,
                           const float* A_log, const float* dt_bias, const GdnDims& d, float* state, float* y, int M,
                           float* capture) {
  if (M <= 0) return;
  float* s = static_cast<float*>(ensure(gdn_, gdn_scratch_floats(d, M) * sizeof(float)));
  cuda::gdn_rows(mixed, alpha, beta_in, conv_w, A_log, dt_bias, d, state, y, M, capture, s, st_);
}

// Chunk-parallel form (gdn_chunk.cu) for the shapes it takes; gdn_rows computes the same function
// for the others.
void CudaBackend::gdn_chunked(const float* mixed, const float* alpha, const float* beta_in, const float* conv_w,
                              const float* A_log, const float* dt_bias, const GdnDims& d, float* state, float* y,
                              int M) {
  if (M <= 0) return;
  if (!cuda::gdn_chunk_supported(d)) return gdn_rows(mixed, alpha, beta_in, conv_w, A_log, dt_bias, d, state, y, M, nullptr);
  float* s = static_cast<float*>(ensure(gdn_, cuda::gdn_chunk_scratch_floats(d, M) * sizeof(float)));
  cuda::gdn_chunked(mixed, alpha, beta_in, conv_w, A_log, dt_bias, d, state, y, M, s, st_);
}

// ---- selection ---------------------------------------------------------------------------------
void CudaBackend::argmax_rows(const float* x, int M, int n, int32_t* out) {
  if (M <= 0) return;
  void* s = ensure(argmax_, argmax_scratch_bytes(M, n));
  cuda::argmax_rows(x, M, n, out, s, st_);
}

void CudaBackend::topk_rows(const float* x, int M, int n, int k, float* vals, int32_t* ids) {
  if (M <= 0 || k <= 0) return;
  void* s = ensure(topk_, topk_scratch_bytes(M, n, k));
  cuda::topk_rows(x, M, n, k, vals, ids, s, st_);
}

// ---- DFlash2 -----------------------------------------------------------------------------------
void CudaBackend::dyn_conv(const float* x, const float* base, const float* D, float* out, int L, int H, int Kc,
                           int gs, int side) {
  cuda::dyn_conv(x, base, D, out, L, H, Kc, gs, side, st_);
}

void CudaBackend::selector_walk(const float* cand_vals, const int32_t* cand_ids, const float* P,
                                const WeightRef& Epre, const WeightRef& Esuc, const int32_t* anchor, int k, int K,
                                int R, int32_t* drafts, float* scores) {
  const size_t bytes = cuda::selector_walk_scratch_bytes(k, K);
  void* table = bytes ? ensure(selwalk_, bytes) : nullptr;
  cuda::selector_walk(cand_vals, cand_ids, P, Epre, Esuc, anchor, k, K, R, drafts, scores, table, err_dev_, st_);
}

}  // namespace qf::cuda
