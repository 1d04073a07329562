#include "model/qwen38.h"

#include <algorithm>

#include "core/error.h"
#include "core/log.h"
#include "model/graph_runner.h"

namespace qf {

const char* target_layout_name(TargetLayout l) {
  switch (l) {
    case TargetLayout::Text: return "text (model.*)";
    case TargetLayout::Multimodal: return "multimodal (model.language_model.*)";
    case TargetLayout::Mlx: return "mlx (language_model.model.*)";
  }
  return "?";
}

Qwen38Model::~Qwen38Model() = default;
Qwen38Model::Qwen38Model() = default;

std::unique_ptr<Qwen38Model> Qwen38Model::load(const std::string& dir, Backend* be, int max_rows,
                                               const WeightOptions& w) {
  std::unique_ptr<Qwen38Model> m(new Qwen38Model());
  m->be_ = be;
  m->max_rows_ = max_rows;
  m->cfg_ = load_target_config(dir);  // guards run before any weights file is opened
  const TargetConfig& c = m->cfg_;
  m->store_ = std::make_unique<TensorStore>(TensorStore::open_dir(dir));
  const TensorStore& st = *m->store_;

  std::string lm_name;
  if (st.find("model.language_model.embed_tokens.weight")) {
    m->layout_ = TargetLayout::Multimodal;
    m->prefix_ = "model.language_model.";
    lm_name = "lm_head.weight";
  } else if (st.find("language_model.model.embed_tokens.weight")) {
    m->layout_ = TargetLayout::Mlx;
    m->prefix_ = "language_model.model.";
    lm_name = "language_model.lm_head.weight";
    m->norm_form_ = NormForm::Full;  // mlx-vlm's conversion already added the +1
  } else if (st.find("model.embed_tokens.weight")) {
    m->layout_ = TargetLayout::Text;
    m->prefix_ = "model.";
    lm_name = "lm_head.weight";
  } else {
    fail(ErrorKind::Tensor,
         "%s: no embedding tensor found (looked for model.embed_tokens.weight, "
         "model.language_model.embed_tokens.weight, language_model.model.embed_tokens.weight; %zu tensors)",
         dir.c_str(), st.size());
  }
  if (c.tie_word_embeddings && !st.find(lm_name)) lm_name = m->prefix_ + "embed_tokens.weight";
  m->ws_ = std::make_unique<WeightSet>(be, m->store_.get(), w);
  m->has_mtp_ = c.mtp_num_hidden_layers > 0 && st.find("mtp.fc.weight") != nullptr;
  m->build(dir, lm_name);
  return m;
}

std::unique_ptr<Qwen38Model> Qwen38Model::load_synthetic(const std::string& config_path, Backend* be, int max_rows,
                                                         uint64_t seed, const WeightOptions& w) {
  std::unique_ptr<Qwen38Model> m(new Qwen38Model());
  m->be_ = be;
  m->max_rows_ = max_rows;
  m->cfg_ = load_target_config(config_path);
  // The tensor names of the layout the config describes (Qwen/Qwen3.8-27B is multimodal).
  const bool mm = m->cfg_.layout == "multimodal";
  m->layout_ = mm ? TargetLayout::Multimodal : TargetLayout::Text;
  m->prefix_ = mm ? "model.language_model." : "model.";
  m->ws_ = std::make_unique<WeightSet>(be, seed, w);
  m->has_mtp_ = m->cfg_.mtp_num_hidden_layers > 0;
  m->build(config_path + " (synthetic random weights)", "lm_head.weight");
  return m;
}

void Qwen38Model::build(const std::string& origin, const std::string& lm_name) {
  Qwen38Model* m = this;
  Backend* be = be_;
  const TargetConfig& c = cfg_;
  origin_ = origin;

  m->ad_.n_heads = c.num_attention_heads;
  m->ad_.n_kv_heads = c.num_key_value_heads;
  m->ad_.head_dim = c.head_dim;
  m->ad_.rot_dim = c.rotary_dim;
  m->ad_.theta = static_cast<float>(c.rope_theta);
  m->gd_.n_k_heads = c.linear_num_key_heads;
  m->gd_.n_v_heads = c.linear_num_value_heads;
  m->gd_.d_k = c.linear_key_head_dim;
  m->gd_.d_v = c.linear_value_head_dim;
  m->gd_.conv_kernel = c.linear_conv_kernel_dim;

  WeightSet& ws = *m->ws_;
  const int H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
  // The bar counts the checkpoint bytes of the text model's tensors and the head (synthetic
  // weights: no bar): the globals first, then each layer's tensors.
  const std::vector<std::string> names = store_ ? store_->names() : std::vector<std::string>{};
  auto bytes_of = [&](const std::string& prefix, const std::string& exact) {
    size_t b = 0;
    for (const std::string& n : names)
      if ((!prefix.empty() && n.rfind(prefix, 0) == 0) || n == exact) b += store_->find(n)->nbytes;
    return b;
  };
  const std::string layers_prefix = m->prefix_ + "layers.";
  size_t total = bytes_of(m->prefix_, lm_name.rfind(m->prefix_, 0) == 0 ? "" : lm_name);
  size_t loaded = total - bytes_of(layers_prefix, "");
  Progress progress("loading target", total);
  m->embed_ = ws.matrix(m->prefix_ + "embed_tokens.weight", V, H, /*matmul_only=*/false);
  m->lm_head_ = ws.matrix(lm_name, V, H);
  m->final_norm_ = ws.norm(m->prefix_ + "norm.weight", H, m->norm_form_);
  progress.set(loaded);
  int n_full = 0, n_gdn = 0;
  for (int L = 0; L < c.num_hidden_layers; L++) {
    const bool full = c.full_attention[L];
    m->layers_.push_back(load_layer(ws, m->prefix_ + "layers." + std::to_string(L) + ".", full, H, I,
                                    m->ad_, m->gd_, m->norm_form_));
    m->layer_slot_.push_back(full ? n_full++ : n_gdn++);
    loaded += bytes_of(layers_prefix + std::to_string(L) + ".", "");
    progress.set(loaded);
  }
  progress.done();

  const size_t R = static_cast<size_t>(max_rows_);
  m->scratch_.allocate(be, max_rows_, H, m->ad_, &m->gd_, I);
  m->ids_ = DeviceBuffer(be, R * sizeof(int32_t));
  m->meta_ = DeviceBuffer(be, sizeof(StepMeta));
  m->h_ = DeviceBuffer(be, R * H * sizeof(float));
  m->hidden_final_ = DeviceBuffer(be, R * H * sizeof(float));
  m->logits_ = DeviceBuffer(be, R * V * sizeof(float));
  m->argmax_ = DeviceBuffer(be, R * sizeof(int32_t));
  m->out_hidden_ = m->hidden_final_.f();
  m->graphs_ = std::make_shared<GraphRunner>(be);
  log_info("target: %s, layout %s, %d layers (%d attention, %d deltanet), hidden %d, vocab %d, %.1f MB of weights%s",
           origin.c_str(), target_layout_name(m->layout_), c.num_hidden_layers, n_full, n_gdn, H, V,
           ws.imported_bytes() / 1e6, m->has_mtp_ ? ", MTP head present" : "");
}

uint64_t Qwen38Model::graph_replays() const { return graphs_ ? graphs_->replays() : 0; }
uint64_t Qwen38Model::graph_recordings() const { return graphs_ ? graphs_->recordings() : 0; }

void Qwen38Model::set_taps(const std::vector<int>& ids) {
  for (int id : ids)
    if (id < 0 || id >= cfg_.num_hidden_layers)
      fail(ErrorKind::Config, "tap layer %d outside the target's %d layers", id, cfg_.num_hidden_layers);
  tap_ids_ = ids;
  graphs_->clear();  // recordings refer to the old tap buffer
  taps_ = DeviceBuffer(be_, static_cast<size_t>(max_rows_) * ids.size() * cfg_.hidden_size * sizeof(float));
  out_taps_ = taps_.f();
  pre_.taps.reset();  // resized for the new tap count at the next prefill forward
}

void Qwen38Model::check_prefill_rows(int rows) {
  if (rows < 0 || rows % Backend::kPrefillChunk != 0)
    fail(ErrorKind::Usage, "prefill chunk of %d rows: must be 0 (decode ops) or a positive multiple of %d", rows,
         Backend::kPrefillChunk);
}

void Qwen38Model::set_prefill_rows(int rows) {
  check_prefill_rows(rows);
  prefill_rows_ = rows;
  pre_ = PrefillBuffers{};
  out_hidden_ = hidden_final_.f();
  out_taps_ = taps_.f();
}

// Grows the prefill buffers to hold `M` rows (rounded up to a chunk, at most prefill_rows_).
void Qwen38Model::ensure_prefill_buffers(int M) {
  const int C = Backend::kPrefillChunk;
  const int rows = std::min(prefill_rows_, (M + C - 1) / C * C);
  const size_t H = cfg_.hidden_size, nt = tap_ids_.size();
  if (pre_.rows < rows) {
    const size_t R = static_cast<size_t>(rows);
    pre_.scratch = BlockScratch{};  // free before allocating the larger set
    pre_.scratch.allocate(be_, rows, cfg_.hidden_size, ad_, &gd_, cfg_.intermediate_size);
    pre_.ids = DeviceBuffer(be_, R * sizeof(int32_t));
    pre_.h = DeviceBuffer(be_, R * H * sizeof(float));
    pre_.hidden_final = DeviceBuffer(be_, R * H * sizeof(float));
    pre_.taps.reset();
    pre_.rows = rows;
  }
  const size_t tap_bytes = static_cast<size_t>(pre_.rows) * nt * H * sizeof(float);
  if (nt > 0 && pre_.taps.bytes() < tap_bytes) pre_.taps = DeviceBuffer(be_, tap_bytes);
}

void Qwen38Model::set_kv_dtype(DType dt) {
  if (dt != DType::BF16 && dt != DType::F32)
    fail(ErrorKind::Usage, "KV cache dtype must be BF16 or F32 (got %s)", dtype_name(dt));
  kv_dtype_ = dt;
}

std::unique_ptr<TargetState> Qwen38Model::new_state(int max_pos, int capture_slots) const {
  auto st = std::make_unique<TargetState>();
  st->max_pos = max_pos;
  st->graphs = GraphOwner(graphs_);
  st->capture_slots = capture_slots;
  st->kv_dtype = kv_dtype_;
  const size_t row_bytes = static_cast<size_t>(ad_.n_kv_heads) * ad_.head_dim * dtype_size(kv_dtype_);
  for (size_t L = 0; L < layers_.size(); L++) {
    if (layers_[L].full_attention) {
      st->kcache.emplace_back(be_, static_cast<size_t>(max_pos) * row_bytes);
      st->vcache.emplace_back(be_, static_cast<size_t>(max_pos) * row_bytes);
    } else {
      st->gdn.emplace_back(be_, gd_.state_floats() * sizeof(float));
      if (capture_slots > 0)
        st->capture.emplace_back(be_, static_cast<size_t>(capture_slots) * gd_.state_floats() * sizeof(float));
    }
  }
  return st;
}

void Qwen38Model::reset(TargetState& st) const {
  for (auto& b : st.gdn) be_->fill_zero(b.get(), b.bytes());
  st.pos = 0;  // KV rows past pos are never read
}

void Qwen38Model::forward(TargetState& st, const int32_t* host_tokens, int M, const ForwardOpts& o,
                          const DumpHook* dump) {
  const int R = o.prefill ? prefill_rows_ : max_rows_;
  QF_CHECK(M >= 1 && M <= R, "%s forward of %d rows (max %d)", o.prefill ? "prefill" : "target", M, R);
  if (o.prefill && o.capture) fail(ErrorKind::Internal, "a prefill forward does not capture GDN states");
  if (st.pos + M > st.max_pos)
    fail(ErrorKind::Usage, "context full: %d + %d tokens exceed the %d positions allocated", st.pos, M,
         st.max_pos);
  if (o.capture && M > st.capture_slots)
    fail(ErrorKind::Internal, "verify of %d rows needs %d capture slots, state has %d", M, M, st.capture_slots);
  if (o.taps && tap_ids_.empty()) fail(ErrorKind::Internal, "forward asked for taps but none are set");
  const int V = cfg_.vocab_size;
  Backend& be = *be_;
  for (int i = 0; i < M; i++)
    if (host_tokens[i] < 0 || host_tokens[i] >= V)
      fail(ErrorKind::Usage, "token id %d outside the vocabulary (%d)", host_tokens[i], V);
  if (o.prefill) ensure_prefill_buffers(M);
  be.upload(o.prefill ? pre_.ids.get() : ids_.get(), host_tokens, M * sizeof(int32_t));
  StepMeta meta{st.pos, 0, st.pos + M, 0};
  be.upload(meta_.get(), &meta, sizeof(meta));
  out_hidden_ = o.prefill ? pre_.hidden_final.f() : hidden_final_.f();
  out_taps_ = o.prefill ? pre_.taps.f() : taps_.f();

  if ((dump && *dump) || o.prefill) {  // named intermediates, prefill: always direct
    forward_ops(st, M, o, dump);
  } else if (M <= kMaxGraphRows) {
    const GraphKey key = GraphKey(st.graphs.id())
                             .field("rows", static_cast<uint64_t>(M), 16)
                             .flag("lm_head", o.lm_head)
                             .flag("logits_last_only", o.logits_last_only)
                             .flag("capture", o.capture)
                             .flag("taps", o.taps)
                             .flag("final_hidden", o.final_hidden);
    graphs_->run(key, [&] { forward_ops(st, M, o, nullptr); });
  } else {
    forward_ops(st, M, o, nullptr);
  }
  st.pos += M;
}

void Qwen38Model::forward_ops(TargetState& st, int M, const ForwardOpts& o, const DumpHook* dump) {
  const TargetConfig& c = cfg_;
  const int H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  Backend& be = *be_;
  const bool pre = o.prefill;
  BlockScratch& scratch = pre ? pre_.scratch : scratch_;
  float* h = pre ? pre_.h.f() : h_.f();
  float* hidden_final = pre ? pre_.hidden_final.f() : hidden_final_.f();
  float* taps = pre ? pre_.taps.f() : taps_.f();
  be.embed(embed_, pre ? pre_.ids.i() : ids_.i(), h, M);
  if (dump && *dump) (*dump)("embed", h, static_cast<size_t>(M) * H);
  const int nt = static_cast<int>(tap_ids_.size());
  const float* pending = nullptr;
  for (size_t L = 0; L < layers_.size(); L++) {
    LayerIO io;
    io.meta = this->meta();
    io.pending = pending;
    io.prefill = pre;
    bool tapped = false;
    if (o.taps)
      for (int t = 0; t < nt; t++) tapped = tapped || tap_ids_[t] == static_cast<int>(L);
    // Defer the MLP residual add into the next layer's norm unless h is read right after this
    // layer (taps, dumps) or this is the last layer.
    io.defer_add = !(dump && *dump) && !tapped && L + 1 < layers_.size();
    const int slot = layer_slot_[L];
    if (layers_[L].full_attention) {
      io.kcache = st.kcache[slot].get();
      io.vcache = st.vcache[slot].get();
      io.kv_dtype = st.kv_dtype;
    } else {
      io.gdn_state = st.gdn[slot].f();
      io.capture = o.capture ? st.capture[slot].f() : nullptr;
    }
    decoder_layer(be, layers_[L], scratch, h, M, H, I, ad_, gd_, eps, io, dump,
                  "layer." + std::to_string(L));
    pending = io.defer_add ? scratch.o.f() : nullptr;
    if (o.taps)
      for (int t = 0; t < nt; t++)
        if (tap_ids_[t] == static_cast<int>(L)) be.copy_2d(taps + t * H, nt * H, h, H, M, H);
  }
  if (!o.lm_head && !o.final_hidden) return;
  // Final norm over every row (MTP reads them all); the head only over the rows asked for. A
  // prefill without final_hidden needs the last row only. The head is the matmul for every
  // forward (one row in prefill: the GEMV, as in decode).
  const int r0 = (o.logits_last_only || pre) ? M - 1 : 0, nr = M - r0;
  const int n0 = pre && !o.final_hidden ? r0 : 0;
  be.rmsnorm(h + static_cast<size_t>(n0) * H, final_norm_.ptr(), hidden_final + static_cast<size_t>(n0) * H, M - n0,
             H, eps);
  if (dump && *dump && n0 == 0) (*dump)("final_hidden", hidden_final, static_cast<size_t>(M) * H);
  if (!o.lm_head) return;
  be.matmul(lm_head_, hidden_final + static_cast<size_t>(r0) * H, logits_.f(), nr);
  if (dump && *dump) (*dump)("logits", logits_.f(), static_cast<size_t>(nr) * V);
  be.argmax_rows(logits_.f(), nr, V, argmax_.i());
}

void Qwen38Model::rollback(TargetState& st, int slot, int pos) const {
  QF_CHECK(slot >= 0 && slot < st.capture_slots, "rollback slot %d of %d", slot, st.capture_slots);
  const size_t bytes = gd_.state_floats() * sizeof(float);
  for (size_t i = 0; i < st.gdn.size(); i++)
    be_->copy(st.gdn[i].get(), static_cast<const char*>(st.capture[i].get()) + slot * bytes, bytes);
  st.pos = pos;
}

}  // namespace qf
