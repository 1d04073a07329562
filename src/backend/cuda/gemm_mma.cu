// The prefill GEMM straight from the GEMV's tiled weights (QFLASH_GEMM=mma; gemm.h): no untile
// copy, mma.sync m16n8k16 bf16 -> fp32, a cp.async pipeline of 64-column chunks.
//
// Why it fits the layout. A 4 KB block of the tiled layout (one 32-row tile, one 64-column chunk)
// holds, at vector v * 32 + lane, exactly the A-fragment words lane (g, t) of a warp needs: rows
// g, g+8, g+16, g+24 of the tile (v = 2i + h, row 16 (i / 2) + g + 8 (i % 2)), columns
// 16 t + 8 h .. + 8. Read with the GEMV's k permutation (k16 step s of the chunk: logical k-pair t
// <- columns 16 t + 4 s + {0, 1}, pair t + 4 <- 16 t + 4 s + {2, 3}), a block is copied to shared
// memory as it is and read back with one conflict-free 16-byte load per lane and vector. The
// activations (bf16, row-major) are staged 128 bytes per token and chunk, 16-byte granule q at
// q ^ (token % 8), so that the B fragments (token g's columns 16 t .. 16 t + 15) load without
// bank conflicts too.
//
// Row-invariance: an output is one accumulator chain, chunk 0..nch-1 then k16 steps 0..3 inside
// a chunk, in the MMA's own order; the tile a row lands in and M change nothing of it.
//
// Geometry: a block computes 128 weight rows (4 tiles) x 256 tokens with 8 warps, warp (wr, wc)
// rows 64 wr .. + 64 (2 tiles) x tokens 64 wc .. + 64 (8 n8 tiles). 4 pipeline stages of 48 KB.
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/gemm.h"

namespace qf::cuda {

namespace {

constexpr int kMmaRows = 128, kMmaTok = 256, kMmaStages = 4;
constexpr int kStageA = (kMmaRows / 32) * 4096;  // 4 tiles x 4 KB
constexpr int kStageB = kMmaTok * 128;           // 256 tokens x 64 bf16
constexpr int kStageBytes = kStageA + kStageB;
constexpr int kMmaSmem = kMmaStages * kStageBytes;

__device__ __forceinline__ uint4 lds16(const char* p) { return *reinterpret_cast<const uint4*>(p); }
__device__ __forceinline__ uint32_t w4(const uint4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

struct MmaParams {
  const char* w;    // tiled bf16 weights
  const char* xb;   // bf16 activations [M, K]
  float* y;         // [M, N]
  int N, K, M, nch, ntiles;
};

__global__ void __launch_bounds__(256, 1) gemm_mma_kernel(const MmaParams P) {
  extern __shared__ __align__(128) char smem[];
  pdl_trigger();
  pdl_wait();  // xb comes from the previous kernel; y may still be read by an earlier one
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int wr = warp >> 2, wc = warp & 3;
  const int tile0 = blockIdx.y * (kMmaRows / 32);
  const int tok0 = blockIdx.x * kMmaTok;

  auto load_stage = [&](int stage, int c) {
    char* sa = smem + stage * kStageBytes;
    char* sb = sa + kStageA;
#pragma unroll
    for (int i = 0; i < kStageA / 16 / 256; i++) {  // 4 granules of A per thread
      const int gi = tid + 256 * i, T = gi >> 8, off = (gi & 255) * 16;
      const int tile = tile0 + T;
      const bool ok = tile < P.ntiles;
      const char* src = P.w + (static_cast<size_t>(ok ? tile : 0) * P.nch + c) * 4096 + off;
      cp_async16(smem_u32(sa + T * 4096 + off), src, ok ? 16 : 0);
    }
#pragma unroll
    for (int i = 0; i < kStageB / 16 / 256; i++) {  // 8 granules of B per thread
      const int gi = tid + 256 * i, n = gi >> 3, q = gi & 7;
      const int m = tok0 + n;
      const bool ok = m < P.M;
      const char* src = P.xb + (static_cast<size_t>(ok ? m : 0) * P.K + c * 64 + q * 8) * 2;
      cp_async16(smem_u32(sb + n * 128 + ((q ^ (n & 7)) * 16)), src, ok ? 16 : 0);
    }
  };

  float acc[2][2][8][4];
#pragma unroll
  for (int T = 0; T < 2; T++)
#pragma unroll
    for (int a = 0; a < 2; a++)
#pragma unroll
      for (int j = 0; j < 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[T][a][j][e] = 0.0f;

#pragma unroll
  for (int s = 0; s < kMmaStages - 1; s++) {
    if (s < P.nch) load_stage(s, s);
    cp_async_commit();
  }
  for (int c = 0; c < P.nch; c++) {
    cp_async_wait<kMmaStages - 2>();
    __syncthreads();  // chunk c has landed; every warp is done with the stage refilled next
    {
      const int cn = c + kMmaStages - 1;
      if (cn < P.nch) load_stage(cn % kMmaStages, cn);
      cp_async_commit();
    }
    const char* sa = smem + (c % kMmaStages) * kStageBytes;
    const char* sb = sa + kStageA;
#pragma unroll
    for (int h = 0; h < 2; h++) {
      // B: token n = 64 wc + 8 j + g, granule 2 t + h (columns 16 t + 8 h .. + 8): words 0, 1 feed
      // k16 step 2h, words 2, 3 step 2h + 1.
      uint4 bv[8];
#pragma unroll
      for (int j = 0; j < 8; j++) {
        const int n = 64 * wc + 8 * j + g;
        bv[j] = lds16(sb + n * 128 + (((2 * t + h) ^ (n & 7)) * 16));
      }
#pragma unroll
      for (int T = 0; T < 2; T++) {
        const char* blk = sa + (2 * wr + T) * 4096 + lane * 16;
        uint4 av[4];  // rows g, g + 8, g + 16, g + 24: vectors v = 2 i + h
#pragma unroll
        for (int i = 0; i < 4; i++) av[i] = lds16(blk + (2 * i + h) * 512);
#pragma unroll
        for (int e = 0; e < 2; e++)
#pragma unroll
          for (int a = 0; a < 2; a++) {
            const uint32_t af[4] = {w4(av[2 * a], 2 * e), w4(av[2 * a + 1], 2 * e), w4(av[2 * a], 2 * e + 1),
                                    w4(av[2 * a + 1], 2 * e + 1)};
#pragma unroll
            for (int j = 0; j < 8; j++) mma_bf16_16816(acc[T][a][j], af, w4(bv[j], 2 * e), w4(bv[j], 2 * e + 1));
          }
      }
    }
  }
  cp_async_wait<0>();

  // Accumulator element e of (T, a, j): weight row 32 (tile) + 16 a + g + 8 (e / 2), token 8 j + 2 t + (e % 2).
#pragma unroll
  for (int T = 0; T < 2; T++)
#pragma unroll
    for (int a = 0; a < 2; a++)
#pragma unroll
      for (int j = 0; j < 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int r = (tile0 + 2 * wr + T) * 32 + 16 * a + g + 8 * (e >> 1);
          const int m = tok0 + 64 * wc + 8 * j + 2 * t + (e & 1);
          if (r < P.N && m < P.M) P.y[static_cast<size_t>(m) * P.N + r] = acc[T][a][j][e];
        }
}

}  // namespace

void gemm_mma_tiled(const WeightRef& W, const uint16_t* xb, float* y, int M, cudaStream_t st) {
  if (W.dtype != DType::BF16 || W.layout != WeightRef::kTc32x64 || W.cols % 64 != 0)
    backend_fail("cuda gemm (mma): tiled bf16 weights with cols %% 64 == 0 expected");
  if (M <= 0) return;
  static const bool attr_ok = [] {
    return cudaFuncSetAttribute(gemm_mma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kMmaSmem) == cudaSuccess;
  }();
  if (!attr_ok) backend_fail("cuda gemm (mma): cannot reserve %d bytes of shared memory", kMmaSmem);
  MmaParams P;
  P.w = static_cast<const char*>(W.data);
  P.xb = reinterpret_cast<const char*>(xb);
  P.y = y;
  P.N = static_cast<int>(W.rows);
  P.K = static_cast<int>(W.cols);
  P.M = M;
  P.nch = P.K / 64;
  P.ntiles = (P.N + 31) / 32;
  const unsigned gx = static_cast<unsigned>((M + kMmaTok - 1) / kMmaTok);
  const unsigned gy = static_cast<unsigned>((P.N + kMmaRows - 1) / kMmaRows);
  if (gy > 65535) backend_fail("cuda gemm (mma): %d weight rows exceed the grid", P.N);
  if (prof_on()) prof_tag("%d x %d, M=%d", P.N, P.K, M);
  launch_k(gemm_mma_kernel, dim3(gx, gy), dim3(256), static_cast<size_t>(kMmaSmem), st, P);
  QF_CUDA_LAUNCH_CHECK("gemm_mma_kernel");
}

}  // namespace qf::cuda
