// Prefix reuse across requests (docs/DESIGN.md, "Prefix reuse"): snapshots of a sequence's
// state after the prefill forward that ended at a multiple of 64 tokens, kept in backend memory
// in an LRU within a byte budget. A request resumes from the longest snapshot whose tokens it
// starts with and prefills only the rest; since the prefill ops are split-invariant at multiples
// of 64, the resumed state equals a fresh prefill bit for bit.
//
// A snapshot at n holds the target's K/V rows [0, n) and every GDN blob (recurrent state and
// conv tail), plus what the draft source keeps for those positions (the MTP head's K/V rows, the
// DFlash drafter's context window). Its key is the n + 1 tokens [0, n]: the MTP head's pair n-1
// was run with token n, so that token must match too (a resume needs it anyway: n < prompt).
#pragma once
#include <cstddef>
#include <cstdint>
#include <list>
#include <vector>

#include "backend/backend.h"
#include "model/target_model.h"

namespace qf {

class PrefixCache {
 public:
  static constexpr int kBlock = 64;  // snapshot boundaries: the prefill ops' split granularity
  PrefixCache(Backend& be, size_t budget_bytes) : be_(be), budget_(budget_bytes) {}

  struct Entry {
    std::vector<int32_t> tokens;       // [n + 1]: the key
    std::vector<uint64_t> block_hash;  // [n / kBlock]: chained hash of blocks 0..i
    std::vector<size_t> layout;        // bytes per region, in order (a restore must match it)
    DeviceBuffer data;                 // the regions packed back to back
    int n = 0;
  };

  // The longest entry usable for `prompt`: n < prompt.size() and tokens [0, n] equal (block
  // hashes first, then every id compared). Marks it recently used. nullptr when none.
  const Entry* find(const std::vector<int32_t>& prompt);
  // The longest common prefix, in tokens, of `prompt` and any cached key (0 when empty): where a
  // new branch of a shared prefix starts, worth its own snapshot.
  int shared_prefix(const std::vector<int32_t>& prompt) const;
  // Copies `entry` into `regions` (same sizes, in order; Internal error otherwise).
  void restore(const Entry& entry, const std::vector<StateRegion>& regions);
  // Stores the regions under tokens [0, n] (prompt must have more than n tokens), evicting the
  // least recently used entries to stay within the budget. False (nothing stored) when the
  // snapshot alone exceeds the budget or the backend has no memory for it; true when it is
  // stored or an equal key already is.
  bool store(const std::vector<int32_t>& prompt, int n, const std::vector<StateRegion>& regions);

  size_t budget() const { return budget_; }
  size_t used() const { return used_; }
  int entries() const { return static_cast<int>(lru_.size()); }
  void clear();

 private:
  static std::vector<uint64_t> block_hashes(const std::vector<int32_t>& t, int blocks);
  static int common_blocks(const std::vector<uint64_t>& a, const std::vector<uint64_t>& b);
  Backend& be_;
  size_t budget_ = 0, used_ = 0;
  bool warned_oom_ = false;
  std::list<Entry> lru_;  // most recently used first
};

}  // namespace qf
