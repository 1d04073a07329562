// bf16 instantiations of the multi-row GEMV, plus the bench's schedule variants.
#include "backend/cuda/gemv_impl.cuh"

namespace qf::cuda {

namespace {
struct Variant {
  const char* name;
  int r, u;
};
// Bench-only schedules (R rows per lane group, U chunks per load step) for bf16 at MB = 1, 8
// and 16. They differ from the default in scheduling only; the arithmetic per row is the same.
constexpr Variant kVariants[] = {{"default", 0, 0}, {"R1U4", 1, 4}, {"R1U8", 1, 8}, {"R2U2", 2, 2},
                                 {"R2U8", 2, 8},    {"R4U2", 4, 2}, {"R4U1", 4, 1}, {"R8U1", 8, 1},
                                 {"R8U2", 8, 2}};
constexpr int kNumVariants = sizeof(kVariants) / sizeof(kVariants[0]);

template <int MB>
bool bf16_variant(const GemvParams& P, int v, cudaStream_t st) {
  switch (v) {
    case 1: gemv_launch<WK::BF16, MB, 1, 4, true>(P, st); return true;
    case 2: gemv_launch<WK::BF16, MB, 1, 8, true>(P, st); return true;
    case 3: gemv_launch<WK::BF16, MB, 2, 2, true>(P, st); return true;
    case 4: gemv_launch<WK::BF16, MB, 2, 8, true>(P, st); return true;
    case 5: gemv_launch<WK::BF16, MB, 4, 2, true>(P, st); return true;
    case 6: gemv_launch<WK::BF16, MB, 4, 1, true>(P, st); return true;
    case 7: gemv_launch<WK::BF16, MB, 8, 1, true>(P, st); return true;
    case 8:
      if constexpr (MB <= 8) {
        gemv_launch<WK::BF16, MB, 8, 2, true>(P, st);
        return true;
      }
      return false;
    default: return false;
  }
}
}  // namespace

int gemv_variant_count() { return kNumVariants; }
const char* gemv_variant_name(int v) { return v >= 0 && v < kNumVariants ? kVariants[v].name : "?"; }

bool gemv_run_bf16(const GemvParams& P, int mb, bool vec, int variant, cudaStream_t st) {
  if (variant > 0) {
    if (!vec) return false;
    if (mb == 1) return bf16_variant<1>(P, variant, st);
    if (mb == 8) return bf16_variant<8>(P, variant, st);
    if (mb == 16) return bf16_variant<16>(P, variant, st);
    return false;
  }
  gemv_dispatch_mb<WK::BF16>(P, mb, vec, st);
  return true;
}

}  // namespace qf::cuda
