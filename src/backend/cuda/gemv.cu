// Backend::matmul's entry point: validates, plans (shape-only column split), and runs the
// multi-row GEMV in passes of at most 16 rows (bf16 weights: the tensor-core GEMV, gemv_tc.cu).
// See gemv_impl.cuh.
#include <cstdlib>
#include <cstring>

#include "backend/cuda/gemv_impl.cuh"

namespace qf::cuda {

namespace {
int cw_of(DType t) {
  switch (t) {
    case DType::BF16: case DType::F16: return 8;
    case DType::F32: return 4;
    case DType::U32: return 32;
    default: backend_fail("cuda matmul: unsupported weight dtype code %d", static_cast<int>(t));
  }
}
int bucket(int m) { return m <= 1 ? 1 : m <= 2 ? 2 : m <= 4 ? 4 : m <= 8 ? 8 : 16; }
}  // namespace

bool gemv_tc_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("QFLASH_GEMV");
    return !(e && std::strcmp(e, "fma") == 0);
  }();
  return on;
}

int gemv_auto_slices(const WeightRef& W) {
  if (gemv_tc_enabled() && gemv_tc_eligible(W)) return gemv_tc_slices((W.rows + 31) / 32, W.cols);
  return gemv_slices_for(W.rows, W.cols, cw_of(W.dtype));
}

GemvParams gemv_params(const WeightRef& W, int x_ld, int ks, bool* vec_out) {
  const int cw = cw_of(W.dtype);
  GemvParams P{};
  P.w = W.data;
  P.scales = static_cast<const uint16_t*>(W.scales);
  P.biases = static_cast<const uint16_t*>(W.biases);
  P.rows = static_cast<int>(W.rows);
  P.cols = static_cast<int>(W.cols);
  P.x_ld = x_ld;
  P.group = W.group;
  bool vec = (reinterpret_cast<uintptr_t>(W.data) & 15) == 0 && W.cols % cw == 0;
  if (W.dtype == DType::U32) {
    if (!W.scales || !W.biases || W.group <= 0 || W.cols % 8 != 0 || W.cols % W.group != 0)
      backend_fail("cuda matmul: int4 weight %lld x %lld needs scales, biases and a group (%d) dividing cols",
                   (long long)W.rows, (long long)W.cols, W.group);
    P.row_bytes = static_cast<size_t>(W.cols) / 2;
    vec = vec && W.group % 32 == 0;
  } else {
    P.row_bytes = static_cast<size_t>(W.cols) * (W.dtype == DType::F32 ? 4 : 2);
  }
  P.ks = ks;
  if (P.ks != 1 && P.ks != 2 && P.ks != 4 && P.ks != 8) backend_fail("cuda matmul: column slices %d not in {1,2,4,8}", P.ks);
  const int chunk = 8 * cw;
  P.nchunks = (P.cols + chunk - 1) / chunk;
  P.cps = (P.nchunks + P.ks - 1) / P.ks;
  P.full_chunks = P.cols / chunk;
  *vec_out = vec;
  return P;
}

int gemv_bucket(int m) { return bucket(m); }

void gemv(const WeightRef& W, const float* x, int x_ld, float* y, int M, void* scratch, cudaStream_t st) {
  if (M <= 0 || W.rows <= 0) return;
  if (!W.data) backend_fail("cuda matmul: weight has no data");
  if (W.rows > INT32_MAX / 2 || W.cols > INT32_MAX / 2)
    backend_fail("cuda matmul: %lld x %lld weight is too large", (long long)W.rows, (long long)W.cols);
  if ((reinterpret_cast<uintptr_t>(x) & 15) != 0 || x_ld % 4 != 0 || x_ld < W.cols)
    backend_fail("cuda matmul: activations must be 16-byte aligned with a row stride multiple of 4 >= cols "
                 "(x %p, ld %d, cols %lld)", static_cast<const void*>(x), x_ld, (long long)W.cols);
  if (W.layout == WeightRef::kTcQ4) {  // int4 tiles: only the int4 tensor-core kernel reads them
    gemv_tc_q4(W, x, x_ld, y, M, st);
    return;
  }
  if (W.layout == WeightRef::kTc32x64) {  // re-laid out for the tensor-core kernel: only it reads this
    gemv_tc(W, x, x_ld, y, M, scratch, st);
    return;
  }
  if (gemv_tc_enabled() && gemv_tc_eligible(W)) {
    gemv_tc(W, x, x_ld, y, M, scratch, st);
    return;
  }
  bool vec = false;
  GemvParams P = gemv_params(W, x_ld, gemv_slices_for(W.rows, W.cols, cw_of(W.dtype)), &vec);
  for (int g0 = 0; g0 < M; g0 += 16) {
    const int mg = M - g0 < 16 ? M - g0 : 16;
    P.M = mg;
    P.x = x + static_cast<size_t>(g0) * x_ld;
    P.y = y + static_cast<size_t>(g0) * W.rows;
    const int mb = bucket(mg);
    if (prof_on()) prof_tag("%lld x %lld, M=%d, fma dtype %d", (long long)W.rows, (long long)W.cols, mg, static_cast<int>(W.dtype));
    switch (W.dtype) {
      case DType::BF16: gemv_run_bf16(P, mb, vec, st); break;
      case DType::F16: gemv_run_f16(P, mb, vec, st); break;
      case DType::F32: gemv_run_f32(P, mb, vec, st); break;
      default: gemv_run_q4(P, mb, vec, st); break;
    }
  }
}

}  // namespace qf::cuda
