// Host-callable launchers of the CUDA backend's kernels (one .cu file per family). Every
// launcher enqueues on the given stream and checks the launch; none synchronizes.
// Included by the backend class (cuda_backend.h), the CUDA tests' helpers and the GEMV bench;
// never by model code.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "backend/backend.h"

namespace qf::cuda {

// Device-side checks that cannot throw (a bad token id, a KV write before the cache start) set
// this record; the backend reads it at sync() / download() and throws qf::Error there.
struct DevError {
  int code;  // 0 = none; see DevErrCode
  int a, b, c;
};
enum DevErrCode : int { kErrNone = 0, kErrEmbedId = 1, kErrKvWrite = 2, kErrSelectorId = 3 };

// ---- GEMV (gemv.cu, gemv_tc.cu) ------------------------------------------------------------------
// y[m, r] = sum_c x[m * x_ld + c] * W[r, c] for m < M. x must be 16-byte aligned and x_ld a
// multiple of 4 (the backend stages x when it is not). Row-invariant: see cuda_kernels.md. The
// column split depends on the matrix shape alone, never on M. Schedule experiments (forced splits,
// the CUDA-core GEMV's R/U variants, stream-K) live in the kernel lab, bench/lab_gemv_*.cu.
// scratch: gemv_tc_scratch_bytes() of device memory, zero-filled before its first use, for the
// tensor-core path's cross-block split (every launch leaves it fit for the next; one stream at a
// time); shapes that do not split ignore it, and may pass nullptr.
void gemv(const WeightRef& W, const float* x, int x_ld, float* y, int M, void* scratch, cudaStream_t st);
// Tensor-core path (gemv_tc.cu): bf16 weights with cols % 64 == 0 take it for every M (decode
// included), unless QFLASH_GEMV=fma selects the CUDA-core kernel for the whole process.
bool gemv_tc_eligible(const WeightRef& W);
int gemv_tc_slices(int64_t tiles, int64_t cols);  // tiles: 32-row tiles of the (grouped) weights
// Column blocks sharing each tile group's columns (1: no cross-block split), from the shape
// alone; QFLASH_TC_SPLIT=off makes it 1 for every shape.
int gemv_tc_split_blocks(int64_t tiles, int64_t cols);
size_t gemv_tc_scratch_bytes();  // the scratch the split needs (the same for every shape)
// `sched` numbers the production schedules, 0 (the default) .. gemv_tc_sched_count() - 1; the
// tests run each. One today: column slices (split across blocks where the grid is small).
void gemv_tc(const WeightRef& W, const float* x, int x_ld, float* y, int M, void* scratch, cudaStream_t st,
             int sched = 0);
// Up to 4 tc-eligible weights with the same cols reading the same x, in one launch; the split
// is chosen from the group's total rows and cols (shape-only).
void gemv_tc_group(const WeightRef* const* Ws, float* const* ys, int n, const float* x, int x_ld, int M,
                   void* scratch, cudaStream_t st, int sched = 0);
int gemv_tc_sched_count();
const char* gemv_tc_sched_name(int sched);
// The tensor-core GEMV's own weight layout (WeightRef::kTc32x64): for every 32-row tile and
// 64-column chunk, the 4 KB the tile's warp reads for that chunk lie contiguously, in the order
// its lanes load them (8 loads of 512 bytes, one 16-byte vector per lane), chunks of a tile one
// after another; the rows are padded with zeros to a multiple of 32. Same values, same
// arithmetic: only the addresses change (one contiguous stream per warp instead of 32 rows
// 10 KB apart).
size_t gemv_tc_tiled_bytes(int64_t rows, int64_t cols);
// src: row-major bf16 [rows, cols] (gemv_tc_eligible); dst: gemv_tc_tiled_bytes(rows, cols).
void gemv_tc_relayout(const void* src, void* dst, int64_t rows, int64_t cols, cudaStream_t st);
bool gemv_tc_enabled();
// Column slices the automatic plan uses for this matrix (shape-only).
int gemv_auto_slices(const WeightRef& W);

// ---- elementwise and small ops (elementwise.cu) --------------------------------------------------
// Backend::fill_random: bf16 or f32, element i = scale * random_uniform_pm1(seed, i) (backend.h).
void fill_random(void* dst, size_t n, DType dt, uint64_t seed, float scale, cudaStream_t st);
void embed(const WeightRef& E, const int32_t* ids, float* out, int M, DevError* err, cudaStream_t st);
void rmsnorm(const float* x, const float* w, float* y, int rows, int n, float eps, cudaStream_t st);
void add_rmsnorm(float* h, const float* r, const float* w, float* y, int rows, int n, float eps, cudaStream_t st);
void rmsnorm_gated(const float* x, const float* gate, const float* w, float* y, int rows, int n, float eps,
                   cudaStream_t st);
void add(float* y, const float* x, size_t n, cudaStream_t st);
void scale(float* y, float s, size_t n, cudaStream_t st);
void swiglu(const float* g, const float* u, float* out, size_t n, cudaStream_t st);
// The prefill fusions' producers: the same fp32 values as swiglu / rmsnorm_gated, stored as bf16
// (round to nearest even, qf::f32_to_bf16). rmsnorm_gated_bf16 returns false for rows over 8192.
void swiglu_bf16(const float* g, const float* u, uint16_t* out, size_t n, cudaStream_t st);
bool rmsnorm_gated_bf16(const float* x, const float* gate, const float* w, uint16_t* y, int rows, int n, float eps,
                        cudaStream_t st);
void sigmoid_mul(float* y, const float* g, size_t n, cudaStream_t st);
// The prefill's fused norm / gate + projection inputs, bf16 as above: rmsnorm_bf16 and
// add_rmsnorm_bf16 (h += r in fp32 as add_rmsnorm) return false for rows over 8192
// (no work enqueued then); sigmoid_mul_bf16: out = bf16(x * sigmoid(g)).
bool rmsnorm_bf16(const float* x, const float* w, uint16_t* y, int rows, int n, float eps, cudaStream_t st);
bool add_rmsnorm_bf16(float* h, const float* r, const float* w, uint16_t* y, int rows, int n, float eps,
                      cudaStream_t st);
void sigmoid_mul_bf16(const float* x, const float* g, uint16_t* out, size_t n, cudaStream_t st);
void softcap(float* y, float cap, size_t n, cudaStream_t st);
void split_qgate(const float* qg, float* q, float* gate, int M, int n_heads, int head_dim, cudaStream_t st);
constexpr int kMaxRopeHalf = 256;  // rot_dim <= 512
struct RopeFreqs {
  float inv[kMaxRopeHalf];
};
void rope(float* x, int M, int n_heads, int head_dim, int rot_dim, const RopeFreqs& f, const StepMeta* meta,
          cudaStream_t st);
// cache of dt: F32, or BF16 rounded to nearest even exactly as qf::f32_to_bf16.
void kv_write(void* cache, DType dt, const float* rows, int M, int width, const StepMeta* meta, DevError* err,
              cudaStream_t st);
void dyn_conv(const float* x, const float* base, const float* D, float* out, int L, int H, int Kc, int gs, int side,
              cudaStream_t st);

// ---- attention (attention.cu) -----------------------------------------------------------------
// Fixed key-chunk size and split count: the chunk boundaries are absolute key indices (multiples
// of kAttnChunk), chunk c is handled by split c % kAttnSplits, and the splits are combined in
// split order: a row's reduction order depends only on its own visible key range.
constexpr int kAttnChunk = 64;
constexpr int kAttnSplits = 16;
constexpr int kAttnMaxHeadDim = 512;
// Decode/verify with bf16 K/V (attention_group.cu): one block per (kv group, split, kGrpRows q
// rows), chunk c in split c % kGrpSplits. Used by attention() where attention_grouped_applies(p)
// (bf16 K/V, head_dim 64/128/256, <= kGrpRows heads per kv head; QFLASH_ATTN=split turns it off):
// a choice from the shapes only, so decode and verify always take the same kernel.
constexpr int kGrpSplits = 64;
constexpr int kGrpRows = 48;
bool attention_grouped_applies(const AttnParams& p);
void attention_grouped(const float* q, const void* K, const void* V, float* out, int M, const AttnParams& p,
                       const StepMeta* meta, float* scratch, cudaStream_t st);
size_t attention_scratch_floats(int M, int n_heads, int head_dim);
// K, V of p.kv_dtype (F32 or BF16).
void attention(const float* q, const void* K, const void* V, float* out, int M, const AttnParams& p,
               const StepMeta* meta, float* scratch, cudaStream_t st);

// ---- attention_prefill (attention_prefill.cu) -------------------------------------------------
// Causal (or windowed) attention for many query rows on the tensor cores, K/V in bf16: see the
// file's header for the tiling and why a row's bits never depend on M. Returns false (nothing
// launched) where the kernel does not apply (fp32 K/V, a head_dim other than 64/128/256): the
// caller runs attention() instead. variant: kPrefillV1 (one 32/64-key tile at a time), kPrefillV3
// (two tiles per double-buffered stage, the same bits as v1 by construction; v1 where its shared
// memory does not fit), kPrefillV4 (wgmma on sm_90a, its own bits; v3 where it does not apply),
// kPrefillV4B (v4 with q and p as one bf16 piece each, half the tensor work; an A/B candidate, its
// own error bound; v3 where v4 does not apply), kPrefillV5B (v4b's bits, P V(t) and S(t + 1) in
// flight together), kPrefillEnv = the QFLASH_ATTN_PREFILL switch (v1 | v3 | v4 | v4b | v5b;
// default v5b since run 66, v4 before).
enum PrefillVariant : int {
  kPrefillEnv = 0, kPrefillV1 = 1, kPrefillV3 = 3, kPrefillV4 = 4, kPrefillV4B = 5, kPrefillV5B = 6
};
bool attention_prefill(const float* q, const void* K, const void* V, float* out, int M, const AttnParams& p,
                       const StepMeta* meta, cudaStream_t st, int variant = kPrefillEnv);
// Whether kPrefillV3 runs its own kernel for these parameters (bf16 K/V, head_dim 64/128/256, and
// its shared memory within the device's limit: at head_dim 256 only blocks of <= 6 warps, e.g. the
// 27B's 6 q heads per kv head); otherwise it runs v1.
bool attention_prefill_v3_applies(const AttnParams& p);
// Whether kPrefillV4 (wgmma, sm_90a) runs its own kernel for these parameters (head_dim 256, an even
// q-head group, bf16 K/V, a compute capability 9.0 device and a build with sm_90a); else v3 runs.
bool attention_prefill_v4_applies(const AttnParams& p);
// The kernel attention_prefill runs for these parameters when asked for `variant` (kPrefillEnv: the
// QFLASH_ATTN_PREFILL switch): kPrefillV1, kPrefillV3, kPrefillV4, kPrefillV4B or kPrefillV5B. Tests
// use it to hold a result to the error bound of the kernel that made it.
int attention_prefill_runs(const AttnParams& p, int variant = kPrefillEnv);

// ---- gated DeltaNet (gdn.cu) ----------------------------------------------------------------
size_t gdn_scratch_floats(const GdnDims& d, int M);
void gdn_rows(const float* mixed, const float* alpha, const float* beta_in, const float* conv_w, const float* A_log,
              const float* dt_bias, const GdnDims& d, float* state, float* y, int M, float* capture, float* scratch,
              cudaStream_t st);

// ---- selection (select.cu) ------------------------------------------------------------------
size_t argmax_scratch_bytes(int M, int n);
void argmax_rows(const float* x, int M, int n, int32_t* out, void* scratch, cudaStream_t st);
size_t topk_scratch_bytes(int M, int n, int k);
void topk_rows(const float* x, int M, int n, int k, float* vals, int32_t* ids, void* scratch, cudaStream_t st);
// The greedy selector walk. Where top-k <= 32 (and QFLASH_SELECTOR_WALK is not "seq", an A/B switch)
// it runs as a table of every (step, predecessor, candidate) score in parallel plus a one-warp walk,
// in `scratch` (selector_walk_scratch_bytes); otherwise one block walks the steps in order. Both give
// the same drafts and scores, bit for bit.
// mode: -1 as above, 0 the one-block walk, 1 the table (K <= 32; tests compare the two).
size_t selector_walk_scratch_bytes(int k, int K);
void selector_walk(const float* cand_vals, const int32_t* cand_ids, const float* P, const WeightRef& Epre,
                   const WeightRef& Esuc, const int32_t* anchor, int k, int K, int R, int32_t* drafts, float* scores,
                   void* scratch, DevError* err, cudaStream_t st, int mode = -1);

// ---- int4 tensor-core GEMV (gemv_tc_q4.cu) ----------------------------------------------------
// int4 (mlx group-affine, group 32/64/128) weights relaid into the kernel's tiles at load
// (WeightRef::kTcQ4, scales and biases inside the blob); every M, decode included, row-invariant.
// Activations as for gemv(). QFLASH_TC_Q4_PIECES=3 splits x into 3 bf16 pieces instead of 2.
bool gemv_tc_q4_eligible(const WeightRef& W);  // row-major int4, cols a multiple of max(64, group)
size_t gemv_tc_q4_bytes(int64_t rows, int64_t cols, int group);
void gemv_tc_q4_relayout(const WeightRef& W, void* dst, cudaStream_t st);  // dst: gemv_tc_q4_bytes, 16-byte aligned
void gemv_tc_q4(const WeightRef& W, const float* x, int x_ld, float* y, int M, cudaStream_t st);
// The prefill GEMM's int4 route (Backend::gemm): xr holds bf16 values already (GemmRunner's
// rounding), so one bf16 piece is exact and a pass takes 32 tokens; bit for bit gemv_tc_q4 on
// the same xr, row-invariant.
void gemm_tc_q4(const WeightRef& W, const float* xr, int x_ld, float* y, int M, cudaStream_t st);
// The prefill GEMM's int4 route (gemm.h): an int4 matrix (kTcQ4 tiles, or row-major mlx with
// scales and biases) as row-major bf16 [rows, cols] in dst (16-byte aligned), each weight
// bf16_rn(fl(q * scale) + bias): the CPU twin's value (cpu_backend.cpp) bit for bit.
void q4_dequant_bf16(const WeightRef& W, void* dst, cudaStream_t st);
// Up to 4 kTcQ4 weights with the same cols and group reading the same x, in one launch.
void gemv_tc_q4_group(const WeightRef* const* Ws, float* const* ys, int n, const float* x, int x_ld, int M,
                      cudaStream_t st);
// Backend::quantize_int4: bit for bit int4_quantize_row (io/quantize.h), one thread per group.
void quantize_int4(const void* bf16, int64_t rows, int64_t cols, int group, void* q, void* scales, void* biases,
                   cudaStream_t st);

// ---- misc -----------------------------------------------------------------------------------------
// A trivial kernel: make_cuda_backend launches it once to prove the binary has code for the device.
cudaError_t probe_launch(cudaStream_t st);

}  // namespace qf::cuda
