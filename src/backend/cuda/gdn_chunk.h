// Chunked gated DeltaNet on the GPU (Backend::gdn_chunked): launchers of gdn_chunk.cu, whose
// header comment gives the algorithm. Host code; included by the backend class and the tests.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>

#include "backend/backend.h"

namespace qf::cuda {

// Shapes the chunked kernels take: d_k and d_v multiples of 32 up to 128, conv kernel 1..8,
// n_v_heads a multiple of n_k_heads. The backend runs gdn_rows (the same function, sequential)
// for other shapes.
bool gdn_chunk_supported(const GdnDims& d);

// The intermediates of one call, in the scratch buffer (nc = chunks = ceil(M / 64); rows past M
// are zero). Exposed so that the tests can check the parallel stage on its own.
struct GdnChunkScratch {
  float* qn;   // [nc, n_k_heads, 64, d_k] l2-normalised q times d_k^-0.5
  float* kn;   // [nc, n_k_heads, 64, d_k] l2-normalised k
  float* w;    // [nc, n_v_heads, 64, d_k] W = (I + A)^-1 diag(beta e^G) K
  float* u;    // [nc, n_v_heads, 64, d_v] U = (I + A)^-1 diag(beta) V
  float* aqk;  // [nc, n_v_heads, 64, 64]  (q_t . k_s) e^{G_t - G_s} for s <= t, else 0
  float* eg;   // [nc, n_v_heads, 64]      e^{G_t}
  float* er;   // [nc, n_v_heads, 64]      e^{G_{L-1} - G_t}
};
size_t gdn_chunk_scratch_floats(const GdnDims& d, int M);
GdnChunkScratch gdn_chunk_scratch_layout(const GdnDims& d, int M, float* scratch);

// Backend::gdn_chunked for a supported shape; scratch holds gdn_chunk_scratch_floats(d, M).
// recur_warps: warps per block of the sequential stage, 4 or 8 (the same bits either way; 8 is
// taken only where d_k is a multiple of 64); 0 = QFLASH_GDN_WARPS, else 8. generic_conv: the
// parallel stage's conv for any kernel size even where it is 4 (for the tests: the same bits as
// the compile-time size 4 that runs otherwise).
void gdn_chunked(const float* mixed, const float* alpha, const float* beta_in, const float* conv_w, const float* A_log,
                 const float* dt_bias, const GdnDims& d, float* state, float* y, int M, float* scratch,
                 cudaStream_t st, int recur_warps = 0, bool generic_conv = false);

}  // namespace qf::cuda
