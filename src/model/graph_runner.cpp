#include "model/graph_runner.h"

#include <atomic>

#include "core/error.h"

namespace qf {

uint64_t next_graph_owner_id() {
  static std::atomic<uint64_t> n{1};
  return n++;
}

GraphKey& GraphKey::field(const char* name, uint64_t value, int bits) {
  if (bits < 1 || bits > 64 - used_bits_)
    fail(ErrorKind::Internal, "graph key field '%s' asks for %d bits; %d of 64 are left", name, bits, 64 - used_bits_);
  if (bits < 64 && value >> bits)
    fail(ErrorKind::Internal, "graph key field '%s' = %llu does not fit its %d bits", name,
         static_cast<unsigned long long>(value), bits);
  packed_ |= value << used_bits_;
  used_bits_ += bits;
  return *this;
}

GraphOwner& GraphOwner::operator=(GraphOwner&& o) noexcept {
  if (this != &o) {
    release();
    runner_ = std::move(o.runner_);
    id_ = o.id_;
    o.id_ = 0;
  }
  return *this;
}

void GraphOwner::release() {
  if (id_ == 0) return;
  if (auto r = runner_.lock()) r->forget_owner(id_);
  runner_.reset();
  id_ = 0;
}

GraphRunner::GraphRunner(Backend* be, size_t max_entries) : be_(be), max_entries_(max_entries) {
  QF_CHECK(max_entries >= 1, "a graph runner holding %zu keys", max_entries);
}

void GraphRunner::drop(std::map<Key, Entry>::iterator it) {
  if (it->second.graph) be_->graph_destroy(it->second.graph);
  m_.erase(it);
}

void GraphRunner::clear() {
  while (!m_.empty()) drop(m_.begin());
}

void GraphRunner::forget_owner(uint64_t owner) {
  auto it = m_.lower_bound(Key{owner, 0});
  while (it != m_.end() && it->first.first == owner) drop(it++);
}

GraphRunner::Entry& GraphRunner::entry(const GraphKey& key) {
  const Key k{key.owner(), key.packed()};
  auto it = m_.find(k);
  if (it == m_.end()) {
    if (m_.size() >= max_entries_) {  // evict the least recently run key
      auto lru = m_.begin();
      for (auto i = m_.begin(); i != m_.end(); ++i)
        if (i->second.last_run < lru->second.last_run) lru = i;
      drop(lru);
    }
    it = m_.emplace(k, Entry{}).first;
  }
  it->second.last_run = ++tick_;
  return it->second;
}

void GraphRunner::run(const GraphKey& key, const std::function<void()>& body) {
  if (!be_->graphs_enabled()) {
    body();
    return;
  }
  Entry& e = entry(key);
  const uint64_t epoch = be_->graph_epoch();
  if (e.graph && e.epoch != epoch) {  // a scratch buffer moved: the recording is stale
    be_->graph_destroy(e.graph);
    e.graph = nullptr;
    e.direct_runs = 0;
  }
  if (e.graph) {
    be_->graph_launch(e.graph);
    replays_++;
    return;
  }
  if (e.direct_runs < 1) {  // first run of this sequence: direct, sizing every scratch buffer
    body();
    e.direct_runs++;
    return;
  }
  be_->capture_begin();
  try {
    body();
  } catch (...) {
    be_->capture_abort();
    throw;
  }
  void* g = be_->capture_end();
  recordings_++;
  if (!g) {  // could not instantiate: keep running directly
    body();
    return;
  }
  if (be_->graph_epoch() != epoch) {  // cannot happen (growth during capture throws), but be safe
    be_->graph_destroy(g);
    body();
    return;
  }
  e.graph = g;
  e.epoch = epoch;
  be_->graph_launch(g);
  replays_++;
}

}  // namespace qf
