#include "runtime/draft_source.h"

#include <algorithm>
#include <vector>

#include "core/error.h"

namespace qf {

MtpDraftSource::MtpDraftSource(Qwen38Model& target, int max_pos)
    : head_(MtpHead::load(target, max_pos)), be_(&target.backend()), H_(target.config().hidden_size) {
  seed_hidden_ = DeviceBuffer(be_, static_cast<size_t>(H_) * sizeof(float));
}

void MtpDraftSource::begin(int) {
  seed_draft_ = -1;
  seed_pos_ = -1;
}

// Committed pairs (t_{j+1}, H_j) for j = pos0..pos0+n-1 run through the head now; the last
// one's output is the seed: its argmax is the next round's first draft, its Hm the chain input.
void MtpDraftSource::observe(const Qwen38Model& target, int pos0, int n, const int32_t* next_tokens) {
  const int H = H_;
  for (int off = 0; off < n; off += head_->max_rows()) {
    const int m = std::min(head_->max_rows(), n - off);
    head_->forward(next_tokens + off, target.final_hidden() + static_cast<size_t>(off) * H, m, pos0 + off);
    if (off + m == n) {
      be_->copy(seed_hidden_.get(), head_->out_hidden() + static_cast<size_t>(m - 1) * H, H * sizeof(float));
      be_->download(&seed_draft_, head_->argmax_ids() + (m - 1), sizeof(int32_t));
      seed_pos_ = pos0 + n - 1;
    }
  }
}

void MtpDraftSource::draft(int32_t anchor, int pos, int k, int32_t* out) {
  // The seed pair is (anchor, H_{pos-1}) at pair position pos-1.
  QF_CHECK(seed_pos_ == pos - 1, "MTP seed at pair %d, round at %d", seed_pos_, pos);
  (void)anchor;
  out[0] = seed_draft_;
  for (int i = 1; i < k; i++) {
    // Chain: (previous draft, previous Hm) at the next pair position. Rejected pairs written
    // here are overwritten by the next observe() (the cache is trimmed by position).
    head_->forward(&out[i - 1], seed_hidden_.f(), 1, pos + i - 1);
    be_->copy(seed_hidden_.get(), head_->out_hidden(), H_ * sizeof(float));
    be_->download(&out[i], head_->argmax_ids(), sizeof(int32_t));
  }
}

DFlashDraftSource::DFlashDraftSource(std::unique_ptr<DFlash2Drafter> d) : drafter_(std::move(d)) {}

void DFlashDraftSource::begin(int prompt_len) {
  drafter_->reset();
  const int W = drafter_->config().sliding_window;
  skip_before_ = W > 0 ? std::max(0, prompt_len - (W - 1)) : 0;
}

void DFlashDraftSource::observe(const Qwen38Model& target, int pos0, int n, const int32_t*) {
  int first = 0;
  if (drafter_->context_rows() == 0 && pos0 < skip_before_) first = std::min(n, skip_before_ - pos0);
  if (first >= n) return;
  const size_t w = target.taps().size() * static_cast<size_t>(target.config().hidden_size);
  drafter_->append_context(target.tap_rows() + first * w, n - first, pos0 + first);
}

void DFlashDraftSource::draft(int32_t anchor, int pos, int k, int32_t* out) {
  drafter_->draft(anchor, pos, k, out);
}

}  // namespace qf
