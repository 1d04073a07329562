// Target config.json parsing (src/io/config.h) against fixtures written from docs/spec/qwen38.md and
// by transformers itself (tests/fixtures/configs/make_configs.py).
#include <gtest/gtest.h>

#include <functional>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/config.h"
#include "io/safetensors.h"

namespace {

using nlohmann::json;

const std::string kFixtures = std::string(QFLASH_SOURCE_DIR) + "/tests/fixtures/configs/";
const std::string k27b = kFixtures + "qwen38_27b";
const std::string kTiny = kFixtures + "qwen38_tiny_text";

json fixture(const std::string& dir) {
  return json::parse(qf::read_text_file(dir + "/config.json"));
}

// Parses `base` after `edit`; the origin string is what errors must name.
qf::TargetConfig parse_edited(const std::string& base, const std::function<void(json&)>& edit) {
  json j = fixture(base);
  edit(j);
  return qf::parse_target_config(j.dump(), "edited/config.json");
}

// The edit must fail with a Config error containing every needle.
void expect_config_error(const std::string& base, const std::function<void(json&)>& edit,
                         const std::vector<std::string>& needles,
                         qf::ErrorKind kind = qf::ErrorKind::Config) {
  try {
    parse_edited(base, edit);
  } catch (const qf::Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    for (const auto& n : needles)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos)
          << "message lacks '" << n << "': " << e.what();
    EXPECT_NE(std::string(e.what()).find("edited/config.json"), std::string::npos) << e.what();
    return;
  }
  ADD_FAILURE() << "edit accepted";
}

}  // namespace

TEST(ConfigTarget, Full27bMultimodal) {
  qf::TargetConfig c = qf::load_target_config(k27b);
  EXPECT_EQ(c.path, k27b + "/config.json");
  EXPECT_EQ(c.layout, "multimodal");
  EXPECT_EQ(c.model_type, "qwen3_5");
  // Expected values: docs/spec/qwen38.md section 1.2 and 1.3.
  EXPECT_EQ(c.hidden_size, 5120);
  EXPECT_EQ(c.num_hidden_layers, 64);
  EXPECT_EQ(c.num_attention_heads, 24);
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.linear_num_key_heads, 16);
  EXPECT_EQ(c.linear_num_value_heads, 48);
  EXPECT_EQ(c.linear_key_head_dim, 128);
  EXPECT_EQ(c.linear_value_head_dim, 128);
  EXPECT_EQ(c.linear_conv_kernel_dim, 4);
  EXPECT_EQ(c.intermediate_size, 17408);
  EXPECT_EQ(c.vocab_size, 248320);
  EXPECT_EQ(c.hidden_act, "silu");
  EXPECT_EQ(c.rope_theta, 10000000.0);
  EXPECT_EQ(c.partial_rotary_factor, 0.25);
  EXPECT_EQ(c.rotary_dim, 64);
  EXPECT_EQ(c.mrope_section, (std::vector<int>{11, 11, 10}));
  EXPECT_TRUE(c.mrope_interleaved);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_TRUE(c.attn_output_gate);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_EQ(c.max_position_embeddings, 262144);
  EXPECT_EQ(c.mtp_num_hidden_layers, 1);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int>{248044}));
  EXPECT_EQ(c.bos_token_id, 248044);
  EXPECT_EQ(c.quant_bits, 0);
  ASSERT_EQ(c.full_attention.size(), 64u);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(c.full_attention[i], i % 4 == 3) << "layer " << i;
  EXPECT_EQ(c.n_full_layers(), 16);
  EXPECT_EQ(c.n_gdn_layers(), 48);
  EXPECT_EQ(c.gdn_key_dim(), 2048);
  EXPECT_EQ(c.gdn_value_dim(), 6144);
  EXPECT_EQ(c.gdn_conv_dim(), 10240);
  // Same result when given the file itself.
  EXPECT_EQ(qf::load_target_config(k27b + "/config.json").hidden_size, 5120);
}

TEST(ConfigTarget, TinyTextAsTransformersWritesIt) {
  qf::TargetConfig c = qf::load_target_config(kTiny);
  // Expected values: docs/spec/qwen38.md section 9.
  EXPECT_EQ(c.layout, "text");
  EXPECT_EQ(c.model_type, "qwen3_5_text");
  EXPECT_EQ(c.hidden_size, 256);
  EXPECT_EQ(c.num_hidden_layers, 8);
  EXPECT_EQ(c.full_attention,
            (std::vector<bool>{false, false, false, true, false, false, false, true}));
  EXPECT_EQ(c.num_attention_heads, 4);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.gdn_key_dim(), 128);
  EXPECT_EQ(c.gdn_value_dim(), 384);
  EXPECT_EQ(c.gdn_conv_dim(), 640);
  EXPECT_EQ(c.intermediate_size, 768);
  EXPECT_EQ(c.vocab_size, 8192);
  EXPECT_EQ(c.rotary_dim, 16);
  EXPECT_EQ(c.mrope_section, (std::vector<int>{3, 3, 2}));
  EXPECT_EQ(c.rope_theta, 1e7);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_TRUE(c.attn_output_gate);  // transformers does not write the field
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.mtp_num_hidden_layers, 1);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int>{8190}));
}

TEST(ConfigTarget, OldRopeLayoutAtTopLevel) {
  qf::TargetConfig c = parse_edited(kTiny, [](json& j) {
    j.erase("rope_parameters");
    j["rope_theta"] = 5e6;
    j["partial_rotary_factor"] = 0.5;
    j["rope_scaling"] = {{"type", "mrope"}, {"mrope_section", {6, 5, 5}}};
  });
  EXPECT_EQ(c.rope_theta, 5e6);
  EXPECT_EQ(c.rotary_dim, 32);
  EXPECT_EQ(c.mrope_section, (std::vector<int>{6, 5, 5}));
}

TEST(ConfigTarget, LayerTypesFromInterval) {
  qf::TargetConfig c = parse_edited(kTiny, [](json& j) { j.erase("layer_types"); });
  EXPECT_EQ(c.full_attention,
            (std::vector<bool>{false, false, false, true, false, false, false, true}));
  c = parse_edited(kTiny, [](json& j) {
    j.erase("layer_types");
    j["full_attention_interval"] = 2;
  });
  EXPECT_EQ(c.full_attention,
            (std::vector<bool>{false, true, false, true, false, true, false, true}));
}

TEST(ConfigTarget, EosListAndTopLevelTie) {
  qf::TargetConfig c = parse_edited(k27b, [](json& j) {
    j["text_config"]["eos_token_id"] = {248046, 248044};
    j["tie_word_embeddings"] = true;  // the wrapper's value wins over text_config's false
  });
  EXPECT_EQ(c.eos_token_ids, (std::vector<int>{248046, 248044}));
  EXPECT_TRUE(c.tie_word_embeddings);
  c = parse_edited(kTiny, [](json& j) {
    j["eos_token_id"] = nullptr;
    j["bos_token_id"] = nullptr;
  });
  EXPECT_TRUE(c.eos_token_ids.empty());
  EXPECT_EQ(c.bos_token_id, -1);
}

TEST(ConfigTarget, MlxQuantization) {
  qf::TargetConfig c = parse_edited(k27b, [](json& j) {
    j["quantization"] = {{"group_size", 64}, {"bits", 4}, {"mode", "affine"}};
  });
  EXPECT_EQ(c.quant_bits, 4);
  EXPECT_EQ(c.quant_group, 64);
  c = parse_edited(k27b, [](json& j) {
    j["quantization"] = {{"group_size", 128}, {"bits", 4},
                         {"language_model.model.layers.0.mlp.gate_proj",
                          {{"group_size", 128}, {"bits", 4}}}};
  });
  EXPECT_EQ(c.quant_group, 128);
  c = parse_edited(k27b, [](json& j) {  // mlx mirrors the block under quantization_config
    j["quantization_config"] = {{"group_size", 32}, {"bits", 4}};
  });
  EXPECT_EQ(c.quant_group, 32);
}

TEST(ConfigTarget, QuantizationErrors) {
  expect_config_error(k27b, [](json& j) { j["quantization"] = {{"group_size", 64}, {"bits", 8}}; },
                      {"'quantization.bits'", "expected 4", "found 8"});
  expect_config_error(k27b, [](json& j) { j["quantization"] = {{"group_size", 48}, {"bits", 4}}; },
                      {"'quantization.group_size'", "32, 64 or 128", "found 48"});
  expect_config_error(k27b,
                      [](json& j) {
                        j["quantization"] = {{"group_size", 64}, {"bits", 4}, {"mode", "mxfp4"}};
                      },
                      {"'quantization.mode'", "\"affine\"", "\"mxfp4\""});
  expect_config_error(k27b, [](json& j) { j["quantization"] = {{"group_size", 64}}; },
                      {"field 'quantization.bits' is missing"});
  expect_config_error(k27b,
                      [](json& j) {
                        j["quantization"] = {{"group_size", 64}, {"bits", 4},
                                             {"lm_head", {{"group_size", 64}, {"bits", 8}}}};
                      },
                      {"'quantization.lm_head.bits'", "found 8"});
  expect_config_error(k27b,
                      [](json& j) {
                        j["quantization_config"] = {{"quant_method", "gptq"}, {"bits", 4}};
                      },
                      {"'quantization_config.quant_method'", "\"gptq\""});
}

TEST(ConfigTarget, MissingFieldMessage) {
  try {
    parse_edited(k27b, [](json& j) { j["text_config"].erase("hidden_size"); });
    ADD_FAILURE() << "missing hidden_size accepted";
  } catch (const qf::Error& e) {
    EXPECT_EQ(e.kind(), qf::ErrorKind::Config);
    EXPECT_EQ(std::string(e.what()),
              "config.json (edited/config.json): field 'text_config.hidden_size' is missing");
  }
  expect_config_error(kTiny, [](json& j) { j.erase("vocab_size"); },
                      {"field 'vocab_size' is missing"});
  expect_config_error(k27b, [](json& j) { j.erase("text_config"); },
                      {"field 'text_config' is missing"});
  expect_config_error(k27b, [](json& j) { j.erase("model_type"); },
                      {"field 'model_type' is missing"});
  expect_config_error(k27b, [](json& j) { j["text_config"].erase("rms_norm_eps"); },
                      {"'text_config.rms_norm_eps' is missing"});
  expect_config_error(kTiny, [](json& j) { j["rope_parameters"].erase("rope_theta"); },
                      {"'rope_parameters.rope_theta' is missing"});
}

// The 27B config carries the factor twice (text_config and rope_parameters); keep them equal.
void set_factor(json& j, double f) {
  j["text_config"]["rope_parameters"]["partial_rotary_factor"] = f;
  j["text_config"]["partial_rotary_factor"] = f;
}

struct FieldCase {
  const char* what;
  std::function<void(json&)> edit;
  std::vector<std::string> needles;
};

TEST(ConfigTarget, FieldValueErrors) {
  auto tc = [](const char* k, json v) { return [k, v](json& j) { j["text_config"][k] = v; }; };
  const std::vector<FieldCase> cases = {
      {"hidden_act", tc("hidden_act", "gelu"),
       {"'text_config.hidden_act'", "expected \"silu\"", "found \"gelu\""}},
      {"hidden_size string", tc("hidden_size", "5120"),
       {"'text_config.hidden_size'", "integer", "\"5120\""}},
      {"hidden_size fraction", tc("hidden_size", 5120.5), {"'text_config.hidden_size'", "5120.5"}},
      {"hidden_size huge", tc("hidden_size", 1ll << 40),
       {"'text_config.hidden_size'", "int range"}},
      {"vocab zero", tc("vocab_size", 0), {"'text_config.vocab_size'", "positive", "found 0"}},
      {"negative layers", tc("num_hidden_layers", -64), {"'text_config.num_hidden_layers'", "-64"}},
      {"conv kernel zero", tc("linear_conv_kernel_dim", 0),
       {"'text_config.linear_conv_kernel_dim'"}},
      {"kv heads", tc("num_key_value_heads", 5),
       {"'text_config.num_attention_heads'", "multiple of num_key_value_heads 5", "found 24"}},
      {"gdn heads", tc("linear_num_value_heads", 40),
       {"'text_config.linear_num_value_heads'", "linear_num_key_heads 16", "found 40"}},
      {"gate off", tc("attn_output_gate", false),
       {"'text_config.attn_output_gate'", "found false"}},
      {"gate type", tc("attn_output_gate", 1), {"'text_config.attn_output_gate'", "true or false"}},
      {"bias on", tc("attention_bias", true), {"'text_config.attention_bias'", "found true"}},
      {"eps zero", tc("rms_norm_eps", 0.0), {"'text_config.rms_norm_eps'", "positive"}},
      {"eps negative", tc("rms_norm_eps", -1e-6), {"'text_config.rms_norm_eps'"}},
      {"eos out of vocab", tc("eos_token_id", 248320), {"'text_config.eos_token_id'", "248320"}},
      {"eos bad list", tc("eos_token_id", json::array({1, "x"})), {"'text_config.eos_token_id'"}},
      {"bos negative", tc("bos_token_id", -2), {"'text_config.bos_token_id'"}},
      {"layer type entry",
       [](json& j) { j["text_config"]["layer_types"][5] = "sliding_attention"; },
       {"'text_config.layer_types'", "\"sliding_attention\" at index 5"}},
      {"layer types length",
       [](json& j) { j["text_config"]["layer_types"].erase(0); },
       {"'text_config.layer_types'", "64 entries", "found 63 entries"}},
      {"interval zero",
       [](json& j) {
         j["text_config"].erase("layer_types");
         j["text_config"]["full_attention_interval"] = 0;
       },
       {"'text_config.full_attention_interval'"}},
      {"mrope sum",
       [](json& j) { j["text_config"]["rope_parameters"]["mrope_section"] = {11, 11, 11}; },
       {"'text_config.rope_parameters.mrope_section'", "rotary_dim/2 = 32", "(sum 33)"}},
      {"rotary odd",  // 256 x 33/256 = 33: an integer but odd
       [](json& j) { set_factor(j, 0.12890625); },
       {"'text_config.rope_parameters.partial_rotary_factor'", "even integer", "= 33"}},
      {"rotary fraction",
       [](json& j) { set_factor(j, 0.3); },
       {"'text_config.rope_parameters.partial_rotary_factor'", "76.8"}},
      {"rope factor conflict",
       [](json& j) { j["text_config"]["rope_parameters"]["partial_rotary_factor"] = 0.5; },
       {"'text_config.rope_parameters.partial_rotary_factor' = 0.5",
        "'text_config.partial_rotary_factor' = 0.25"}},
      {"rope type", [](json& j) { j["text_config"]["rope_parameters"]["rope_type"] = "yarn"; },
       {"'text_config.rope_parameters.rope_type'", "\"yarn\""}},
      {"rope params not object", [](json& j) { j["text_config"]["rope_parameters"] = 3; },
       {"'text_config.rope_parameters'", "an object"}},
      {"model type", [](json& j) { j["model_type"] = "llama"; },
       {"'model_type'", "\"qwen3_5\" or \"qwen3_5_text\"", "found \"llama\""}},
      {"text model type", [](json& j) { j["text_config"]["model_type"] = "qwen3_5_moe_text"; },
       {"'text_config.model_type'", "qwen3_5_moe_text"}},
      {"text_config type", [](json& j) { j["text_config"] = json::array(); },
       {"'text_config'", "an object"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    expect_config_error(k27b, c.edit, c.needles);
  }
}

TEST(ConfigTarget, NotJsonOrNotFound) {
  try {
    qf::parse_target_config("{\"model_type\": ", "broken/config.json");
    ADD_FAILURE();
  } catch (const qf::Error& e) {
    EXPECT_EQ(e.kind(), qf::ErrorKind::Format);
    EXPECT_NE(std::string(e.what()).find("broken/config.json"), std::string::npos);
  }
  try {
    qf::parse_target_config("[1]", "arr/config.json");
    ADD_FAILURE();
  } catch (const qf::Error& e) {
    EXPECT_EQ(e.kind(), qf::ErrorKind::Format);
  }
  try {
    qf::load_target_config(kFixtures + "no_such_model");
    ADD_FAILURE();
  } catch (const qf::Error& e) {
    EXPECT_EQ(e.kind(), qf::ErrorKind::Io);
    EXPECT_NE(std::string(e.what()).find("no_such_model/config.json"), std::string::npos);
  }
}
