#include "backend/backend.h"

#include <vector>

#include "io/quantize.h"

namespace qf {

void Backend::quantize_int4(const void* bf16, int64_t rows, int64_t cols, int group, void* q, void* scales,
                            void* biases) {
  const size_t n = static_cast<size_t>(rows) * cols, ng = static_cast<size_t>(rows) * (cols / group);
  std::vector<uint16_t> h(n), s(ng), b(ng);
  std::vector<uint32_t> qh(n / 8);
  download(h.data(), bf16, n * 2);
  int4_quantize_matrix(h.data(), DType::BF16, rows, cols, group, qh.data(), s.data(), b.data());
  upload(q, qh.data(), qh.size() * 4);
  upload(scales, s.data(), ng * 2);
  upload(biases, b.data(), ng * 2);
}

#ifndef QFLASH_HAVE_CUDA
std::unique_ptr<Backend> make_cuda_backend(std::string* why) {
  if (why) *why = "qflash was built without the CUDA backend (QFLASH_CUDA=OFF or no nvcc)";
  return nullptr;
}
bool cuda_compiled() { return false; }
#endif

}  // namespace qf
