// Host-side helpers of the CUDA backend: error checking that turns every CUDA failure into a
// qf::Error(ErrorKind::Backend) naming the call, file:line and the CUDA error name.
// Host code only (no kernels); model code never includes this header.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdarg>
#include <string>

#include "core/error.h"

namespace qf::cuda {

// printf-style message -> qf::Error(ErrorKind::Backend). Self-contained (does not need
// qflash_lib's strf), so qflash_cuda links on its own.
[[noreturn]] void backend_fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string fmt_str(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

[[noreturn]] void cuda_fail(cudaError_t e, const char* what, const char* file, int line);

// QFLASH_PDL=1: kernels are launched with programmatic dependent launch (device_common.cuh).
bool pdl_enabled();

inline void cuda_check(cudaError_t e, const char* what, const char* file, int line) {
  if (e != cudaSuccess) cuda_fail(e, what, file, line);
}

}  // namespace qf::cuda

// CUDA_CHECK(cudaMalloc(...)): throws qf::Error(Backend, "file:line: cudaMalloc(...) failed: cudaErrorX (text)").
#define QF_CUDA_CHECK(expr) ::qf::cuda::cuda_check((expr), #expr, __FILE__, __LINE__)
// After a kernel launch: launch-configuration errors surface here (execution errors at the next sync).
#define QF_CUDA_LAUNCH_CHECK(name) ::qf::cuda::cuda_check(cudaGetLastError(), "launch of " name, __FILE__, __LINE__)
