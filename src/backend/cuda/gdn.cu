// Gated DeltaNet recurrence (Backend::gdn_rows), two kernels per call.
//
// gdn_conv_kernel: one thread per conv channel. It keeps the channel's conv window in registers,
// walks the M rows in order (u = silu(conv)), writes the conv tail after each row into the
// capture slots, and finally the new tail into the state. A channel is owned by one thread, so
// reading the old tail and writing the new one cannot race.
//
// gdn_recur_kernel: grid (value head, value-row block). A warp owns RW value rows of S[h] in
// registers (lane holds key dims j = lane + 32t), loops over the M rows in order: l2-normalise q
// and k of the key head (every warp computes the same values with the same fixed tree), decay,
// delta rule, y = S q, and after each row stores its S rows into the capture slot.
//
// Row-invariance: every row is processed by the same instructions whatever M is (the row loop
// is sequential inside the kernels), so M rows in one call equal M calls of one row, bit for bit,
// including the captured states.
#include <cmath>

#include "backend/cuda/device_common.cuh"
#include "backend/cuda/kernels.h"

namespace qf::cuda {

namespace {

constexpr int kConvMax = 8;
constexpr int kRW = 4;    // value rows per warp
constexpr int kWPB = 4;   // warps per block

__global__ void gdn_conv_kernel(const float* __restrict__ mixed, const float* __restrict__ conv_w, float* tail,
                                float* __restrict__ u, float* __restrict__ capture, size_t cap_stride, size_t s_floats,
                                int C, int K, int M) {
  pdl_trigger();
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  float w[kConvMax];  // conv weights before the wait: no kernel in flight writes weights
#pragma unroll
  for (int j = 0; j < kConvMax; j++) w[j] = c < C && j < K ? conv_w[static_cast<size_t>(c) * K + j] : 0.0f;
  pdl_wait();
  if (c >= C) return;
  float win[kConvMax - 1];
#pragma unroll
  for (int j = 0; j < kConvMax - 1; j++) win[j] = j < K - 1 ? tail[static_cast<size_t>(j) * C + c] : 0.0f;
  float wlast = 0.0f;
#pragma unroll
  for (int j = 0; j < kConvMax; j++)
    if (j == K - 1) wlast = w[j];
  for (int m = 0; m < M; m++) {
    const float raw = mixed[static_cast<size_t>(m) * C + c];
    u[static_cast<size_t>(m) * C + c] = silu_f(gdn_conv_acc(w, win, wlast, raw, K));
    gdn_conv_push(win, raw, K);
    if (capture) {
      float* ct = capture + m * cap_stride + s_floats;
#pragma unroll
      for (int j = 0; j < kConvMax - 1; j++)
        if (j < K - 1) ct[static_cast<size_t>(j) * C + c] = win[j];
    }
  }
#pragma unroll
  for (int j = 0; j < kConvMax - 1; j++)
    if (j < K - 1) tail[static_cast<size_t>(j) * C + c] = win[j];
}

struct RecurArgs {
  const float* u;  // [M, C] after conv + silu
  const float* alpha;
  const float* beta_in;
  const float* A_log;
  const float* dt_bias;
  float* S;  // [Hv, dv, dk]
  float* y;  // [M, Hv * dv]
  float* capture;
  size_t cap_stride;
  int C, key_dim, Hv, dk, dv, ratio, M;
  float eps, qscale;
};

template <int TPL>
__global__ void __launch_bounds__(kWPB * 32) gdn_recur_kernel(const RecurArgs a) {
  pdl_trigger();
  pdl_wait();
  const int h = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int i0 = (blockIdx.y * kWPB + warp) * kRW;
  if (i0 >= a.dv) return;  // whole warp
  const int kh = h / a.ratio;
  const int dk = a.dk, dv = a.dv;
  float* Sh = a.S + static_cast<size_t>(h) * dv * dk;

  float S[kRW][TPL];
#pragma unroll
  for (int r = 0; r < kRW; r++)
#pragma unroll
    for (int t = 0; t < TPL; t++) {
      const int i = i0 + r, j = lane + 32 * t;
      S[r][t] = (i < dv && j < dk) ? Sh[static_cast<size_t>(i) * dk + j] : 0.0f;
    }
  const float negA = -expf(a.A_log[h]);
  const float dtb = a.dt_bias[h];

  // Row inputs are loaded one row ahead, so their latency overlaps the previous row's math.
  struct RowIn {
    float q[TPL], k[TPL], v[kRW], al, be;
  };
  auto load_row = [&](int m, RowIn& in) {
    const float* um = a.u + static_cast<size_t>(m) * a.C;
#pragma unroll
    for (int t = 0; t < TPL; t++) {
      const int j = lane + 32 * t;
      in.q[t] = j < dk ? um[kh * dk + j] : 0.0f;
      in.k[t] = j < dk ? um[a.key_dim + kh * dk + j] : 0.0f;
    }
    const float* vm = um + 2 * a.key_dim + static_cast<size_t>(h) * dv;
#pragma unroll
    for (int r = 0; r < kRW; r++) in.v[r] = i0 + r < dv ? vm[i0 + r] : 0.0f;
    in.al = a.alpha[static_cast<size_t>(m) * a.Hv + h];
    in.be = a.beta_in[static_cast<size_t>(m) * a.Hv + h];
  };
  RowIn cur;
  load_row(0, cur);
  RowIn nxt = cur;

  for (int m = 0; m < a.M; m++) {
    if (m + 1 < a.M) load_row(m + 1, nxt);
    float qv[TPL], kv[TPL];
    float sq = 0.0f, sk = 0.0f;
#pragma unroll
    for (int t = 0; t < TPL; t++) {
      qv[t] = cur.q[t];
      kv[t] = cur.k[t];
      sq = fmaf(qv[t], qv[t], sq);
      sk = fmaf(kv[t], kv[t], sk);
    }
    sq = warp_sum(sq);
    sk = warp_sum(sk);
    const float iq = gdn_inv_norm(sq, a.eps);
    const float ik = gdn_inv_norm(sk, a.eps);
#pragma unroll
    for (int t = 0; t < TPL; t++) {
      qv[t] = __fmul_rn(__fmul_rn(qv[t], iq), a.qscale);
      kv[t] = __fmul_rn(kv[t], ik);
    }
    const float g = expf(gdn_log_decay(negA, cur.al, dtb));
    const float beta = sigmoid_f(cur.be);
    float* ym = a.y + static_cast<size_t>(m) * a.Hv * dv + static_cast<size_t>(h) * dv;
#pragma unroll
    for (int r = 0; r < kRW; r++) {
      const int i = i0 + r;
      const float vi = cur.v[r];
      float p = 0.0f;
#pragma unroll
      for (int t = 0; t < TPL; t++) {
        S[r][t] = __fmul_rn(S[r][t], g);
        p = fmaf(S[r][t], kv[t], p);
      }
      const float rr = warp_sum(p);
      const float delta = __fmul_rn(beta, __fsub_rn(vi, rr));
      float o = 0.0f;
#pragma unroll
      for (int t = 0; t < TPL; t++) {
        S[r][t] = __fadd_rn(S[r][t], __fmul_rn(delta, kv[t]));
        o = fmaf(S[r][t], qv[t], o);
      }
      o = warp_sum(o);
      if (lane == 0 && i < dv) ym[i] = o;
    }
    if (a.capture) {
      float* cs = a.capture + m * a.cap_stride + static_cast<size_t>(h) * dv * dk;
#pragma unroll
      for (int r = 0; r < kRW; r++)
#pragma unroll
        for (int t = 0; t < TPL; t++) {
          const int i = i0 + r, j = lane + 32 * t;
          if (i < dv && j < dk) cs[static_cast<size_t>(i) * dk + j] = S[r][t];
        }
    }
    cur = nxt;
  }
#pragma unroll
  for (int r = 0; r < kRW; r++)
#pragma unroll
    for (int t = 0; t < TPL; t++) {
      const int i = i0 + r, j = lane + 32 * t;
      if (i < dv && j < dk) Sh[static_cast<size_t>(i) * dk + j] = S[r][t];
    }
}

}  // namespace

size_t gdn_scratch_floats(const GdnDims& d, int M) { return static_cast<size_t>(M) * d.conv_dim(); }

void gdn_rows(const float* mixed, const float* alpha, const float* beta_in, const float* conv_w, const float* A_log,
              const float* dt_bias, const GdnDims& d, float* state, float* y, int M, float* capture, float* scratch,
              cudaStream_t st) {
  if (M <= 0) return;
  if (d.conv_kernel < 1 || d.conv_kernel > kConvMax)
    backend_fail("cuda gdn_rows: conv kernel %d outside 1..%d", d.conv_kernel, kConvMax);
  if (d.d_k <= 0 || d.d_k > 256 || d.d_v <= 0 || d.n_k_heads <= 0 || d.n_v_heads % d.n_k_heads != 0)
    backend_fail("cuda gdn_rows: unsupported dims (k heads %d, v heads %d, d_k %d, d_v %d)", d.n_k_heads, d.n_v_heads,
                 d.d_k, d.d_v);
  const int C = d.conv_dim();
  const size_t SF = d.state_floats();
  launch_k(gdn_conv_kernel, dim3((C + 127) / 128), dim3(128), 0, st, mixed, conv_w, state + d.s_floats(), scratch, capture, SF,
                                                   d.s_floats(), C, d.conv_kernel, M);
  QF_CUDA_LAUNCH_CHECK("gdn_conv_kernel");
  RecurArgs a;
  gdn_common_args(a, d, alpha, beta_in, A_log, dt_bias, M);
  a.u = scratch;
  a.S = state;
  a.y = y;
  a.capture = capture;
  a.cap_stride = SF;
  const dim3 grid(d.n_v_heads, (d.d_v + kRW * kWPB - 1) / (kRW * kWPB));
  const int tpl = (d.d_k + 31) / 32;
  if (tpl <= 1) launch_k(gdn_recur_kernel<1>, dim3(grid), dim3(kWPB * 32), 0, st, a);
  else if (tpl <= 2) launch_k(gdn_recur_kernel<2>, dim3(grid), dim3(kWPB * 32), 0, st, a);
  else if (tpl <= 4) launch_k(gdn_recur_kernel<4>, dim3(grid), dim3(kWPB * 32), 0, st, a);
  else launch_k(gdn_recur_kernel<8>, dim3(grid), dim3(kWPB * 32), 0, st, a);
  QF_CUDA_LAUNCH_CHECK("gdn_recur_kernel");
}

}  // namespace qf::cuda
