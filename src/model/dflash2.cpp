#include "model/dflash2.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/log.h"
#include "model/graph_runner.h"

namespace qf {

namespace {

// A drafter without a sliding window attends to its whole context, so compaction may drop
// nothing; its cache holds at most this many context rows (at the 27B drafter's shapes, 5 layers
// x K and V x 8 kv heads x 128 x 4 bytes = 40 KB a row, 1.3 GB in all), and a longer sequence
// fails in compact() rather than silently losing rows the block could see.
constexpr int kMaxUnwindowedContextRows = 32768;

DeviceBuffer fbuf(Backend* be, size_t n) { return DeviceBuffer(be, n * sizeof(float)); }

}  // namespace

DFlash2Drafter::~DFlash2Drafter() = default;
DFlash2Drafter::DFlash2Drafter() : graph_id_(next_graph_owner_id()) {}

std::unique_ptr<DFlash2Drafter> DFlash2Drafter::load(const std::string& dir, TargetModel& t) {
  return load(dir, t.config(), &t.backend(), t.embed_weight(), t.lm_head_weight(), t.max_rows(), 0,
              t.weights().options(), t.kv_dtype());
}

std::unique_ptr<DFlash2Drafter> DFlash2Drafter::load(const std::string& dir, const TargetConfig& tc, Backend* be,
                                                     const WeightRef& embed, const WeightRef& lm_head, int max_rows,
                                                     uint64_t synthetic_seed, const WeightOptions& w,
                                                     DType kv_dtype) {
  DrafterConfig cfg = load_drafter_config(dir);
  if (kv_dtype != DType::F32 && kv_dtype != DType::BF16)
    fail(ErrorKind::Usage, "drafter %s: context K/V dtype code %d (F32 or BF16 expected)", dir.c_str(),
         static_cast<int>(kv_dtype));
  check_drafter_pair(cfg, tc);  // before any weights file is opened
  std::unique_ptr<DFlash2Drafter> d(new DFlash2Drafter());
  d->cfg_ = cfg;
  d->be_ = be;
  d->embed_ = embed;
  d->lm_head_ = lm_head;
  d->kv_dtype_ = kv_dtype;
  if (synthetic_seed) {
    d->ws_ = std::make_unique<WeightSet>(d->be_, synthetic_seed, w);
  } else {
    d->store_ = std::make_unique<TensorStore>(TensorStore::open_dir(dir));
    d->ws_ = std::make_unique<WeightSet>(d->be_, d->store_.get(), w);
  }
  WeightSet& ws = *d->ws_;
  const int H = cfg.hidden_size, I = cfg.intermediate_size, nh = cfg.num_attention_heads,
            nkv = cfg.num_key_value_heads, hd = cfg.head_dim, Nt = static_cast<int>(cfg.target_layer_ids.size());
  const int V = cfg.vocab_size;
  d->fc_ = ws.matrix("fc.weight", H, static_cast<int64_t>(Nt) * H);
  d->hidden_norm_ = ws.norm("hidden_norm.weight", H, NormForm::Full);
  d->norm_ = ws.norm("norm.weight", H, NormForm::Full);
  const int W = cfg.sliding_window;
  // Context rows kept: W-1 (all that block row 0 can see); the buffer holds twice that plus a
  // block so that compaction (a shift) happens once every ~W committed tokens.
  if (W > 0) {
    d->keep_ = W - 1;
    d->cap_ = 2 * d->keep_ + cfg.block_size + max_rows;
  } else {
    d->keep_ = tc.max_position_embeddings;
    d->cap_ = std::min(d->keep_, kMaxUnwindowedContextRows) + cfg.block_size + max_rows;
  }
  for (int l = 0; l < cfg.num_hidden_layers; l++) {
    const std::string p = "layers." + std::to_string(l) + ".";
    DFlashLayer L;
    L.in_norm = ws.norm(p + "input_layernorm.weight", H, NormForm::Full);
    L.post_norm = ws.norm(p + "post_attention_layernorm.weight", H, NormForm::Full);
    L.q = ws.matrix(p + "self_attn.q_proj.weight", nh * hd, H);
    L.k = ws.matrix(p + "self_attn.k_proj.weight", nkv * hd, H);
    L.v = ws.matrix(p + "self_attn.v_proj.weight", nkv * hd, H);
    L.o = ws.matrix(p + "self_attn.o_proj.weight", H, nh * hd);
    L.q_norm = ws.norm(p + "self_attn.q_norm.weight", hd, NormForm::Full);
    L.k_norm = ws.norm(p + "self_attn.k_norm.weight", hd, NormForm::Full);
    L.gate = ws.matrix(p + "mlp.gate_proj.weight", I, H);
    L.up = ws.matrix(p + "mlp.up_proj.weight", I, H);
    L.down = ws.matrix(p + "mlp.down_proj.weight", H, I);
    const size_t kv_bytes = static_cast<size_t>(d->cap_) * nkv * hd * dtype_size(kv_dtype);
    L.kctx = DeviceBuffer(d->be_, kv_bytes);
    L.vctx = DeviceBuffer(d->be_, kv_bytes);
    d->layers_.push_back(std::move(L));
  }
  if (cfg.is_v2) d->load_v2_weights(H, V);
  d->allocate_scratch(max_rows);
  log_info("drafter: %s, %s, %d layers, block %d, taps %zu, window %d, %.1f MB of weights", dir.c_str(),
           cfg.architecture.c_str(), cfg.num_hidden_layers, cfg.block_size, cfg.target_layer_ids.size(), W,
           d->ws_->imported_bytes() / 1e6);
  return d;
}

// DFlash2 only: the conv around both sublayers of every layer, and the candidate selector.
void DFlash2Drafter::load_v2_weights(int H, int V) {
  WeightSet& ws = *ws_;
  const int Kc = cfg_.conv_kernel_size, G = H / cfg_.conv_group_size, R = cfg_.selector_rank;
  for (int l = 0; l < cfg_.num_hidden_layers; l++) {
    const std::string p = "layers." + std::to_string(l) + ".";
    DFlashLayer& L = layers_[l];
    L.attn_conv.kernel_proj = ws.matrix(p + "attention_conv.kernel_projection.weight", 2 * Kc * G, H);
    L.mlp_conv.kernel_proj = ws.matrix(p + "mlp_conv.kernel_projection.weight", 2 * Kc * G, H);
    L.attn_conv.base = ws.f32_tensor(p + "attention_conv.base_kernel", {2, Kc, H});
    L.mlp_conv.base = ws.f32_tensor(p + "mlp_conv.base_kernel", {2, Kc, H});
  }
  hidden_proj_ = ws.matrix("candidate_selector.hidden_projection.weight", R, H);
  auto codebook = [&](const std::string& n) {
    return ws.has(n) ? ws.matrix(n, V, R, false) : ws.matrix(n + ".weight", V, R, false);
  };
  epre_ = codebook("candidate_selector.predecessor_codebook");
  esuc_ = codebook("candidate_selector.successor_codebook");
}

void DFlash2Drafter::allocate_scratch(int max_rows) {
  Backend* be = be_;
  const DrafterConfig& c = cfg_;
  const size_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
  const size_t q_width = static_cast<size_t>(c.num_attention_heads) * c.head_dim;
  const size_t kv_width = static_cast<size_t>(c.num_key_value_heads) * c.head_dim;
  const size_t Kc = std::max(c.conv_kernel_size, 1), G = c.is_v2 ? c.hidden_size / c.conv_group_size : 1;
  const size_t B = c.block_size, rows = std::max<size_t>(max_rows, B), K = std::max(c.selector_top_k, 1);
  const size_t R = std::max(c.selector_rank, 1);
  chunk_ = max_rows;
  s_.block_ids = DeviceBuffer(be, B * sizeof(int32_t));
  s_.ctx_meta = DeviceBuffer(be, sizeof(StepMeta));
  graphs_ = std::make_unique<GraphRunner>(be);
  s_.block_meta = DeviceBuffer(be, sizeof(StepMeta));
  s_.anchor_id = DeviceBuffer(be, sizeof(int32_t));
  s_.ctx_hidden = fbuf(be, rows * H);
  s_.hidden = fbuf(be, B * H);
  s_.normed = fbuf(be, B * H);
  s_.conv_in = fbuf(be, B * H);
  s_.conv_coef = fbuf(be, B * 2 * Kc * G);
  s_.q = fbuf(be, B * q_width);
  s_.k = fbuf(be, rows * kv_width);
  s_.v = fbuf(be, rows * kv_width);
  s_.attn_out = fbuf(be, B * q_width);
  s_.branch = fbuf(be, B * H);
  s_.conv_out = fbuf(be, B * H);
  s_.mlp_gate = fbuf(be, B * I);
  s_.mlp_up = fbuf(be, B * I);
  s_.final_hidden = fbuf(be, B * H);
  s_.logits = fbuf(be, B * V);
  s_.cand_vals = fbuf(be, B * K);
  s_.cand_ids = DeviceBuffer(be, B * K * sizeof(int32_t));
  s_.selector_hidden = fbuf(be, B * R);
  s_.scores = fbuf(be, B * K);
  s_.drafts = DeviceBuffer(be, B * sizeof(int32_t));
}

std::unique_ptr<DFlash2Drafter> DFlash2Drafter::load_synthetic(const std::string& config_path, TargetModel& t,
                                                               uint64_t seed) {
  return load(config_path, t.config(), &t.backend(), t.embed_weight(), t.lm_head_weight(), t.max_rows(), seed,
              t.weights().options(), t.kv_dtype());
}

std::vector<float> DFlash2Drafter::codebook_row(const WeightRef& w, int32_t row) const {
  QF_CHECK(row >= 0 && row < w.rows, "codebook row %d of %lld", row, (long long)w.rows);
  std::vector<float> out(static_cast<size_t>(w.cols));
  if (w.dtype == DType::F32) {
    be_->download(out.data(), static_cast<const float*>(w.data) + static_cast<size_t>(row) * w.cols, out.size() * 4);
  } else if (w.dtype == DType::BF16 || w.dtype == DType::F16) {
    std::vector<uint16_t> h(out.size());
    be_->download(h.data(), static_cast<const uint16_t*>(w.data) + static_cast<size_t>(row) * w.cols, h.size() * 2);
    for (size_t i = 0; i < h.size(); i++) out[i] = w.dtype == DType::BF16 ? bf16_to_f32(h[i]) : f16_to_f32(h[i]);
  } else {
    fail(ErrorKind::Tensor, "sampled selector walk needs bf16/f16/f32 codebooks (found %s)", dtype_name(w.dtype));
  }
  return out;
}

void DFlash2Drafter::reset() {
  n_ctx_ = 0;
  ctx_pos0_ = 0;
}

// Drops the oldest rows so that `incoming` more rows plus a block fit; keeps at least keep_.
void DFlash2Drafter::compact(int incoming) {
  const int need = n_ctx_ + incoming + cfg_.block_size;
  if (need <= cap_) return;
  const int drop = n_ctx_ - std::min(n_ctx_, keep_);
  if (drop <= 0)
    fail(ErrorKind::Usage,
         "the drafter's context cache is full (%d rows of %d; without a sliding window it holds at most %d): "
         "the sequence is too long for this drafter",
         n_ctx_, cap_, kMaxUnwindowedContextRows);
  trim_context(ctx_pos0_ + drop);
}

std::vector<StateRegion> DFlash2Drafter::context_regions(int p0, int p1) const {
  QF_CHECK(p0 >= ctx_pos0_ && p1 <= context_end() && p0 <= p1, "context rows %d..%d of %d..%d", p0, p1, ctx_pos0_,
           context_end());
  const size_t row = static_cast<size_t>(cfg_.num_key_value_heads) * cfg_.head_dim * dtype_size(kv_dtype_);
  const size_t off = static_cast<size_t>(p0 - ctx_pos0_) * row, bytes = static_cast<size_t>(p1 - p0) * row;
  std::vector<StateRegion> r;
  for (const auto& L : layers_) {
    r.push_back({static_cast<char*>(L.kctx.get()) + off, bytes});
    r.push_back({static_cast<char*>(L.vctx.get()) + off, bytes});
  }
  return r;
}

void DFlash2Drafter::set_context(int p0, int p1) {
  QF_CHECK(p1 - p0 + cfg_.block_size <= cap_, "context of %d rows (cache holds %d)", p1 - p0, cap_);
  ctx_pos0_ = p0;
  n_ctx_ = p1 - p0;
}

void DFlash2Drafter::trim_context(int p) {
  const int drop = std::min(n_ctx_, p - ctx_pos0_);
  if (drop <= 0) return;
  const size_t row = static_cast<size_t>(cfg_.num_key_value_heads) * cfg_.head_dim * dtype_size(kv_dtype_);
  for (auto& L : layers_)
    for (DeviceBuffer* c : {&L.kctx, &L.vctx}) {
      char* base = static_cast<char*>(c->get());
      be_->copy(base, base + static_cast<size_t>(drop) * row, static_cast<size_t>(n_ctx_ - drop) * row);
    }
  n_ctx_ -= drop;
  ctx_pos0_ += drop;
}

void DFlash2Drafter::append_context(const float* tap_rows, int n, int pos, const DumpHook* dump, bool direct) {
  if (n <= 0) return;
  if (n_ctx_ > 0 && pos != context_end())
    fail(ErrorKind::Internal, "drafter context at %d..%d, appended rows start at %d", ctx_pos0_, context_end(), pos);
  if (n_ctx_ == 0) ctx_pos0_ = pos;
  const int H = cfg_.hidden_size, Nt = static_cast<int>(cfg_.target_layer_ids.size());
  for (int off = 0; off < n; off += chunk_) {
    const int m = std::min(chunk_, n - off);
    compact(m);
    const float* taps = tap_rows + static_cast<size_t>(off) * Nt * H;
    StepMeta meta{ctx_pos0_ + n_ctx_, ctx_pos0_, 0, 0};
    be_->upload(s_.ctx_meta.get(), &meta, sizeof(meta));
    if ((dump && *dump) || direct) {
      context_ops(taps, m, dump);
    } else {
      size_t ti = 0;
      while (ti < taps_seen_.size() && taps_seen_[ti] != taps) ti++;
      if (ti == taps_seen_.size()) taps_seen_.push_back(taps);
      const GraphKey key = GraphKey(graph_id_).field("pass", 1, 1).field("rows", m, 16).field("taps_ptr", ti, 16);
      graphs_->run(key, [&] { context_ops(taps, m, nullptr); });
    }
    n_ctx_ += m;
  }
}

// Context rows (docs/spec/dflash2.md 2.2): ctx = hidden_norm(fc(taps)), then every layer's
// k_norm'd, RoPE'd keys and values written into its cache at the rows' positions.
void DFlash2Drafter::context_ops(const float* taps, int m, const DumpHook* dump) {
  const int H = cfg_.hidden_size, nkv = cfg_.num_key_value_heads, hd = cfg_.head_dim;
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  float* ctx = s_.ctx_hidden.f();
  be_->matmul(fc_, taps, ctx, m);
  be_->rmsnorm(ctx, hidden_norm_.ptr(), ctx, m, H, eps);
  if (dump && *dump) (*dump)("drafter.ctx", ctx, static_cast<size_t>(m) * H);
  const StepMeta* meta = reinterpret_cast<const StepMeta*>(s_.ctx_meta.get());
  for (auto& L : layers_) {
    const WeightRef* ws[2] = {&L.k, &L.v};
    float* ys[2] = {s_.k.f(), s_.v.f()};
    be_->matmul_group(ws, ys, 2, ctx, m);
    be_->rmsnorm(s_.k.f(), L.k_norm.ptr(), s_.k.f(), m * nkv, hd, eps);
    be_->rope(s_.k.f(), m, nkv, hd, hd, static_cast<float>(cfg_.rope_theta), meta);
    be_->kv_write(L.kctx.get(), s_.k.f(), m, nkv * hd, meta, kv_dtype_);
    be_->kv_write(L.vctx.get(), s_.v.f(), m, nkv * hd, meta, kv_dtype_);
  }
}

// prepare: conv_in = conv(x) with coefficients base[0] + kernel_proj(x), which also serve the
// matching finish. v1: x itself.
const float* DFlash2Drafter::conv_prepare(const DynConvWeights& c, const float* x, int rows) {
  if (!cfg_.is_v2) return x;
  const int H = cfg_.hidden_size, Kc = cfg_.conv_kernel_size, gs = cfg_.conv_group_size;
  be_->matmul(c.kernel_proj, x, s_.conv_coef.f(), rows);
  be_->dyn_conv(x, c.base.f(), s_.conv_coef.f(), s_.conv_in.f(), rows, H, Kc, gs, 0);
  return s_.conv_in.f();
}

// finish: conv_out = conv(y) with base[1] and the prepare step's coefficients. v1: y itself.
const float* DFlash2Drafter::conv_finish(const DynConvWeights& c, const float* y, int rows) {
  if (!cfg_.is_v2) return y;
  const int H = cfg_.hidden_size, Kc = cfg_.conv_kernel_size, gs = cfg_.conv_group_size;
  be_->dyn_conv(y, c.base.f() + static_cast<size_t>(Kc) * H, s_.conv_coef.f(), s_.conv_out.f(), rows, H, Kc, gs,
                1);
  return s_.conv_out.f();
}

// One decoder layer on the block (docs/spec/dflash2.md 2.5): both sublayers wrapped in the conv.
const float* DFlash2Drafter::layer_forward(DFlashLayer& L, float* h, int rows, const DumpHook* dump, int l,
                                           const float* pending, bool defer) {
  const int H = cfg_.hidden_size, I = cfg_.intermediate_size, nh = cfg_.num_attention_heads,
            nkv = cfg_.num_key_value_heads, hd = cfg_.head_dim;
  const float eps = static_cast<float>(cfg_.rms_norm_eps), theta = static_cast<float>(cfg_.rope_theta);
  const StepMeta* meta = reinterpret_cast<const StepMeta*>(s_.block_meta.get());
  const size_t MH = static_cast<size_t>(rows) * H;
  float* normed = s_.normed.f();
  float *q = s_.q.f(), *k = s_.k.f(), *v = s_.v.f();
  // attention sublayer
  if (pending)
    be_->add_rmsnorm(h, pending, L.in_norm.ptr(), normed, rows, H, eps);
  else
    be_->rmsnorm(h, L.in_norm.ptr(), normed, rows, H, eps);
  const float* x = conv_prepare(L.attn_conv, normed, rows);
  {
    const WeightRef* ws[3] = {&L.q, &L.k, &L.v};
    float* ys[3] = {q, k, v};
    be_->matmul_group(ws, ys, 3, x, rows);
  }
  be_->rmsnorm(q, L.q_norm.ptr(), q, rows * nh, hd, eps);
  be_->rmsnorm(k, L.k_norm.ptr(), k, rows * nkv, hd, eps);
  be_->rope(q, rows, nh, hd, hd, theta, meta);
  be_->rope(k, rows, nkv, hd, hd, theta, meta);
  be_->kv_write(L.kctx.get(), k, rows, nkv * hd, meta, kv_dtype_);  // block rows after the context
  be_->kv_write(L.vctx.get(), v, rows, nkv * hd, meta, kv_dtype_);
  AttnParams p;
  p.n_heads = nh;
  p.n_kv_heads = nkv;
  p.head_dim = hd;
  p.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  p.causal = cfg_.is_causal;
  p.window = cfg_.sliding_window;
  p.kv_dtype = kv_dtype_;
  be_->attention(q, L.kctx.get(), L.vctx.get(), s_.attn_out.f(), rows, p, meta);
  be_->matmul(L.o, s_.attn_out.f(), s_.branch.f(), rows);
  const float* a = conv_finish(L.attn_conv, s_.branch.f(), rows);
  // MLP sublayer (the attention branch is added to h inside the norm)
  be_->add_rmsnorm(h, a, L.post_norm.ptr(), normed, rows, H, eps);
  x = conv_prepare(L.mlp_conv, normed, rows);
  {
    const WeightRef* ws[2] = {&L.gate, &L.up};
    float* ys[2] = {s_.mlp_gate.f(), s_.mlp_up.f()};
    be_->matmul_group(ws, ys, 2, x, rows);
  }
  be_->swiglu(s_.mlp_gate.f(), s_.mlp_up.f(), s_.mlp_gate.f(), static_cast<size_t>(rows) * I);
  be_->matmul(L.down, s_.mlp_gate.f(), s_.branch.f(), rows);
  a = conv_finish(L.mlp_conv, s_.branch.f(), rows);
  if (defer) return a;  // added by the next layer's add_rmsnorm (branch / conv_out are untouched until then)
  be_->add(h, a, MH);
  if (dump && *dump) (*dump)("drafter.layer." + std::to_string(l) + ".out", h, MH);
  return nullptr;
}

void DFlash2Drafter::draft(int32_t anchor, int start, int k, int32_t* drafts, const DumpHook* dump) {
  QF_CHECK(k >= 1 && k <= max_drafts(), "draft of %d tokens (block %d)", k, cfg_.block_size);
  if (n_ctx_ > 0 && start != context_end())
    fail(ErrorKind::Internal, "draft at %d but the drafter context ends at %d", start, context_end());
  const int rows = k + 1;
  compact(0);
  std::vector<int32_t> ids(rows, cfg_.mask_token_id);
  ids[0] = anchor;
  be_->upload(s_.block_ids.get(), ids.data(), rows * sizeof(int32_t));
  be_->upload(s_.anchor_id.get(), &anchor, sizeof(int32_t));
  if (n_ctx_ == 0) ctx_pos0_ = start;
  StepMeta meta{start, ctx_pos0_, n_ctx_ + rows, 0};
  be_->upload(s_.block_meta.get(), &meta, sizeof(meta));
  if (dump && *dump) {
    draft_ops(k, dump);
  } else {
    const GraphKey key = GraphKey(graph_id_).field("pass", 0, 1).field("drafts", k, 16);
    graphs_->run(key, [&] { draft_ops(k, nullptr); });
  }
  be_->download(drafts, s_.drafts.get(), k * sizeof(int32_t));
}

void DFlash2Drafter::draft_ops(int k, const DumpHook* dump) {
  const int rows = k + 1, H = cfg_.hidden_size, V = cfg_.vocab_size;
  float* h = s_.hidden.f();
  be_->embed(embed_, s_.block_ids.i(), h, rows);
  if (cfg_.input_embedding_scale != 1.0)
    be_->scale(h, static_cast<float>(cfg_.input_embedding_scale), static_cast<size_t>(rows) * H);
  const float* pending = nullptr;
  const bool dumping = dump && *dump;  // per-layer outputs wanted: every layer finishes its own add
  for (size_t l = 0; l < layers_.size(); l++)
    pending = layer_forward(layers_[l], h, rows, dump, static_cast<int>(l), pending,
                            !dumping && l + 1 < layers_.size());
  // Rows 1..k carry the drafts; row 0 (the anchor) yields none.
  float *hf = s_.final_hidden.f(), *logits = s_.logits.f();
  be_->rmsnorm(h + H, norm_.ptr(), hf, k, H, static_cast<float>(cfg_.rms_norm_eps));
  be_->matmul(lm_head_, hf, logits, k);
  if (cfg_.output_multiplier != 1.0)
    be_->scale(logits, static_cast<float>(cfg_.output_multiplier), static_cast<size_t>(k) * V);
  if (cfg_.final_logit_softcapping > 0)
    be_->softcap(logits, static_cast<float>(cfg_.final_logit_softcapping), static_cast<size_t>(k) * V);
  if (dump && *dump) (*dump)("drafter.logits", logits, static_cast<size_t>(k) * V);
  if (dump && *dump) (*dump)("drafter.final_hidden", hf, static_cast<size_t>(k) * H);
  pick_drafts(k);
}

// v2: the candidate selector walks the top-K of each row from the anchor (docs/spec/dflash2.md 3.1).
// v1: each row's argmax.
void DFlash2Drafter::pick_drafts(int k) {
  const int V = cfg_.vocab_size;
  if (!cfg_.is_v2) {
    be_->argmax_rows(s_.logits.f(), k, V, s_.drafts.i());
    return;
  }
  const int K = cfg_.selector_top_k, R = cfg_.selector_rank;
  be_->topk_rows(s_.logits.f(), k, V, K, s_.cand_vals.f(), s_.cand_ids.i());
  be_->matmul(hidden_proj_, s_.final_hidden.f(), s_.selector_hidden.f(), k);
  be_->selector_walk(s_.cand_vals.f(), s_.cand_ids.i(), s_.selector_hidden.f(), epre_, esuc_, s_.anchor_id.i(), k,
                     K, R, s_.drafts.i(), s_.scores.f());
}

}  // namespace qf
