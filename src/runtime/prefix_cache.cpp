#include "runtime/prefix_cache.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/log.h"

namespace qf {

// FNV-1a over the block's ids, chained through the previous block's hash: equal hashes at block
// i say (up to collisions, which the exact comparison catches) that blocks 0..i are equal.
std::vector<uint64_t> PrefixCache::block_hashes(const std::vector<int32_t>& t, int blocks) {
  std::vector<uint64_t> h(blocks);
  uint64_t x = 1469598103934665603ull;
  for (int b = 0; b < blocks; b++) {
    for (int i = 0; i < kBlock; i++) {
      uint32_t v = static_cast<uint32_t>(t[static_cast<size_t>(b) * kBlock + i]);
      for (int k = 0; k < 4; k++, v >>= 8) x = (x ^ (v & 0xff)) * 1099511628211ull;
    }
    h[b] = x;
  }
  return h;
}

int PrefixCache::common_blocks(const std::vector<uint64_t>& a, const std::vector<uint64_t>& b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) i++;
  return static_cast<int>(i);
}

const PrefixCache::Entry* PrefixCache::find(const std::vector<int32_t>& prompt) {
  const int N = static_cast<int>(prompt.size());
  if (lru_.empty() || N <= kBlock) return nullptr;
  const std::vector<uint64_t> ph = block_hashes(prompt, (N - 1) / kBlock);
  auto best = lru_.end();
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    const Entry& e = *it;
    if (e.n >= N || (best != lru_.end() && e.n <= best->n)) continue;
    if (common_blocks(ph, e.block_hash) * kBlock < e.n) continue;
    if (!std::equal(e.tokens.begin(), e.tokens.end(), prompt.begin())) continue;  // n + 1 <= N ids
    best = it;
  }
  if (best == lru_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, best);
  return &lru_.front();
}

int PrefixCache::shared_prefix(const std::vector<int32_t>& prompt) const {
  int best = 0;
  for (const Entry& e : lru_) {
    const size_t n = std::min(e.tokens.size(), prompt.size());
    size_t i = 0;
    while (i < n && e.tokens[i] == prompt[i]) i++;
    best = std::max(best, static_cast<int>(i));
  }
  return best;
}

void PrefixCache::restore(const Entry& e, const std::vector<StateRegion>& regions) {
  QF_CHECK(regions.size() == e.layout.size(), "prefix snapshot of %zu regions restored into %zu", e.layout.size(),
           regions.size());
  size_t off = 0;
  for (size_t i = 0; i < regions.size(); i++) {
    QF_CHECK(regions[i].bytes == e.layout[i], "prefix snapshot region %zu: %zu bytes stored, %zu to restore", i,
             e.layout[i], regions[i].bytes);
    be_.copy(regions[i].ptr, static_cast<const char*>(e.data.get()) + off, regions[i].bytes);
    off += regions[i].bytes;
  }
}

bool PrefixCache::store(const std::vector<int32_t>& prompt, int n, const std::vector<StateRegion>& regions) {
  QF_CHECK(n > 0 && n % kBlock == 0 && n < static_cast<int>(prompt.size()), "prefix snapshot at %d of %zu tokens", n,
           prompt.size());
  for (auto it = lru_.begin(); it != lru_.end(); ++it)
    if (it->n == n && std::equal(it->tokens.begin(), it->tokens.end(), prompt.begin())) {
      lru_.splice(lru_.begin(), lru_, it);
      return true;
    }
  size_t bytes = 0;
  for (const StateRegion& r : regions) bytes += r.bytes;
  if (bytes == 0 || bytes > budget_) return false;
  while (used_ + bytes > budget_ && !lru_.empty()) {
    used_ -= lru_.back().data.bytes();
    lru_.pop_back();
  }
  Entry e;
  try {
    e.data = DeviceBuffer(&be_, bytes);
  } catch (const Error& err) {
    if (err.kind() != ErrorKind::Backend) throw;
    if (!warned_oom_) log_warn("prefix cache: no memory for a %.1f MB snapshot (%s); not stored", bytes / 1048576.0, err.what());
    warned_oom_ = true;
    return false;
  }
  size_t off = 0;
  for (const StateRegion& r : regions) {
    be_.copy(static_cast<char*>(e.data.get()) + off, r.ptr, r.bytes);
    e.layout.push_back(r.bytes);
    off += r.bytes;
  }
  e.n = n;
  e.tokens.assign(prompt.begin(), prompt.begin() + n + 1);
  e.block_hash = block_hashes(prompt, n / kBlock);
  used_ += bytes;
  lru_.push_front(std::move(e));
  return true;
}

void PrefixCache::clear() {
  lru_.clear();
  used_ = 0;
}

}  // namespace qf
