// bf16 instantiations of the multi-row GEMV (gemv_impl.cuh). Its schedule variants (R, U) are
// in the kernel lab, bench/lab_gemv_fma.cu.
#include "backend/cuda/gemv_impl.cuh"

namespace qf::cuda {

void gemv_run_bf16(const GemvParams& P, int mb, bool vec, cudaStream_t st) { gemv_dispatch_mb<WK::BF16>(P, mb, vec, st); }

}  // namespace qf::cuda
