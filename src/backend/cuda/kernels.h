// Host-callable launchers of the CUDA backend's kernels (one .cu file per family). Every
// launcher enqueues on the given stream and checks the launch; none synchronizes.
// Included by the backend class (cuda_backend.cpp), the CUDA tests' helpers and the GEMV bench;
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
const char* dev_error_text(int code);

// ---- GEMV (gemv.cu) ---------------------------------------------------------------------------
// y[m, r] = sum_c x[m * x_ld + c] * W[r, c] for m < M. x must be 16-byte aligned and x_ld a
// multiple of 4 (the backend stages x when it is not). Row-invariant: see cuda_kernels.md.
// `force_ks` (0 = automatic) and `variant` (0 = default) exist for the bench only: the
// automatic column split depends on the matrix shape alone, never on M. Returns false (nothing
// launched) only for a bench variant that does not exist at that M.
// Stream-K scratch of the tensor-core GEMV (gemv_tc.cu): per-piece partial sums and per-tile
// arrival counters (zero between launches). One per stream that runs GEMVs: the backend owns one.
struct GemvScratch {
  float* part = nullptr;
  int* cnt = nullptr;
  int max_warps = 0, max_tiles = 0;
  int warps = 0;  // resident warps of the stream-K kernel on this device (the split's W cap)
};
void gemv_scratch_create(GemvScratch& s);  // on the current device; throws qf::Error on failure
void gemv_scratch_destroy(GemvScratch& s) noexcept;

// `sc` (may be null) enables the stream-K schedule of the tensor-core path.
bool gemv(const WeightRef& W, const float* x, int x_ld, float* y, int M, cudaStream_t st,
          const GemvScratch* sc = nullptr, int force_ks = 0, int variant = 0);
// Tensor-core path (gemv_tc.cu): bf16 weights with cols % 64 == 0 take it for every M (decode
// included), unless QFLASH_GEMV=fma selects the CUDA-core kernel for the whole process.
// Schedules (`sched`): 0 = automatic (column slices; QFLASH_TC_SCHED=skr|hyb or QFLASH_GEMV=tc
// override it for the process), 1 = column slices, 2 = stream-K, 3 = hybrid (stream-K for
// shapes whose slice grid is ragged, needs `sc`). The bench and the tests run each.
bool gemv_tc_eligible(const WeightRef& W);
int gemv_tc_slices(int64_t tiles, int64_t cols);  // tiles: 32-row tiles of the (grouped) weights
void gemv_tc(const WeightRef& W, const float* x, int x_ld, float* y, int M, cudaStream_t st,
             const GemvScratch* sc = nullptr, int sched = 0, int force_ks = 0);
// Up to 4 tc-eligible weights with the same cols reading the same x, in one launch; the split
// is chosen from the group's total rows and cols (shape-only).
void gemv_tc_group(const WeightRef* const* Ws, float* const* ys, int n, const float* x, int x_ld, int M,
                   cudaStream_t st, const GemvScratch* sc = nullptr, int sched = 0, int force_ks = 0);
// The tensor-core GEMV's own weight layout (WeightRef::kTc32x64): for every 32-row tile and
// 64-column chunk, the 4 KB the tile's warp reads for that chunk lie contiguously, in the order
// its lanes load them (8 loads of 512 bytes, one 16-byte vector per lane), chunks of a tile one
// after another; the rows are padded with zeros to a multiple of 32. Same values, same
// arithmetic: only the addresses change (one contiguous stream per warp instead of 32 rows
// 10 KB apart).
size_t gemv_tc_tiled_bytes(int64_t rows, int64_t cols);
// src: row-major bf16 [rows, cols] (gemv_tc_eligible); dst: gemv_tc_tiled_bytes(rows, cols).
void gemv_tc_relayout(const void* src, void* dst, int64_t rows, int64_t cols, cudaStream_t st);
int gemv_tc_sched_count();
const char* gemv_tc_sched_name(int sched);
bool gemv_tc_enabled();
// Column slices the automatic plan uses for this matrix (shape-only).
int gemv_auto_slices(const WeightRef& W);
// Bench schedule variants (bf16, 16-byte aligned weights, M in {1, 5..8, 9..16}): 0 = default.
int gemv_variant_count();
const char* gemv_variant_name(int v);

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
void sigmoid_mul(float* y, const float* g, size_t n, cudaStream_t st);
void softcap(float* y, float cap, size_t n, cudaStream_t st);
void split_qgate(const float* qg, float* q, float* gate, int M, int n_heads, int head_dim, cudaStream_t st);
constexpr int kMaxRopeHalf = 256;  // rot_dim <= 512
struct RopeFreqs {
  float inv[kMaxRopeHalf];
};
void rope(float* x, int M, int n_heads, int head_dim, int rot_dim, const RopeFreqs& f, const StepMeta* meta,
          cudaStream_t st);
void kv_write(float* cache, const float* rows, int M, int width, const StepMeta* meta, DevError* err,
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
size_t attention_scratch_floats(int M, int n_heads, int head_dim);
void attention(const float* q, const float* K, const float* V, float* out, int M, const AttnParams& p,
               const StepMeta* meta, float* scratch, cudaStream_t st);

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
void selector_walk(const float* cand_vals, const int32_t* cand_ids, const float* P, const WeightRef& Epre,
                   const WeightRef& Esuc, const int32_t* anchor, int k, int K, int R, int32_t* drafts, float* scores,
                   DevError* err, cudaStream_t st);

// ---- misc -----------------------------------------------------------------------------------------
// A trivial kernel: make_cuda_backend launches it once to prove the binary has code for the device.
cudaError_t probe_launch(cudaStream_t st);

}  // namespace qf::cuda
