// Device helpers shared by the CUDA backend's kernels. Every floating-point reduction here has a
// fixed order (explicit _rn intrinsics, fixed shuffle trees), so a result depends on its inputs
// only, never on launch geometry chosen from the row count M.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <utility>

#include "backend/cuda/cuda_util.h"
#include "backend/cuda/kernels.h"

namespace qf::cuda {

constexpr unsigned kFull = 0xffffffffu;

// Sum over the 32 lanes by an xor butterfly. Every lane ends with the same value: at each level
// both partners add the same two operands (fp add is commutative), so the tree is identical.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o >= 1; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(kFull, v, o));
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o >= 1; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFull, v, o));
  return v;
}

// CPU twins (backend/cpu): silu(x) = x / (1 + exp(-x)), sigmoid = 1 / (1 + exp(-x)),
// softplus with torch's threshold 20. Plain IEEE division (no fast-math).
__device__ __forceinline__ float silu_f(float x) { return __fdiv_rn(x, __fadd_rn(1.0f, expf(-x))); }
__device__ __forceinline__ float sigmoid_f(float x) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x))); }
__device__ __forceinline__ float swiglu_f(float g, float u) { return __fmul_rn(silu_f(g), u); }
__device__ __forceinline__ float softplus_f(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ float bf16_bits(uint16_t h) { return __uint_as_float(static_cast<uint32_t>(h) << 16); }
// qf::f32_to_bf16 (core/dtype.h) bit for bit: round to nearest even, NaN kept quiet.
__device__ __forceinline__ uint16_t f32_to_bf16_bits(float f) {
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
__device__ __forceinline__ float f16_bits(uint16_t h) { return __half2float(__ushort_as_half(h)); }
// Exact small-integer to float: 2^23 + q has q in its mantissa.
__device__ __forceinline__ float nib_to_f(uint32_t q) { return __fsub_rn(__uint_as_float(0x4B000000u | q), 8388608.0f); }
// int4 group-affine dequantisation exactly as the CPU twin: q * scale + bias, two roundings.
__device__ __forceinline__ float deq4(uint32_t q, float s, float b) { return __fadd_rn(__fmul_rn(nib_to_f(q), s), b); }

// Programmatic dependent launch (Hopper). pdl_trigger(): a kernel lets the next kernel in the
// stream be scheduled now, if that kernel was launched with the programmatic attribute
// (launch_k sets it on every launch unless QFLASH_PDL=0); the next kernel still sees none of this kernel's writes until it
// has called pdl_wait(), which returns when every earlier kernel has completed and flushed. Both
// are no-ops for a kernel launched the ordinary way.
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Asks L2 for the line holding p (no data returned, nothing to wait for). Used before
// pdl_wait() on buffers an earlier kernel may still write: the line is coherent in L2 either way,
// and the address translation and first fetch overlap the previous kernel's tail.
__device__ __forceinline__ void touch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// Every kernel launch of the backend: the ordinary launch, or with programmatic dependent launch
// unless QFLASH_PDL=0 (pdl_enabled(), cuda_util.h). Every kernel launched here calls pdl_trigger()
// and then pdl_wait() before it touches memory that an earlier kernel may write, so PDL overlaps
// a kernel's launch and scheduling with its predecessor's tail. The exceptions read weights
// before pdl_wait(): the tensor-core GEMVs (their first chunk), the norms (the norm vector) and
// the GDN conv (its taps). Weights are written only by uploads (copies, which never overlap a
// kernel) and by fill_random and the GEMV relayout, which do not trigger early, so no weight
// is still being written when a later kernel starts.
template <class... Exp, class... Act>
void launch_k(void (*kernel)(Exp...), dim3 grid, dim3 block, size_t smem, cudaStream_t st, Act&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 1 : 0;
  const bool prof = prof_on();
  if (prof) prof_before(st);
  cuda_check(cudaLaunchKernelEx(&cfg, kernel, std::forward<Act>(args)...), "cudaLaunchKernelEx", __FILE__, __LINE__);
  if (prof) prof_after(reinterpret_cast<const void*>(kernel), grid.x * grid.y * grid.z, block.x * block.y * block.z, st);
}

// Streaming 16-byte weight load: read once, keep out of L1 (the activations live there).
__device__ __forceinline__ uint4 ld_stream16(const void* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

// One weight element as fp32 for the generic (scalar) paths: dtype codes as qf::DType.
struct WeightView {
  const void* data;
  const uint16_t* scales;
  const uint16_t* biases;
  int64_t rows, cols;
  int group;
  int dtype;  // static_cast<int>(qf::DType)
};

__device__ __forceinline__ float weight_at(const WeightView& W, int64_t r, int64_t c) {
  switch (W.dtype) {
    case 0:  // F32
      return static_cast<const float*>(W.data)[r * W.cols + c];
    case 1:  // F16
      return f16_bits(static_cast<const uint16_t*>(W.data)[r * W.cols + c]);
    case 2:  // BF16
      return bf16_bits(static_cast<const uint16_t*>(W.data)[r * W.cols + c]);
    default: {  // U32: int4 packed 8 per word
      const uint32_t word = static_cast<const uint32_t*>(W.data)[r * (W.cols / 8) + c / 8];
      const uint32_t q = (word >> (4 * (c % 8))) & 0xfu;
      const int64_t ng = W.cols / W.group;
      const float s = bf16_bits(W.scales[r * ng + c / W.group]);
      const float b = bf16_bits(W.biases[r * ng + c / W.group]);
      return deq4(q, s, b);
    }
  }
}

inline WeightView view_of(const WeightRef& W) {
  WeightView v;
  v.data = W.data;
  v.scales = static_cast<const uint16_t*>(W.scales);
  v.biases = static_cast<const uint16_t*>(W.biases);
  v.rows = W.rows;
  v.cols = W.cols;
  v.group = W.group;
  v.dtype = static_cast<int>(W.dtype);
  return v;
}

// Plain stores (the record may live in mapped host memory, where device atomics are not
// guaranteed): when several threads fail at once, one of their reports survives.
__device__ __forceinline__ void set_error(DevError* e, int code, int a, int b, int c) {
  if (!e) return;
  volatile DevError* v = e;
  if (v->code != 0) return;
  v->a = a;
  v->b = b;
  v->c = c;
  __threadfence_system();
  v->code = code;
}

// weight_at decodes F32 / F16 / BF16 and treats anything else as int4: refuse other dtypes (and
// int4 without its scales) on the host, where the CPU twin fails too.
inline void check_weight_view(const WeightRef& W, const char* what) {
  if (!W.data) backend_fail("cuda %s: weight has no data", what);
  if (W.dtype == DType::U32) {
    if (W.group <= 0 || !W.scales || !W.biases || W.cols % 8 != 0 || W.cols % W.group != 0)
      backend_fail("cuda %s: int4 weight without scales/biases or with group %d not dividing cols %lld", what, W.group,
                   static_cast<long long>(W.cols));
  } else if (W.dtype != DType::F32 && W.dtype != DType::F16 && W.dtype != DType::BF16) {
    backend_fail("cuda %s: unsupported weight dtype code %d", what, static_cast<int>(W.dtype));
  }
}

inline unsigned grid_for(size_t n, int block, unsigned cap = 65535u * 8u) {
  size_t g = (n + block - 1) / block;
  if (g < 1) g = 1;
  return static_cast<unsigned>(g > cap ? cap : g);
}

// ---- tensor cores: cp.async, ldmatrix, mma.sync (sm_80+) -----------------------------------
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16-byte async copy global -> shared; src_bytes 0 fills the destination with zeros.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
// Four 8x8 b16 matrices from shared memory (lane l gives the row address of matrix l / 8).
__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
// c += a b: m16n8k16, bf16 operands, fp32 accumulate (a: 4 words of the A fragment, b0 b1 of B).
__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// Two fp32 values as bf16 pairs x = hi + lo (hi = bf16(x), lo = bf16(x - hi), round to nearest
// even; |x - hi - lo| <= 2^-18 |x|), the first value in the low half of each word.
__device__ __forceinline__ void split_bf16x2(float a, float b, uint32_t& hi, uint32_t& lo) {
  const __nv_bfloat16 ha = __float2bfloat16_rn(a), hb = __float2bfloat16_rn(b);
  hi = static_cast<uint32_t>(__bfloat16_as_ushort(ha)) | (static_cast<uint32_t>(__bfloat16_as_ushort(hb)) << 16);
  const __nv_bfloat162 l =
      __floats2bfloat162_rn(__fsub_rn(a, __bfloat162float(ha)), __fsub_rn(b, __bfloat162float(hb)));
  lo = *reinterpret_cast<const uint32_t*>(&l);
}

// ---- attention ------------------------------------------------------------------------------
// The key rows [lo, hi) query row m sees (backend.h: causal, sliding window), as rows of the key
// buffer, from the positions in the StepMeta; hi <= lo means none. CLAMP: an empty range comes
// out with hi = lo. I: int64_t, or int (hi <= n_kv fits).
template <bool CLAMP, class I>
__device__ __forceinline__ void attn_visible_range(const StepMeta* meta, int m, int causal, int window, I* lo_out,
                                                   I* hi_out) {
  const int64_t qpos = static_cast<int64_t>(meta->q_pos0) + m;
  const int64_t kv0 = meta->kv_pos0;
  int64_t lo = 0, hi = meta->n_kv;
  if (causal && qpos - kv0 + 1 < hi) hi = qpos - kv0 + 1;
  if (window > 0) {
    if (qpos - window + 1 - kv0 > lo) lo = qpos - window + 1 - kv0;
    if (!causal && qpos + window - kv0 < hi) hi = qpos + window - kv0;
  }
  if constexpr (CLAMP) {
    if (hi < lo) hi = lo;
  }
  *lo_out = static_cast<I>(lo);
  *hi_out = static_cast<I>(hi);
}

// The fields the tensor-core attention launchers (attention_group.cu, attention_prefill.cu) fill
// alike in their geometry structs; scale_log2 = scale log2(e), so that scores go into exp2.
template <class Geom>
void attn_common_geom(Geom& G, const AttnParams& p, int M) {
  G.M = M;
  G.n_heads = p.n_heads;
  G.group = p.n_heads / p.n_kv_heads;
  G.kvw = p.n_kv_heads * p.head_dim;
  G.scale_log2 = p.scale * 1.4426950408889634f;
  G.causal = p.causal ? 1 : 0;
  G.window = p.window;
}

// ---- gated DeltaNet: the CPU twin's arithmetic, shared by gdn_rows (gdn.cu) and gdn_chunked --
// (gdn_chunk.cu), so that both paths round the same way.
// Causal conv of one channel at one row, before the SiLU: the K-1 earlier raw rows in win (oldest
// first) times w[0..K-2], then the current raw row times wlast, summed in that order.
// KFIX > 0: K is known at compile time (KFIX, which the caller checked equals K), so the tests on
// j fold away and the window moves by register renaming; the same operations in the same order.
template <int KMAX, int KFIX = 0>
__device__ __forceinline__ float gdn_conv_acc(const float (&w)[KMAX], const float (&win)[KMAX - 1], float wlast,
                                              float raw, int K) {
  const int k = KFIX > 0 ? KFIX : K;
  float acc = 0.0f;
#pragma unroll
  for (int j = 0; j < KMAX - 1; j++)
    if (j < k - 1) acc = __fadd_rn(acc, __fmul_rn(w[j], win[j]));
  return __fadd_rn(acc, __fmul_rn(wlast, raw));
}
// Moves the conv window on by one row: raw becomes its newest entry.
template <int W, int KFIX = 0>
__device__ __forceinline__ void gdn_conv_push(float (&win)[W], float raw, int K) {
  const int k = KFIX > 0 ? KFIX : K;
#pragma unroll
  for (int j = 0; j < W; j++) {
    if (j < k - 2) win[j] = win[j + 1 < W ? j + 1 : j];
    else if (j == k - 2) win[j] = raw;
  }
}
// 1 / sqrt(sum of squares + eps): the l2 normalisation of q and k.
__device__ __forceinline__ float gdn_inv_norm(float ss, float eps) {
  return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(ss, eps)));
}
// log of the decay g: -exp(A_log) softplus(alpha + dt_bias), with neg_a = -exp(A_log).
__device__ __forceinline__ float gdn_log_decay(float neg_a, float alpha, float dt_bias) {
  return __fmul_rn(neg_a, softplus_f(__fadd_rn(alpha, dt_bias)));
}
// The inputs and head geometry both GDN launchers pass to their kernels (Args: their argument
// structs, which name these fields alike).
template <class Args>
void gdn_common_args(Args& a, const GdnDims& d, const float* alpha, const float* beta_in, const float* A_log,
                     const float* dt_bias, int M) {
  a.alpha = alpha;
  a.beta_in = beta_in;
  a.A_log = A_log;
  a.dt_bias = dt_bias;
  a.M = M;
  a.C = d.conv_dim();
  a.key_dim = d.key_dim();
  a.Hv = d.n_v_heads;
  a.ratio = d.n_v_heads / d.n_k_heads;
  a.dk = d.d_k;
  a.dv = d.d_v;
  a.eps = d.eps;
  a.qscale = 1.0f / std::sqrt(static_cast<float>(d.d_k));  // the CPU twin's expression
}


// ---- tensor-core GEMV (gemv_tc_impl.cuh bf16, gemv_tc_q4.cu int4): one warp = one 32-row tile
// and one column slice. Params: their launch structs, which name these fields alike.

// The weights of one grouped launch: each weight's data (as Elem), rows and first tile in the
// group's list of 32-row tiles (tile0[n] = all the tiles), the shared cols and the x row stride.
template <class Elem, class Params>
void tc_fill_segments(Params& P, const WeightRef* const* Ws, int n, int x_ld, int64_t tiles) {
  P.nseg = n;
  P.cols = static_cast<int>(Ws[0]->cols);
  P.x_ld = x_ld;
  for (int i = 0, t0 = 0; i < n; i++) {
    P.w[i] = static_cast<const Elem*>(Ws[i]->data);
    P.rows[i] = static_cast<int>(Ws[i]->rows);
    P.tile0[i] = t0;
    t0 += static_cast<int>((Ws[i]->rows + 31) / 32);
  }
  P.tile0[n] = static_cast<int>(tiles);
}

// Zeroes a warp's accumulators: two 16-row halves of its 32-row tile x NT n-tiles x the 4
// C-fragment values.
template <int NT>
__device__ __forceinline__ void tc_zero(float (&acc)[2][NT][4]) {
#pragma unroll
  for (int a = 0; a < 2; a++)
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) acc[a][j][e] = 0.0f;
}

// A warp's token rows: row j * 8 + g of x for n-tile j (xv: the row exists; a missing row reads
// row 0, whose products are never stored), offset by `lane_off` floats; and its accumulators,
// zeroed.
template <int NT>
__device__ __forceinline__ void tc_warp_rows(const float* x, int M, int x_ld, int g, int lane_off, bool (&xv)[NT],
                                             const float* (&xp)[NT], float (&acc)[2][NT][4]) {
#pragma unroll
  for (int j = 0; j < NT; j++) {
    xv[j] = j * 8 + g < M;
    xp[j] = x + static_cast<size_t>(xv[j] ? j * 8 + g : 0) * x_ld + lane_off;
  }
  tc_zero<NT>(acc);
}

// A wave of the column-slice grid: 132 SMs x 2 resident 8-warp blocks on the H200 (a constant, so
// the split chosen from it is the same on every device and for every M).
constexpr int kTcConcurrentBlocks = 264;

// Column slices from the shape alone (never from M): the smallest ks in {1, 2, .., warps} that
// keeps at least 8 column units (chunks) per slice and fills the last wave best.
inline int tc_column_slices(int64_t tiles, int64_t units, int warps) {
  int best = 1;
  double best_eff = -1;
  for (int ks = 1; ks <= warps; ks *= 2) {
    if (ks > 1 && units < 8 * ks) break;
    const double blocks = static_cast<double>((tiles * ks + warps - 1) / warps);
    const double waves = blocks / kTcConcurrentBlocks;
    const double eff = waves / std::ceil(waves);
    if (eff > best_eff + 0.02) {
      best = ks;
      best_eff = eff;
    }
  }
  return best;
}

// The segment (grouped weight) of global tile `tile`.
template <int MaxSeg, class Params>
__device__ __forceinline__ int tc_seg_of(const Params& P, int tile) {
  int s = 0;
#pragma unroll
  for (int i = 1; i < MaxSeg; i++)
    if (i < P.nseg && tile >= P.tile0[i]) s = i;
  return s;
}

// A warp's finished sums of one tile, each value v of row r (< nrows), token m (< M) handed to
// put(r, m, v); row0 is the tile's first row. Accumulator element e of tile (a, j): row
// row0 + 16a + g + 8(e / 2), token 8j + 2t + (e % 2).
template <int NT, class Put>
__device__ __forceinline__ void tc_put_tile(int nrows, int M, int row0, int g, int t, const float (&v)[2][NT][4],
                                            Put&& put) {
#pragma unroll
  for (int a = 0; a < 2; a++)
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int r = row0 + 16 * a + g + 8 * (e >> 1), m = 8 * j + 2 * t + (e & 1);
        if (r < nrows && m < M) put(r, m, v[a][j][e]);
      }
}

// tc_put_tile into Y ([M][nrows]).
template <int NT>
__device__ __forceinline__ void tc_write_tile(float* Y, int nrows, int M, int row0, int g, int t,
                                              const float (&v)[2][NT][4]) {
  tc_put_tile<NT>(nrows, M, row0, g, t, v, [&](int r, int m, float x) { Y[static_cast<size_t>(m) * nrows + r] = x; });
}

// A block's finished sums: the value v of row r of segment sg, token m (r < the segment's rows,
// m < P.M) goes to put(sg, r, m, v). One slice: each warp's own sums (seg, row0, nrows: its
// tile's; nrows 0 past the last tile); else partial sums through shared memory, added in slice
// order. tile_base: the block's first tile.
template <int NT, int MaxSeg, class Params, class Put>
__device__ __forceinline__ void tc_reduce_block(const Params& P, const float (&acc)[2][NT][4], int tile_base, int seg,
                                                int row0, int nrows, int warp, int lane, int g, int t, Put&& put) {
  if (P.ks == 1) {
    tc_put_tile<NT>(nrows, P.M, row0, g, t, acc, [&](int r, int m, float v) { put(seg, r, m, v); });
    return;
  }
  extern __shared__ float red[];  // [warp][a][j][e][lane]
#pragma unroll
  for (int a = 0; a < 2; a++)
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) red[(((warp * 2 + a) * NT + j) * 4 + e) * 32 + lane] = acc[a][j][e];
  __syncthreads();
  const int per_tile = 2 * NT * 4 * 32;
  for (int idx = threadIdx.x; idx < P.tiles_per_block * per_tile; idx += blockDim.x) {
    const int tl = idx / per_tile, rem = idx % per_tile;
    const int ln = rem % 32, e = (rem / 32) % 4, j = (rem / 128) % NT, a = rem / (128 * NT);
    const int gt = tile_base + tl;
    if (gt >= P.tile0[P.nseg]) continue;
    const int sg = tc_seg_of<MaxSeg>(P, gt);
    const int rows_s = P.rows[sg];
    const int r = (gt - P.tile0[sg]) * 32 + 16 * a + (ln >> 2) + 8 * (e >> 1);
    const int m = 8 * j + 2 * (ln & 3) + (e & 1);
    if (r >= rows_s || m >= P.M) continue;
    float s = 0.0f;
    for (int k = 0; k < P.ks; k++) s = __fadd_rn(s, red[((((tl * P.ks + k) * 2 + a) * NT + j) * 4 + e) * 32 + ln]);
    put(sg, r, m, s);
  }
}

// A warp's results to y (segment sg: P.y[sg], [M][P.rows[sg]]): tc_reduce_block of block
// blockIdx.x, whose tiles are blockIdx.x * P.tiles_per_block onwards.
template <int NT, int MaxSeg, class Params>
__device__ __forceinline__ void tc_store_y(const Params& P, const float (&acc)[2][NT][4], int seg, int row0, int nrows,
                                           int warp, int lane, int g, int t) {
  if (P.ks == 1) {
    tc_write_tile<NT>(P.y[seg], nrows, P.M, row0, g, t, acc);
    return;
  }
  tc_reduce_block<NT, MaxSeg>(P, acc, static_cast<int>(blockIdx.x) * P.tiles_per_block, seg, row0, nrows, warp, lane,
                              g, t, [&](int sg, int r, int m, float v) {
                                P.y[sg][static_cast<size_t>(m) * P.rows[sg] + r] = v;
                              });
}

}  // namespace qf::cuda
