// Draft sources for the speculative round loop (spec/speculative.md section 3).
// The loop calls observe() after every target forward with the rows it committed, so a source
// always sees a contiguous history (plain steps included), and draft() at the start of a round.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "model/dflash2.h"
#include "model/mtp.h"
#include "model/qwen38.h"
#include "runtime/sampling.h"

namespace qf {

class DraftSource {
 public:
  virtual ~DraftSource() = default;
  virtual std::string name() const = 0;  // "mtp", "dflash2", "dflash", or a test's name
  virtual int max_k() const = 0;         // deepest draft this source supports
  virtual int default_k() const = 0;
  virtual bool needs_taps() const { return false; }
  virtual std::vector<int> tap_layers() const { return {}; }
  // A new sequence starts; `prompt_len` lets sources skip rows they can never use.
  virtual void begin(int prompt_len) = 0;
  // The target's last forward ran rows at positions pos0..; rows 0..n-1 are committed.
  // next_tokens[i] is the token at position pos0+i+1 (the one row i predicted and that was kept).
  virtual void observe(const Qwen38Model& target, int pos0, int n, const int32_t* next_tokens) = 0;
  // Propose k drafts following `anchor` (at position `pos`, not yet fed to the target).
  virtual void draft(int32_t anchor, int pos, int k, int32_t* out) = 0;
  // Sampling (T > 0): drafts drawn from the source's own distribution at `temperature`, with
  // that distribution q per draft (spec/speculative.md section 5).
  virtual void draft_sampled(int32_t anchor, int pos, int k, float temperature, Rng& rng, int32_t* out,
                             std::vector<DraftDist>& q);
};

// The checkpoint's MTP head, chained k times (spec/qwen38.md 4.2).
class MtpDraftSource final : public DraftSource {
 public:
  MtpDraftSource(Qwen38Model& target, int max_pos);
  std::string name() const override { return "mtp"; }
  int max_k() const override { return 8; }
  int default_k() const override { return 3; }
  void begin(int prompt_len) override;
  void observe(const Qwen38Model& target, int pos0, int n, const int32_t* next_tokens) override;
  void draft(int32_t anchor, int pos, int k, int32_t* out) override;
  void draft_sampled(int32_t anchor, int pos, int k, float temperature, Rng& rng, int32_t* out,
                     std::vector<DraftDist>& q) override;
  MtpHead& head() { return *head_; }

 private:
  std::unique_ptr<MtpHead> head_;
  Backend* be_;
  int H_;
  DeviceBuffer seed_hidden_;  // Hm of the last observed pair: input of the next chained step
  int32_t seed_draft_ = -1;   // its argmax: the first draft of the next round
  int seed_pos_ = -1;         // pair position of the seed
  int seed_row_ = 0;          // its row in the head's logits (valid until the next head forward)
  int V_;
};

// The DFlash2 (or v1) block drafter (spec/dflash2.md section 4).
class DFlashDraftSource final : public DraftSource {
 public:
  DFlashDraftSource(std::unique_ptr<DFlash2Drafter> d);
  std::string name() const override { return drafter_->is_v2() ? "dflash2" : "dflash"; }
  int max_k() const override { return drafter_->max_drafts(); }
  int default_k() const override { return drafter_->max_drafts(); }
  bool needs_taps() const override { return true; }
  std::vector<int> tap_layers() const override { return drafter_->config().target_layer_ids; }
  void begin(int prompt_len) override;
  void observe(const Qwen38Model& target, int pos0, int n, const int32_t* next_tokens) override;
  void draft(int32_t anchor, int pos, int k, int32_t* out) override;
  void draft_sampled(int32_t anchor, int pos, int k, float temperature, Rng& rng, int32_t* out,
                     std::vector<DraftDist>& q) override;
  DFlash2Drafter& drafter() { return *drafter_; }

 private:
  std::unique_ptr<DFlash2Drafter> drafter_;
  int skip_before_ = 0;  // prompt rows older than this are never visible to the first block
};

}  // namespace qf
