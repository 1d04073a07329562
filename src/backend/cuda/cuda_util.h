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
std::string vfmt(const char* fmt, va_list ap);

[[noreturn]] void cuda_fail(cudaError_t e, const char* what, const char* file, int line);

// Kernels are launched with programmatic dependent launch (device_common.cuh) unless QFLASH_PDL=0.
bool pdl_enabled();

// Kernel profiler (cuda_profiler.cpp; `qflash bench --profile`, the GEMV bench): while it is on, launch_k brackets
// every launch with two CUDA events; prof_report() adds the GPU time up by kernel and tag. It
// skips launches made during a stream capture. prof_tag() names the next launch (the GEMV puts
// its shape there) and is cleared by it.
bool prof_on();
void prof_set(bool on);
void prof_tag(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void prof_before(cudaStream_t st);
void prof_after(const void* fn, unsigned grid, unsigned block, cudaStream_t st);
// Synchronizes, then returns a table of kernel time per call of the profiled sequence (the
// records are divided by `iters`) and clears the records.
std::string prof_report(int iters);

inline void cuda_check(cudaError_t e, const char* what, const char* file, int line) {
  if (e != cudaSuccess) cuda_fail(e, what, file, line);
}

}  // namespace qf::cuda

// CUDA_CHECK(cudaMalloc(...)): throws qf::Error(Backend, "file:line: cudaMalloc(...) failed: cudaErrorX (text)").
#define QF_CUDA_CHECK(expr) ::qf::cuda::cuda_check((expr), #expr, __FILE__, __LINE__)
// After a kernel launch: launch-configuration errors surface here (execution errors at the next sync).
#define QF_CUDA_LAUNCH_CHECK(name) ::qf::cuda::cuda_check(cudaGetLastError(), "launch of " name, __FILE__, __LINE__)
