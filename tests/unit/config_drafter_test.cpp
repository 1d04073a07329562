// Drafter config.json parsing and target pairing guards (src/io/config.h) against fixtures
// written from docs/spec/dflash2.md sections 1.1 and 8 (tests/fixtures/configs/make_configs.py).
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/config.h"
#include "io/safetensors.h"

namespace {

using nlohmann::json;

const std::string kFixtures = std::string(QFLASH_SOURCE_DIR) + "/tests/fixtures/configs/";
const std::string kDrafter27b = kFixtures + "dflash2_27b";
const std::string kDrafterTiny = kFixtures + "dflash2_tiny";
const std::string kTarget27b = kFixtures + "qwen38_27b";
const std::string kTargetTiny = kFixtures + "qwen38_tiny_text";

json fixture(const std::string& dir) {
  return json::parse(qf::read_text_file(dir + "/config.json"));
}

qf::DrafterConfig parse_edited(const std::string& base, const std::function<void(json&)>& edit) {
  json j = fixture(base);
  edit(j);
  return qf::parse_drafter_config(j.dump(), "edited/config.json");
}

void expect_error_with(const std::function<void()>& fn, const std::vector<std::string>& needles) {
  try {
    fn();
  } catch (const qf::Error& e) {
    EXPECT_EQ(e.kind(), qf::ErrorKind::Config) << e.what();
    for (const auto& n : needles)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos)
          << "message lacks '" << n << "': " << e.what();
    return;
  }
  ADD_FAILURE() << "accepted";
}

void expect_drafter_error(const std::function<void(json&)>& edit,
                          const std::vector<std::string>& needles) {
  std::vector<std::string> all = needles;
  all.push_back("edited/config.json");
  expect_error_with([&] { parse_edited(kDrafterTiny, edit); }, all);
}

auto in_dflash(const char* key, json v) {
  return [key, v](json& j) { j["dflash_config"][key] = v; };
}

}  // namespace

TEST(ConfigDrafter, Published27b) {
  qf::DrafterConfig c = qf::load_drafter_config(kDrafter27b);
  // Expected values: docs/spec/dflash2.md section 1.1.
  EXPECT_EQ(c.path, kDrafter27b + "/config.json");
  EXPECT_EQ(c.architecture, "DFlash2DraftModel");
  EXPECT_TRUE(c.is_v2);
  EXPECT_EQ(c.hidden_size, 5120);
  EXPECT_EQ(c.intermediate_size, 17408);
  EXPECT_EQ(c.num_hidden_layers, 5);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.num_target_layers, 64);
  EXPECT_EQ(c.vocab_size, 248320);
  EXPECT_EQ(c.target_layer_ids, (std::vector<int>{5, 19, 33, 47, 61}));
  EXPECT_EQ(c.block_size, 8);
  EXPECT_EQ(c.mask_token_id, 248070);
  EXPECT_EQ(c.conv_kernel_size, 2);
  EXPECT_EQ(c.conv_group_size, 16);
  EXPECT_EQ(c.selector_rank, 256);
  EXPECT_EQ(c.selector_top_k, 16);
  EXPECT_EQ(c.sliding_window, 2048);
  EXPECT_FALSE(c.is_causal);
  EXPECT_EQ(c.rope_theta, 1e7);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.input_embedding_scale, 1.0);
  EXPECT_EQ(c.output_multiplier, 1.0);
  EXPECT_EQ(c.final_logit_softcapping, 0.0);
  qf::check_drafter_pair(c, qf::load_target_config(kTarget27b));
}

TEST(ConfigDrafter, TinyPairsWithTinyTarget) {
  qf::DrafterConfig c = qf::load_drafter_config(kDrafterTiny);
  // Expected values: docs/spec/dflash2.md section 8.
  EXPECT_EQ(c.hidden_size, 256);
  EXPECT_EQ(c.intermediate_size, 768);
  EXPECT_EQ(c.num_hidden_layers, 2);
  EXPECT_EQ(c.num_attention_heads, 4);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.num_target_layers, 8);
  EXPECT_EQ(c.target_layer_ids, (std::vector<int>{1, 3, 5}));
  EXPECT_EQ(c.block_size, 8);
  EXPECT_EQ(c.sliding_window, 64);
  EXPECT_FALSE(c.is_causal);
  EXPECT_EQ(c.selector_rank, 32);
  EXPECT_EQ(c.vocab_size, 8192);
  EXPECT_EQ(c.mask_token_id, 8191);
  qf::check_drafter_pair(c, qf::load_target_config(kTargetTiny));
}

TEST(ConfigDrafter, BuildTargetLayerIds) {
  // Spec values (dflash2.md 2.1, section 8) and Python 3's int(round(...)) for the others.
  EXPECT_EQ(qf::build_target_layer_ids(64, 5), (std::vector<int>{1, 16, 31, 46, 61}));
  EXPECT_EQ(qf::build_target_layer_ids(8, 2), (std::vector<int>{1, 5}));
  EXPECT_EQ(qf::build_target_layer_ids(64, 1), (std::vector<int>{32}));
  EXPECT_EQ(qf::build_target_layer_ids(7, 1), (std::vector<int>{3}));
  // Ties: 1 + 1.5 = 2.5 and 1 + 4.5 = 5.5 round to even (2, 6); half-away-from-zero gives 3, 6.
  EXPECT_EQ(qf::build_target_layer_ids(10, 5), (std::vector<int>{1, 2, 4, 6, 7}));
  EXPECT_EQ(qf::build_target_layer_ids(7, 3), (std::vector<int>{1, 2, 4}));
  EXPECT_EQ(qf::build_target_layer_ids(13, 3), (std::vector<int>{1, 6, 10}));
}

TEST(ConfigDrafter, DefaultsAndLookupOrder) {
  qf::DrafterConfig c = parse_edited(kDrafterTiny, [](json& j) {
    j["dflash_config"].erase("target_layer_ids");
    j["dflash_config"].erase("block_size");
  });
  EXPECT_EQ(c.target_layer_ids, (std::vector<int>{1, 5}));  // build_target_layer_ids(8, 2)
  EXPECT_EQ(c.block_size, 16);
  c = parse_edited(kDrafterTiny, [](json& j) { j["block_size"] = 4; });  // dflash_config wins
  EXPECT_EQ(c.block_size, 8);
  c = parse_edited(kDrafterTiny, [](json& j) {
    j["block_size"] = 4;
    j["dflash_config"].erase("block_size");
    j["dflash_config"]["output_multiplier"] = 0.19611613513818404;  // FX drafter values
    j["final_logit_softcapping"] = 20.0;
    j["dflash_config"]["input_embedding_scale"] = 2.0;
  });
  EXPECT_EQ(c.block_size, 4);
  EXPECT_EQ(c.output_multiplier, 0.19611613513818404);
  EXPECT_EQ(c.final_logit_softcapping, 20.0);
  EXPECT_EQ(c.input_embedding_scale, 2.0);
}

TEST(ConfigDrafter, WindowAndCausality) {
  qf::DrafterConfig c = parse_edited(kDrafterTiny, [](json& j) { j.erase("is_causal"); });
  EXPECT_TRUE(c.is_causal);  // default: causal on sliding layers
  c = parse_edited(kDrafterTiny, [](json& j) {
    j.erase("is_causal");
    j["layer_types"] = {"full_attention", "full_attention"};
    j["use_sliding_window"] = false;
  });
  EXPECT_FALSE(c.is_causal);
  EXPECT_EQ(c.sliding_window, 0);
  c = parse_edited(kDrafterTiny, [](json& j) {  // sliding layer types alone enable the window
    j["use_sliding_window"] = false;
  });
  EXPECT_EQ(c.sliding_window, 64);
  c = parse_edited(kDrafterTiny, [](json& j) { j.erase("layer_types"); });
  EXPECT_EQ(c.sliding_window, 64);  // use_sliding_window alone
}

TEST(ConfigDrafter, V1WithoutConvOrSelector) {
  qf::DrafterConfig c = parse_edited(kDrafterTiny, [](json& j) {
    j["architectures"] = {"DFlashDraftModel"};
    for (const char* k : {"conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"})
      j["dflash_config"].erase(k);
  });
  EXPECT_FALSE(c.is_v2);
  EXPECT_EQ(c.conv_kernel_size, 0);
  EXPECT_EQ(c.selector_top_k, 0);
}

TEST(ConfigDrafter, FieldErrors) {
  expect_drafter_error([](json& j) { j["dflash_config"].erase("selector_top_k"); },
                       {"field 'dflash_config.selector_top_k' is missing",
                        "also looked for 'selector_top_k'"});
  expect_drafter_error([](json& j) { j["dflash_config"].erase("mask_token_id"); },
                       {"'dflash_config.mask_token_id' is missing"});
  expect_drafter_error([](json& j) { j.erase("num_target_layers"); },
                       {"'dflash_config.num_target_layers' is missing", "'num_target_layers'"});
  expect_drafter_error([](json& j) { j.erase("hidden_size"); }, {"'hidden_size' is missing"});
  expect_drafter_error([](json& j) { j.erase("architectures"); }, {"'architectures' is missing"});
  expect_drafter_error([](json& j) { j["architectures"] = json::array(); }, {"'architectures'"});
  expect_drafter_error([](json& j) { j["num_key_value_heads"] = 3; },
                       {"'num_attention_heads'", "num_key_value_heads 3", "found 4"});
  expect_drafter_error([](json& j) { j["head_dim"] = 63; }, {"'head_dim'", "even", "found 63"});
  expect_drafter_error(in_dflash("conv_group_size", 24),
                       {"'dflash_config.conv_group_size'", "hidden_size 256", "found 24"});
  expect_drafter_error(in_dflash("conv_kernel_size", 9),
                       {"'dflash_config.conv_kernel_size'", "block_size 8", "found 9"});
  expect_drafter_error(in_dflash("selector_top_k", 8193),
                       {"'dflash_config.selector_top_k'", "vocab_size 8192", "found 8193"});
  expect_drafter_error(in_dflash("target_layer_ids", json::array()),
                       {"'dflash_config.target_layer_ids'", "non-empty"});
  expect_drafter_error(in_dflash("target_layer_ids", {1, -1}),
                       {"'dflash_config.target_layer_ids'", "found -1"});
  expect_drafter_error(in_dflash("mask_token_id", -5), {"'dflash_config.mask_token_id'", "-5"});
  expect_drafter_error(in_dflash("block_size", 0), {"'dflash_config.block_size'", "found 0"});
  expect_drafter_error([](json& j) { j["sliding_window"] = 4; },
                       {"'sliding_window'", "block_size 8", "found 4"});
  expect_drafter_error([](json& j) { j.erase("sliding_window"); }, {"'sliding_window' is missing"});
  expect_drafter_error([](json& j) { j["layer_types"] = {"sliding_attention", "full_attention"}; },
                       {"'layer_types'", "same kind"});
  expect_drafter_error([](json& j) { j["layer_types"] = {"linear_attention", "linear_attention"}; },
                       {"'layer_types'", "\"linear_attention\" at index 0"});
  expect_drafter_error([](json& j) { j["layer_types"] = {"sliding_attention"}; },
                       {"'layer_types'", "2 strings"});
  expect_drafter_error([](json& j) { j["hidden_act"] = "gelu"; }, {"'hidden_act'", "\"gelu\""});
  expect_drafter_error([](json& j) { j["rope_parameters"]["rope_type"] = "yarn"; },
                       {"'rope_parameters.rope_type'", "\"yarn\""});
  expect_drafter_error([](json& j) { j["rms_norm_eps"] = 0; }, {"'rms_norm_eps'"});
  expect_drafter_error(in_dflash("output_multiplier", "big"),
                       {"'dflash_config.output_multiplier'", "a number", "\"big\""});
}

// ---- pairing fixtures: config.json only, no weights, so guards fire before any load ------

struct MismatchCase {
  const char* folder;
  std::vector<std::string> needles;  // besides the drafter path
  bool names_target;                 // a pair error also names the target's config
};

TEST(ConfigDrafter, MismatchFixturesFailBeforeWeights) {
  const std::string tpath = kTargetTiny + "/config.json";
  const std::vector<MismatchCase> cases = {
      {"mismatch_vocab", {"vocab_size 4096 does not match", "vocab_size 8192"}, true},
      {"mismatch_hidden", {"hidden_size 512 does not match", "hidden_size 256"}, true},
      {"mismatch_num_target_layers", {"num_target_layers 12", "num_hidden_layers 8"}, true},
      {"mismatch_mask_id", {"mask_token_id 8192", "[0, 8192)"}, true},
      {"mismatch_tap_id", {"'dflash_config.target_layer_ids'", "found 8"}, false},
      {"mismatch_architecture",
       {"'architectures'", "DFlash2DraftModel", "found \"Qwen3ForCausalLM\""}, false},
      {"mismatch_block_size", {"'dflash_config.block_size'", "found 1"}, false},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.folder);
    const std::string dir = kFixtures + c.folder;
    std::vector<std::string> files;
    for (const auto& e : std::filesystem::directory_iterator(dir))
      files.push_back(e.path().filename().string());
    EXPECT_EQ(files, std::vector<std::string>{"config.json"});  // nothing else to open
    std::vector<std::string> needles = c.needles;
    needles.push_back(dir + "/config.json");
    if (c.names_target) needles.push_back(tpath);
    expect_error_with(
        [&] {
          qf::TargetConfig t = qf::load_target_config(kTargetTiny);
          qf::DrafterConfig d = qf::load_drafter_config(dir);
          qf::check_drafter_pair(d, t);
        },
        needles);
  }
}

TEST(ConfigDrafter, PairMessageFormat) {
  qf::DrafterConfig d = qf::load_drafter_config(kDrafterTiny);
  qf::TargetConfig t = qf::load_target_config(kTarget27b);
  try {
    qf::check_drafter_pair(d, t);
    ADD_FAILURE() << "tiny drafter paired with the 27B target";
  } catch (const qf::Error& e) {
    EXPECT_EQ(e.kind(), qf::ErrorKind::Config);
    EXPECT_EQ(std::string(e.what()), "drafter " + kDrafterTiny + "/config.json vocab_size 8192 "
              "does not match target " + kTarget27b + "/config.json vocab_size 248320");
  }
  // Guards that earlier checks normally shadow still fire on hand-built configs.
  qf::TargetConfig tt = qf::load_target_config(kTargetTiny);
  qf::DrafterConfig bad = d;
  bad.target_layer_ids = {1, 8};
  expect_error_with([&] { qf::check_drafter_pair(bad, tt); },
                    {"target_layer_ids entry 8", "[0, 8)"});
  bad = d;
  bad.selector_top_k = 9000;
  expect_error_with([&] { qf::check_drafter_pair(bad, tt); }, {"selector_top_k 9000"});
}
