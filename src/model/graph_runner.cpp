#include "model/graph_runner.h"

#include <atomic>

namespace qf {

uint64_t next_graph_owner_id() {
  static std::atomic<uint64_t> n{1};
  return n++;
}

void GraphRunner::clear() {
  for (auto& [k, e] : m_) be_->graph_destroy(e.graph);
  m_.clear();
}

void GraphRunner::run(uint64_t key, const std::function<void()>& body) {
  if (!be_->graphs_enabled()) {
    body();
    return;
  }
  Entry& e = m_[key];
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
