// DFlash / DFlash2 drafter config.json (docs/spec/dflash2.md section 1.1) and the target pairing
// guards (section 1.4, 2.4, 8). The drafter is a Qwen3-style config ("model_type": "qwen3")
// with the speculative keys in "dflash_config"; a key there wins over the same top-level key.
#include <cmath>

#include "core/error.h"
#include "io/config.h"
#include "io/config_fields.h"

namespace qf {

std::vector<int> build_target_layer_ids(int num_target_layers, int num_draft_layers) {
  if (num_target_layers <= 0 || num_draft_layers <= 0)
    fail(ErrorKind::Usage, "build_target_layer_ids(%d, %d): both counts must be positive",
         num_target_layers, num_draft_layers);
  if (num_draft_layers == 1) return {num_target_layers / 2};
  std::vector<int> ids;
  for (int i = 0; i < num_draft_layers; ++i) {
    // Same float steps as Python's 1 + i*(Lt-4)/(Ld-1): the integer product is exact, the true
    // division rounds once, and round() goes to even on ties. std::nearbyint under the default
    // FE_TONEAREST mode is half-to-even; std::round (half away from zero) would differ.
    double x = 1.0 + static_cast<double>(i * (num_target_layers - 4)) /
                         static_cast<double>(num_draft_layers - 1);
    ids.push_back(static_cast<int>(std::nearbyint(x)));
  }
  return ids;
}

DrafterConfig parse_drafter_config(const std::string& json_text, const std::string& origin) {
  const Json root = parse_config_json(json_text, origin);
  DrafterConfig c;
  c.path = origin;
  ConfigFields top(origin, {{&root, ""}});
  const Json* dflash = top.opt_object("dflash_config");
  ConfigFields d(origin, {{dflash, "dflash_config."}, {&root, ""}});

  const Json* arch = top.find("architectures");
  if (!arch) top.missing("architectures");
  if (!arch->is_array() || arch->empty() || !(*arch)[0].is_string())
    top.bad("architectures", "a non-empty list of strings");
  c.architecture = (*arch)[0].get<std::string>();
  if (c.architecture != "DFlash2DraftModel" && c.architecture != "DFlashDraftModel")
    top.bad("architectures", "[\"DFlash2DraftModel\"] or [\"DFlashDraftModel\"]",
            json_brief((*arch)[0]));
  c.is_v2 = c.architecture == "DFlash2DraftModel";

  c.hidden_size = top.req_pos_int("hidden_size");
  c.intermediate_size = top.req_pos_int("intermediate_size");
  c.num_hidden_layers = top.req_pos_int("num_hidden_layers");
  c.num_attention_heads = top.req_pos_int("num_attention_heads");
  c.num_key_value_heads = top.req_pos_int("num_key_value_heads");
  c.head_dim = top.req_pos_int("head_dim");
  c.vocab_size = top.req_pos_int("vocab_size");
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    top.bad("num_attention_heads",
            "a multiple of num_key_value_heads " + std::to_string(c.num_key_value_heads));
  if (c.head_dim % 2 != 0) top.bad("head_dim", "an even number (rotate_half over the head)");
  if (top.opt_str("hidden_act", "silu") != "silu") top.bad("hidden_act", "\"silu\"");
  if (top.opt_bool("attention_bias", false)) top.bad("attention_bias", "false");
  c.rms_norm_eps = top.req_num("rms_norm_eps");
  if (c.rms_norm_eps <= 0) top.bad("rms_norm_eps", "a positive number");

  ConfigFields rope(origin, {{top.opt_object("rope_parameters"), "rope_parameters."},
                             {&root, ""},
                             {top.opt_object("rope_scaling"), "rope_scaling."}});
  if (rope.opt_str("rope_type", "default") != "default")
    rope.bad("rope_type", "\"default\" (no rope scaling)");
  c.rope_theta = rope.req_num("rope_theta");
  if (c.rope_theta <= 0) rope.bad("rope_theta", "a positive number");

  c.num_target_layers = d.req_pos_int("num_target_layers");
  c.block_size = d.opt_int("block_size", 16);  // ZL's default when neither level sets it
  if (c.block_size < 2) d.bad("block_size", "at least 2 (the anchor plus one draft)");
  c.mask_token_id = d.req_int("mask_token_id");
  if (c.mask_token_id < 0) d.bad("mask_token_id", "a non-negative token id");

  if (d.has("target_layer_ids")) {
    c.target_layer_ids = d.opt_int_list("target_layer_ids");
    if (c.target_layer_ids.empty()) d.bad("target_layer_ids", "a non-empty list");
  } else {
    c.target_layer_ids = build_target_layer_ids(c.num_target_layers, c.num_hidden_layers);
  }
  for (int id : c.target_layer_ids)
    if (id < 0 || id >= c.num_target_layers)
      d.bad("target_layer_ids", strf("ids in [0, num_target_layers = %d)", c.num_target_layers),
            std::to_string(id));

  if (c.is_v2) {
    c.conv_kernel_size = d.req_pos_int("conv_kernel_size");
    c.conv_group_size = d.req_pos_int("conv_group_size");
    c.selector_rank = d.req_pos_int("selector_rank");
    c.selector_top_k = d.req_pos_int("selector_top_k");
    if (c.hidden_size % c.conv_group_size != 0)
      d.bad("conv_group_size", strf("a divisor of hidden_size %d", c.hidden_size));
    if (c.conv_kernel_size > c.block_size)
      d.bad("conv_kernel_size", strf("at most block_size %d", c.block_size));
    if (c.selector_top_k > c.vocab_size)
      d.bad("selector_top_k", strf("at most vocab_size %d", c.vocab_size));
  }

  // Layer kinds: one drafter window for all layers, so mixed kinds are refused.
  bool sliding_layers = false;
  if (const Json* lt = top.find("layer_types")) {
    if (!lt->is_array() || static_cast<int>(lt->size()) != c.num_hidden_layers)
      top.bad("layer_types", strf("a list of %d strings (num_hidden_layers)", c.num_hidden_layers));
    for (size_t i = 0; i < lt->size(); ++i) {
      const Json& e = (*lt)[i];
      std::string s = e.is_string() ? e.get<std::string>() : "";
      if (s != "sliding_attention" && s != "full_attention")
        top.bad("layer_types", "entries \"sliding_attention\" or \"full_attention\"",
                json_brief(e) + " at index " + std::to_string(i));
      if (i > 0 && (s == "sliding_attention") != sliding_layers)
        top.bad("layer_types", "the same kind for every layer", json_brief(*lt));
      sliding_layers = s == "sliding_attention";
    }
  }
  bool use_window = top.opt_bool("use_sliding_window", false) || sliding_layers;
  if (use_window) {
    c.sliding_window = top.req_pos_int("sliding_window");
    // W >= B keeps the whole block visible to every block row (docs/spec/dflash2.md section 8).
    if (c.sliding_window < c.block_size)
      top.bad("sliding_window", strf("at least block_size %d", c.block_size));
  }
  // ZL: the configured value, else causal exactly on sliding layers.
  c.is_causal = top.opt_bool("is_causal", use_window);

  c.input_embedding_scale = d.opt_num("input_embedding_scale", 1.0);
  c.output_multiplier = d.opt_num("output_multiplier", 1.0);
  c.final_logit_softcapping = d.opt_num("final_logit_softcapping", 0.0);
  return c;
}

void check_drafter_pair(const DrafterConfig& d, const TargetConfig& t) {
  const char* dp = d.path.c_str();
  const char* tp = t.path.c_str();
  if (d.vocab_size != t.vocab_size)
    fail(ErrorKind::Config, "drafter %s vocab_size %d does not match target %s vocab_size %d", dp,
         d.vocab_size, tp, t.vocab_size);
  // The drafter borrows the target's embed_tokens and lm_head, and fc reads Nt x hidden taps.
  if (d.hidden_size != t.hidden_size)
    fail(ErrorKind::Config, "drafter %s hidden_size %d does not match target %s hidden_size %d",
         dp, d.hidden_size, tp, t.hidden_size);
  if (d.num_target_layers != t.num_hidden_layers)
    fail(ErrorKind::Config,
         "drafter %s num_target_layers %d does not match target %s num_hidden_layers %d", dp,
         d.num_target_layers, tp, t.num_hidden_layers);
  for (int id : d.target_layer_ids)
    if (id < 0 || id >= t.num_hidden_layers)
      fail(ErrorKind::Config,
           "drafter %s target_layer_ids entry %d is outside target %s layers [0, %d)", dp, id, tp,
           t.num_hidden_layers);
  if (d.mask_token_id < 0 || d.mask_token_id >= t.vocab_size)
    fail(ErrorKind::Config,
         "drafter %s mask_token_id %d is outside target %s vocabulary [0, %d)", dp,
         d.mask_token_id, tp, t.vocab_size);
  if (d.is_v2 && d.selector_top_k > t.vocab_size)
    fail(ErrorKind::Config, "drafter %s selector_top_k %d exceeds target %s vocab_size %d", dp,
         d.selector_top_k, tp, t.vocab_size);
}

}  // namespace qf
