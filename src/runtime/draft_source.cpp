#include "runtime/draft_source.h"

#include <algorithm>
#include <vector>

#include "core/error.h"

namespace qf {

void DeferredRows::push(Backend& be, const float* src, int width, int pos0, int n, const int32_t* next_tokens) {
  const int held = rows();
  QF_CHECK(n >= 1 && fits(n), "deferred rows: %d held, %d more (capacity %d)", held, n, kCapacity);
  if (held == 0) pos0_ = pos0;
  QF_CHECK(pos0 == pos0_ + held, "deferred rows at %d..%d, next rows start at %d", pos0_, pos0_ + held, pos0);
  const size_t row_bytes = static_cast<size_t>(width) * sizeof(float);
  if (buf_.bytes() < kCapacity * row_bytes) buf_ = DeviceBuffer(&be, kCapacity * row_bytes);
  be.copy(buf_.f() + static_cast<size_t>(held) * width, src, n * row_bytes);
  tokens_.insert(tokens_.end(), next_tokens, next_tokens + n);
}

void DraftSource::draft_sampled(int32_t, int, int, float, Rng&, int32_t*, std::vector<DraftDist>&) {
  fail(ErrorKind::Usage, "draft source '%s' does not support sampling (temperature > 0)", name().c_str());
}

void DeferringDraftSource::begin(int prompt_len) {
  pending_.clear();
  prompt_len_ = prompt_len;
}

void DeferringDraftSource::observe(const TargetModel& target, int pos0, int n, const int32_t* next_tokens) {
  catch_up();
  run_rows(rows_of(target).data, pos0, n, next_tokens, pos0 < prompt_len_);
}

// Plain steps: the rows are copied aside (the next forward overwrites them) and run in
// catch_up(), through the same ops observe() would have used. Prompt rows, and rows past the
// batch's capacity, run now.
void DeferringDraftSource::observe_deferred(const TargetModel& target, int pos0, int n, const int32_t* next_tokens) {
  if (!pending_.fits(n)) catch_up();
  if (!pending_.fits(n) || pos0 < prompt_len_) return observe(target, pos0, n, next_tokens);
  const Rows r = rows_of(target);
  pending_.push(*r.be, r.data, r.width, pos0, n, next_tokens);
}

void DeferringDraftSource::catch_up() {
  if (pending_.rows() == 0) return;
  run_rows(pending_.data(), pending_.pos0(), pending_.rows(), pending_.tokens(), true);
  pending_.clear();
}

MtpDraftSource::MtpDraftSource(TargetModel& target, int max_pos)
    : head_(MtpHead::load(target, max_pos)), be_(&target.backend()), H_(target.config().hidden_size),
      V_(target.config().vocab_size) {
  seed_hidden_ = DeviceBuffer(be_, static_cast<size_t>(H_) * sizeof(float));
}

void MtpDraftSource::begin(int prompt_len) {
  DeferringDraftSource::begin(prompt_len);
  seed_draft_ = -1;
  seed_pos_ = -1;
}


// Committed pairs (t_{j+1}, H_j) for j = pos0..pos0+n-1 run through the head; the last one's
// output is the seed: its argmax is the next round's first draft, its Hm the chain input.
void MtpDraftSource::run_rows(const float* hidden, int pos0, int n, const int32_t* next_tokens, bool direct) {
  const int H = H_;
  if (pos0 < prompt_len()) {  // prompt pairs (the target ran them as prefill): the prefill ops
    head_->forward_prefill(next_tokens, hidden, n, pos0);
    be_->copy(seed_hidden_.get(), head_->prefill_hidden(), H * sizeof(float));
    be_->download(&seed_draft_, head_->argmax_ids(), sizeof(int32_t));
    seed_pos_ = pos0 + n - 1;
    seed_row_ = 0;
    return;
  }
  for (int off = 0; off < n; off += head_->max_rows()) {
    const int m = std::min(head_->max_rows(), n - off);
    head_->forward(next_tokens + off, hidden + static_cast<size_t>(off) * H, m, pos0 + off, nullptr, direct);
    if (off + m == n) {
      be_->copy(seed_hidden_.get(), head_->out_hidden() + static_cast<size_t>(m - 1) * H, H * sizeof(float));
      be_->download(&seed_draft_, head_->argmax_ids() + (m - 1), sizeof(int32_t));
      seed_pos_ = pos0 + n - 1;
      seed_row_ = m - 1;
    }
  }
}

std::vector<StateRegion> MtpDraftSource::snapshot_regions(int n) const {
  const size_t bytes = static_cast<size_t>(n) * head_->kv_row_bytes();
  return {{head_->kv_rows(false), bytes}, {head_->kv_rows(true), bytes}};
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
  DeferringDraftSource::begin(prompt_len);
  drafter_->reset();
  fresh_skip_ = window_start(prompt_len);
  skip_before_ = fresh_skip_;
}

int DFlashDraftSource::window_start(int n) const {
  const int W = drafter_->config().sliding_window;
  return W > 0 ? std::max(0, n - (W - 1)) : 0;
}

void DFlashDraftSource::prepare_snapshots(int n) { skip_before_ = std::min(skip_before_, window_start(n)); }

std::vector<StateRegion> DFlashDraftSource::resume_regions(int n) {
  drafter_->set_context(window_start(n), n);
  return snapshot_regions(n);
}

std::vector<StateRegion> DFlashDraftSource::snapshot_regions(int n) const {
  if (drafter_->context_rows() == 0) {  // nothing appended yet: only an empty window is valid
    QF_CHECK(window_start(n) == n, "drafter snapshot at %d with an empty context", n);
    return {};
  }
  return drafter_->context_regions(window_start(n), n);
}

DeferringDraftSource::Rows DFlashDraftSource::rows_of(const TargetModel& target) const {
  return {&drafter_->backend(), target.tap_rows(), static_cast<int>(target.taps().size()) * target.config().hidden_size};
}

// Plain steps' rows are appended in passes of up to max_rows rows (one pass reads the context
// weights once for all of them).
void DFlashDraftSource::run_rows(const float* tap_rows, int pos0, int n, const int32_t*, bool direct) {
  int first = 0;
  if (drafter_->context_rows() == 0 && pos0 < skip_before_) first = std::min(n, skip_before_ - pos0);
  if (first >= n) return;
  const size_t w = drafter_->config().target_layer_ids.size() * static_cast<size_t>(drafter_->config().hidden_size);
  drafter_->append_context(tap_rows + first * w, n - first, pos0 + first, nullptr, direct);
  if (pos0 + n == prompt_len()) drafter_->trim_context(fresh_skip_);  // rows kept only for snapshots
}

void DFlashDraftSource::draft(int32_t anchor, int pos, int k, int32_t* out) {
  drafter_->draft(anchor, pos, k, out);
}

// DFlash2 at T > 0: the drafter's block pass and candidates as in greedy drafting, then the
// selector walk samples k* ~ softmax(s / T) over the top-K given the sampled predecessor
// (docs/spec/dflash2.md 3.1 step 5); q_j is that softmax on the candidate ids. DFlash v1 samples each
// row from softmax(logits / T) independently.
void DFlashDraftSource::draft_sampled(int32_t anchor, int pos, int k, float temperature, Rng& rng, int32_t* out,
                                      std::vector<DraftDist>& q) {
  drafter_->draft(anchor, pos, k, out);
  q.assign(k, DraftDist{});
  if (drafter_->is_v2())
    sample_selector_walk(anchor, temperature, rng, k, out, q);
  else
    sample_rows(temperature, rng, k, out, q);
}

void DFlashDraftSource::sample_rows(float temperature, Rng& rng, int k, int32_t* out, std::vector<DraftDist>& q) {
  DFlash2Drafter& d = *drafter_;
  const int V = d.config().vocab_size;
  std::vector<float> logits(static_cast<size_t>(k) * V);
  d.backend().download(logits.data(), d.logits(), logits.size() * 4);
  for (int j = 0; j < k; j++) {
    softmax_t(logits.data() + static_cast<size_t>(j) * V, V, temperature, q[j].probs);
    out[j] = sample_from(q[j].probs, rng);
  }
}

void DFlashDraftSource::sample_selector_walk(int32_t anchor, float temperature, Rng& rng, int k, int32_t* out,
                                             std::vector<DraftDist>& q) {
  DFlash2Drafter& d = *drafter_;
  Backend& be = d.backend();
  const int K = d.config().selector_top_k, R = d.config().selector_rank;
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
