#include "model/mtp.h"

#include "core/error.h"
#include "model/graph_runner.h"

namespace qf {

MtpHead::MtpHead() = default;
MtpHead::~MtpHead() = default;

std::unique_ptr<MtpHead> MtpHead::load(Qwen38Model& t, int max_pos) {
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
  const size_t kvw = static_cast<size_t>(t.attn_dims().n_kv_heads) * t.attn_dims().head_dim;
  m->kcache_ = DeviceBuffer(be, static_cast<size_t>(max_pos) * kvw * sizeof(float));
  m->vcache_ = DeviceBuffer(be, static_cast<size_t>(max_pos) * kvw * sizeof(float));
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

void MtpHead::forward(const int32_t* host_tokens, const float* hidden, int M, int pos, const DumpHook* dump) {
  QF_CHECK(M >= 1 && M <= max_rows_, "mtp forward of %d rows (max %d)", M, max_rows_);
  if (pos + M > max_pos_) fail(ErrorKind::Usage, "MTP context full: %d + %d > %d", pos, M, max_pos_);
  Backend& be = t_->backend();
  be.upload(ids_.get(), host_tokens, M * sizeof(int32_t));
  StepMeta meta{pos, 0, pos + M, 0};
  be.upload(meta_.get(), &meta, sizeof(meta));
  if (dump && *dump) {
    forward_ops(hidden, M, dump);
    return;
  }
  size_t hi = 0;
  while (hi < hidden_seen_.size() && hidden_seen_[hi] != hidden) hi++;
  if (hi == hidden_seen_.size()) hidden_seen_.push_back(hidden);
  graphs_->run(static_cast<uint64_t>(M) | (static_cast<uint64_t>(hi) << 8), [&] { forward_ops(hidden, M, nullptr); });
}

void MtpHead::forward_ops(const float* hidden, int M, const DumpHook* dump) {
  Backend& be = t_->backend();
  const TargetConfig& c = t_->config();
  const int H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  // u = fc([RMS(e)*(1+w_e) ; RMS(H)*(1+w_h)]), embedding half first.
  be.embed(t_->embed_weight(), ids_.i(), e_.f(), M);
  be.rmsnorm(e_.f(), pre_e_.ptr(), e_.f(), M, H, eps);
  be.copy_2d(cat_.f(), 2 * H, e_.f(), H, M, H);
  be.rmsnorm(hidden, pre_h_.ptr(), e_.f(), M, H, eps);
  be.copy_2d(cat_.f() + H, 2 * H, e_.f(), H, M, H);
  be.matmul(fc_, cat_.f(), h_.f(), M);
  if (dump && *dump) (*dump)("mtp.fc_out", h_.f(), static_cast<size_t>(M) * H);
  LayerIO io;
  io.meta = reinterpret_cast<const StepMeta*>(meta_.get());
  io.kcache = kcache_.f();
  io.vcache = vcache_.f();
  decoder_layer(be, layer_, scratch_, h_.f(), M, H, I, t_->attn_dims(), t_->gdn_dims(), eps, io, dump, "mtp.layer");
  be.rmsnorm(h_.f(), norm_.ptr(), hm_.f(), M, H, eps);
  if (dump && *dump) (*dump)("mtp.hidden", hm_.f(), static_cast<size_t>(M) * H);
  be.matmul(t_->lm_head_weight(), hm_.f(), logits_.f(), M);
  be.argmax_rows(logits_.f(), M, V, argmax_.i());
}

}  // namespace qf
