// f16 and f32 instantiations of the multi-row GEMV (gemv_impl.cuh).
#include "backend/cuda/gemv_impl.cuh"

namespace qf::cuda {

void gemv_run_f16(const GemvParams& P, int mb, bool vec, cudaStream_t st) { gemv_dispatch_mb<WK::F16>(P, mb, vec, st); }
void gemv_run_f32(const GemvParams& P, int mb, bool vec, cudaStream_t st) { gemv_dispatch_mb<WK::F32>(P, mb, vec, st); }

}  // namespace qf::cuda
