#include "model/mtp.h"

#include <algorithm>

#include "core/error.h"
#include "model/graph_runner.h"

namespace qf {

MtpHead::MtpHead() = default;
MtpHead::~MtpHead() = default;

std::unique_ptr<MtpHead> MtpHead::load(TargetModel& t, int max_pos) {
  if (!t.has_mtp())
    fail(ErrorKind::Tensor, "%s: the checkpoint has no MTP head (no mtp.fc.weight, or mtp_num_hidden_layers = 0)",
         t.origin().c_str());
  std::unique_ptr<MtpHead> m(new MtpHead());
  m->t_ = &t;
  m->max_rows_ = t.max_rows();
  m->max_pos_ = max_pos;
  const TargetConfig& c = t.config();
  const int H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
  WeightSet& ws = t.weights();
  const NormForm nf = t.norm_form();
  m->fc_ = ws.matrix("mtp.fc.weight", H, 2 * H);
  m->pre_e_ = ws.norm("mtp.pre_fc_norm_embedding.weight", H, nf);
  m->pre_h_ = ws.norm("mtp.pre_fc_norm_hidden.weight", H, nf);
  m->norm_ = ws.norm("mtp.norm.weight", H, nf);
  m->layer_ = load_layer(ws, "mtp.layers.0.", true, H, I, t.attn_dims(), t.gdn_dims(), nf);
  Backend* be = &t.backend();
  const size_t R = m->max_rows_;
  m->scratch_.allocate(be, m->max_rows_, H, t.attn_dims(), nullptr, I);
  m->kv_dtype_ = t.kv_dtype();
  const size_t row_bytes = static_cast<size_t>(t.attn_dims().n_kv_heads) * t.attn_dims().head_dim * dtype_size(m->kv_dtype_);
  m->kcache_ = DeviceBuffer(be, static_cast<size_t>(max_pos) * row_bytes);
  m->vcache_ = DeviceBuffer(be, static_cast<size_t>(max_pos) * row_bytes);
  m->ids_ = DeviceBuffer(be, R * sizeof(int32_t));
  m->meta_ = DeviceBuffer(be, sizeof(StepMeta));
  m->e_ = DeviceBuffer(be, R * H * sizeof(float));
  m->cat_ = DeviceBuffer(be, R * 2 * H * sizeof(float));
  m->h_ = DeviceBuffer(be, R * H * sizeof(float));
  m->hm_ = DeviceBuffer(be, R * H * sizeof(float));
  m->logits_ = DeviceBuffer(be, R * V * sizeof(float));
  m->argmax_ = DeviceBuffer(be, R * sizeof(int32_t));
  m->graphs_ = std::make_unique<GraphRunner>(be);
  return m;
}

void MtpHead::forward(const int32_t* host_tokens, const float* hidden, int M, int pos, const DumpHook* dump,
                      bool direct) {
  QF_CHECK(M >= 1 && M <= max_rows_, "mtp forward of %d rows (max %d)", M, max_rows_);
  if (pos + M > max_pos_) fail(ErrorKind::Usage, "MTP context full: %d + %d > %d", pos, M, max_pos_);
  Backend& be = t_->backend();
  be.upload(ids_.get(), host_tokens, M * sizeof(int32_t));
  StepMeta meta{pos, 0, pos + M, 0};
  be.upload(meta_.get(), &meta, sizeof(meta));
  if ((dump && *dump) || direct) {
    forward_ops(false, hidden, M, 0, dump);
    return;
  }
  size_t hi = 0;
  while (hi < hidden_seen_.size() && hidden_seen_[hi] != hidden) hi++;
  if (hi == hidden_seen_.size()) hidden_seen_.push_back(hidden);
  // The head owns its buffers (owner 0); the hidden rows' address is baked into a recording.
  const GraphKey key = GraphKey(0).field("rows", static_cast<uint64_t>(M), 16).field("hidden_ptr", hi, 16);
  graphs_->run(key, [&] { forward_ops(false, hidden, M, 0, nullptr); });
}

void MtpHead::forward_prefill(const int32_t* host_tokens, const float* hidden, int M, int pos) {
  QF_CHECK(M >= 1, "mtp prefill of %d rows", M);
  if (pos + M > max_pos_) fail(ErrorKind::Usage, "MTP context full: %d + %d > %d", pos, M, max_pos_);
  Backend& be = t_->backend();
  const TargetConfig& c = t_->config();
  const size_t R = kPrefillRows, H = c.hidden_size;
  if (!pre_.ids.get()) {
    pre_.scratch.allocate(&be, kPrefillRows, c.hidden_size, t_->attn_dims(), nullptr, c.intermediate_size);
    pre_.ids = DeviceBuffer(&be, R * sizeof(int32_t));
    pre_.e = DeviceBuffer(&be, R * H * sizeof(float));
    pre_.cat = DeviceBuffer(&be, R * 2 * H * sizeof(float));
    pre_.h = DeviceBuffer(&be, R * H * sizeof(float));
    pre_.hm = DeviceBuffer(&be, R * H * sizeof(float));
  }
  for (int off = 0; off < M; off += kPrefillRows) {
    const int m = std::min(kPrefillRows, M - off);
    be.upload(pre_.ids.get(), host_tokens + off, m * sizeof(int32_t));
    StepMeta meta{pos + off, 0, pos + off + m, 0};
    be.upload(meta_.get(), &meta, sizeof(meta));
    // Only the last pair's head output is ever read (the next round's first draft and chain input).
    forward_ops(true, hidden + off * H, m, off + m == M ? m - 1 : m, nullptr);
  }
  prefill_hm_ = pre_.hm.f() + static_cast<size_t>((M - 1) % kPrefillRows) * H;
}

void MtpHead::forward_ops(bool pre, const float* hidden, int M, int head0, const DumpHook* dump) {
  Backend& be = t_->backend();
  const TargetConfig& c = t_->config();
  const int H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  float* e = pre ? pre_.e.f() : e_.f();
  float* cat = pre ? pre_.cat.f() : cat_.f();
  float* h = pre ? pre_.h.f() : h_.f();
  float* hm = pre ? pre_.hm.f() : hm_.f();
  // u = fc([RMS(e)*(1+w_e) ; RMS(H)*(1+w_h)]), embedding half first.
  be.embed(t_->embed_weight(), pre ? pre_.ids.i() : ids_.i(), e, M);
  be.rmsnorm(e, pre_e_.ptr(), e, M, H, eps);
  be.copy_2d(cat, 2 * H, e, H, M, H);
  be.rmsnorm(hidden, pre_h_.ptr(), e, M, H, eps);
  be.copy_2d(cat + H, 2 * H, e, H, M, H);
  if (pre)
    be.gemm(fc_, cat, h, M);
  else
    be.matmul(fc_, cat, h, M);
  if (dump && *dump) (*dump)("mtp.fc_out", h, static_cast<size_t>(M) * H);
  LayerIO io;
  io.meta = reinterpret_cast<const StepMeta*>(meta_.get());
  io.kcache = kcache_.get();
  io.vcache = vcache_.get();
  io.kv_dtype = kv_dtype_;
  io.prefill = pre;
  decoder_layer(be, layer_, pre ? pre_.scratch : scratch_, h, M, H, I, t_->attn_dims(), t_->gdn_dims(), eps, io, dump,
                "mtp.layer");
  if (head0 >= M) return;
  const size_t o0 = static_cast<size_t>(head0) * H;
  be.rmsnorm(h + o0, norm_.ptr(), hm + o0, M - head0, H, eps);
  if (dump && *dump) (*dump)("mtp.hidden", hm, static_cast<size_t>(M) * H);
  be.matmul(t_->lm_head_weight(), hm + o0, logits_.f(), M - head0);
  be.argmax_rows(logits_.f(), M - head0, V, argmax_.i());
}

}  // namespace qf
