#include "support/test_models.h"

#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <unistd.h>

#include "core/dtype.h"
#include "io/safetensors.h"

namespace qf::test {

namespace fs = std::filesystem;

std::string temp_dir(const std::string& name) {
  static int counter = 0;
  fs::path p = fs::temp_directory_path() /
               ("qflash_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) + "_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

namespace {

// Collects bf16 tensors and writes them in one file.
struct Writer {
  std::mt19937_64 rng;
  std::vector<std::unique_ptr<std::vector<uint16_t>>> bufs;
  std::vector<TensorToWrite> tensors;
  explicit Writer(uint64_t seed) : rng(seed) {}
  void add(const std::string& name, std::vector<int64_t> shape, float mean, float std) {
    int64_t n = 1;
    for (auto s : shape) n *= s;
    auto buf = std::make_unique<std::vector<uint16_t>>(n);
    std::normal_distribution<float> nd(mean, std);
    for (auto& v : *buf) v = f32_to_bf16(nd(rng));
    tensors.push_back({name, DType::BF16, shape, buf->data()});
    bufs.push_back(std::move(buf));
  }
  void add_uniform(const std::string& name, std::vector<int64_t> shape, float lo, float hi) {
    int64_t n = 1;
    for (auto s : shape) n *= s;
    auto buf = std::make_unique<std::vector<uint16_t>>(n);
    std::uniform_real_distribution<float> ud(lo, hi);
    for (auto& v : *buf) v = f32_to_bf16(ud(rng));
    tensors.push_back({name, DType::BF16, shape, buf->data()});
    bufs.push_back(std::move(buf));
  }
  void write(const std::string& path) { write_safetensors(path, tensors, {{"format", "pt"}}); }
};

void add_attention(Writer& w, const std::string& p, const TinyTarget& t) {
  const float s = t.weight_std;
  const int H = t.hidden, qd = t.heads * t.head_dim, kd = t.kv_heads * t.head_dim;
  w.add(p + "self_attn.q_proj.weight", {2 * qd, H}, 0, s);
  w.add(p + "self_attn.k_proj.weight", {kd, H}, 0, s);
  w.add(p + "self_attn.v_proj.weight", {kd, H}, 0, s);
  w.add(p + "self_attn.o_proj.weight", {H, qd}, 0, s);
  w.add(p + "self_attn.q_norm.weight", {t.head_dim}, 0, 0.1f);
  w.add(p + "self_attn.k_norm.weight", {t.head_dim}, 0, 0.1f);
}

void add_mlp_norms(Writer& w, const std::string& p, const TinyTarget& t) {
  const float s = t.weight_std;
  w.add(p + "input_layernorm.weight", {t.hidden}, 0, 0.1f);
  w.add(p + "post_attention_layernorm.weight", {t.hidden}, 0, 0.1f);
  w.add(p + "mlp.gate_proj.weight", {t.intermediate, t.hidden}, 0, s);
  w.add(p + "mlp.up_proj.weight", {t.intermediate, t.hidden}, 0, s);
  w.add(p + "mlp.down_proj.weight", {t.hidden, t.intermediate}, 0, s);
}

}  // namespace

std::string write_tiny_target(const std::string& dir, const TinyTarget& t) {
  fs::create_directories(dir);
  Writer w(t.seed);
  const int H = t.hidden;
  const int kdim = t.gdn_k_heads * t.gdn_dk, vdim = t.gdn_v_heads * t.gdn_dv, cdim = 2 * kdim + vdim;
  w.add("model.embed_tokens.weight", {t.vocab, H}, 0, 1.0f);
  w.add("lm_head.weight", {t.vocab, H}, 0, t.weight_std);
  w.add("model.norm.weight", {H}, 0, 0.1f);
  nlohmann::json layer_types = nlohmann::json::array();
  for (int L = 0; L < t.layers; L++) {
    const std::string p = "model.layers." + std::to_string(L) + ".";
    const bool full = (L + 1) % 4 == 0;
    layer_types.push_back(full ? "full_attention" : "linear_attention");
    add_mlp_norms(w, p, t);
    if (full) {
      add_attention(w, p, t);
    } else {
      const std::string g = p + "linear_attn.";
      w.add(g + "in_proj_qkv.weight", {cdim, H}, 0, t.weight_std);
      w.add(g + "in_proj_z.weight", {vdim, H}, 0, t.weight_std);
      w.add(g + "in_proj_a.weight", {t.gdn_v_heads, H}, 0, t.weight_std);
      w.add(g + "in_proj_b.weight", {t.gdn_v_heads, H}, 0, t.weight_std);
      w.add(g + "out_proj.weight", {H, vdim}, 0, t.weight_std);
      w.add(g + "conv1d.weight", {cdim, 1, t.conv}, 0, 0.3f);
      w.add_uniform(g + "A_log", {t.gdn_v_heads}, 0.0f, 2.5f);
      w.add(g + "dt_bias", {t.gdn_v_heads}, 0, 0.5f);
      w.add(g + "norm.weight", {t.gdn_dv}, 1.0f, 0.1f);
    }
  }
  if (t.mtp) {
    w.add("mtp.fc.weight", {H, 2 * H}, 0, t.weight_std);
    w.add("mtp.pre_fc_norm_embedding.weight", {H}, 0, 0.1f);
    w.add("mtp.pre_fc_norm_hidden.weight", {H}, 0, 0.1f);
    w.add("mtp.norm.weight", {H}, 0, 0.1f);
    add_mlp_norms(w, "mtp.layers.0.", t);
    add_attention(w, "mtp.layers.0.", t);
  }
  w.write((fs::path(dir) / "model.safetensors").string());
  const int rot = t.head_dim / 4;
  nlohmann::json cfg = {
      {"architectures", {"Qwen3_5ForCausalLM"}},
      {"model_type", "qwen3_5_text"},
      {"hidden_size", H},
      {"num_hidden_layers", t.layers},
      {"layer_types", layer_types},
      {"full_attention_interval", 4},
      {"num_attention_heads", t.heads},
      {"num_key_value_heads", t.kv_heads},
      {"head_dim", t.head_dim},
      {"linear_num_key_heads", t.gdn_k_heads},
      {"linear_num_value_heads", t.gdn_v_heads},
      {"linear_key_head_dim", t.gdn_dk},
      {"linear_value_head_dim", t.gdn_dv},
      {"linear_conv_kernel_dim", t.conv},
      {"intermediate_size", t.intermediate},
      {"vocab_size", t.vocab},
      {"hidden_act", "silu"},
      {"rms_norm_eps", 1e-6},
      {"tie_word_embeddings", false},
      {"attn_output_gate", true},
      {"attention_bias", false},
      {"max_position_embeddings", 262144},
      {"mtp_num_hidden_layers", t.mtp ? 1 : 0},
      {"eos_token_id", t.vocab - 2},
      {"rope_parameters",
       {{"rope_type", "default"},
        {"rope_theta", 10000000.0},
        {"partial_rotary_factor", 0.25},
        {"mrope_section", {rot / 2 - 2 * (rot / 8), rot / 8, rot / 8}},
        {"mrope_interleaved", true}}},
  };
  write_file_atomic((fs::path(dir) / "config.json").string(), cfg.dump(2));
  return dir;
}

std::string write_tiny_drafter(const std::string& dir, const TinyDrafter& d, const TinyTarget& t) {
  fs::create_directories(dir);
  Writer w(d.seed);
  const int H = t.hidden, Nt = static_cast<int>(d.taps.size());
  const float s = 0.05f;
  w.add("fc.weight", {H, Nt * H}, 0, s);
  w.add("hidden_norm.weight", {H}, 1.0f, 0.1f);
  w.add("norm.weight", {H}, 1.0f, 0.1f);
  const int G = H / d.conv_group;
  for (int l = 0; l < d.layers; l++) {
    const std::string p = "layers." + std::to_string(l) + ".";
    w.add(p + "input_layernorm.weight", {H}, 1.0f, 0.1f);
    w.add(p + "post_attention_layernorm.weight", {H}, 1.0f, 0.1f);
    w.add(p + "self_attn.q_proj.weight", {d.heads * d.head_dim, H}, 0, s);
    w.add(p + "self_attn.k_proj.weight", {d.kv_heads * d.head_dim, H}, 0, s);
    w.add(p + "self_attn.v_proj.weight", {d.kv_heads * d.head_dim, H}, 0, s);
    w.add(p + "self_attn.o_proj.weight", {H, d.heads * d.head_dim}, 0, s);
    w.add(p + "self_attn.q_norm.weight", {d.head_dim}, 1.0f, 0.1f);
    w.add(p + "self_attn.k_norm.weight", {d.head_dim}, 1.0f, 0.1f);
    w.add(p + "mlp.gate_proj.weight", {d.intermediate, H}, 0, s);
    w.add(p + "mlp.up_proj.weight", {d.intermediate, H}, 0, s);
    w.add(p + "mlp.down_proj.weight", {H, d.intermediate}, 0, s);
    if (d.v2) {
      for (const char* c : {"attention_conv.", "mlp_conv."}) {
        w.add(p + c + "base_kernel", {2, d.conv_kernel, H}, 0.5f, 0.2f);
        w.add(p + c + "kernel_projection.weight", {2 * d.conv_kernel * G, H}, 0, s);
      }
    }
  }
  if (d.v2) {
    w.add("candidate_selector.hidden_projection.weight", {d.rank, H}, 0, s);
    w.add("candidate_selector.predecessor_codebook", {t.vocab, d.rank}, 0, 0.3f);
    w.add("candidate_selector.successor_codebook", {t.vocab, d.rank}, 0, 0.3f);
  }
  w.write((fs::path(dir) / "model.safetensors").string());
  nlohmann::json lt = nlohmann::json::array();
  for (int l = 0; l < d.layers; l++) lt.push_back("sliding_attention");
  nlohmann::json dc = {{"block_size", d.block}, {"mask_token_id", d.mask_id}, {"target_layer_ids", d.taps}};
  if (d.v2) {
    dc["conv_kernel_size"] = d.conv_kernel;
    dc["conv_group_size"] = d.conv_group;
    dc["selector_rank"] = d.rank;
    dc["selector_top_k"] = d.top_k;
  }
  nlohmann::json cfg = {
      {"architectures", {d.v2 ? "DFlash2DraftModel" : "DFlashDraftModel"}},
      {"model_type", "qwen3"},
      {"attention_bias", false},
      {"is_causal", false},
      {"hidden_size", H},
      {"intermediate_size", d.intermediate},
      {"hidden_act", "silu"},
      {"num_hidden_layers", d.layers},
      {"num_attention_heads", d.heads},
      {"num_key_value_heads", d.kv_heads},
      {"head_dim", d.head_dim},
      {"num_target_layers", t.layers},
      {"layer_types", lt},
      {"sliding_window", d.window},
      {"use_sliding_window", true},
      {"max_window_layers", d.layers},
      {"max_position_embeddings", 262144},
      {"rope_parameters", {{"rope_theta", 10000000.0}, {"rope_type", "default"}}},
      {"rms_norm_eps", 1e-6},
      {"tie_word_embeddings", false},
      {"vocab_size", t.vocab},
      {"eos_token_id", t.vocab - 2},
      {"dflash_config", dc},
  };
  write_file_atomic((fs::path(dir) / "config.json").string(), cfg.dump(2));
  return dir;
}

}  // namespace qf::test
