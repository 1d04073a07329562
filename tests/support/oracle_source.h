// A test draft source that replaces the drafter with injected drafts: given the plain greedy
// continuation, it proposes all-right, all-wrong, or right-for-a-random-prefix drafts.
#pragma once
#include <random>
#include <vector>

#include "runtime/draft_source.h"

namespace qf::test {

enum class OracleMode { AllRight, AllWrong, RandomPrefix };

class OracleSource final : public DraftSource {
 public:
  // ref[i] = the token plain decoding emits at position prompt_len + i.
  OracleSource(std::vector<int32_t> ref, int prompt_len, int vocab, OracleMode mode, int max_k, uint64_t seed)
      : ref_(std::move(ref)), n_(prompt_len), vocab_(vocab), mode_(mode), max_k_(max_k), rng_(seed) {}
  std::string name() const override { return "oracle"; }
  int max_k() const override { return max_k_; }
  int default_k() const override { return max_k_; }
  void begin(int) override {}
  void observe(const TargetModel&, int, int, const int32_t*) override {}
  void draft(int32_t, int pos, int k, int32_t* out) override {
    int right = k;
    if (mode_ == OracleMode::AllWrong) right = 0;
    if (mode_ == OracleMode::RandomPrefix) right = std::uniform_int_distribution<int>(0, k)(rng_);
    for (int i = 0; i < k; i++) {
      const size_t idx = static_cast<size_t>(pos - n_ + 1 + i);
      const int32_t truth = idx < ref_.size() ? ref_[idx] : 0;
      out[i] = i < right ? truth : (truth + 1 + i) % vocab_;
    }
  }

 private:
  std::vector<int32_t> ref_;
  int n_, vocab_;
  OracleMode mode_;
  int max_k_;
  std::mt19937_64 rng_;
};

}  // namespace qf::test
