// The kernel profiler (`qflash bench --profile`, the GEMV bench; cuda_util.h declares it): while
// it is on, launch_k brackets every launch with two CUDA events; prof_report sums them by kernel
// and tag. Also CudaBackend::profile_begin/end, which switch it on and off around a sequence.
#include <cuda_runtime_api.h>
#include <cxxabi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_util.h"

namespace qf::cuda {

namespace {

struct ProfRec {
  cudaEvent_t a = nullptr, b = nullptr;
  const void* fn = nullptr;
  unsigned grid = 0, block = 0;
  std::string tag;
};
struct Prof {
  bool on = false;
  bool open = false;  // prof_before recorded an event that prof_after has not closed
  std::string tag;
  std::vector<ProfRec> recs;
  std::vector<cudaEvent_t> pool;
};
Prof& prof() {
  static Prof p;
  return p;
}
cudaEvent_t prof_event() {
  Prof& p = prof();
  if (!p.pool.empty()) {
    cudaEvent_t e = p.pool.back();
    p.pool.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  QF_CUDA_CHECK(cudaEventCreate(&e));
  return e;
}
bool capturing(cudaStream_t st) {
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  return cudaStreamIsCapturing(st, &cs) == cudaSuccess && cs != cudaStreamCaptureStatusNone;
}
std::string kernel_name(const void* fn) {
  const char* raw = nullptr;
  if (cudaFuncGetName(&raw, fn) != cudaSuccess || !raw) {
    cudaGetLastError();
    return fmt_str("kernel@%p", fn);
  }
  int status = 0;
  char* dem = abi::__cxa_demangle(raw, nullptr, nullptr, &status);
  std::string n = status == 0 && dem ? dem : raw;
  std::free(dem);
  // void qf::cuda::(anonymous namespace)::gemv_tc_kernel<1>(qf::cuda::...): keep the name and
  // template arguments only
  size_t end = n.size();
  int depth = 0;
  for (size_t i = 0; i < n.size(); i++) {
    if (n[i] == '<') depth++;
    if (n[i] == '>') depth--;
    if (n[i] == '(' && depth == 0 && n.compare(i, 12, "(anonymous n") != 0) {
      end = i;
      break;
    }
  }
  n = n.substr(0, end);
  for (const char* pre : {"void ", "qf::cuda::", "(anonymous namespace)::"}) {
    size_t at;
    while ((at = n.find(pre)) != std::string::npos) n.erase(at, std::strlen(pre));
  }
  return n;
}

}  // namespace

bool prof_on() { return prof().on; }
void prof_set(bool on) { prof().on = on; }

void prof_tag(const char* fmt, ...) {
  if (!prof().on) return;
  va_list ap;
  va_start(ap, fmt);
  prof().tag = vfmt(fmt, ap);
  va_end(ap);
}

void prof_before(cudaStream_t st) {
  Prof& p = prof();
  if (!p.on || capturing(st)) return;
  ProfRec r;
  r.a = prof_event();
  QF_CUDA_CHECK(cudaEventRecord(r.a, st));
  p.recs.push_back(std::move(r));
  p.open = true;
}

void prof_after(const void* fn, unsigned grid, unsigned block, cudaStream_t st) {
  Prof& p = prof();
  if (!p.open) {
    p.tag.clear();
    return;
  }
  p.open = false;
  ProfRec& r = p.recs.back();
  r.b = prof_event();
  QF_CUDA_CHECK(cudaEventRecord(r.b, st));
  r.fn = fn;
  r.grid = grid;
  r.block = block;
  r.tag = std::move(p.tag);
  p.tag.clear();
}

std::string prof_report(int iters) {
  Prof& p = prof();
  QF_CUDA_CHECK(cudaDeviceSynchronize());
  struct Agg {
    double us = 0;
    long n = 0;
    unsigned grid = 0, block = 0;
  };
  std::map<std::string, Agg> by;
  std::map<const void*, std::string> names;
  double total = 0;
  long launches = 0;
  for (ProfRec& r : p.recs) {
    if (!r.b) continue;
    float ms = 0;
    QF_CUDA_CHECK(cudaEventElapsedTime(&ms, r.a, r.b));
    auto it = names.find(r.fn);
    if (it == names.end()) it = names.emplace(r.fn, kernel_name(r.fn)).first;
    std::string key = it->second;
    if (!r.tag.empty()) key += " [" + r.tag + "]";
    key += fmt_str(" grid %u x %u", r.grid, r.block);
    Agg& a = by[key];
    a.us += ms * 1e3;
    a.n++;
    a.grid = r.grid;
    a.block = r.block;
    total += ms * 1e3;
    launches++;
  }
  for (ProfRec& r : p.recs) {
    if (r.a) p.pool.push_back(r.a);
    if (r.b) p.pool.push_back(r.b);
  }
  p.recs.clear();
  std::vector<std::pair<std::string, Agg>> v(by.begin(), by.end());
  std::sort(v.begin(), v.end(), [](const auto& x, const auto& y) { return x.second.us > y.second.us; });
  const double it = iters > 0 ? iters : 1;
  std::string out = fmt_str("%10s %8s %9s %6s  %s\n", "us/iter", "calls", "us/call", "share", "kernel [tag] grid x block");
  for (const auto& [k, a] : v)
    out += fmt_str("%10.1f %8.1f %9.2f %5.1f%%  %s\n", a.us / it, a.n / it, a.us / a.n, 100.0 * a.us / total, k.c_str());
  out += fmt_str("%10.1f %8.1f %9s %6s  total kernel time (events around each launch; gaps not included)\n", total / it,
                 launches / it, "", "");
  return out;
}

void CudaBackend::profile_begin() {
  QF_CUDA_CHECK(cudaStreamSynchronize(st_));
  profiling_ = true;
  cuda::prof_set(true);
}

std::string CudaBackend::profile_end(int iters) {
  QF_CUDA_CHECK(cudaStreamSynchronize(st_));
  cuda::prof_set(false);
  profiling_ = false;
  return cuda::prof_report(iters);
}

}  // namespace qf::cuda
