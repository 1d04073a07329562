#include "model/dflash2.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/log.h"
#include "model/graph_runner.h"

namespace qf {

DFlash2Drafter::~DFlash2Drafter() = default;
DFlash2Drafter::DFlash2Drafter() : graph_id_(next_graph_owner_id()) {}

static DeviceBuffer fbuf(Backend* be, size_t n) { return DeviceBuffer(be, n * sizeof(float)); }

std::unique_ptr<DFlash2Drafter> DFlash2Drafter::load(const std::string& dir, Qwen38Model& t) {
  return load(dir, t.config(), &t.backend(), t.embed_weight(), t.lm_head_weight(), t.max_rows());
}

std::unique_ptr<DFlash2Drafter> DFlash2Drafter::load(const std::string& dir, const TargetConfig& tc, Backend* be,
                                                     const WeightRef& embed, const WeightRef& lm_head, int max_rows,
                                                     uint64_t synthetic_seed) {
  DrafterConfig cfg = load_drafter_config(dir);
  check_drafter_pair(cfg, tc);  // before any weights file is opened
  std::unique_ptr<DFlash2Drafter> d(new DFlash2Drafter());
  d->cfg_ = cfg;
  d->be_ = be;
  d->embed_ = embed;
  d->lm_head_ = lm_head;
  if (synthetic_seed) {
    d->ws_ = std::make_unique<WeightSet>(d->be_, synthetic_seed);
  } else {
    d->store_ = std::make_unique<TensorStore>(TensorStore::open_dir(dir));
    d->ws_ = std::make_unique<WeightSet>(d->be_, d->store_.get());
  }
  WeightSet& ws = *d->ws_;
  const int H = cfg.hidden_size, I = cfg.intermediate_size, nh = cfg.num_attention_heads,
            nkv = cfg.num_key_value_heads, hd = cfg.head_dim, Nt = static_cast<int>(cfg.target_layer_ids.size());
  const int V = cfg.vocab_size;
  d->fc_ = ws.matrix("fc.weight", H, static_cast<int64_t>(Nt) * H);
  d->hidden_norm_ = ws.norm("hidden_norm.weight", H, NormForm::Full);
  d->norm_ = ws.norm("norm.weight", H, NormForm::Full);
  const int Kc = cfg.conv_kernel_size, G = cfg.is_v2 ? H / cfg.conv_group_size : 0;
  const int W = cfg.sliding_window;
  // Context rows kept: W-1 (all that block row 0 can see); the buffer holds twice that plus a
  // block so that compaction (a shift) happens once every ~W committed tokens.
  d->keep_ = W > 0 ? W - 1 : tc.max_position_embeddings;
  d->cap_ = W > 0 ? 2 * d->keep_ + cfg.block_size + max_rows : 0;
  if (W <= 0) d->cap_ = std::min(d->keep_, 32768) + cfg.block_size + max_rows;
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
    if (cfg.is_v2) {
      L.attn_kp = ws.matrix(p + "attention_conv.kernel_projection.weight", 2 * Kc * G, H);
      L.mlp_kp = ws.matrix(p + "mlp_conv.kernel_projection.weight", 2 * Kc * G, H);
      L.attn_base = ws.f32_tensor(p + "attention_conv.base_kernel", {2, Kc, H});
      L.mlp_base = ws.f32_tensor(p + "mlp_conv.base_kernel", {2, Kc, H});
    }
    L.kctx = fbuf(d->be_, static_cast<size_t>(d->cap_) * nkv * hd);
    L.vctx = fbuf(d->be_, static_cast<size_t>(d->cap_) * nkv * hd);
    d->layers_.push_back(std::move(L));
  }
  if (cfg.is_v2) {
    const int R = cfg.selector_rank;
    d->hidden_proj_ = ws.matrix("candidate_selector.hidden_projection.weight", R, H);
    auto codebook = [&](const std::string& n) {
      return ws.has(n) ? ws.matrix(n, V, R, false) : ws.matrix(n + ".weight", V, R, false);
    };
    d->epre_ = codebook("candidate_selector.predecessor_codebook");
    d->esuc_ = codebook("candidate_selector.successor_codebook");
  }
  const int B = cfg.block_size, R = std::max(max_rows, B), K = std::max(cfg.selector_top_k, 1);
  d->chunk_ = max_rows;
  d->ids_ = DeviceBuffer(be, B * sizeof(int32_t));
  d->ctx_meta_ = DeviceBuffer(be, sizeof(StepMeta));
  d->graphs_ = std::make_unique<GraphRunner>(be);
  d->meta_ = DeviceBuffer(be, sizeof(StepMeta));
  d->anchor_ = DeviceBuffer(be, sizeof(int32_t));
  d->ctx_ = fbuf(be, static_cast<size_t>(R) * H);
  d->h_ = fbuf(be, static_cast<size_t>(B) * H);
  d->u_ = fbuf(be, static_cast<size_t>(B) * H);
  d->u2_ = fbuf(be, static_cast<size_t>(B) * H);
  d->D_ = fbuf(be, static_cast<size_t>(B) * 2 * std::max(Kc, 1) * std::max(G, 1));
  d->q_ = fbuf(be, static_cast<size_t>(B) * nh * hd);
  d->k_ = fbuf(be, static_cast<size_t>(R) * nkv * hd);
  d->v_ = fbuf(be, static_cast<size_t>(R) * nkv * hd);
  d->attn_ = fbuf(be, static_cast<size_t>(B) * nh * hd);
  d->o_ = fbuf(be, static_cast<size_t>(B) * H);
  d->o2_ = fbuf(be, static_cast<size_t>(B) * H);
  d->g_ = fbuf(be, static_cast<size_t>(B) * I);
  d->up_ = fbuf(be, static_cast<size_t>(B) * I);
  d->hf_ = fbuf(be, static_cast<size_t>(B) * H);
  d->logits_ = fbuf(be, static_cast<size_t>(B) * V);
  d->cand_vals_ = fbuf(be, static_cast<size_t>(B) * K);
  d->cand_ids_ = DeviceBuffer(be, static_cast<size_t>(B) * K * sizeof(int32_t));
  d->P_ = fbuf(be, static_cast<size_t>(B) * std::max(cfg.selector_rank, 1));
  d->scores_ = fbuf(be, static_cast<size_t>(B) * K);
  d->drafts_ = DeviceBuffer(be, B * sizeof(int32_t));
  log_info("drafter: %s, %s, %d layers, block %d, taps %zu, window %d, %.1f MB of weights", dir.c_str(),
           cfg.architecture.c_str(), cfg.num_hidden_layers, B, cfg.target_layer_ids.size(), W,
           d->ws_->imported_bytes() / 1e6);
  return d;
}

std::unique_ptr<DFlash2Drafter> DFlash2Drafter::load_synthetic(const std::string& config_path, Qwen38Model& t,
                                                               uint64_t seed) {
  return load(config_path, t.config(), &t.backend(), t.embed_weight(), t.lm_head_weight(), t.max_rows(), seed);
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
  if (drop <= 0) fail(ErrorKind::Internal, "drafter context overflow (%d rows, cap %d)", n_ctx_, cap_);
  const int kvw = cfg_.num_key_value_heads * cfg_.head_dim;
  for (auto& L : layers_) {
    be_->copy(L.kctx.f(), L.kctx.f() + static_cast<size_t>(drop) * kvw,
              static_cast<size_t>(n_ctx_ - drop) * kvw * sizeof(float));
    be_->copy(L.vctx.f(), L.vctx.f() + static_cast<size_t>(drop) * kvw,
              static_cast<size_t>(n_ctx_ - drop) * kvw * sizeof(float));
  }
  n_ctx_ -= drop;
  ctx_pos0_ += drop;
}

void DFlash2Drafter::append_context(const float* tap_rows, int n, int pos, const DumpHook* dump) {
  if (n <= 0) return;
  if (n_ctx_ > 0 && pos != context_end())
    fail(ErrorKind::Internal, "drafter context at %d..%d, appended rows start at %d", ctx_pos0_, context_end(), pos);
  if (n_ctx_ == 0) ctx_pos0_ = pos;
  const int H = cfg_.hidden_size, Nt = static_cast<int>(cfg_.target_layer_ids.size());
  const int nkv = cfg_.num_key_value_heads, hd = cfg_.head_dim;
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  for (int off = 0; off < n; off += chunk_) {
    const int m = std::min(chunk_, n - off);
    compact(m);
    const float* taps = tap_rows + static_cast<size_t>(off) * Nt * H;
    StepMeta meta{ctx_pos0_ + n_ctx_, ctx_pos0_, 0, 0};
    be_->upload(ctx_meta_.get(), &meta, sizeof(meta));
    auto ops = [&, taps, m](const DumpHook* dh) {
      be_->matmul(fc_, taps, ctx_.f(), m);
      be_->rmsnorm(ctx_.f(), hidden_norm_.ptr(), ctx_.f(), m, H, eps);
      if (dh && *dh) (*dh)("drafter.ctx", ctx_.f(), static_cast<size_t>(m) * H);
      const StepMeta* dm = reinterpret_cast<const StepMeta*>(ctx_meta_.get());
      for (auto& L : layers_) {
        const WeightRef* ws[2] = {&L.k, &L.v};
        float* ys[2] = {k_.f(), v_.f()};
        be_->matmul_group(ws, ys, 2, ctx_.f(), m);
        be_->rmsnorm(k_.f(), L.k_norm.ptr(), k_.f(), m * nkv, hd, eps);
        be_->rope(k_.f(), m, nkv, hd, hd, static_cast<float>(cfg_.rope_theta), dm);
        be_->kv_write(L.kctx.f(), k_.f(), m, nkv * hd, dm);
        be_->kv_write(L.vctx.f(), v_.f(), m, nkv * hd, dm);
      }
    };
    if (dump && *dump) {
      ops(dump);
    } else {
      size_t ti = 0;
      while (ti < taps_seen_.size() && taps_seen_[ti] != taps) ti++;
      if (ti == taps_seen_.size()) taps_seen_.push_back(taps);
      // Keys of the context pass: bit 40 set (draft-pass keys never reach it), rows, tap rows.
      graphs_->run((1ull << 40) | static_cast<uint64_t>(m) | (static_cast<uint64_t>(ti) << 8) | (graph_id_ << 48),
                   [&] { ops(nullptr); });
    }
    n_ctx_ += m;
  }
}

const float* DFlash2Drafter::layer_forward(DFlashLayer& L, float* h, int rows, const DumpHook* dump, int l,
                                           const float* pending, bool defer) {
  const int H = cfg_.hidden_size, I = cfg_.intermediate_size, nh = cfg_.num_attention_heads,
            nkv = cfg_.num_key_value_heads, hd = cfg_.head_dim, Kc = cfg_.conv_kernel_size,
            gs = cfg_.conv_group_size;
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  const StepMeta* dm = reinterpret_cast<const StepMeta*>(meta_.get());
  const size_t MH = static_cast<size_t>(rows) * H;
  // attention sublayer, wrapped by the dynamic conv (prepare on its input, finish on its output)
  if (pending)
    be_->add_rmsnorm(h, pending, L.in_norm.ptr(), u_.f(), rows, H, eps);
  else
    be_->rmsnorm(h, L.in_norm.ptr(), u_.f(), rows, H, eps);
  float* x = u_.f();
  if (cfg_.is_v2) {
    be_->matmul(L.attn_kp, u_.f(), D_.f(), rows);
    be_->dyn_conv(u_.f(), L.attn_base.f(), D_.f(), u2_.f(), rows, H, Kc, gs, 0);
    x = u2_.f();
  }
  {
    const WeightRef* ws[3] = {&L.q, &L.k, &L.v};
    float* ys[3] = {q_.f(), k_.f(), v_.f()};
    be_->matmul_group(ws, ys, 3, x, rows);
  }
  be_->rmsnorm(q_.f(), L.q_norm.ptr(), q_.f(), rows * nh, hd, eps);
  be_->rmsnorm(k_.f(), L.k_norm.ptr(), k_.f(), rows * nkv, hd, eps);
  be_->rope(q_.f(), rows, nh, hd, hd, static_cast<float>(cfg_.rope_theta), dm);
  be_->rope(k_.f(), rows, nkv, hd, hd, static_cast<float>(cfg_.rope_theta), dm);
  be_->kv_write(L.kctx.f(), k_.f(), rows, nkv * hd, dm);  // block rows after the context
  be_->kv_write(L.vctx.f(), v_.f(), rows, nkv * hd, dm);
  AttnParams p;
  p.n_heads = nh;
  p.n_kv_heads = nkv;
  p.head_dim = hd;
  p.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  p.causal = cfg_.is_causal;
  p.window = cfg_.sliding_window;
  be_->attention(q_.f(), L.kctx.f(), L.vctx.f(), attn_.f(), rows, p, dm);
  be_->matmul(L.o, attn_.f(), o_.f(), rows);
  float* a = o_.f();
  if (cfg_.is_v2) {
    be_->dyn_conv(o_.f(), L.attn_base.f() + static_cast<size_t>(Kc) * H, D_.f(), o2_.f(), rows, H, Kc, gs, 1);
    a = o2_.f();
  }
  // MLP sublayer (the attention branch is added to h inside the norm)
  be_->add_rmsnorm(h, a, L.post_norm.ptr(), u_.f(), rows, H, eps);
  x = u_.f();
  if (cfg_.is_v2) {
    be_->matmul(L.mlp_kp, u_.f(), D_.f(), rows);
    be_->dyn_conv(u_.f(), L.mlp_base.f(), D_.f(), u2_.f(), rows, H, Kc, gs, 0);
    x = u2_.f();
  }
  {
    const WeightRef* ws[2] = {&L.gate, &L.up};
    float* ys[2] = {g_.f(), up_.f()};
    be_->matmul_group(ws, ys, 2, x, rows);
  }
  be_->swiglu(g_.f(), up_.f(), g_.f(), static_cast<size_t>(rows) * I);
  be_->matmul(L.down, g_.f(), o_.f(), rows);
  a = o_.f();
  if (cfg_.is_v2) {
    be_->dyn_conv(o_.f(), L.mlp_base.f() + static_cast<size_t>(Kc) * H, D_.f(), o2_.f(), rows, H, Kc, gs, 1);
    a = o2_.f();
  }
  if (defer) return a;  // added by the next layer's add_rmsnorm (o_ / o2_ are untouched until then)
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
  be_->upload(ids_.get(), ids.data(), rows * sizeof(int32_t));
  be_->upload(anchor_.get(), &anchor, sizeof(int32_t));
  if (n_ctx_ == 0) ctx_pos0_ = start;
  StepMeta meta{start, ctx_pos0_, n_ctx_ + rows, 0};
  be_->upload(meta_.get(), &meta, sizeof(meta));
  if (dump && *dump)
    draft_ops(k, dump);
  else
    graphs_->run(static_cast<uint64_t>(k) | (graph_id_ << 16), [&] { draft_ops(k, nullptr); });
  be_->download(drafts, drafts_.get(), k * sizeof(int32_t));
}

void DFlash2Drafter::draft_ops(int k, const DumpHook* dump) {
  const int rows = k + 1, H = cfg_.hidden_size, V = cfg_.vocab_size;
  float* h = h_.f();
  be_->embed(embed_, ids_.i(), h, rows);
  if (cfg_.input_embedding_scale != 1.0)
    be_->scale(h, static_cast<float>(cfg_.input_embedding_scale), static_cast<size_t>(rows) * H);
  const float* pending = nullptr;
  const bool dumping = dump && *dump;  // per-layer outputs wanted: every layer finishes its own add
  for (size_t l = 0; l < layers_.size(); l++)
    pending = layer_forward(layers_[l], h, rows, dump, static_cast<int>(l), pending,
                            !dumping && l + 1 < layers_.size());
  // Rows 1..k carry the drafts; row 0 (the anchor) yields none.
  be_->rmsnorm(h + H, norm_.ptr(), hf_.f(), k, H, static_cast<float>(cfg_.rms_norm_eps));
  be_->matmul(lm_head_, hf_.f(), logits_.f(), k);
  if (cfg_.output_multiplier != 1.0)
    be_->scale(logits_.f(), static_cast<float>(cfg_.output_multiplier), static_cast<size_t>(k) * V);
  if (cfg_.final_logit_softcapping > 0)
    be_->softcap(logits_.f(), static_cast<float>(cfg_.final_logit_softcapping), static_cast<size_t>(k) * V);
  if (dump && *dump) (*dump)("drafter.logits", logits_.f(), static_cast<size_t>(k) * V);
  if (dump && *dump) (*dump)("drafter.final_hidden", hf_.f(), static_cast<size_t>(k) * H);
  if (cfg_.is_v2) {
    const int K = cfg_.selector_top_k, R = cfg_.selector_rank;
    be_->topk_rows(logits_.f(), k, V, K, cand_vals_.f(), cand_ids_.i());
    be_->matmul(hidden_proj_, hf_.f(), P_.f(), k);
    be_->selector_walk(cand_vals_.f(), cand_ids_.i(), P_.f(), epre_, esuc_, anchor_.i(), k, K, R, drafts_.i(),
                       scores_.f());
  } else {
    be_->argmax_rows(logits_.f(), k, V, drafts_.i());
  }
}

}  // namespace qf
