#include "runtime/generate.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"

namespace qf {

namespace {
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}
}  // namespace

Generator::Generator(Qwen38Model& target, DraftSource* source, int max_pos) : target_(target), source_(source) {
  if (source_) {
    max_k_ = std::min(source_->max_k(), target.max_rows() - 1);
    if (source_->needs_taps()) target_.set_taps(source_->tap_layers());
  }
  state_ = target_.new_state(max_pos, max_k_ + 1);
}

GenStats Generator::generate(const std::vector<int32_t>& prompt, const GenerateOptions& opt,
                             const TokenCallback& on_token, const RoundCallback& on_round) {
  GenStats st;
  Backend& be = target_.backend();
  const int N = static_cast<int>(prompt.size());
  TargetState& ts = *state_;
  if (N < 1) fail(ErrorKind::Usage, "the prompt is empty: at least one token is needed");
  if (N >= ts.max_pos)
    fail(ErrorKind::Usage, "the prompt has %d tokens; the context holds %d (raise --max-context)", N, ts.max_pos);
  int k_req = 0;
  if (source_) {
    k_req = opt.draft_k > 0 ? opt.draft_k : source_->default_k();
    k_req = std::clamp(k_req, 1, max_k_);
    st.draft = source_->name();
  }
  st.k = k_req;
  st.prompt_tokens = N;
  st.accept_at.assign(k_req, 0);
  st.drafted_at.assign(k_req, 0);

  target_.reset(ts);
  if (source_) source_->begin(N);
  const bool taps = source_ && source_->needs_taps();
  const int R = target_.max_rows();

  const bool sampled = !opt.sampling.greedy();
  const int V = target_.config().vocab_size;
  Rng rng(opt.sampling.seed);
  std::vector<float> logits_host, p, res;
  std::vector<DraftDist> q;
  // The next token from the last row of the target's logits: argmax, or a draw from p at T > 0.
  auto pick_first = [&]() -> int32_t {
    int32_t t;
    if (!sampled) {
      be.download(&t, target_.argmax_ids(), sizeof(int32_t));
      return t;
    }
    logits_host.resize(V);
    be.download(logits_host.data(), target_.logits(), V * sizeof(float));
    target_probs(logits_host.data(), V, opt.sampling, p);
    return sample_from(p, rng);
  };

  // ---- prefill (shared by plain and speculative decoding) ----
  auto t0 = Clock::now();
  int32_t first = -1;
  std::vector<int32_t> next(R + 1);
  for (int off = 0; off < N; off += R) {
    const int m = std::min(R, N - off);
    const bool last = off + m == N;
    ForwardOpts fo;
    fo.lm_head = last;
    fo.logits_last_only = true;
    fo.taps = taps;
    fo.final_hidden = source_ != nullptr;
    target_.forward(ts, prompt.data() + off, m, fo);
    if (last) first = pick_first();
    if (source_) {
      for (int i = 0; i < m; i++) next[i] = (off + i + 1 < N) ? prompt[off + i + 1] : first;
      source_->observe(target_, off, m, next.data());
    }
  }
  be.sync();
  st.prefill_ms = ms_since(t0);

  // ---- emission ----
  bool done = false;
  auto emit = [&](int32_t tok) {
    if (done) return;
    for (int32_t s : opt.stop_ids)
      if (tok == s) {
        done = true;
        st.stop_reason = "stop_token";
        return;
      }
    st.generated_tokens++;
    if (on_token && !on_token(tok)) {
      done = true;
      st.stop_reason = "callback";
      return;
    }
    if (st.generated_tokens >= opt.max_new_tokens) {
      done = true;
      st.stop_reason = "max_tokens";
    }
  };

  auto t_dec = Clock::now();
  if (opt.max_new_tokens <= 0) {
    st.stop_reason = "max_tokens";
    return st;
  }
  emit(first);
  int32_t anchor = first;
  int P = N;
  std::vector<int32_t> drafts(max_k_ + 1), tokens(max_k_ + 1), targ(max_k_ + 1);
  while (!done) {
    if (P + 1 > ts.max_pos) {
      st.stop_reason = "context_full";
      break;
    }
    int k = k_req;
    k = std::min(k, opt.max_new_tokens - st.generated_tokens - 1);  // drafts past the end are wasted
    k = std::min(k, ts.max_pos - P - 1);
    k = std::max(k, 0);
    auto tr = Clock::now();
    if (k > 0) {
      if (sampled)
        source_->draft_sampled(anchor, P, k, opt.sampling.temperature, rng, drafts.data(), q);
      else
        source_->draft(anchor, P, k, drafts.data());
      st.draft_ms += ms_since(tr);
    }
    tokens[0] = anchor;
    for (int i = 0; i < k; i++) tokens[i + 1] = drafts[i];
    auto tv = Clock::now();
    ForwardOpts fo;
    fo.capture = k > 0;
    fo.taps = taps;
    fo.final_hidden = source_ != nullptr;
    target_.forward(ts, tokens.data(), k + 1, fo);
    if (sampled) {
      logits_host.resize(static_cast<size_t>(k + 1) * V);
      be.download(logits_host.data(), target_.logits(), logits_host.size() * sizeof(float));
    } else {
      be.download(targ.data(), target_.argmax_ids(), (k + 1) * sizeof(int32_t));
    }
    st.verify_ms += ms_since(tv);

    auto ta = Clock::now();
    int a = 0;
    int32_t bonus;
    if (sampled) {
      // Accept draft j while u * q_j(d_j) < p_j(d_j); at the first rejection draw from
      // normalize(max(p_j - q_j, 0)); if all are accepted, draw the bonus from p_k.
      bonus = -1;
      for (; a < k; a++) {
        target_probs(logits_host.data() + static_cast<size_t>(a) * V, V, opt.sampling, p);
        const int32_t d = drafts[a];
        if (uniform01(rng) * q[a].prob_of(d) < p[d]) continue;
        residual(p, q[a], res);
        bonus = sample_from(res, rng);
        break;
      }
      if (bonus < 0) {
        target_probs(logits_host.data() + static_cast<size_t>(k) * V, V, opt.sampling, p);
        bonus = sample_from(p, rng);
      }
    } else {
      if (opt.force_accept >= 0)
        a = std::min(opt.force_accept, k);
      else
        while (a < k && drafts[a] == targ[a]) a++;
      bonus = targ[a];
    }
    if (a < k) target_.rollback(ts, a, P + a + 1);
    if (source_) {
      for (int i = 0; i < a; i++) next[i] = drafts[i];
      next[a] = bonus;
      source_->observe(target_, P, a + 1, next.data());
    }
    be.sync();
    st.accept_ms += ms_since(ta);

    st.rounds++;
    st.drafted += k;
    st.accepted += a;
    for (int j = 0; j < k && j < static_cast<int>(st.drafted_at.size()); j++) {
      st.drafted_at[j]++;
      if (j < a) st.accept_at[j]++;
    }
    st.accept_lengths.push_back(a + 1);
    if (on_round) on_round(P, std::vector<int32_t>(drafts.begin(), drafts.begin() + k), a, bonus);
    for (int i = 0; i < a; i++) emit(drafts[i]);
    emit(bonus);
    anchor = bonus;
    P += a + 1;
  }
  st.total_decode_ms = ms_since(t_dec);
  return st;
}

}  // namespace qf
