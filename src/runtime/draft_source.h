// Draft sources for the speculative round loop (docs/spec/speculative.md section 3).
// The loop calls observe() after every target forward with the rows it committed, so a source
// always sees a contiguous history (plain steps included), and draft() at the start of a round.
// After a plain step it calls observe_deferred() instead: a source may keep the rows' inputs and
// run them in one batch in catch_up(), which the loop calls before the next draft.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "model/dflash2.h"
#include "model/mtp.h"
#include "model/target_model.h"
#include "runtime/sampling.h"

namespace qf {

// Rows of backend memory copied aside for a later batch (observe_deferred), with their
// positions and next tokens. Holds up to kCapacity rows; the buffer is allocated at first use.
class DeferredRows {
 public:
  static constexpr int kCapacity = 256;  // past it the owner catches up early (the batch stays cheap)
  int rows() const { return static_cast<int>(tokens_.size()); }
  int pos0() const { return pos0_; }
  bool fits(int n) const { return rows() + n <= kCapacity; }
  // Appends n rows of `width` floats (backend memory) at positions pos0.. (contiguous with
  // what is held) and their next tokens.
  void push(Backend& be, const float* src, int width, int pos0, int n, const int32_t* next_tokens);
  const float* data() const { return buf_.f(); }
  const int32_t* tokens() const { return tokens_.data(); }
  void clear() { tokens_.clear(); }

 private:
  DeviceBuffer buf_;             // f32 [kCapacity, width]
  std::vector<int32_t> tokens_;  // [rows]
  int pos0_ = 0;
};

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
  virtual void observe(const TargetModel& target, int pos0, int n, const int32_t* next_tokens) = 0;
  // The same rows, when no draft is due yet (the depth controller's plain steps). The default
  // observes them now; MTP and DFlash copy the target's rows aside (the next forward overwrites
  // them) and run them later, so a run of plain steps costs the source a copy per step.
  virtual void observe_deferred(const TargetModel& target, int pos0, int n, const int32_t* next_tokens) {
    observe(target, pos0, n, next_tokens);
  }
  // Runs the deferred rows: afterwards the source is where observe() would have left it.
  virtual void catch_up() {}
  virtual int pending_rows() const { return 0; }  // deferred rows not yet run
  // Propose k drafts following `anchor` (at position `pos`, not yet fed to the target).
  virtual void draft(int32_t anchor, int pos, int k, int32_t* out) = 0;
  // Sampling (T > 0): drafts drawn from the source's own distribution at `temperature`, with
  // that distribution q per draft (docs/spec/speculative.md section 5).
  virtual void draft_sampled(int32_t anchor, int pos, int k, float temperature, Rng& rng, int32_t* out,
                             std::vector<DraftDist>& q);

  // ---- prefix snapshots (runtime/prefix_cache.h). A resumable source's state for positions
  // [0, n) lives in regions of backend memory; the round loop calls, after begin():
  //  prepare_snapshots(n): snapshots will be taken at positions >= n; keep what they need;
  //  resume_regions(n): the sequence resumes at n: set up for that and return where the state
  //    for [0, n) goes (the loop copies the snapshot there, then observes rows n.. as usual);
  //  snapshot_regions(n): after the observe() that reached n, where that state is.
  virtual bool resumable() const { return false; }
  virtual void prepare_snapshots(int /*n*/) {}
  virtual std::vector<StateRegion> resume_regions(int /*n*/) { return {}; }
  virtual std::vector<StateRegion> snapshot_regions(int /*n*/) const { return {}; }
};

// A source that keeps the target's rows of plain steps aside and runs them in one batch before
// its next draft (MTP, DFlash): the deferral policy, written once. The subclass names the
// target rows it reads (rows_of) and runs rows (run_rows); observe() runs rows now, after any
// held ones, so both paths feed run_rows the same rows in the same order.
class DeferringDraftSource : public DraftSource {
 public:
  void begin(int prompt_len) override;  // subclasses call it from theirs
  void observe(const TargetModel& target, int pos0, int n, const int32_t* next_tokens) final;
  void observe_deferred(const TargetModel& target, int pos0, int n, const int32_t* next_tokens) final;
  void catch_up() final;
  int pending_rows() const final { return pending_.rows(); }

 protected:
  struct Rows {
    Backend* be;        // where they live
    const float* data;  // the target's rows of its last forward, [n, width]
    int width;
  };
  virtual Rows rows_of(const TargetModel& target) const = 0;
  // Rows at positions pos0.. (next_tokens[i]: the token after row i). direct: run without
  // graphs (prompt rows come from the target's prefill buffers at any offset, deferred rows from
  // the batch buffer; a recording is keyed by its input pointer).
  virtual void run_rows(const float* rows, int pos0, int n, const int32_t* next_tokens, bool direct) = 0;
  int prompt_len() const { return prompt_len_; }  // observed rows below it are prompt rows

 private:
  int prompt_len_ = 0;
  DeferredRows pending_;
};

// The checkpoint's MTP head, chained k times (docs/spec/qwen38.md 4.2).
class MtpDraftSource final : public DeferringDraftSource {
 public:
  MtpDraftSource(TargetModel& target, int max_pos);
  std::string name() const override { return "mtp"; }
  int max_k() const override { return 8; }
  int default_k() const override { return 3; }
  void begin(int prompt_len) override;
  void draft(int32_t anchor, int pos, int k, int32_t* out) override;
  void draft_sampled(int32_t anchor, int pos, int k, float temperature, Rng& rng, int32_t* out,
                     std::vector<DraftDist>& q) override;
  MtpHead& head() { return *head_; }
  // The head's K/V rows of pairs [0, n) (pair n-1 used token n: the snapshot key includes it).
  bool resumable() const override { return true; }
  std::vector<StateRegion> resume_regions(int n) override { return snapshot_regions(n); }
  std::vector<StateRegion> snapshot_regions(int n) const override;

 private:
  Rows rows_of(const TargetModel& target) const override { return {be_, target.final_hidden(), H_}; }
  // Pairs (next_tokens[i], hidden row i) at pair positions pos0..: through the head, the last
  // one becoming the seed. direct: no graph (rows at one-off addresses).
  void run_rows(const float* hidden, int pos0, int n, const int32_t* next_tokens, bool direct) override;
  std::unique_ptr<MtpHead> head_;
  Backend* be_;
  int H_;
  DeviceBuffer seed_hidden_;  // Hm of the last observed pair: input of the next chained step
  int32_t seed_draft_ = -1;   // its argmax: the first draft of the next round
  int seed_pos_ = -1;         // pair position of the seed
  int seed_row_ = 0;          // its row in the head's logits (valid until the next head forward)
  int V_;
};

// The DFlash2 (or v1) block drafter (docs/spec/dflash2.md section 4).
class DFlashDraftSource final : public DeferringDraftSource {
 public:
  DFlashDraftSource(std::unique_ptr<DFlash2Drafter> d);
  std::string name() const override { return drafter_->is_v2() ? "dflash2" : "dflash"; }
  int max_k() const override { return drafter_->max_drafts(); }
  int default_k() const override { return drafter_->max_drafts(); }
  bool needs_taps() const override { return true; }
  std::vector<int> tap_layers() const override { return drafter_->config().target_layer_ids; }
  void begin(int prompt_len) override;
  void draft(int32_t anchor, int pos, int k, int32_t* out) override;
  void draft_sampled(int32_t anchor, int pos, int k, float temperature, Rng& rng, int32_t* out,
                     std::vector<DraftDist>& q) override;
  DFlash2Drafter& drafter() { return *drafter_; }
  // The context rows a draft after position n can see ([n - (W-1), n) with a sliding window W,
  // else [0, n)); the prompt's last observe() trims the context to what a fresh run keeps, so
  // the drafts do not depend on where the sequence resumed.
  bool resumable() const override { return true; }
  void prepare_snapshots(int n) override;
  std::vector<StateRegion> resume_regions(int n) override;
  std::vector<StateRegion> snapshot_regions(int n) const override;

 private:
  Rows rows_of(const TargetModel& target) const override;
  // Tap rows appended to the drafter's context (next tokens unused).
  void run_rows(const float* tap_rows, int pos0, int n, const int32_t* next_tokens, bool direct) override;
  // T > 0 after a greedy pass: v1 draws each row from its logits, v2 walks the selector.
  void sample_rows(float temperature, Rng& rng, int k, int32_t* out, std::vector<DraftDist>& q);
  void sample_selector_walk(int32_t anchor, float temperature, Rng& rng, int k, int32_t* out,
                            std::vector<DraftDist>& q);
  std::unique_ptr<DFlash2Drafter> drafter_;
  int window_start(int n) const;
  int skip_before_ = 0;  // prompt rows older than this are not appended (never visible, not snapshotted)
  int fresh_skip_ = 0;   // the rows a fresh run keeps start here (the first block's window)
};

}  // namespace qf
