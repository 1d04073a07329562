// The Qwen 3.8 target (qwen3_5 architecture): 3 of 4 layers gated DeltaNet, every 4th gated
// full attention, SwiGLU MLPs, final norm, untied lm_head; optional one-layer MTP head weights.
// spec/qwen38.md sections 1-3.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "model/blocks.h"
#include "model/weights.h"

namespace qf {

class GraphRunner;

// Checkpoint layout, detected from tensor names.
enum class TargetLayout { Text, Multimodal, Mlx };
const char* target_layout_name(TargetLayout l);

// Per-sequence state of the target: KV caches at absolute positions, GDN state blobs, and the
// verify capture arena (slot i = every GDN layer's blob after verify row i).
struct TargetState {
  int max_pos = 0;
  int capture_slots = 0;
  std::vector<DeviceBuffer> kcache, vcache;  // per full-attention layer: f32 [max_pos, n_kv*head_dim]
  std::vector<DeviceBuffer> gdn;             // per GDN layer: f32 [GdnDims::state_floats()]
  std::vector<DeviceBuffer> capture;         // per GDN layer: f32 [capture_slots][state_floats]
  int pos = 0;                               // committed tokens (next write position)
  uint64_t id = 0;                           // names this state's buffers in recorded graphs
};

struct ForwardOpts {
  bool lm_head = true;          // compute logits + argmax (rows selected by `logits_last_only`)
  bool logits_last_only = false;
  bool capture = false;         // GDN per-row capture into the arena (verify)
  bool taps = false;            // copy tap-layer outputs into `taps`
  bool final_hidden = true;     // keep post-final-norm rows in `final_hidden`
};

class Qwen38Model {
 public:
  // Loads config + weights from a checkpoint folder onto `be`. `max_rows` bounds M per forward.
  static std::unique_ptr<Qwen38Model> load(const std::string& dir, Backend* be, int max_rows = 64);
  // Full-size speed runs without a checkpoint: the shapes of `config_path` (a config.json),
  // random weights made on the backend (text layout names, MTP head included).
  static std::unique_ptr<Qwen38Model> load_synthetic(const std::string& config_path, Backend* be, int max_rows,
                                                     uint64_t seed);
  ~Qwen38Model();

  const TargetConfig& config() const { return cfg_; }
  TargetLayout layout() const { return layout_; }
  const std::string& prefix() const { return prefix_; }  // "model." / "model.language_model." / ...
  Backend& backend() const { return *be_; }
  int max_rows() const { return max_rows_; }
  const WeightRef& embed_weight() const { return embed_; }
  const WeightRef& lm_head_weight() const { return lm_head_; }
  bool has_mtp() const { return has_mtp_; }
  const TensorStore& store() const { return *store_; }
  bool synthetic() const { return ws_->synthetic(); }
  const std::string& origin() const { return origin_; }
  WeightSet& weights() { return *ws_; }
  const GdnDims& gdn_dims() const { return gd_; }
  const AttnDims& attn_dims() const { return ad_; }
  NormForm norm_form() const { return norm_form_; }
  const NormVec& final_norm() const { return final_norm_; }
  size_t weight_bytes() const { return ws_->imported_bytes(); }

  // Layers whose outputs are copied into `taps` (concatenated in this order) when opts.taps.
  void set_taps(const std::vector<int>& layer_ids);
  const std::vector<int>& taps() const { return tap_ids_; }

  std::unique_ptr<TargetState> new_state(int max_pos, int capture_slots) const;
  void reset(TargetState& st) const;

  // Runs M <= max_rows() tokens at positions st.pos .. st.pos+M-1 and advances st.pos by M.
  // Results stay in backend memory until the next call: argmax_ids() [M] (or [1] when
  // logits_last_only), logits() [M or 1, V], final_hidden() [M, H], tap_rows() [M, taps*H].
  void forward(TargetState& st, const int32_t* host_tokens, int M, const ForwardOpts& opts,
               const DumpHook* dump = nullptr);
  // Restores the GDN state captured after verify row `slot` and sets st.pos = pos.
  void rollback(TargetState& st, int slot, int pos) const;

  // Forwards replayed from a recorded CUDA graph so far (0 on backends without graphs).
  uint64_t graph_replays() const;
  const int32_t* argmax_ids() const { return argmax_.i(); }
  const float* logits() const { return logits_.f(); }
  const float* final_hidden() const { return hidden_final_.f(); }
  const float* tap_rows() const { return taps_.f(); }
  const StepMeta* meta() const { return reinterpret_cast<const StepMeta*>(meta_.get()); }

 private:
  Qwen38Model();
  // Enqueues the forward's ops (no uploads, no host reads): what a graph records.
  void forward_ops(TargetState& st, int M, const ForwardOpts& o, const DumpHook* dump);
  static constexpr int kMaxGraphRows = 32;
  void build(const std::string& origin, const std::string& lm_name);
  Backend* be_ = nullptr;
  TargetConfig cfg_;
  TargetLayout layout_ = TargetLayout::Text;
  NormForm norm_form_ = NormForm::ZeroCentred;
  std::string prefix_, origin_;
  std::unique_ptr<TensorStore> store_;
  std::unique_ptr<WeightSet> ws_;
  int max_rows_ = 0;
  bool has_mtp_ = false;
  AttnDims ad_;
  GdnDims gd_;
  WeightRef embed_, lm_head_;
  NormVec final_norm_;
  std::vector<LayerWeights> layers_;
  std::vector<int> layer_slot_;  // layer -> index into kcache (full) or gdn (linear)
  std::vector<int> tap_ids_;
  BlockScratch scratch_;
  DeviceBuffer ids_, meta_, h_, hidden_final_, logits_, argmax_, taps_;
  std::unique_ptr<GraphRunner> graphs_;  // after the buffers: destroyed first
};

}  // namespace qf
