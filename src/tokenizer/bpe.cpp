#include "tokenizer/bpe.h"

#include <algorithm>

#include "core/error.h"
#include "tokenizer/byte_level.h"

namespace qf {
namespace {

uint64_t mix64(uint64_t x) {  // splitmix64 finalizer: pair keys are far from uniform
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

// Words longer than this are merged but not cached: they are rare and would bloat the cache.
constexpr size_t kMaxCachedWordBytes = 256;
// 64k words cover the working vocabulary of long prompts; clearing is cheaper than LRU upkeep.
constexpr size_t kMaxCacheEntries = 1u << 16;

}  // namespace

BpeModel::BpeModel(std::unordered_map<std::string, int32_t> vocab,
                   const std::vector<std::pair<std::string, std::string>>& merges,
                   const std::string& where, std::optional<int32_t> unk_id, bool fuse_unk,
                   bool ignore_merges)
    : vocab_(std::move(vocab)), unk_id_(unk_id), fuse_unk_(fuse_unk), ignore_merges_(ignore_merges) {
  for (int b = 0; b < 256; ++b) {
    std::string spelled;
    char c = static_cast<char>(b);
    byte_level::encode(std::string_view(&c, 1), spelled);
    auto it = vocab_.find(spelled);
    byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
  }

  size_t cap = 16;
  while (cap < merges.size() * 2 + 1) cap <<= 1;
  merge_table_.assign(cap, MergeEntry{kEmptyKey, 0, 0});
  std::string joined;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    auto lookup = [&](const std::string& tok) {
      auto it = vocab_.find(tok);
      if (it == vocab_.end())
        fail(ErrorKind::Tokenizer, "%s: model.merges[%zu] (\"%s\" \"%s\"): token \"%s\" is not in model.vocab",
             where.c_str(), rank, a.c_str(), b.c_str(), tok.c_str());
      return it->second;
    };
    joined.assign(a).append(b);
    int32_t left = lookup(a), right = lookup(b), merged = lookup(joined);
    uint64_t key = pair_key(left, right);
    size_t mask = cap - 1, slot = mix64(key) & mask;
    while (merge_table_[slot].key != kEmptyKey && merge_table_[slot].key != key) slot = (slot + 1) & mask;
    if (merge_table_[slot].key == kEmptyKey) ++n_merges_;
    // A repeated pair keeps its last rank, as the reference implementation's map insert does.
    merge_table_[slot] = MergeEntry{key, static_cast<int32_t>(rank), merged};
  }
}

const BpeModel::MergeEntry* BpeModel::find_merge(int32_t left, int32_t right) const {
  uint64_t key = pair_key(left, right);
  size_t mask = merge_table_.size() - 1, slot = mix64(key) & mask;
  while (true) {
    const MergeEntry& e = merge_table_[slot];
    if (e.key == key) return &e;
    if (e.key == kEmptyKey) return nullptr;
    slot = (slot + 1) & mask;
  }
}

void BpeModel::encode_word(std::string_view bytes, std::vector<int32_t>& out) const {
  if (bytes.empty()) return;
  bool cacheable = bytes.size() <= kMaxCachedWordBytes;
  std::string key;
  if (cacheable) {
    key.assign(bytes);
    std::lock_guard<std::mutex> lock(cache_mu_);
    auto it = cache_.find(key);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  size_t before = out.size();
  merge_word(bytes, out);
  if (cacheable) {
    std::vector<int32_t> ids(out.begin() + static_cast<ptrdiff_t>(before), out.end());
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (cache_.size() >= kMaxCacheEntries) cache_.clear();
    cache_.emplace(std::move(key), std::move(ids));
  }
}

// Classic rank-ordered BPE: repeatedly apply the lowest-rank merge among adjacent symbols,
// leftmost first on ties. Symbols form a linked list over the word's bytes; a min-heap holds
// candidate pairs, and stale candidates (a side already merged away) are skipped when popped.
// O(n log n) per word, versus O(n^2) for rescanning all pairs after every merge.
void BpeModel::merge_word(std::string_view bytes, std::vector<int32_t>& out) const {
  if (ignore_merges_) {
    std::string spelled;
    byte_level::encode(bytes, spelled);
    auto it = vocab_.find(spelled);
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }

  struct Symbol {
    int32_t id;  // -1 once merged into its left neighbour
    int32_t prev, next;
  };
  struct Candidate {
    int32_t rank, pos, left, right;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  thread_local std::vector<Symbol> syms;
  thread_local std::vector<Candidate> heap;
  syms.clear();
  heap.clear();

  for (char c : bytes) {
    int32_t id = byte_ids_[static_cast<uint8_t>(c)];
    if (id < 0) {
      if (!unk_id_) continue;  // no unk token: the byte is dropped, as the reference does
      if (fuse_unk_ && !syms.empty() && syms.back().id == *unk_id_) continue;
      id = *unk_id_;
    }
    auto n = static_cast<int32_t>(syms.size());
    syms.push_back(Symbol{id, n - 1, -1});
    if (n > 0) syms[n - 1].next = n;
  }
  if (syms.empty()) return;

  auto greater = [](const Candidate& a, const Candidate& b) { return a > b; };
  auto push_pair = [&](int32_t pos) {
    if (pos < 0) return;
    int32_t nx = syms[pos].next;
    if (nx < 0) return;
    if (const MergeEntry* m = find_merge(syms[pos].id, syms[nx].id)) {
      heap.push_back(Candidate{m->rank, pos, syms[pos].id, syms[nx].id});
      std::push_heap(heap.begin(), heap.end(), greater);
    }
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(syms.size()); ++i) push_pair(i);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), greater);
    Candidate c = heap.back();
    heap.pop_back();
    Symbol& s = syms[c.pos];
    if (s.id != c.left || s.next < 0 || syms[s.next].id != c.right) continue;  // stale
    const MergeEntry* m = find_merge(c.left, c.right);
    Symbol& r = syms[s.next];
    s.id = m->merged_id;
    r.id = -1;
    s.next = r.next;
    if (s.next >= 0) syms[s.next].prev = c.pos;
    push_pair(s.prev);
    push_pair(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = syms[i].next) out.push_back(syms[i].id);
}

}  // namespace qf
