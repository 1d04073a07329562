// CudaBackend graphs: the engine records a step's op sequence once (capture_begin/end) and
// replays it (graph_launch). QFLASH_CUDA_GRAPHS=0 or off runs every op directly; so does a
// profiled run (the profiler's events skip captured launches). The graph epoch moves on whenever a
// scratch buffer grows (cuda_memory.cpp, ensure): recorded graphs hold the old addresses.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/cuda_backend.h"

namespace qf::cuda {

bool CudaBackend::graphs_from_env() {
  const char* e = std::getenv("QFLASH_CUDA_GRAPHS");
  return !(e && (std::strcmp(e, "0") == 0 || std::strcmp(e, "off") == 0));
}

bool CudaBackend::graphs_enabled() const { return graphs_on_ && !profiling_; }

uint64_t CudaBackend::graph_epoch() const { return epoch_; }

void CudaBackend::capture_begin() {
  QF_CUDA_CHECK(cudaStreamBeginCapture(st_, cudaStreamCaptureModeThreadLocal));
  capturing_ = true;
}

void* CudaBackend::capture_end() {
  capturing_ = false;
  cudaGraph_t g = nullptr;
  QF_CUDA_CHECK(cudaStreamEndCapture(st_, &g));
  cudaGraphExec_t ex = nullptr;
  const cudaError_t e = cudaGraphInstantiate(&ex, g, 0);
  cudaGraphDestroy(g);
  if (e != cudaSuccess) {
    cudaGetLastError();
    std::fprintf(stderr, "qflash: warning: CUDA graph instantiation failed (%s); running ops directly\n",
                 cudaGetErrorName(e));
    return nullptr;
  }
  return ex;
}

void CudaBackend::capture_abort() {
  if (!capturing_) return;
  capturing_ = false;
  cudaGraph_t g = nullptr;
  cudaStreamEndCapture(st_, &g);
  if (g) cudaGraphDestroy(g);
  cudaGetLastError();
}

void CudaBackend::graph_launch(void* g) {
  QF_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(g), st_));
}

void CudaBackend::graph_destroy(void* g) {
  if (g) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(g));
}

}  // namespace qf::cuda
