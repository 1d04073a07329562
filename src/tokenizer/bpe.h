// Byte-level BPE model: vocabulary, ranked merges, and the merge loop for one pre-token.
#pragma once
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace qf {

class BpeModel {
 public:
  // vocab: token string (byte-level spelling) -> id. Ids need not be dense.
  // merges: pairs of token strings in rank order; `where` names the file for errors.
  BpeModel(std::unordered_map<std::string, int32_t> vocab,
           const std::vector<std::pair<std::string, std::string>>& merges, const std::string& where,
           std::optional<int32_t> unk_id, bool fuse_unk, bool ignore_merges);

  // Appends the ids of one pre-token given as raw bytes (before the byte-level mapping).
  void encode_word(std::string_view bytes, std::vector<int32_t>& out) const;

  const std::unordered_map<std::string, int32_t>& vocab() const { return vocab_; }
  size_t n_merges() const { return n_merges_; }

 private:
  struct MergeEntry {
    uint64_t key;  // (left id << 32) | right id; kEmptyKey marks a free slot
    int32_t rank;
    int32_t merged_id;
  };
  static constexpr uint64_t kEmptyKey = ~0ull;

  const MergeEntry* find_merge(int32_t left, int32_t right) const;
  void merge_word(std::string_view bytes, std::vector<int32_t>& out) const;

  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<MergeEntry> merge_table_;  // open addressing, power-of-two size, linear probing
  size_t n_merges_ = 0;
  int32_t byte_ids_[256];  // id of the single-byte token for each byte; -1 when absent
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;

  // Per-word cache: real text repeats words constantly. Bounded and cleared when full; a
  // mutex keeps encode() const and thread-safe (contention is negligible next to the merges).
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace qf
