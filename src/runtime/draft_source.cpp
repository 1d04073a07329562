#include "runtime/draft_source.h"

#include <algorithm>
#include <vector>

#include "core/error.h"

namespace qf {

void DraftSource::draft_sampled(int32_t, int, int, float, Rng&, int32_t*, std::vector<DraftDist>&) {
  fail(ErrorKind::Usage, "draft source '%s' does not support sampling (temperature > 0)", name().c_str());
}

MtpDraftSource::MtpDraftSource(Qwen38Model& target, int max_pos)
    : head_(MtpHead::load(target, max_pos)), be_(&target.backend()), H_(target.config().hidden_size),
      V_(target.config().vocab_size) {
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
      seed_row_ = m - 1;
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

void MtpDraftSource::draft_sampled(int32_t anchor, int pos, int k, float temperature, Rng& rng, int32_t* out,
                                   std::vector<DraftDist>& q) {
  QF_CHECK(seed_pos_ == pos - 1, "MTP seed at pair %d, round at %d", seed_pos_, pos);
  (void)anchor;
  q.assign(k, DraftDist{});
  std::vector<float> logits(V_);
  // Draft i is drawn from the head's softmax at `temperature`; its logits row is still in the
  // head's buffer (row seed_row_ after observe, row 0 after each chained step).
  const float* row = head_->logits() + static_cast<size_t>(seed_row_) * V_;
  for (int i = 0; i < k; i++) {
    if (i > 0) {
      head_->forward(&out[i - 1], seed_hidden_.f(), 1, pos + i - 1);
      be_->copy(seed_hidden_.get(), head_->out_hidden(), H_ * sizeof(float));
      row = head_->logits();
    }
    be_->download(logits.data(), row, V_ * sizeof(float));
    softmax_t(logits.data(), V_, temperature, q[i].probs);
    out[i] = sample_from(q[i].probs, rng);
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

namespace qf {

// DFlash2 at T > 0: the drafter's block pass and candidates as in greedy drafting, then the
// selector walk samples k* ~ softmax(s / T) over the top-K given the sampled predecessor
// (spec/dflash2.md 3.1 step 5); q_j is that softmax on the candidate ids. DFlash v1 samples each
// row from softmax(logits / T) independently.
void DFlashDraftSource::draft_sampled(int32_t anchor, int pos, int k, float temperature, Rng& rng, int32_t* out,
                                      std::vector<DraftDist>& q) {
  DFlash2Drafter& d = *drafter_;
  d.draft(anchor, pos, k, out);
  Backend& be = d.backend();
  q.assign(k, DraftDist{});
  const DrafterConfig& c = d.config();
  if (!d.is_v2()) {
    const int V = c.vocab_size;
    std::vector<float> logits(static_cast<size_t>(k) * V);
    be.download(logits.data(), d.logits(), logits.size() * 4);
    for (int j = 0; j < k; j++) {
      softmax_t(logits.data() + static_cast<size_t>(j) * V, V, temperature, q[j].probs);
      out[j] = sample_from(q[j].probs, rng);
    }
    return;
  }
  const int K = c.selector_top_k, R = c.selector_rank;
  std::vector<float> vals(static_cast<size_t>(k) * K), P(static_cast<size_t>(k) * R);
  std::vector<int32_t> ids(static_cast<size_t>(k) * K);
  be.download(vals.data(), d.cand_vals(), vals.size() * 4);
  be.download(ids.data(), d.cand_ids(), ids.size() * 4);
  be.download(P.data(), d.selector_hidden(), P.size() * 4);
  int32_t pred = anchor;
  std::vector<float> gp(R), scores(K);
  for (int j = 0; j < k; j++) {
    const std::vector<float> epre = d.predecessor_row(pred);
    for (int r = 0; r < R; r++) gp[r] = epre[r] * P[static_cast<size_t>(j) * R + r];
    for (int cand = 0; cand < K; cand++) {
      const std::vector<float> esuc = d.successor_row(ids[static_cast<size_t>(j) * K + cand]);
      float s = 0;
      for (int r = 0; r < R; r++) s += gp[r] * esuc[r];
      scores[cand] = s + vals[static_cast<size_t>(j) * K + cand];
    }
    softmax_t(scores.data(), K, temperature, q[j].probs);
    q[j].ids.assign(ids.begin() + static_cast<size_t>(j) * K, ids.begin() + static_cast<size_t>(j + 1) * K);
    out[j] = q[j].ids[sample_from(q[j].probs, rng)];
    pred = out[j];
  }
}

}  // namespace qf
