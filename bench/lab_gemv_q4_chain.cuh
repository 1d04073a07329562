// Kernel lab, int4 GEMV chain mode (bench/lab_gemv_q4.cu --chain): a 27B layer's int4 GEMVs in
// order, each stage's x made from the previous stage's outputs, timed (a) as separate launches of
// version 22 "ixt" (one x-preparation launch + one GEMV launch per stage, plain or PDL) and (b) as
// ONE persistent launch that walks every stage with device counters instead of kernel boundaries.
// Lab only: nothing here is compiled into the backend. docs/experiments/cuda_kernels.md, section
// "Persistent int4 chain", has the design and the question.
//
// Arithmetic: version 22's, bit for bit. A stage is version 22's grid: blocks of 8 warps, TPB = 8 / S
// 32-row tiles a block, the warp of (tile, slice) folding groups gs..ge-1 in order into its
// accumulators, slices added in slice order into +0 (q4ix_split picks S from the shape). The
// persistent walk runs the same blocks ("units") one after another on fewer, resident blocks;
// the x digits come from the same per-(token, group) code (qc_prep_task = q4ix_prep_kernel's
// math, after the stand-in transform). So (a) and (b) must agree bit for bit, and both must equal
// q4ix_run (version 22 itself) on the x values (a) writes out: the lab memcmp's all three.
//
// Stand-in transform between stages (what sits between the projections in the model, reduced to
// one cheap elementwise op): x[c] = fl(fl(a[c] * sigmoid(b[c])) * 2^k) where the stage takes a gated
// input (gdn in -> out: a = qkv rows 0..6143, b = z; attn q|k|v -> o: a = q rows 0..6143, b = rows
// 6144..12287; gate|up -> down: a = gate, b = up), else x[c] = fl(a[c] * 2^k) (out -> gate|up,
// down -> next layer's in). The powers of two keep the rms near 1 over many layers.
//
// Persistent walk (q4c_persist_kernel): grid = SMs x resident blocks a SM (occupancy API), so every
// block is resident. Global unit list in stage order: stage 0's preparation units (8 (token,
// group) tasks each), then for every stage its GEMV units (version 22's blocks, in block order).
// Block b takes units b, b + grid, b + 2 grid, ... in increasing order. Dependencies:
//   - a GEMV unit of stage s waits until cnt[s] (x tasks of stage s done) == M * ng_s;
//   - x tasks of stage s > 0 are done by the block that completes the last of the 2 (ungated) or 4
//     (gated) previous-stage tiles a group of stage s reads: after writing its tiles' outputs the
//     unit adds 1 to each fed group's counter (atom.acq_rel.gpu); the block that brings a group to
//     its count prepares that group's digits for all M tokens and adds M to cnt[s]
//     (red.release.gpu). A waiter spins on ld.acquire.gpu by one thread, then bar.sync.
// Deadlock-free by construction: a unit waits only on work of units with smaller indices, every
// block takes its units in increasing order and every block is resident, so the unfinished unit
// with the smallest index can always run. A watchdog (%globaltimer) turns a wait longer than
// timeout into an error record and an abort flag that every waiter polls. Counters: two sets; a
// launch uses one and zeroes the other for the next launch (which starts after this one ends).
// Data written in the launch (outputs, digits) is read with ld.global.cg (L2), never the
// non-coherent path.
#pragma once
#include <cstdint>
#include <stdexcept>

#include "lab_gemv_q4_ix.cuh"

namespace qf::cuda {
namespace {

struct Q4cStage {
  // The GEMV: n <= 4 weights of the same cols in version 22's layout (tiled nibbles, packed sb).
  const uint4* q[kIxMaxW];
  const uint4* sb[kIxMaxW];
  float* y[kIxMaxW];  // [M][rows]
  int rows[kIxMaxW];
  int tile0[kIxMaxW + 1];
  int n, cols, ng, S, units;  // units: 8-warp blocks of TPB = 8 / S tiles (version 22's grid)
  // x[tok][c] = xa[tok lda + c] (* sigmoid(xb[tok ldb + c]) if xb) * xscale
  const float* xa;
  const float* xb;
  int lda, ldb;
  float xscale;
  uint8_t* xq;  // the digits: [16][ng][3][64] bytes
  float* xsp;   // [ng][16][2]: (xs, pow2)
  float* xout;  // optional: the x values [M][cols] (the checks)
  // Persistent walk.
  int base, pre;  // first unit of the stage; its preparation units (stage 0 only)
  int cnt;        // counters from cnt: [0] x tasks done, [1 + slice] the same per column slice, [9 + g] tiles done that group g reads
  int dep_aw, dep_at0, dep_bw, dep_bt0;  // previous stage's weight / first tile read as xa, xb (-1: none)
  int need;                              // tiles a group reads: 2 (xa) or 4 (xa, xb)
};

struct Q4cPersist {
  const Q4cStage* st;  // [ns], device memory
  int ns, M, total;    // stages, tokens, units
  unsigned* cnt;       // this launch's counter set
  unsigned* cnt_zero;  // the other set, zeroed for the next launch
  int ncnt;
  int* err;  // [0]: first error (1 + stage * 65536 + unit), sticky; [1]: abort flag
  long long timeout_ns;
  int mode;  // bits: 1 a unit's first D groups of weights requested after its wait (else before); 2 L2
             // prefetch; 4 per-warp waits on the warp's column slice; 8 units from an atomic ticket
  int pf;    // mode 2: groups beyond the first D prefetched into L2 before the wait
};

__device__ __forceinline__ unsigned qc_ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void qc_red_release(unsigned* p, unsigned v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned qc_atom_acq_rel(unsigned* p, unsigned v) {
  unsigned old;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}
__device__ __forceinline__ long long qc_now() {
  long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// The stand-in transform (explicit roundings: the same bits in every kernel that inlines it).
__device__ __forceinline__ float qc_xform(float a, const float* b, float bv, float sc) {
  return __fmul_rn(b ? __fmul_rn(a, __frcp_rn(__fadd_rn(1.0f, expf(-bv)))) : a, sc);
}

// One warp: the digits of token tok, group gi of stage P's x (q4ix_prep_kernel's math, after the
// transform). Reads the previous outputs through L2 (they may have been written in this launch).
__device__ __forceinline__ void qc_prep_task(const Q4cStage& P, int tok, int gi, int lane) {
  const int col = gi * 64 + 2 * lane;
  const float2 a = __ldcg(reinterpret_cast<const float2*>(P.xa + static_cast<int64_t>(tok) * P.lda + col));
  float2 b = make_float2(0.0f, 0.0f);
  if (P.xb) b = __ldcg(reinterpret_cast<const float2*>(P.xb + static_cast<int64_t>(tok) * P.ldb + col));
  float2 v;
  v.x = qc_xform(a.x, P.xb, b.x, P.xscale);
  v.y = qc_xform(a.y, P.xb, b.y, P.xscale);
  if (P.xout) *reinterpret_cast<float2*>(P.xout + static_cast<int64_t>(tok) * P.cols + col) = v;
  const int ng = P.ng;
  float mx = fmaxf(fabsf(v.x), fabsf(v.y));
#pragma unroll
  for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  int X0 = 0, X1 = 0;
  float pow2 = 1.0f;
  if (mx > 0.0f) {
    int e;
    frexpf(mx, &e);
    if (rintf(ldexpf(mx, 23 - e)) > 8323072.0f) e += 1;  // as q4ix_prep_kernel
    X0 = static_cast<int>(rintf(ldexpf(v.x, 23 - e)));
    X1 = static_cast<int>(rintf(ldexpf(v.y, 23 - e)));
    pow2 = ldexpf(1.0f, e - 23);
  }
  int sum = X0 + X1;
#pragma unroll
  for (int o = 16; o; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  const int t = lane >> 3, j = (lane >> 2) & 1, i = lane & 3;
  uint8_t* base = P.xq + (static_cast<int64_t>(tok) * ng + gi) * 3 * 64 + t * 16 + j * 8 + i;
  const int Xs[2] = {X0, X1};
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const int X = Xs[h];
    const int l = static_cast<int8_t>(X & 0xFF);
    const int r1 = (X - l) >> 8;
    const int m = static_cast<int8_t>(r1 & 0xFF);
    const int hi = (r1 - m) >> 8;
    base[0 * 64 + h * 4] = static_cast<uint8_t>(hi);
    base[1 * 64 + h * 4] = static_cast<uint8_t>(m);
    base[2 * 64 + h * 4] = static_cast<uint8_t>(l);
  }
  if (lane == 0) {
    P.xsp[(static_cast<int64_t>(gi) * 16 + tok) * 2 + 0] = static_cast<float>(sum) * pow2;
    P.xsp[(static_cast<int64_t>(gi) * 16 + tok) * 2 + 1] = pow2;
  }
}

// One version-22 block ("unit") of stage P: q4ix_kernel<NT, true>'s body with the unit index for
// blockIdx.x. wait() is called by every thread after the unit's first D groups of weights are
// requested (or before them: late), as wait(live, slice, gs, ge); it returns false to abandon the
// unit (abort; uniform across the block). CG: x digits through L2 (written in this launch) instead of __ldg. Ends with a
// barrier (the outputs are written, red may be reused).
template <int NT, bool CG, class Wait>
__device__ __forceinline__ bool qc_gemv_unit(const Q4cStage& P, int M, int unit, float (*red)[32][16], bool late,
                                             int pf, Wait&& wait) {
  constexpr int D = NT == 1 ? 4 : 3;  // groups in flight per warp (version 22's)
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int S = P.S, TPB = 8 / S;
  const int ntiles = P.tile0[P.n];
  const int tile = unit * TPB + warp / S, slice = warp % S;
  const bool live = tile < ntiles;
  int wi = 0;
  while (wi + 1 < P.n && tile >= P.tile0[wi + 1]) wi++;
  const int lt = tile - P.tile0[wi];
  const int ng = P.ng;
  const int gs = slice * ng / S, ge = (slice + 1) * ng / S;
  const uint4* tb = P.q[wi] + static_cast<int64_t>(lt) * ng * 64 + lane;
  const uint4* sbp = P.sb[wi] + static_cast<int64_t>(lt) * ng * 8 + g;
  uint2 W[D][4];
  uint4 SB[D];
  auto load = [&](uint2 (&w)[4], uint4& sbv, int gi) {
    const uint4 u0 = ld_stream16(tb + gi * 64), u1 = ld_stream16(tb + gi * 64 + 32);
    w[0] = make_uint2(u0.x, u0.y);
    w[1] = make_uint2(u0.z, u0.w);
    w[2] = make_uint2(u1.x, u1.y);
    w[3] = make_uint2(u1.z, u1.w);
    sbv = ld_stream16(sbp + gi * 8);
  };
  auto prologue = [&] {
#pragma unroll
    for (int s = 0; s < D; s++)
      if (gs + s < ge) load(W[s], SB[s], gs + s);
  };
  if (live && !late) {
    prologue();
    // mode 2: the next pf groups of the warp's slice into L2 (lanes 0..7: the 1 KB of nibbles,
    // lane 8: the 128 bytes of scales) while the unit waits.
    if (pf > 0 && lane < 9)
      for (int gi = gs + D; gi < ge && gi < gs + D + pf; gi++)
        prefetch_l2(lane < 8 ? static_cast<const void*>(tb - lane + gi * 64 + 8 * lane)
                             : static_cast<const void*>(sbp - g + gi * 8));
  }
  if (!wait(live, slice, gs, ge)) return false;
  if (live && late) prologue();
  float acc[NT][2][2][2];
#pragma unroll
  for (int a = 0; a < NT; a++)
#pragma unroll
    for (int b = 0; b < 8; b++) (&acc[a][0][0][0])[b] = 0.0f;
  if (live) {
    const uint4* xqv = reinterpret_cast<const uint4*>(P.xq);
    const float4* xspv = reinterpret_cast<const float4*>(P.xsp);
    for (int gb = gs; gb < ge; gb += D) {
#pragma unroll
      for (int s = 0; s < D; s++) {
        const int gi = gb + s;
        if (gi < ge) {
          uint2 w[4];
#pragma unroll
          for (int i = 0; i < 4; i++) w[i] = W[s][i];
          const uint4 sb = SB[s];
          if (gi + D < ge) load(W[s], SB[s], gi + D);
          uint4 xb[NT][3];
          float4 xp[NT];
#pragma unroll
          for (int tt = 0; tt < NT; tt++) {
            const int tok = tt * 8 + g;
#pragma unroll
            for (int d = 0; d < 3; d++) {
              const uint4* p = xqv + ((static_cast<int64_t>(tok) * ng + gi) * 3 + d) * 4 + t;
              xb[tt][d] = tok < M ? (CG ? __ldcg(p) : __ldg(p)) : make_uint4(0u, 0u, 0u, 0u);
            }
            const float4* pp = xspv + static_cast<int64_t>(gi) * 8 + tt * 4 + t;
            xp[tt] = CG ? __ldcg(pp) : __ldg(pp);
          }
          uint32_t ev[4][2], od[4][2];
#pragma unroll
          for (int i = 0; i < 4; i++) {
            const uint32_t wj[2] = {w[i].x, w[i].y};
#pragma unroll
            for (int j = 0; j < 2; j++) {
              ev[i][j] = wj[j] & 0x0F0F0F0Fu;
              od[i][j] = (wj[j] >> 4) & 0x0F0F0F0Fu;
            }
          }
          const uint32_t sbw[4] = {sb.x, sb.y, sb.z, sb.w};
#pragma unroll
          for (int tt = 0; tt < NT; tt++) {
#pragma unroll
            for (int mt = 0; mt < 2; mt++) {
              int c[3][4];
#pragma unroll
              for (int d = 0; d < 3; d++) {
                const uint32_t bx[4] = {xb[tt][d].x, xb[tt][d].y, xb[tt][d].z, xb[tt][d].w};
#pragma unroll
                for (int k = 0; k < 4; k++) c[d][k] = 0;
#pragma unroll
                for (int j = 0; j < 2; j++)
                  ix_mma(c[d], ev[2 * mt][j], ev[2 * mt + 1][j], od[2 * mt][j], od[2 * mt + 1][j], bx[2 * j], bx[2 * j + 1]);
              }
#pragma unroll
              for (int h = 0; h < 2; h++) {
                const uint32_t sw = sbw[2 * mt + h];
                const float scale = __uint_as_float(sw << 16), bias = __uint_as_float(sw & 0xFFFF0000u);
#pragma unroll
                for (int cc = 0; cc < 2; cc++) {
                  if (tt * 8 + 2 * t + cc < M) {
                    const int k = 2 * h + cc;
                    const float low = static_cast<float>(c[1][k] * 256 + c[2][k]);
                    const float qd = fmaf(static_cast<float>(c[0][k]), 65536.0f, low);
                    const float xs = cc ? xp[tt].z : xp[tt].x, p2 = cc ? xp[tt].w : xp[tt].y;
                    acc[tt][mt][h][cc] += fmaf(scale, qd * p2, bias * xs);
                  }
                }
              }
            }
          }
        }
      }
    }
  }
#pragma unroll
  for (int tt = 0; tt < NT; tt++)
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
      for (int h = 0; h < 2; h++)
#pragma unroll
        for (int cc = 0; cc < 2; cc++) {
          const int tok = tt * 8 + 2 * t + cc;
          if (tok < M) red[warp][mt * 16 + 8 * h + g][tok] = acc[tt][mt][h][cc];
        }
  __syncthreads();
  for (int idx = threadIdx.x; idx < TPB * 32 * M; idx += blockDim.x) {
    const int tl = idx / (32 * M), rr = (idx / M) % 32, tok = idx % M;
    const int tg = unit * TPB + tl;
    if (tg >= ntiles) continue;
    int w2 = 0;
    while (w2 + 1 < P.n && tg >= P.tile0[w2 + 1]) w2++;
    const int64_t row = static_cast<int64_t>(tg - P.tile0[w2]) * 32 + rr;
    if (row >= P.rows[w2]) continue;
    float v = 0.0f;
    for (int s = 0; s < S; s++) v += red[tl * S + s][rr][tok];
    P.y[w2][static_cast<int64_t>(tok) * P.rows[w2] + row] = v;
  }
  __syncthreads();
  return true;
}

// (a) The x preparation of one stage: one warp per (token, group), tok = task / ng.
__global__ void __launch_bounds__(256) q4c_prep_kernel(const __grid_constant__ Q4cStage P, int M) {
  pdl_trigger();
  pdl_wait();
  const int task = blockIdx.x * 8 + (threadIdx.x >> 5);
  if (task >= M * P.ng) return;
  qc_prep_task(P, task / P.ng, task % P.ng, threadIdx.x & 31);
}

// (a) One stage's GEMV: version 22's grid and arithmetic; under PDL its first weights are
// requested before griddepcontrol.wait (as production's GEMVs do).
template <int NT>
__global__ void __launch_bounds__(256, NT == 1 ? 2 : 1) q4c_gemv_kernel(const __grid_constant__ Q4cStage P, int M) {
  __shared__ float red[8][32][16];
  pdl_trigger();
  qc_gemv_unit<NT, false>(P, M, blockIdx.x, red, false, 0, [](bool, int, int, int) {
    pdl_wait();
    return true;
  });
}

// One thread: wait until *c >= target. 0: done; 1: abort (timeout here or elsewhere).
__device__ __noinline__ int qc_wait(const unsigned* c, unsigned target, int* err, long long timeout_ns, int code) {
  if (qc_ld_acquire(c) >= target) return 0;
  const long long t0 = qc_now();
  for (;;) {
    if (qc_ld_acquire(c) >= target) return 0;
    if (*reinterpret_cast<volatile int*>(err + 1)) return 1;
    if (qc_now() - t0 > timeout_ns) {
      atomicCAS(err, 0, code);
      atomicExch(err + 1, 1);
      return 1;
    }
  }
}

// The column slice (of S over ng groups, version 22's partition) that holds group gi.
__device__ __forceinline__ int qc_slice_of(int gi, int ng, int S) {
  int sl = 0;
  while (sl + 1 < S && (sl + 1) * ng / S <= gi) sl++;
  return sl;
}

// (b) The whole chain in one launch (see the file comment). Counters of stage s at cnt + P.cnt:
// [0] x tasks done, [1 + slice] x tasks done in that column slice, [9 + g] tiles done that group g
// reads; the last counter of the set is the unit ticket (mode 8). Modes (bits): 1 late first
// weights, 2 L2 prefetch, 4 each warp waits only for its own slice's groups (stages overlap),
// 8 units after the first from an atomic ticket instead of round-robin.
template <int NT>
__global__ void __launch_bounds__(256, NT == 1 ? 2 : 1) q4c_persist_kernel(const __grid_constant__ Q4cPersist K) {
  __shared__ float red[8][32][16];
  __shared__ int s_flag, s_nready, s_abort;
  __shared__ int s_next[2];
  __shared__ int s_ready[16];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  for (int i = blockIdx.x * blockDim.x + tid; i < K.ncnt; i += gridDim.x * blockDim.x) K.cnt_zero[i] = 0u;
  const int M = K.M;
  const bool dyn = K.mode & 8, swait = K.mode & 4;
  int s = 0, it = 0;
  for (int u = blockIdx.x; u < K.total; it ^= 1) {
    while (s + 1 < K.ns && u >= K.st[s + 1].base) s++;
    const Q4cStage& P = K.st[s];
    const int lu = u - P.base;
    // The block's next unit (requested now; the ticket's latency hides behind this unit).
    int nxt = u + static_cast<int>(gridDim.x);
    if (dyn && tid == 0) nxt = static_cast<int>(gridDim.x + atomicAdd(K.cnt + K.ncnt - 1, 1u));
    if (lu < P.pre) {  // stage 0's x: 8 (token, group) tasks
      const int task = lu * 8 + warp, ntask = M * P.ng;
      if (task < ntask) qc_prep_task(P, task / P.ng, task % P.ng, lane);
      if (tid == 0) s_next[it] = nxt;
      __syncthreads();
      if (tid == 0) {
        const int nt = min(8, ntask - lu * 8);
        for (int k = 0; k < nt; k++) qc_red_release(K.cnt + P.cnt + 1 + qc_slice_of((lu * 8 + k) % P.ng, P.ng, P.S), 1u);
        qc_red_release(K.cnt + P.cnt, static_cast<unsigned>(nt));
      }
      u = s_next[it];
      continue;
    }
    const int gu = lu - P.pre;
    const bool ok = qc_gemv_unit<NT, true>(
        P, M, gu, red, K.mode & 1, (K.mode & 2) ? K.pf : 0, [&](bool live, int slice, int gs, int ge) {
          if (swait) {  // per warp; on abort the unit runs on (the block leaves after it)
            if (live) {
              if (lane == 0)
                qc_wait(K.cnt + P.cnt + 1 + slice, static_cast<unsigned>(M * (ge - gs)), K.err, K.timeout_ns,
                        1 + s * 65536 + gu);
              __syncwarp();
            }
            return true;
          }
          if (tid == 0)
            s_flag = qc_wait(K.cnt + P.cnt, static_cast<unsigned>(M * P.ng), K.err, K.timeout_ns, 1 + s * 65536 + gu);
          __syncthreads();
          return s_flag == 0;
        });
    if (!ok) break;
    // Feed the next stage's groups; the block that completes a group prepares its x.
    if (tid == 0) {
      s_next[it] = nxt;
      s_abort = *reinterpret_cast<volatile int*>(K.err + 1);
      int nr = 0;
      if (s + 1 < K.ns) {
        const Q4cStage& N = K.st[s + 1];
        const int TPB = 8 / P.S, ntiles = P.tile0[P.n];
        for (int tl = 0; tl < TPB; tl++) {
          const int tg = gu * TPB + tl;
          if (tg >= ntiles) break;
          int w2 = 0;
          while (w2 + 1 < P.n && tg >= P.tile0[w2 + 1]) w2++;
          const int lt = tg - P.tile0[w2];
#pragma unroll
          for (int ab = 0; ab < 2; ab++) {
            const int dw = ab ? N.dep_bw : N.dep_aw, dt0 = ab ? N.dep_bt0 : N.dep_at0;
            if (dw == w2 && lt >= dt0 && lt < dt0 + 2 * N.ng) {
              const int gj = (lt - dt0) >> 1;
              if (qc_atom_acq_rel(K.cnt + N.cnt + 9 + gj, 1u) + 1u == static_cast<unsigned>(N.need)) s_ready[nr++] = gj;
            }
          }
        }
      }
      s_nready = nr;
    }
    __syncthreads();
    if (s_abort) break;
    const int nr = s_nready;
    if (nr) {
      const Q4cStage& N = K.st[s + 1];
      for (int task = warp; task < nr * M; task += 8) qc_prep_task(N, task % M, s_ready[task / M], lane);
      __syncthreads();
      if (tid == 0) {
        for (int k = 0; k < nr; k++)
          qc_red_release(K.cnt + N.cnt + 1 + qc_slice_of(s_ready[k], N.ng, N.S), static_cast<unsigned>(M));
        qc_red_release(K.cnt + N.cnt, static_cast<unsigned>(nr * M));
      }
    }
    u = s_next[it];
  }
}

}  // namespace
}  // namespace qf::cuda
