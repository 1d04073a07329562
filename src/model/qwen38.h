// The Qwen 3.8 target (qwen3_5 architecture): 3 of 4 layers gated DeltaNet, every 4th gated
// full attention, SwiGLU MLPs, final norm, untied lm_head; optional one-layer MTP head weights.
// docs/spec/qwen38.md sections 1-3.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "model/blocks.h"
#include "model/target_model.h"
#include "model/weights.h"

namespace qf {

// Checkpoint layout, detected from tensor names.
enum class TargetLayout { Text, Multimodal, Mlx };
const char* target_layout_name(TargetLayout l);

class Qwen38Model final : public TargetModel {
 public:
  // Loads config + weights from a checkpoint folder onto `be`. `max_rows` bounds M per forward.
  // `w`: int4 at load (--weights int4); a drafter loaded against this target follows it.
  static std::unique_ptr<Qwen38Model> load(const std::string& dir, Backend* be, int max_rows = 64,
                                           const WeightOptions& w = {});
  // Full-size speed runs without a checkpoint: the shapes of `config_path` (a config.json),
  // random weights made on the backend (text layout names, MTP head included).
  static std::unique_ptr<Qwen38Model> load_synthetic(const std::string& config_path, Backend* be, int max_rows,
                                                     uint64_t seed, const WeightOptions& w = {});
  ~Qwen38Model();

  const TargetConfig& config() const override { return cfg_; }
  TargetLayout layout() const { return layout_; }
  const std::string& prefix() const { return prefix_; }  // "model." / "model.language_model." / ...
  Backend& backend() const override { return *be_; }
  int max_rows() const override { return max_rows_; }
  // Rows per prefill forward: a multiple of Backend::kPrefillChunk (so that chunk boundaries are
  // split points the prefill ops are invariant to). The buffers grow at the first prefill
  // forward that needs them; set_prefill_rows releases them. 0: no prefill path; the round loop
  // runs the prompt through the decode ops (the fp32 function, e.g. for parity with an fp32
  // reference; slow for long prompts).
  static constexpr int kDefaultPrefillRows = 4096;
  int prefill_rows() const override { return prefill_rows_; }
  void set_prefill_rows(int rows);
  static void check_prefill_rows(int rows);  // Usage error unless 0 or a positive multiple of the chunk
  const WeightRef& embed_weight() const override { return embed_; }
  const WeightRef& lm_head_weight() const override { return lm_head_; }
  bool has_mtp() const override { return has_mtp_; }
  const TensorStore& store() const { return *store_; }
  bool synthetic() const { return ws_->synthetic(); }
  const std::string& origin() const override { return origin_; }
  WeightSet& weights() override { return *ws_; }
  const GdnDims& gdn_dims() const override { return gd_; }
  const AttnDims& attn_dims() const override { return ad_; }
  NormForm norm_form() const override { return norm_form_; }
  const NormVec& final_norm() const { return final_norm_; }
  size_t weight_bytes() const { return ws_->imported_bytes(); }

  // Layers whose outputs are copied into `taps` (concatenated in this order) when opts.taps.
  void set_taps(const std::vector<int>& layer_ids) override;
  const std::vector<int>& taps() const override { return tap_ids_; }

  // Element type of the KV caches that new_state() and the MTP head allocate: BF16 (the default;
  // K/V rounded to nearest even when written, docs/DESIGN.md) or F32. Set before new_state().
  DType kv_dtype() const override { return kv_dtype_; }
  void set_kv_dtype(DType dt);
  std::unique_ptr<TargetState> new_state(int max_pos, int capture_slots) const override;
  void reset(TargetState& st) const override;

  // See TargetModel::forward (prefill: ForwardOpts::prefill, up to prefill_rows() rows).
  void forward(TargetState& st, const int32_t* host_tokens, int M, const ForwardOpts& opts,
               const DumpHook* dump = nullptr) override;
  // Restores the GDN state captured after verify row `slot` and sets st.pos = pos.
  void rollback(TargetState& st, int slot, int pos) const override;

  // Forwards replayed from a recorded CUDA graph so far (0 on backends without graphs).
  uint64_t graph_replays() const;
  uint64_t graph_recordings() const;
  const int32_t* argmax_ids() const override { return argmax_.i(); }
  const float* logits() const override { return logits_.f(); }
  const float* final_hidden() const override { return out_hidden_; }
  const float* tap_rows() const override { return out_taps_; }
  const StepMeta* meta() const { return reinterpret_cast<const StepMeta*>(meta_.get()); }

 private:
  Qwen38Model();
  // Enqueues the forward's ops (no uploads, no host reads): what a graph records.
  void forward_ops(TargetState& st, int M, const ForwardOpts& o, const DumpHook* dump);
  void ensure_prefill_buffers(int rows);
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
  DType kv_dtype_ = DType::BF16;
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
  // Prefill forwards: their own rows of ids, h, final hidden and taps ([rows, ...] as above), and
  // layer scratch; `rows` is what they hold now (0 until the first prefill forward).
  struct PrefillBuffers {
    int rows = 0;
    BlockScratch scratch;
    DeviceBuffer ids, h, hidden_final, taps;
  };
  int prefill_rows_ = kDefaultPrefillRows;
  PrefillBuffers pre_;
  const float* out_hidden_ = nullptr;  // the last forward's final_hidden / tap rows
  const float* out_taps_ = nullptr;
  // After the buffers: destroyed first. Shared so that states can drop their recordings.
  std::shared_ptr<GraphRunner> graphs_;
};

}  // namespace qf
