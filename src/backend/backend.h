// The narrow interface that model code is written against (docs/ARCHITECTURE.md, "Backend
// interface"). CPU (backend/cpu) and CUDA (backend/cuda) implement every op.
//
// Conventions for every op:
//  - activations, residuals and recurrent state are fp32, row-major, on the backend's memory;
//  - weights are WeightRef: bf16 / f16 / f32, or packed int4 (group-affine, mlx layout);
//  - "row-invariant": the result for row m is bit-identical whatever the row count M, so plain
//    decode (M = 1) and verify (M = k+1) agree bit for bit (docs/spec/speculative.md section 2);
//  - positions and counts that change from call to call are read from backend memory
//    (`const int32_t*` arguments), never passed as scalars, so a captured CUDA graph can be
//    replayed after the host updates them.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/dtype.h"

namespace qf {

// A weight matrix [rows = out features, cols = in features] resident on a backend.
struct WeightRef {
  DType dtype = DType::BF16;  // BF16, F16, F32; U32 = int4 packed 8 per word along cols
  int64_t rows = 0, cols = 0;
  const void* data = nullptr;    // [rows, cols] (int4: u32 [rows, cols/8], element j at bits 4j)
  const void* scales = nullptr;  // int4 only: bf16 [rows, cols/group]
  const void* biases = nullptr;  // int4 only: bf16 [rows, cols/group]; w = q*scale + bias
  int group = 0;                 // int4 group size (64 for mlx checkpoints)
  // Memory layout of data. kRowMajor everywhere except where a backend re-laid a matrix out for
  // its own GEMV (Backend::relayout_matrix); such a weight is only ever passed to matmul.
  // kTcQ4: int4 in the CUDA int4 tensor-core GEMV's tiles, scales and biases inside `data`
  // (`scales`/`biases` are null).
  static constexpr uint8_t kRowMajor = 0, kTc32x64 = 1, kTcQ4 = 2;
  uint8_t layout = kRowMajor;
  bool valid() const { return data != nullptr; }
};

// Attention geometry. A key at buffer row j has absolute position kv_pos0 + j; query row m has
// position q_pos0 + m. Key j is visible to query m iff j < n_kv and
//   causal:     kpos <= qpos                     (and qpos - kpos < window if window > 0)
//   non-causal: |qpos - kpos| < window (window > 0), else all keys.
// kv_dtype: the element type of the K and V buffers: F32, or BF16 (round-to-nearest-even on
// kv_write, widened exactly on read); every other computation stays fp32.
struct AttnParams {
  int n_heads = 0, n_kv_heads = 0, head_dim = 0;
  float scale = 0;
  bool causal = true;
  int window = 0;
  DType kv_dtype = DType::F32;
};

// Per-step positions kept in backend memory. Written by the host before each forward.
struct StepMeta {
  int32_t q_pos0;   // position of query row 0
  int32_t kv_pos0;  // position of key row 0 in the key buffer
  int32_t n_kv;     // valid key rows in the key buffer
  int32_t pad;
};

// Gated DeltaNet dimensions. The per-layer state blob is
//   S    f32 [n_v_heads, d_v, d_k]         (S[h][i][j]: value dim i, key dim j)
//   tail f32 [conv_kernel - 1, conv_dim]    (raw conv inputs, oldest row first)
struct GdnDims {
  int n_k_heads = 0, n_v_heads = 0, d_k = 0, d_v = 0, conv_kernel = 4;
  float eps = 1e-6f;  // l2norm epsilon (inside the sqrt)
  int key_dim() const { return n_k_heads * d_k; }
  int value_dim() const { return n_v_heads * d_v; }
  int conv_dim() const { return 2 * key_dim() + value_dim(); }
  size_t s_floats() const { return static_cast<size_t>(n_v_heads) * d_v * d_k; }
  size_t state_floats() const { return s_floats() + static_cast<size_t>(conv_kernel - 1) * conv_dim(); }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual bool is_gpu() const = 0;

  // ---- memory -------------------------------------------------------------------------------
  virtual void* alloc(size_t bytes) = 0;  // zero-filled; Backend error when it does not fit
  virtual void release(void* p) = 0;
  virtual void upload(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void download(void* host_dst, const void* src, size_t bytes) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  virtual void fill_zero(void* dst, size_t bytes) = 0;
  virtual void sync() = 0;
  // Weight bytes from a host mapping: the CPU returns `host` itself (zero copy), a GPU backend
  // allocates and uploads. Freed with release_weight.
  virtual const void* import_weight(const void* host, size_t bytes) = 0;
  virtual void release_weight(const void* p) = 0;
  // Synthetic weights for full-size benchmarks without a checkpoint: element i of `dst` (n
  // elements of dtype bf16 or f32) = scale * (2 u - 1), u = the top 24 bits of
  // splitmix64(seed + i) / 2^24. Identical on every backend.
  virtual void fill_random(void* dst, size_t n, DType dt, uint64_t seed, float scale) = 0;
  // Bytes of backend memory in use by this process (GPU: total - free), 0 if unknown.
  virtual size_t memory_used() const { return 0; }
  // The most memory_used() has been since the backend was made or memory_peak_reset() (GPU:
  // sampled after every allocation, so it includes load-time transients), 0 if unknown.
  virtual size_t memory_peak() const { return memory_used(); }
  virtual void memory_peak_reset() {}
  // Bytes of backend memory free now (and the total in *total), 0 if unknown or unbounded (CPU).
  virtual size_t memory_free(size_t* total = nullptr) const {
    if (total) *total = 0;
    return 0;
  }

  // ---- CUDA graphs (optional) ----------------------------------------------------------------
  // When graphs_enabled(), the ops enqueued between capture_begin() and capture_end() are
  // recorded instead of run; capture_end() returns a handle that graph_launch() replays
  // (nullptr when instantiation failed: the caller runs the ops directly). A recording bakes in
  // every pointer and scalar argument, so a caller replays only the identical op sequence;
  // positions and counts live in backend memory (StepMeta) and may change between replays.
  // graph_epoch() changes whenever the backend moves an internal scratch buffer: recordings of
  // an older epoch must not be replayed. capture_abort() ends a capture that threw.
  virtual bool graphs_enabled() const { return false; }
  virtual uint64_t graph_epoch() const { return 0; }
  virtual void capture_begin() {}
  virtual void* capture_end() { return nullptr; }
  virtual void capture_abort() {}
  virtual void graph_launch(void* /*graph*/) {}
  virtual void graph_destroy(void* /*graph*/) {}

  // ---- kernel profile (optional; `qflash bench --profile`) ----------------------------------
  // Between profile_begin() and profile_end(), every kernel is timed on its own with device
  // events and graphs are not used (ops run directly). profile_end() returns a table of kernel
  // time per iteration (the records divided by `iters`); "" where the backend has no profiler.
  virtual void profile_begin() {}
  virtual std::string profile_end(int /*iters*/) { return ""; }

  // ---- weight layout (optional) -------------------------------------------------------------
  // For a matrix that only matmul / matmul_group will read: a copy in this backend's own GEMV
  // layout (backend memory, released with release_weight), its layout code in *layout; nullptr
  // to keep the matrix as it is (the default; also when the copy does not fit). The caller then
  // releases the original (for int4: data, scales and biases, which the copy holds).
  virtual const void* relayout_matrix(const WeightRef& /*w*/, uint8_t* /*layout*/) { return nullptr; }
  // Device bytes the prefill GEMM may keep in row-major copies of relaid matrices (made at a
  // matrix's first prefill GEMM, reused by every later one, released with the matrix) instead of
  // restoring the row-major order into scratch at every call: the same bits either way. The
  // engine sets it after its loads from what stays free (fit.h, prefill_copy_budget); 0, the
  // default, keeps none. prefill_copy_bytes: what the copies hold now.
  virtual void set_prefill_copy_budget(size_t /*bytes*/) {}
  virtual size_t prefill_copy_bytes() const { return 0; }
  // int4 of a row-major bf16 matrix [rows, cols] in backend memory (synthetic int4 weights):
  // q u32 [rows, cols/8], scales/biases bf16 [rows, cols/group], bit for bit what
  // int4_quantize_row (io/quantize.h) computes. The default goes through the host.
  virtual void quantize_int4(const void* bf16, int64_t rows, int64_t cols, int group, void* q, void* scales,
                             void* biases);

  // ---- dense ops ----------------------------------------------------------------------------
  // y[m, r] = sum_c x[m, c] * W[r, c]; x [M, W.cols], y [M, W.rows]. Row-invariant.
  virtual void matmul(const WeightRef& W, const float* x, float* y, int M) = 0;
  // ys[i] = x W_i^T for n weights with the same cols that read the same x (the projections of
  // one layer). A GPU backend may run them as one launch; row-invariant like matmul.
  virtual void matmul_group(const WeightRef* const* Ws, float* const* ys, int n, const float* x, int M) {
    for (int i = 0; i < n; i++) matmul(*Ws[i], x, ys[i], M);
  }
  // out[m, :] = E[ids[m], :] as f32 (ids in backend memory).
  virtual void embed(const WeightRef& E, const int32_t* ids, float* out, int M) = 0;
  // y = x / sqrt(mean(x^2) + eps) * w  over rows of n; w f32 [n] (nullptr = ones). In-place ok.
  virtual void rmsnorm(const float* x, const float* w, float* y, int rows, int n, float eps) = 0;
  // y = w * rmsnorm(x) * silu(gate); rows of n. In-place (y == x) ok.
  virtual void rmsnorm_gated(const float* x, const float* gate, const float* w, float* y, int rows,
                             int n, float eps) = 0;
  virtual void add(float* y, const float* x, size_t n) = 0;                        // y += x
  // h += r (rows of n), then y = rmsnorm(h) * w: add() followed by rmsnorm(), bit for bit; a GPU
  // backend runs it as one launch. y must not alias h or r.
  virtual void add_rmsnorm(float* h, const float* r, const float* w, float* y, int rows, int n, float eps) {
    add(h, r, static_cast<size_t>(rows) * n);
    rmsnorm(h, w, y, rows, n, eps);
  }
  virtual void scale(float* y, float s, size_t n) = 0;                             // y *= s
  virtual void swiglu(const float* gate, const float* up, float* out, size_t n) = 0;  // silu(g)*u
  virtual void sigmoid_mul(float* y, const float* gate, size_t n) = 0;            // y *= sigmoid(g)
  // logits = tanh(logits / cap) * cap when cap > 0 (after the caller's scale).
  virtual void softcap(float* y, float cap, size_t n) = 0;
  // dst[r, 0:cols] = src[r, 0:cols] with leading dimensions in floats.
  virtual void copy_2d(float* dst, int dst_ld, const float* src, int src_ld, int rows, int cols) = 0;

  // ---- attention ----------------------------------------------------------------------------
  // qg [M, n_heads, 2, head_dim] (query | gate per head) -> q, gate [M, n_heads, head_dim].
  virtual void split_qgate(const float* qg, float* q, float* gate, int M, int n_heads, int head_dim) = 0;
  // NeoX rotate-half RoPE on dims [0, rot_dim) of each head; row m at position meta->q_pos0 + m.
  // x [M, n_heads, head_dim]; inv_freq[i] = 1 / powf(theta, 2i/rot_dim) in fp32, as transformers does.
  virtual void rope(float* x, int M, int n_heads, int head_dim, int rot_dim, float theta,
                    const StepMeta* meta) = 0;
  // cache[(meta->q_pos0 - meta->kv_pos0 + m), :] = rows[m, :]; cache [capacity, width] of
  // cache_dtype (F32, or BF16 rounded to nearest even exactly as f32_to_bf16).
  virtual void kv_write(void* cache, const float* rows, int M, int width, const StepMeta* meta,
                        DType cache_dtype = DType::F32) = 0;
  // out[m, h, :] = softmax over visible keys of (q[m,h]·K[j,g]) * scale, times V[j,g];
  // g = h / (n_heads / n_kv_heads). K, V [>= n_kv, n_kv_heads*head_dim] of p.kv_dtype. fp32
  // softmax; the reduction order depends only on the key range, never on M.
  virtual void attention(const float* q, const void* K, const void* V, float* out, int M,
                         const AttnParams& p, const StepMeta* meta) = 0;

  // ---- gated DeltaNet -----------------------------------------------------------------------
  // Rows are processed sequentially (docs/spec/qwen38.md 3.3): causal depthwise conv over
  // [tail | mixed rows] + SiLU, split q/k/v, l2-normalise q and k (q also * d_k^-0.5),
  // g = exp(-exp(A_log) * softplus(alpha + dt_bias)), beta = sigmoid(beta_in), delta rule on S,
  // y = S q. mixed [M, conv_dim], alpha/beta_in [M, n_v_heads], conv_w f32 [conv_dim, K],
  // A_log/dt_bias f32 [n_v_heads], state = the layer's blob (GdnDims), y [M, value_dim].
  // capture (nullable): after row m the whole blob is copied to capture + m * state_floats().
  virtual void gdn_rows(const float* mixed, const float* alpha, const float* beta_in,
                        const float* conv_w, const float* A_log, const float* dt_bias,
                        const GdnDims& d, float* state, float* y, int M, float* capture) = 0;

  // ---- prefill (long prompts; docs/spec/qwen38.md, "Prefill") -------------------------------
  // The prompt path for many rows. Each op below computes the same function as its decode twin
  // up to rounding (the tolerance is stated where the op is tested), and each is invariant to
  // how a prompt is split at multiples of kPrefillChunk rows: running rows [0, A) and then
  // [A, N) leaves bit-identical outputs and states to running [0, N) at once when A is a multiple
  // of kPrefillChunk. Defaults fall back to the decode ops (correct, slow); backends override.
  static constexpr int kPrefillChunk = 64;
  // y[m, r] = sum_c bf16(x[m, c]) * W[r, c] with fp32 accumulation: activations rounded to bf16
  // (round-to-nearest-even) so a GPU can use its bf16 tensor-core GEMM. Row-invariant for any M.
  // int4 weights enter as bf16 too: W[r, c] = bf16_rn(fl(q * scale) + bias) (the dequantized
  // value in fp32, mul then add, rounded to bf16; docs/DESIGN.md "Prefill path"), so a GPU
  // dequantizes a matrix once per call and runs the same GEMM. f16 and f32 weights are used as
  // they are (the matmul on the rounded activations).
  virtual void gemm(const WeightRef& W, const float* x, float* y, int M) { matmul(W, x, y, M); }
  // ys[i] = gemm(W_i, x) for n weights with the same cols (one layer's projections): the same
  // bits as n gemm calls; a GPU backend rounds x once for all of them.
  virtual void gemm_group(const WeightRef* const* Ws, float* const* ys, int n, const float* x, int M) {
    for (int i = 0; i < n; i++) gemm(*Ws[i], x, ys[i], M);
  }
  // Prefill fusions: an elementwise op whose output only the next gemm reads, and that gemm, as
  // one call; the same bits as the two ops in sequence. y = gemm(W, silu(gate) * up) with
  // gate, up [M, W.cols]; gate's contents afterwards are unspecified.
  virtual void swiglu_gemm(const WeightRef& W, float* gate, const float* up, float* y, int M) {
    swiglu(gate, up, gate, static_cast<size_t>(M) * W.cols);
    gemm(W, gate, y, M);
  }
  // y = gemm(W, rmsnorm_gated(x, gate, w)) over rows of n (M * W.cols / n of them); x's contents
  // afterwards are unspecified.
  virtual void rmsnorm_gated_gemm(const WeightRef& W, float* x, const float* gate, const float* w, float* y, int M,
                                  int n, float eps) {
    rmsnorm_gated(x, gate, w, x, static_cast<int>(static_cast<int64_t>(M) * W.cols / n), n, eps);
    gemm(W, x, y, M);
  }
  // The layer norms in front of a projection group: h += r when r is not null (else h is left as
  // it is), then gemm_group(Ws, ys, n, rmsnorm(h) * w) over rows of `width` (= the weights' cols);
  // the same bits as add_rmsnorm (or rmsnorm) followed by gemm_group. y [M, width] is scratch for
  // the norm's fp32 output where a backend needs it; its contents afterwards are unspecified.
  virtual void add_rmsnorm_gemm_group(float* h, const float* r, const float* w, float* y, int M, int width, float eps,
                                      const WeightRef* const* Ws, float* const* ys, int n) {
    if (r)
      add_rmsnorm(h, r, w, y, M, width, eps);
    else
      rmsnorm(h, w, y, M, width, eps);
    gemm_group(Ws, ys, n, y, M);
  }
  // y = gemm(W, x * sigmoid(gate)) with x, gate [M, W.cols] (the attention output gate in front of
  // the o projection); x's contents afterwards are unspecified.
  virtual void sigmoid_mul_gemm(const WeightRef& W, float* x, const float* gate, float* y, int M) {
    sigmoid_mul(x, gate, static_cast<size_t>(M) * W.cols);
    gemm(W, x, y, M);
  }
  // gdn_rows without capture, computed chunk-parallel (chunks of kPrefillChunk rows from row 0,
  // state carried between chunks, conv tail handled as in gdn_rows).
  virtual void gdn_chunked(const float* mixed, const float* alpha, const float* beta_in, const float* conv_w,
                           const float* A_log, const float* dt_bias, const GdnDims& d, float* state, float* y,
                           int M) {
    gdn_rows(mixed, alpha, beta_in, conv_w, A_log, dt_bias, d, state, y, M, nullptr);
  }
  // attention for many query rows (causal prefill): a row's result depends only on its own
  // query and the keys it sees, never on M or on which other rows run.
  virtual void attention_prefill(const float* q, const void* K, const void* V, float* out, int M,
                                 const AttnParams& p, const StepMeta* meta) {
    attention(q, K, V, out, M, p, meta);
  }

  // ---- selection ----------------------------------------------------------------------------
  // Largest value per row, lowest index among equal maxima. out [M] int32 in backend memory.
  virtual void argmax_rows(const float* x, int M, int n, int32_t* out) = 0;
  // Top-k per row sorted by (value desc, index asc). vals [M, k], ids [M, k].
  virtual void topk_rows(const float* x, int M, int n, int k, float* vals, int32_t* ids) = 0;

  // ---- DFlash2 ------------------------------------------------------------------------------
  // Grouped dynamic causal conv (docs/spec/dflash2.md 2.5) over one block of L rows:
  // out[i,c] = sum_t (base[t,c] + D[i, side*Kc*G + t*G + c/gs]) * x[i-t, c], x[<0] = 0.
  // base = base_kernel + side*Kc*H (f32 [Kc, H]); D [L, 2*Kc*G]. out must not alias x.
  virtual void dyn_conv(const float* x, const float* base, const float* D, float* out, int L, int H,
                        int Kc, int gs, int side) = 0;
  // Candidate path selector walk (docs/spec/dflash2.md 3.1, greedy): for slot j = 0..k-1,
  // s[c] = cand_vals[j,c] + sum_r Epre[pred, r] * P[j, r] * Esuc[cand_ids[j,c], r] (fp32),
  // pick the first max, pred = that candidate. pred starts at *anchor. drafts [k],
  // scores [k, K] (the walk's scores). Epre/Esuc are [V, R] weights (bf16 usually).
  virtual void selector_walk(const float* cand_vals, const int32_t* cand_ids, const float* P,
                             const WeightRef& Epre, const WeightRef& Esuc, const int32_t* anchor,
                             int k, int K, int R, int32_t* drafts, float* scores) = 0;
};

// The counter-based generator behind fill_random (host side, shared by backends' twins).
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
inline float random_uniform_pm1(uint64_t seed, uint64_t i) {
  return static_cast<float>(splitmix64(seed + i) >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

std::unique_ptr<Backend> make_cpu_backend();
// nullptr when qflash was built without CUDA or no GPU is present; `why` says which.
std::unique_ptr<Backend> make_cuda_backend(std::string* why);
bool cuda_compiled();

// RAII buffer on a backend.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Backend* be, size_t bytes) : be_(be), bytes_(bytes), p_(bytes ? be->alloc(bytes) : nullptr) {}
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      be_ = o.be_; bytes_ = o.bytes_; p_ = o.p_;
      o.p_ = nullptr; o.bytes_ = 0;
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { reset(); }
  void reset() {
    if (p_ && be_) be_->release(p_);
    p_ = nullptr; bytes_ = 0;
  }
  float* f() const { return static_cast<float*>(p_); }
  int32_t* i() const { return static_cast<int32_t*>(p_); }
  void* get() const { return p_; }
  size_t bytes() const { return bytes_; }

 private:
  Backend* be_ = nullptr;
  size_t bytes_ = 0;
  void* p_ = nullptr;
};

}  // namespace qf
