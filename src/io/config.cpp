// qwen3_5 target config.json (docs/spec/qwen38.md section 1). Two layouts reach us:
//  - multimodal: {"model_type": "qwen3_5", "text_config": {...}, "vision_config": {...},
//    "tie_word_embeddings", mlx "quantization"} as in the published Qwen3.8 repos;
//  - text-only: {"model_type": "qwen3_5_text", ...} as Qwen3_5ForCausalLM.save_pretrained
//    writes it (transformers 5.x: rope values inside "rope_parameters", no attn_output_gate).
#include "io/config.h"

#include <cmath>
#include <filesystem>

#include "core/error.h"
#include "io/config_fields.h"
#include "io/safetensors.h"

namespace qf {
namespace {

std::string ints_str(const std::vector<int>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// Top-level "quantization" (mlx-lm / mlx-vlm). Only uniform affine int4 is implemented.
void parse_quantization(const Json& root, const std::string& origin, TargetConfig& c) {
  ConfigFields top(origin, {{&root, ""}});
  std::string key = "quantization";
  if (!top.has(key)) {
    // mlx also mirrors the block as "quantization_config"; other tools (GPTQ, AWQ, fp8) use that
    // name with a quant_method we cannot run, so those are refused by name.
    if (!top.has("quantization_config")) return;
    key = "quantization_config";
  }
  const Json* q = top.opt_object(key);
  ConfigFields f(origin, {{q, key + "."}});
  if (f.has("quant_method"))
    f.bad("quant_method", "no quant_method (only mlx affine 4-bit is supported)");
  c.quant_bits = f.req_int("bits");
  if (c.quant_bits != 4) f.bad("bits", "4");
  c.quant_group = f.req_int("group_size");
  if (c.quant_group != 32 && c.quant_group != 64 && c.quant_group != 128)
    f.bad("group_size", "32, 64 or 128");
  std::string mode = f.opt_str("mode", "affine");  // mode was added later; older files are affine
  if (mode != "affine") f.bad("mode", "\"affine\"");
  // Per-module overrides are objects keyed by module path; a different width would need a
  // mixed-precision loader, which qflash does not have.
  for (auto it = q->begin(); it != q->end(); ++it) {
    if (!it.value().is_object()) continue;
    ConfigFields o(origin, {{&it.value(), key + "." + it.key() + "."}});
    if (o.opt_int("bits", c.quant_bits) != c.quant_bits)
      o.bad("bits", "the global " + std::to_string(c.quant_bits) + " (no per-module widths)");
    if (o.opt_int("group_size", c.quant_group) != c.quant_group)
      o.bad("group_size", "the global " + std::to_string(c.quant_group));
  }
}

void parse_layer_types(const ConfigFields& f, TargetConfig& c) {
  const int n = c.num_hidden_layers;
  c.full_attention.assign(n, false);
  if (const Json* lt = f.find("layer_types")) {
    if (!lt->is_array()) f.bad("layer_types", "a list of strings");
    if (static_cast<int>(lt->size()) != n)
      f.bad("layer_types", std::to_string(n) + " entries (num_hidden_layers)",
            std::to_string(lt->size()) + " entries");
    for (int i = 0; i < n; ++i) {
      const Json& e = (*lt)[i];
      std::string s = e.is_string() ? e.get<std::string>() : "";
      if (s != "full_attention" && s != "linear_attention")
        f.bad("layer_types",
              "entries \"full_attention\" or \"linear_attention\"",
              json_brief(e) + " at index " + std::to_string(i));
      c.full_attention[i] = s == "full_attention";
    }
    return;
  }
  // Without layer_types, transformers places full attention on every interval-th layer.
  int interval = f.opt_int("full_attention_interval", 4);
  if (interval <= 0) f.bad("full_attention_interval", "a positive integer");
  for (int i = 0; i < n; ++i) c.full_attention[i] = (i + 1) % interval == 0;
}

void parse_rope(const Json& text, const std::string& prefix, const std::string& origin,
                TargetConfig& c) {
  ConfigFields t(origin, {{&text, prefix}});
  const Json* params = t.opt_object("rope_parameters");
  const Json* scaling = t.opt_object("rope_scaling");  // transformers 4.x spelling
  // transformers 5 keeps everything in rope_parameters; 4.x wrote theta and factor at the
  // top of text_config and mrope_section in rope_scaling.
  ConfigFields r(origin, {{params, prefix + "rope_parameters."},
                          {&text, prefix},
                          {scaling, prefix + "rope_scaling."}});
  // The 27B config repeats partial_rotary_factor beside rope_parameters; a disagreement means a
  // hand-edited file, and silently picking one would change every rotary position.
  for (const char* k : {"rope_theta", "partial_rotary_factor"}) {
    if (!params || !params->contains(k) || !text.contains(k)) continue;
    const Json& a = (*params)[k];
    const Json& b = text[k];
    if (!a.is_null() && !b.is_null() && a != b)
      config_error(origin, "field '%srope_parameters.%s' = %s disagrees with '%s%s' = %s",
                   prefix.c_str(), k, json_brief(a).c_str(), prefix.c_str(), k,
                   json_brief(b).c_str());
  }
  std::string type = r.opt_str("rope_type", r.opt_str("type", "default"));
  if (type != "default" && type != "mrope")
    r.bad(r.has("rope_type") ? "rope_type" : "type", "\"default\" (no rope scaling)");
  c.rope_theta = r.req_num("rope_theta");
  if (c.rope_theta <= 0) r.bad("rope_theta", "a positive number");
  c.partial_rotary_factor = r.req_num("partial_rotary_factor");
  if (!(c.partial_rotary_factor > 0 && c.partial_rotary_factor <= 1))
    r.bad("partial_rotary_factor", "a number in (0, 1]");
  double rot = c.head_dim * c.partial_rotary_factor;
  long rot_i = std::lround(rot);
  if (std::fabs(rot - static_cast<double>(rot_i)) > 1e-9 || rot_i % 2 != 0 || rot_i <= 0)
    r.bad("partial_rotary_factor",
          "head_dim x factor to be a positive even integer",
          strf("%d x %g = %g", c.head_dim, c.partial_rotary_factor, rot));
  c.rotary_dim = static_cast<int>(rot_i);
  c.mrope_section = r.opt_int_list("mrope_section");
  if (!c.mrope_section.empty()) {
    long long sum = 0;  // entries are client-of-the-file data: up to INT_MAX each, so no int sum
    for (int s : c.mrope_section) {
      if (s < 0) r.bad("mrope_section", "non-negative entries");
      sum += s;
    }
    if (sum != c.rotary_dim / 2)
      r.bad("mrope_section", strf("entries summing to rotary_dim/2 = %d", c.rotary_dim / 2),
            ints_str(c.mrope_section) + " (sum " + std::to_string(sum) + ")");
  }
  c.mrope_interleaved = r.opt_bool("mrope_interleaved", false);
}

}  // namespace

int TargetConfig::n_full_layers() const {
  int n = 0;
  for (bool f : full_attention) n += f ? 1 : 0;
  return n;
}

int TargetConfig::n_gdn_layers() const {
  return static_cast<int>(full_attention.size()) - n_full_layers();
}

TargetConfig parse_target_config(const std::string& json_text, const std::string& origin) {
  const Json root = parse_config_json(json_text, origin);
  TargetConfig c;
  c.path = origin;
  ConfigFields top(origin, {{&root, ""}});
  c.model_type = top.req_str("model_type");
  const Json* text = nullptr;
  std::string prefix;
  if (c.model_type == "qwen3_5") {
    c.layout = "multimodal";
    text = top.opt_object("text_config");
    if (!text) top.missing("text_config");
    prefix = "text_config.";
  } else if (c.model_type == "qwen3_5_text") {
    c.layout = "text";
    text = &root;
  } else {
    top.bad("model_type", "\"qwen3_5\" or \"qwen3_5_text\"");
  }
  ConfigFields f(origin, {{text, prefix}});
  if (c.layout == "multimodal" && f.opt_str("model_type", "qwen3_5_text") != "qwen3_5_text")
    f.bad("model_type", "\"qwen3_5_text\"");

  c.hidden_size = f.req_pos_int("hidden_size");
  c.num_hidden_layers = f.req_pos_int("num_hidden_layers");
  c.num_attention_heads = f.req_pos_int("num_attention_heads");
  c.num_key_value_heads = f.req_pos_int("num_key_value_heads");
  c.head_dim = f.req_pos_int("head_dim");
  c.linear_num_key_heads = f.req_pos_int("linear_num_key_heads");
  c.linear_num_value_heads = f.req_pos_int("linear_num_value_heads");
  c.linear_key_head_dim = f.req_pos_int("linear_key_head_dim");
  c.linear_value_head_dim = f.req_pos_int("linear_value_head_dim");
  c.linear_conv_kernel_dim = f.req_pos_int("linear_conv_kernel_dim");
  c.intermediate_size = f.req_pos_int("intermediate_size");
  c.vocab_size = f.req_pos_int("vocab_size");
  c.max_position_embeddings = f.req_pos_int("max_position_embeddings");
  c.mtp_num_hidden_layers = f.opt_int("mtp_num_hidden_layers", 0);
  if (c.mtp_num_hidden_layers < 0) f.bad("mtp_num_hidden_layers", "a non-negative integer");

  if (c.num_attention_heads % c.num_key_value_heads != 0)
    f.bad("num_attention_heads",
          "a multiple of num_key_value_heads " + std::to_string(c.num_key_value_heads));
  if (c.linear_num_value_heads % c.linear_num_key_heads != 0)
    f.bad("linear_num_value_heads",
          "a multiple of linear_num_key_heads " + std::to_string(c.linear_num_key_heads));

  c.hidden_act = f.req_str("hidden_act");
  if (c.hidden_act != "silu") f.bad("hidden_act", "\"silu\"");
  c.rms_norm_eps = f.req_num("rms_norm_eps");
  if (c.rms_norm_eps <= 0) f.bad("rms_norm_eps", "a positive number");
  // transformers does not write attn_output_gate for qwen3_5 (the gate is always on); older
  // exports do. Either way the gated attention path is the only one implemented.
  c.attn_output_gate = f.opt_bool("attn_output_gate", true);
  if (!c.attn_output_gate) f.bad("attn_output_gate", "true");
  c.attention_bias = f.opt_bool("attention_bias", false);
  if (c.attention_bias) f.bad("attention_bias", "false");

  parse_layer_types(f, c);
  parse_rope(*text, prefix, origin, c);

  // The multimodal wrapper's top-level value is the one transformers applies.
  ConfigFields tie(origin, {{&root, ""}, {text, prefix}});
  c.tie_word_embeddings = tie.opt_bool("tie_word_embeddings", false);

  ConfigFields ids(origin, {{text, prefix}, {&root, ""}});
  c.eos_token_ids = ids.opt_int_or_list("eos_token_id");
  for (int id : c.eos_token_ids)
    if (id < 0 || id >= c.vocab_size)
      ids.bad("eos_token_id", strf("ids in [0, %d)", c.vocab_size));
  c.bos_token_id = ids.opt_int("bos_token_id", -1);
  if (ids.has("bos_token_id") && (c.bos_token_id < 0 || c.bos_token_id >= c.vocab_size))
    ids.bad("bos_token_id", strf("an id in [0, %d)", c.vocab_size));

  parse_quantization(root, origin, c);
  return c;
}

namespace {

// A folder, or anything not naming a .json file, means "<path>/config.json"; that keeps the
// error for a missing model folder pointing at the file we wanted.
std::string config_path_of(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec) || !path.ends_with(".json"))
    return path + "/config.json";
  return path;
}

}  // namespace

TargetConfig load_target_config(const std::string& path) {
  std::string p = config_path_of(path);
  return parse_target_config(read_text_file(p), p);
}

DrafterConfig load_drafter_config(const std::string& path) {
  std::string p = config_path_of(path);
  return parse_drafter_config(read_text_file(p), p);
}

}  // namespace qf
