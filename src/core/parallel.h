// A plain std::thread parallel loop for host-side bulk work (quantizing and hashing weights at
// load). Not OpenMP: it must also work in a forked child (the cache tests drop privileges in
// one), where libgomp's thread pool is not usable.
#pragma once
#include <algorithm>
#include <cstddef>
#include <exception>
#include <thread>
#include <vector>

namespace qf {

// Calls f(begin, end) on contiguous ranges covering [0, n), on up to hardware_concurrency()
// threads, each range at least `grain` long. The ranges depend only on n, grain and the thread
// count; callers that need thread-count-independent results write disjoint outputs per index.
// The first exception thrown by f is rethrown after every thread has joined.
template <class F>
void parallel_for(size_t n, size_t grain, F&& f) {
  if (n == 0) return;
  const size_t hw = std::max(1u, std::thread::hardware_concurrency());
  const size_t nt = std::min(hw, std::max<size_t>(1, n / std::max<size_t>(grain, 1)));
  if (nt <= 1) {
    f(size_t(0), n);
    return;
  }
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(nt);
  for (size_t i = 0; i < nt; i++) {
    threads.emplace_back([&, i] {
      try {
        f(n * i / nt, n * (i + 1) / nt);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace qf
