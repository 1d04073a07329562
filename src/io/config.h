// config.json of a qwen3_5 target and of a DFlash/DFlash2 drafter, validated once at load.
// Every field of docs/spec/qwen38.md section 1 and docs/spec/dflash2.md section 1.1; each failure is a
// qf::Error(Config) naming the file, the field, the expected and the found value.
#pragma once
#include <string>
#include <vector>

namespace qf {

struct TargetConfig {
  std::string path;          // config.json this came from
  std::string layout;        // "multimodal" (text_config nested) or "text"
  std::string model_type;    // "qwen3_5" / "qwen3_5_text"
  int hidden_size = 0;
  int num_hidden_layers = 0;
  std::vector<bool> full_attention;  // [num_hidden_layers]; from layer_types or full_attention_interval
  int num_attention_heads = 0;
  int num_key_value_heads = 0;
  int head_dim = 0;
  int linear_num_key_heads = 0;
  int linear_num_value_heads = 0;
  int linear_key_head_dim = 0;
  int linear_value_head_dim = 0;
  int linear_conv_kernel_dim = 0;
  int intermediate_size = 0;
  int vocab_size = 0;
  std::string hidden_act;        // must be "silu"
  double rope_theta = 0;
  double partial_rotary_factor = 0;
  int rotary_dim = 0;            // head_dim * partial_rotary_factor (even)
  std::vector<int> mrope_section;  // may be empty; sums to rotary_dim/2 when present
  bool mrope_interleaved = false;  // rope_parameters.mrope_interleaved (absent = false)
  double rms_norm_eps = 0;
  bool tie_word_embeddings = false;
  bool attn_output_gate = true;  // must be true (qwen3_5 gated attention)
  bool attention_bias = false;   // must be false
  int max_position_embeddings = 0;
  int mtp_num_hidden_layers = 0;
  std::vector<int> eos_token_ids;  // from text_config/top-level eos_token_id (int or list)
  int bos_token_id = -1;
  // Top-level "quantization": {"group_size": 64, "bits": 4, "mode": "affine"} (mlx layout).
  int quant_bits = 0;   // 0 = not quantized
  int quant_group = 0;

  // Derived sizes (filled by the loader).
  int gdn_key_dim() const { return linear_num_key_heads * linear_key_head_dim; }
  int gdn_value_dim() const { return linear_num_value_heads * linear_value_head_dim; }
  int gdn_conv_dim() const { return 2 * gdn_key_dim() + gdn_value_dim(); }
  int n_full_layers() const;
  int n_gdn_layers() const;
};

struct DrafterConfig {
  std::string path;
  std::string architecture;  // "DFlash2DraftModel" or "DFlashDraftModel"
  bool is_v2 = true;         // v1 = no conv, no selector
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_hidden_layers = 0;
  int num_attention_heads = 0;
  int num_key_value_heads = 0;
  int head_dim = 0;
  int num_target_layers = 0;
  int vocab_size = 0;
  std::vector<int> target_layer_ids;  // tap layers (0-based decoder layer outputs)
  int block_size = 0;                 // drafts per round = block_size - 1
  int mask_token_id = -1;
  int conv_kernel_size = 0;  // v2 only
  int conv_group_size = 0;   // v2 only
  int selector_rank = 0;     // v2 only
  int selector_top_k = 0;    // v2 only
  int sliding_window = 0;    // 0 = no window (full attention over the context)
  bool is_causal = false;
  double rope_theta = 0;
  double rms_norm_eps = 0;
  double input_embedding_scale = 1.0;
  double output_multiplier = 1.0;
  double final_logit_softcapping = 0.0;  // off unless > 0
};

// Reads <dir>/config.json (or the file itself if `path` names a .json).
TargetConfig load_target_config(const std::string& path);
DrafterConfig load_drafter_config(const std::string& path);

// Parse from an in-memory JSON string; `origin` names the source in errors.
TargetConfig parse_target_config(const std::string& json_text, const std::string& origin);
DrafterConfig parse_drafter_config(const std::string& json_text, const std::string& origin);

// Pairing guards (docs/spec/dflash2.md 1.4 and issue "speculative"): vocab, hidden size, layer count,
// tap ids, fc width, mask id, ... Throws Config errors naming both values.
void check_drafter_pair(const DrafterConfig& d, const TargetConfig& t);

// Python's round-half-to-even version of build_target_layer_ids (docs/spec/dflash2.md 2.1).
std::vector<int> build_target_layer_ids(int num_target_layers, int num_draft_layers);

}  // namespace qf
