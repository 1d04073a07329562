// int4 (mlx group-affine, u32-packed) instantiations of the multi-row GEMV (gemv_impl.cuh).
#include "backend/cuda/gemv_impl.cuh"

namespace qf::cuda {

void gemv_run_q4(const GemvParams& P, int mb, bool vec, cudaStream_t st) { gemv_dispatch_mb<WK::Q4>(P, mb, vec, st); }

}  // namespace qf::cuda
