// CudaBackend: device setup and teardown, the device-side error record, memory queries, and the
// factory make_cuda_backend.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/cuda_backend.h"

#ifndef QFLASH_CUDA_ARCHS_STR
#define QFLASH_CUDA_ARCHS_STR "90a"
#endif

namespace qf {

namespace cuda {

CudaBackend::CudaBackend(int dev) : dev_(dev) {
  QF_CUDA_CHECK(cudaSetDevice(dev_));
  cudaDeviceProp prop;
  QF_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev_));
  size_t free_b = 0, total_b = 0;
  QF_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  name_ = fmt_str("cuda:%d (%s, sm_%d%d, %.0f GB)", dev_, prop.name, prop.major, prop.minor, total_b / 1e9);
  QF_CUDA_CHECK(cudaStreamCreateWithFlags(&st_, cudaStreamNonBlocking));
  // Device-side error record: mapped pinned host memory when available (read without a copy).
  void* h = nullptr;
  if (cudaHostAlloc(&h, sizeof(DevError), cudaHostAllocMapped) == cudaSuccess) {
    void* d = nullptr;
    if (cudaHostGetDevicePointer(&d, h, 0) == cudaSuccess) {
      err_host_ = static_cast<DevError*>(h);
      err_dev_ = static_cast<DevError*>(d);
      std::memset(h, 0, sizeof(DevError));
    } else {
      cudaFreeHost(h);
    }
  }
  cudaGetLastError();  // clear a failed mapped allocation, if any
  if (!err_dev_) {
    void* d = nullptr;
    QF_CUDA_CHECK(cudaMalloc(&d, sizeof(DevError)));
    QF_CUDA_CHECK(cudaMemset(d, 0, sizeof(DevError)));
    err_dev_ = static_cast<DevError*>(d);
  }
  // The kernels must exist for this device (a binary built for sm_90a runs on CC 9.0 only).
  const cudaError_t pe = probe_launch(st_);
  if (pe != cudaSuccess) {
    cudaGetLastError();
    backend_fail("the CUDA kernels of this build (architectures %s) cannot run on %s (sm_%d%d): %s (%s)",
                 QFLASH_CUDA_ARCHS_STR, prop.name, prop.major, prop.minor, cudaGetErrorName(pe),
                 cudaGetErrorString(pe));
  }
}

CudaBackend::~CudaBackend() {
  if (st_) cudaStreamSynchronize(st_);
  for (Scratch* s : {&xs_, &attn_, &gdn_, &argmax_, &topk_, &move_})
    if (s->p) cudaFree(s->p);
  for (int i = 0; i < 2; i++) {
    if (stage_[i]) cudaFreeHost(stage_[i]);
    if (stage_ev_[i]) cudaEventDestroy(stage_ev_[i]);
  }
  for (cudaEvent_t e : ring_ev_)
    if (e) cudaEventDestroy(e);
  if (ring_) cudaFreeHost(ring_);
  if (err_host_) cudaFreeHost(err_host_);
  else if (err_dev_) cudaFree(err_dev_);
  if (st_) cudaStreamDestroy(st_);
}

void CudaBackend::sync() {
  QF_CUDA_CHECK(cudaStreamSynchronize(st_));
  check_device_errors();
}

size_t CudaBackend::memory_used() const {
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return total_b - free_b;
}

size_t CudaBackend::memory_free(size_t* total) const {
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
    cudaGetLastError();
    free_b = total_b = 0;
  }
  if (total) *total = total_b;
  return free_b;
}

void CudaBackend::check_device_errors() {
  DevError e{};
  if (err_host_) {
    std::memcpy(&e, const_cast<const DevError*>(err_host_), sizeof(e));
    if (e.code == kErrNone) return;
    std::memset(err_host_, 0, sizeof(DevError));
  } else {
    QF_CUDA_CHECK(cudaMemcpy(&e, err_dev_, sizeof(e), cudaMemcpyDeviceToHost));
    if (e.code == kErrNone) return;
    QF_CUDA_CHECK(cudaMemset(err_dev_, 0, sizeof(DevError)));
  }
  switch (e.code) {
    case kErrEmbedId:
      throw Error(ErrorKind::Usage, fmt_str("token id %d outside the embedding's %d rows (row %d)", e.a, e.b, e.c));
    case kErrKvWrite:
      throw Error(ErrorKind::Internal,
                  fmt_str("kv_write before the cache start (q_pos0 %d, kv_pos0 %d)", e.a, e.b));
    case kErrSelectorId:
      throw Error(ErrorKind::Internal,
                  fmt_str("selector walk: token id %d outside the codebook's %d rows (slot %d)", e.a, e.b, e.c));
    default:
      throw Error(ErrorKind::Backend, fmt_str("device-side check failed (code %d: %d %d %d)", e.code, e.a, e.b, e.c));
  }
}

}  // namespace cuda

std::unique_ptr<Backend> make_cuda_backend(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    if (why)
      *why = cuda::fmt_str("no usable CUDA device (cudaGetDeviceCount: %s, %s)", cudaGetErrorName(e),
                           cudaGetErrorString(e));
    return nullptr;
  }
  if (n <= 0) {
    if (why) *why = "no CUDA device present";
    return nullptr;
  }
  int dev = 0;
  if (const char* s = std::getenv("QFLASH_CUDA_DEVICE"); s && *s) dev = std::atoi(s);
  if (dev < 0 || dev >= n) {
    if (why) *why = cuda::fmt_str("QFLASH_CUDA_DEVICE=%d but %d CUDA device(s) present", dev, n);
    return nullptr;
  }
  try {
    return std::make_unique<cuda::CudaBackend>(dev);
  } catch (const Error& err) {
    if (why) *why = err.what();
    return nullptr;
  }
}

bool cuda_compiled() { return true; }

}  // namespace qf
