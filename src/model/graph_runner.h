// Replays recorded op sequences (CUDA graphs) for the hot passes: the target's decode/verify
// forward and the drafter's draft pass. A key names one exact op sequence (row count, options,
// state buffers); the first run of a key runs the ops directly (it also sizes the backend's
// scratch buffers), the second records them and every later one replays the recording.
// On a backend without graphs, run() just calls the body.
#pragma once
#include <cstdint>
#include <functional>
#include <unordered_map>

#include "backend/backend.h"

namespace qf {

class GraphRunner {
 public:
  explicit GraphRunner(Backend* be) : be_(be) {}
  ~GraphRunner() { clear(); }
  GraphRunner(const GraphRunner&) = delete;
  GraphRunner& operator=(const GraphRunner&) = delete;

  // `body` must only enqueue backend ops (no host reads, no allocation, no uploads).
  void run(uint64_t key, const std::function<void()>& body);
  void clear();
  // Replays / recordings so far (tests and --stats).
  uint64_t replays() const { return replays_; }
  uint64_t recordings() const { return recordings_; }

 private:
  struct Entry {
    void* graph = nullptr;
    uint64_t epoch = 0;
    int direct_runs = 0;
  };
  Backend* be_;
  std::unordered_map<uint64_t, Entry> m_;
  uint64_t replays_ = 0, recordings_ = 0;
};

// A process-unique id for objects whose buffers a recording refers to (states, drafters).
uint64_t next_graph_owner_id();

}  // namespace qf
