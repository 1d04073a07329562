#include "backend/backend.h"

namespace qf {

#ifndef QFLASH_HAVE_CUDA
std::unique_ptr<Backend> make_cuda_backend(std::string* why) {
  if (why) *why = "qflash was built without the CUDA backend (QFLASH_CUDA=OFF or no nvcc)";
  return nullptr;
}
bool cuda_compiled() { return false; }
#endif

}  // namespace qf
