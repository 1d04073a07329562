// Replays recorded op sequences (CUDA graphs) for the hot passes: the target's decode/verify
// forward, the MTP head and the drafter's passes. A key names one exact op sequence (row count,
// options, the buffers of its owner); the first run of a key runs the ops directly (it also
// sizes the backend's scratch buffers), the second records them and every later one replays the
// recording. On a backend without graphs, run() just calls the body.
//
// Recordings are bounded: at most `max_entries` keys are held, the least recently run one is
// dropped to make room, and forget_owner() drops every key of an owner that is gone (a
// TargetState's GraphOwner does this when the state is destroyed).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <utility>

#include "backend/backend.h"

namespace qf {

// The key of one recorded op sequence: the owner whose buffers the ops name (a state or a model,
// 0 when the runner's model owns them all) and the sequence's parameters, packed into fields of
// declared bit widths. A value that does not fit its field fails instead of aliasing another key.
class GraphKey {
 public:
  explicit GraphKey(uint64_t owner) : owner_(owner) {}
  // Appends `value` as the next `bits` bits (1..64 in all).
  GraphKey& field(const char* name, uint64_t value, int bits);
  GraphKey& flag(const char* name, bool on) { return field(name, on ? 1 : 0, 1); }
  uint64_t owner() const { return owner_; }
  uint64_t packed() const { return packed_; }

 private:
  uint64_t owner_ = 0, packed_ = 0;
  int used_bits_ = 0;
};

class GraphRunner {
 public:
  // A 27B speculative run uses about 20 keys per state (verify of 1..k+1 rows, with and
  // without capture, and the prefill tails); 256 holds that many states' worth with room.
  static constexpr size_t kDefaultMaxEntries = 256;
  explicit GraphRunner(Backend* be, size_t max_entries = kDefaultMaxEntries);
  ~GraphRunner() { clear(); }
  GraphRunner(const GraphRunner&) = delete;
  GraphRunner& operator=(const GraphRunner&) = delete;

  // `body` must only enqueue backend ops (no host reads, no allocation, no uploads).
  void run(const GraphKey& key, const std::function<void()>& body);
  void clear();
  // Drops every key of `owner` (its buffers are gone; the recordings can never replay again).
  void forget_owner(uint64_t owner);
  // Replays / recordings so far, keys held now (tests and --stats).
  uint64_t replays() const { return replays_; }
  uint64_t recordings() const { return recordings_; }
  size_t entries() const { return m_.size(); }

 private:
  struct Entry {
    void* graph = nullptr;
    uint64_t epoch = 0;
    int direct_runs = 0;
    uint64_t last_run = 0;  // tick of the latest run(): the least recent key is evicted first
  };
  using Key = std::pair<uint64_t, uint64_t>;  // (owner, packed): an owner's keys are one range
  Entry& entry(const GraphKey& key);
  void drop(std::map<Key, Entry>::iterator it);
  Backend* be_;
  size_t max_entries_;
  std::map<Key, Entry> m_;
  uint64_t tick_ = 0, replays_ = 0, recordings_ = 0;
};

// A process-unique id for objects whose buffers a recording refers to (states, drafters).
uint64_t next_graph_owner_id();

// Held by an object whose buffers recorded graphs name (a TargetState): a fresh owner id, and on
// destruction the runner (when it still exists) forgets that id's recordings.
class GraphOwner {
 public:
  GraphOwner() = default;  // id 0: no runner to tell
  explicit GraphOwner(std::weak_ptr<GraphRunner> runner) : runner_(std::move(runner)), id_(next_graph_owner_id()) {}
  ~GraphOwner() { release(); }
  GraphOwner(GraphOwner&& o) noexcept : runner_(std::move(o.runner_)), id_(o.id_) { o.id_ = 0; }
  GraphOwner& operator=(GraphOwner&& o) noexcept;
  GraphOwner(const GraphOwner&) = delete;
  GraphOwner& operator=(const GraphOwner&) = delete;
  uint64_t id() const { return id_; }

 private:
  void release();
  std::weak_ptr<GraphRunner> runner_;
  uint64_t id_ = 0;
};

}  // namespace qf
