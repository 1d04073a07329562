#include "runtime/generate.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "runtime/depth_controller.h"

namespace qf {

struct Generator::Run {
  Run(const GenerateOptions& o, const TokenCallback& t, const RoundCallback& r)
      : opt(o), on_token(t), on_round(r), sampled(!o.sampling.greedy()), rng(o.sampling.seed) {}
  const GenerateOptions& opt;
  const TokenCallback& on_token;
  const RoundCallback& on_round;
  const bool sampled;
  Rng rng;
  GenStats stats;
  int k_req = 0;       // drafts asked for per round (auto: the most the controller may pick)
  DepthController* ctl = nullptr;  // --draft-k auto: picks each round's k (the Generator's)
  int pos = 0;         // P: the anchor's position = tokens the target has committed
  int resumed = 0;     // prompt tokens restored from a prefix snapshot (the prefill starts here)
  std::vector<int> snapshots;  // positions where the prefill stores snapshots, ascending
  int32_t anchor = -1;  // the last emitted token, not yet fed to the target
  bool done = false;
  // This round (K = max_k_, the deepest round this generator runs):
  std::vector<int32_t> drafts;      // [K+1] d1..dk
  std::vector<DraftDist> q;         // [k] their distributions (sampled)
  std::vector<int32_t> block;       // [K+1] the verify block: anchor, d1..dk
  std::vector<int32_t> target_ids;  // [K+1] the target's argmax per slot (greedy)
  std::vector<float> logits;        // [K+1, V] the target's logits per slot (sampled)
  std::vector<int32_t> committed;   // [K+1] the token after each committed row (observe)
  std::vector<float> p, res;        // sampling work space
};

Generator::Generator(TargetModel& target, DraftSource* source, int max_pos) : target_(target), source_(source) {
  if (source_) {
    max_k_ = std::min(source_->max_k(), target.max_rows() - 1);
    if (source_->needs_taps()) target_.set_taps(source_->tap_layers());
  }
  state_ = target_.new_state(max_pos, max_k_ + 1);
}

GenStats Generator::generate(const std::vector<int32_t>& prompt, const GenerateOptions& opt,
                             const TokenCallback& on_token, const RoundCallback& on_round) {
  Run run(opt, on_token, on_round);
  {
    PhaseTimer ttft(run.stats.ttft_ms);  // entry to the first token (it is known after the prefill)
    begin(run, prompt);
    resume(run, prompt);
    run.anchor = prefill(run, prompt);
  }
  run.pos = static_cast<int>(prompt.size());
  if (opt.max_new_tokens <= 0) {
    run.stats.stop_reason = "max_tokens";
    return run.stats;
  }
  {
    PhaseTimer decode(run.stats.total_decode_ms);
    emit(run, run.anchor);
    while (!run.done) {
      if (run.pos + 1 > state_->max_pos) {
        run.stats.stop_reason = "context_full";
        break;
      }
      round(run);
    }
    target_.backend().sync();  // the last observe()'s device work
  }
  return run.stats;
}

// One round; with the depth controller on, its cost (up to the commit: emission is the caller's
// time) goes back to the controller.
void Generator::round(Run& run) {
  const auto t0 = std::chrono::steady_clock::now();
  const int pos = run.pos;
  const int k = round_depth(run);
  draft(run, k);
  verify(run, k);
  const Verdict v = accept(run, k);
  record_round(run, k, v);
  commit(run, k, v);
  if (run.ctl) {
    const double ms = run.opt.round_cost
                          ? run.opt.round_cost(k, pos)
                          : std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    run.stats.round_times.push_back({k, run.ctl->plain_run(), ms});
    run.ctl->record(k, v.accepted, ms);
  }
  for (int i = 0; i < v.accepted; i++) emit(run, run.drafts[i]);
  emit(run, v.bonus);
}

// Checks the request, sizes the round buffers, and resets the target and the source.
void Generator::begin(Run& run, const std::vector<int32_t>& prompt) {
  const int N = static_cast<int>(prompt.size());
  if (N < 1) fail(ErrorKind::Usage, "the prompt is empty: at least one token is needed");
  if (N >= state_->max_pos)
    fail(ErrorKind::Usage, "the prompt has %d tokens; the context holds %d (raise --max-context)", N,
         state_->max_pos);
  if (run.opt.accept_override && run.sampled)
    fail(ErrorKind::Usage, "forced acceptance (an accept override) needs greedy decoding (temperature 0)");
  GenStats& st = run.stats;
  if (source_) {
    st.k_auto = run.opt.draft_k < 1;
    run.k_req = st.k_auto ? max_k_ : std::clamp(run.opt.draft_k, 1, max_k_);
    if (st.k_auto) {
      // One controller per Generator and decoding mode (greedy, sampled: their rounds cost
      // differently): round costs are the machine's and carry over; the acceptance profile
      // carries over as a prior, and probing starts over (DepthController::new_request).
      std::unique_ptr<DepthController>& ctl = run.sampled ? depth_sampled_ : depth_;
      if (!ctl) ctl = std::make_unique<DepthController>(max_k_);
      ctl->new_request();
      run.ctl = ctl.get();
    }
    st.draft = source_->name();
  }
  st.k = run.k_req;
  st.prompt_tokens = N;
  st.accept_at.assign(run.k_req, 0);
  st.drafted_at.assign(run.k_req, 0);
  st.k_rounds.assign(run.k_req + 1, 0);
  run.drafts.resize(max_k_ + 1);
  run.block.resize(max_k_ + 1);
  run.target_ids.resize(max_k_ + 1);
  run.committed.resize(max_k_ + 1);
  target_.reset(*state_);
  if (source_) source_->begin(N);
}

// Prefix reuse: restore the longest cached prefix of the prompt and plan the snapshots this
// prompt leaves: at its last multiple of 64 below N (the next turn of a conversation extends the
// prompt), and where it leaves the longest prefix it shares with a cached one (a branch: other
// requests may share that part too). Snapshots never go below the resume point.
void Generator::resume(Run& run, const std::vector<int32_t>& prompt) {
  if (!cache_ || (source_ && !source_->resumable())) return;
  const int N = static_cast<int>(prompt.size()), B = PrefixCache::kBlock;
  const int branch = std::min(cache_->shared_prefix(prompt), N);
  const PrefixCache::Entry* hit = cache_->find(prompt);
  const int from = hit ? hit->n : 0;
  const int at_branch = branch > 0 ? (branch - 1) / B * B : 0, at_end = (N - 1) / B * B;  // at_branch <= at_end
  if (at_branch > from && at_branch < at_end) run.snapshots.push_back(at_branch);
  if (at_end > from) run.snapshots.push_back(at_end);
  if (source_ && !run.snapshots.empty()) source_->prepare_snapshots(run.snapshots.front());
  if (!hit) return;
  cache_->restore(*hit, regions(from, true));
  state_->pos = from;
  run.resumed = from;
  run.stats.cached_tokens = from;
}

// The target's regions for [0, n), then the source's.
std::vector<StateRegion> Generator::regions(int n, bool for_resume) {
  std::vector<StateRegion> r = state_regions(*state_, n);
  if (source_) {
    const std::vector<StateRegion> s = for_resume ? source_->resume_regions(n) : source_->snapshot_regions(n);
    r.insert(r.end(), s.begin(), s.end());
  }
  return r;
}

// The prompt through the target (shared by plain and speculative decoding), the source
// observing every row; the first token from the last row's logits. The prompt runs through the
// prefill ops in chunks of prefill_rows() rows, a multiple of Backend::kPrefillChunk: every chunk
// boundary is a split the ops are invariant to, so the state after the prompt does not depend on
// the chunk (docs/DESIGN.md, "Prefill path"). prefill_rows() == 0: the decode forward, max_rows
// at a time.
int32_t Generator::prefill(Run& run, const std::vector<int32_t>& prompt) {
  PhaseTimer timer(run.stats.prefill_ms);
  const int N = static_cast<int>(prompt.size());
  const bool prefill_ops = target_.prefill_rows() > 0;
  const int R = prefill_ops ? target_.prefill_rows() : target_.max_rows();
  int32_t first = -1;
  std::vector<int32_t> next(R + 1);
  size_t snap = 0;  // the next entry of run.snapshots
  for (int off = run.resumed, m = 0; off < N; off += m) {
    const int end = snap < run.snapshots.size() ? std::min(N, run.snapshots[snap]) : N;
    m = std::min(R, end - off);  // a snapshot ends a forward (a multiple of 64: a split the ops are invariant to)
    const bool last = off + m == N;
    ForwardOpts fo;
    fo.prefill = prefill_ops;
    fo.lm_head = last;
    fo.logits_last_only = true;
    fo.taps = source_ && source_->needs_taps();
    fo.final_hidden = source_ != nullptr;
    target_.forward(*state_, prompt.data() + off, m, fo);
    if (last) first = sample_last_row(run);
    if (source_) {
      for (int i = 0; i < m; i++) next[i] = (off + i + 1 < N) ? prompt[off + i + 1] : first;
      source_->observe(target_, off, m, next.data());
    }
    if (snap < run.snapshots.size() && off + m == run.snapshots[snap])
      cache_->store(prompt, run.snapshots[snap++], regions(off + m, false));
  }
  target_.backend().sync();
  return first;
}

void Generator::warm_up(const std::vector<int32_t>& prompt_in) {
  if (!target_.backend().graphs_enabled() || prompt_in.empty()) return;
  const int probe_max = DepthController::Params{}.probe_max;
  // A prompt the context cannot hold with room for the runs below is cut (a small --max-context).
  const int need = 3 * probe_max + 2, P = static_cast<int>(prompt_in.size());
  const int cut = P + need <= state_->max_pos ? P : std::max(1, std::max(state_->max_pos - need, state_->max_pos / 4));
  const std::vector<int32_t> prompt(prompt_in.begin(), prompt_in.begin() + std::min(P, cut));
  const int room = state_->max_pos - static_cast<int>(prompt.size()) - 1;
  auto rounds = [&](int k, int keep) {  // three rounds at depth k keeping `keep` drafts
    GenerateOptions o;
    o.draft_k = k;
    o.max_new_tokens = std::min(3 * (keep + 1), room);
    o.accept_override = forced_acceptance(keep);
    if (o.max_new_tokens > 0) generate(prompt, o, nullptr);
  };
  if (!source_) {
    rounds(1, 0);  // a Generator without a source runs plain steps only
    return;
  }
  // Largest shapes first: an op whose scratch must grow moves the graph epoch, and every
  // recording made before it would be made again. Plain steps defer the source's rows, caught up
  // in one batch when drafting resumes: at most the controller's longest wait between probes
  // (DepthController::Params::probe_max) rows, the largest batch of a run; so the controller is
  // first run through plain steps (nothing accepted) until it has caught up a batch of that size
  // (waits 4, 8, .., probe_max, each ended by a probe).
  GenerateOptions o;
  o.draft_k = kDraftKAuto;
  o.accept_override = forced_acceptance(0);
  o.max_new_tokens = std::min(3 * probe_max, room);
  if (o.max_new_tokens > 0) generate(prompt, o, nullptr);
  // Then each depth, deepest first; depth k keeping k - 1 observes k rows, the first run max + 1.
  rounds(max_k_, max_k_);
  for (int k = max_k_; k >= 1; k--) rounds(k, k - 1);
  // The plain step inside a speculative run: verify(0)'s forward (its observe is deferred).
  for (int i = 0; i < 3; i++) {
    target_.reset(*state_);  // (the key does not depend on the position)
    target_.forward(*state_, prompt.data(), 1, verify_opts(0));
  }
  target_.reset(*state_);
  target_.backend().sync();
  // The auto run above saw its depths' graphs being recorded; every depth's are recorded now.
  if (depth_) depth_->forget_warmup();
}

// The next token from the last forward's single logits row: argmax, or a draw from p at T > 0.
int32_t Generator::sample_last_row(Run& run) {
  Backend& be = target_.backend();
  if (!run.sampled) {
    int32_t t;
    be.download(&t, target_.argmax_ids(), sizeof(int32_t));
    return t;
  }
  const int V = target_.config().vocab_size;
  run.logits.resize(V);
  be.download(run.logits.data(), target_.logits(), V * sizeof(float));
  target_probs(run.logits.data(), V, run.opt.sampling, run.p);
  return sample_from(run.p, run.rng);
}

// Drafts this round: the depth asked for (or the controller's pick), but none past the token
// budget (they would be wasted) or past the context.
int Generator::round_depth(Run& run) const {
  int limit = std::min(run.opt.max_new_tokens - run.stats.generated_tokens - 1, state_->max_pos - run.pos - 1);
  limit = std::max(limit, 0);
  return run.ctl ? run.ctl->choose(limit) : std::min(run.k_req, limit);
}

// After plain steps the source may hold rows it has not run yet (observe_deferred): it catches
// up first, billed to this draft.
void Generator::draft(Run& run, int k) {
  if (k == 0) return;
  PhaseTimer timer(run.stats.draft_ms);
  source_->catch_up();
  if (run.sampled)
    source_->draft_sampled(run.anchor, run.pos, k, run.opt.sampling.temperature, run.rng, run.drafts.data(), run.q);
  else
    source_->draft(run.anchor, run.pos, k, run.drafts.data());
}

// One target pass over [anchor, d1..dk] at positions P..P+k, capturing per-row GDN state (for
// rollback) and what the source needs; then the outputs acceptance reads.
void Generator::verify(Run& run, int k) {
  PhaseTimer timer(run.stats.verify_ms);
  run.block[0] = run.anchor;
  std::copy(run.drafts.begin(), run.drafts.begin() + k, run.block.begin() + 1);
  target_.forward(*state_, run.block.data(), k + 1, verify_opts(k));
  Backend& be = target_.backend();
  if (run.sampled) {
    run.logits.resize(static_cast<size_t>(k + 1) * target_.config().vocab_size);
    be.download(run.logits.data(), target_.logits(), run.logits.size() * sizeof(float));
  } else {
    be.download(run.target_ids.data(), target_.argmax_ids(), (k + 1) * sizeof(int32_t));
  }
}

ForwardOpts Generator::verify_opts(int k) const {
  ForwardOpts fo;
  fo.capture = k > 0;
  fo.taps = source_ && source_->needs_taps();
  fo.final_hidden = source_ != nullptr;
  return fo;
}

Verdict Generator::accept(Run& run, int k) {
  PhaseTimer timer(run.stats.accept_ms);
  if (run.opt.accept_override) return run.opt.accept_override(k, run.target_ids.data());
  if (run.sampled)
    return accept_sampled(run.drafts.data(), run.q, run.logits.data(), k, target_.config().vocab_size,
                          run.opt.sampling, run.rng, run.p, run.res);
  return accept_greedy(run.drafts.data(), run.target_ids.data(), k);
}

void Generator::record_round(Run& run, int k, const Verdict& v) {
  GenStats& st = run.stats;
  st.rounds++;
  st.drafted += k;
  st.accepted += v.accepted;
  st.k_rounds[k]++;
  for (int j = 0; j < k && j < static_cast<int>(st.drafted_at.size()); j++) {
    st.drafted_at[j]++;
    if (j < v.accepted) st.accept_at[j]++;
  }
  st.accept_lengths.push_back(v.accepted + 1);
  if (run.on_round)
    run.on_round(run.pos, std::vector<int32_t>(run.drafts.begin(), run.drafts.begin() + k), v.accepted, v.bonus);
}

// The anchor and the a accepted drafts become history: the target rewinds to P+a+1 (restoring
// the GDN state captured after row a), the source observes those rows, and the bonus is the
// next anchor. The rollback is billed to accept, the observe() to draft; the explicit sync ends
// the accept phase, and observe()'s device work completes inside the next round's draft. After
// a plain step no draft is due yet: the source may defer the row (observe_deferred) and run the
// deferred rows in one batch when drafting resumes (catch_up in draft()).
void Generator::commit(Run& run, int k, const Verdict& v) {
  const int a = v.accepted;
  {
    PhaseTimer timer(run.stats.accept_ms);
    if (a < k) target_.rollback(*state_, a, run.pos + a + 1);
    target_.backend().sync();
  }
  if (source_) {
    PhaseTimer timer(run.stats.draft_ms);
    std::copy(run.drafts.begin(), run.drafts.begin() + a, run.committed.begin());
    run.committed[a] = v.bonus;
    if (k > 0)
      source_->observe(target_, run.pos, a + 1, run.committed.data());
    else
      source_->observe_deferred(target_, run.pos, 1, run.committed.data());
  }
  run.anchor = v.bonus;
  run.pos += a + 1;
}

// One token out: stop tokens end generation unemitted; the callback may stop it; the budget ends it.
void Generator::emit(Run& run, int32_t tok) {
  if (run.done) return;
  GenStats& st = run.stats;
  for (int32_t s : run.opt.stop_ids)
    if (tok == s) {
      run.done = true;
      st.stop_reason = "stop_token";
      return;
    }
  st.generated_tokens++;
  if (run.on_token && !run.on_token(tok)) {
    run.done = true;
    st.stop_reason = "callback";
    return;
  }
  if (st.generated_tokens >= run.opt.max_new_tokens) {
    run.done = true;
    st.stop_reason = "max_tokens";
  }
}

// ---- acceptance (section 3 step 4; section 5) ----

Verdict accept_greedy(const int32_t* drafts, const int32_t* target_ids, int k) {
  int a = 0;
  while (a < k && drafts[a] == target_ids[a]) a++;
  return {a, target_ids[a]};
}

Verdict accept_sampled(const int32_t* drafts, const std::vector<DraftDist>& q, const float* logits, int k, int V,
                       const SamplingParams& sampling, Rng& rng, std::vector<float>& p, std::vector<float>& res) {
  for (int a = 0; a < k; a++) {
    target_probs(logits + static_cast<size_t>(a) * V, V, sampling, p);
    const int32_t d = drafts[a];
    if (uniform01(rng) * q[a].prob_of(d) < p[d]) continue;
    residual(p, q[a], res);
    return {a, sample_from(res, rng)};
  }
  target_probs(logits + static_cast<size_t>(k) * V, V, sampling, p);
  return {k, sample_from(p, rng)};
}

AcceptOverride forced_acceptance(int n) {
  return [n](int k, const int32_t* target_ids) {
    const int a = std::min(n, k);
    return Verdict{a, target_ids[a]};
  };
}

}  // namespace qf
