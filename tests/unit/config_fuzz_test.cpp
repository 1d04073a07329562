// Fuzz-style robustness of config.json parsing (src/io/config.h): the target and drafter fixture
// configs mutated by a seeded generator (tests/support/json_mutator.h). Each mutant must parse or
// throw qf::Error naming the file; never crash or leak another exception type. A target that
// parses must hold sizes a model can be built from (every dimension positive, the layer list as
// long as num_hidden_layers), and the pair guard (check_drafter_pair) on parsed configs must
// answer with qf::Error too.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "support/json_mutator.h"

namespace qf::test {
namespace {

using ojson = nlohmann::ordered_json;

ojson load(const std::string& rel) {
  return ojson::parse(read_text_file(std::string(QFLASH_SOURCE_DIR) + "/tests/fixtures/" + rel));
}

JsonMutator config_mutator(const ojson& a, const ojson& b) {
  JsonMutator m;
  m.strings = {"", "linear_attention", "full_attention", "silu", "gelu", "bfloat16", "float16", "float32", "mlx",
               "affine", "qwen3_5", "qwen3_5_text", "Qwen3_5ForCausalLM", "DFlashDraftModel", "sliding_attention",
               "default", "mrope", "x"};
  m.keys = {"type", "rope_type", "mrope_section", "rope_theta", "partial_rotary_factor", "group_size", "bits", "x"};
  for (const ojson* j : {&a, &b})
    for (auto it = j->begin(); it != j->end(); ++it) m.top.push_back(it.key());
  for (const char* k : {"text_config", "rope_parameters", "quantization", "layer_types", "num_hidden_layers",
                        "hidden_size", "vocab_size", "head_dim", "dflash_config", "target_layer_ids"})
    m.top.push_back(k);
  return m;
}

// "" when the outcome is acceptable, else what went wrong.
template <class Parse>
std::string take(const ojson& doc, Parse&& parse) {
  try {
    parse(doc.dump(-1, ' ', false, ojson::error_handler_t::replace));
    return "";
  } catch (const Error& e) {
    const std::string msg = e.what();
    if (msg.find("fuzz/config.json") == std::string::npos) return "an error that does not name the file: " + msg;
    return "";
  } catch (const std::exception& e) {
    return std::string("a ") + typeid(e).name() + ": " + e.what();
  }
}

TEST(ConfigFuzz, MutatedTargetConfigsParseSaneOrNameTheFile) {
  const std::vector<ojson> base = {load("configs/qwen38_27b/config.json"), load("configs/qwen38_tiny_text/config.json"),
                                   load("target/micro/config.json"), load("target/odd/config.json"),
                                   load("target/micro_mm/config.json")};
  const JsonMutator mut = config_mutator(base[0], base[1]);
  std::mt19937_64 rng(1204);
  int parsed = 0, refused = 0, bad = 0;
  for (int i = 0; i < 20000; i++) {
    const ojson m = mut.mutate(base[static_cast<size_t>(i) % base.size()], rng);
    std::string insane;
    const std::string err = take(m, [&](const std::string& text) {
      const TargetConfig c = parse_target_config(text, "fuzz/config.json");
      if (c.hidden_size <= 0 || c.num_hidden_layers <= 0 || c.vocab_size <= 0 || c.intermediate_size <= 0 ||
          static_cast<int>(c.full_attention.size()) != c.num_hidden_layers)
        insane = "parsed with an unusable shape";
    });
    if (err.empty() && insane.empty()) {
      try {
        (void)parse_target_config(m.dump(-1, ' ', false, ojson::error_handler_t::replace), "fuzz/config.json");
        parsed++;
      } catch (const Error&) {
        refused++;
      }
      continue;
    }
    if (++bad <= 8) ADD_FAILURE() << (err.empty() ? insane : err) << "\n  config: " << m.dump().substr(0, 600);
  }
  EXPECT_EQ(bad, 0);
  EXPECT_GT(parsed, 1000);
  EXPECT_GT(refused, 1000);
}

TEST(ConfigFuzz, MutatedDrafterConfigsParseOrNameTheFileAndThePairGuardHolds) {
  const std::vector<ojson> base = {load("configs/dflash2_27b/config.json"), load("configs/dflash2_tiny/config.json"),
                                   load("drafter/micro/config.json"), load("drafter/micro_v1/config.json")};
  const std::vector<TargetConfig> targets = {
      load_target_config(std::string(QFLASH_SOURCE_DIR) + "/tests/fixtures/configs/qwen38_27b"),
      load_target_config(std::string(QFLASH_SOURCE_DIR) + "/tests/fixtures/configs/qwen38_tiny_text"),
      load_target_config(std::string(QFLASH_SOURCE_DIR) + "/tests/fixtures/target/micro")};
  const JsonMutator mut = config_mutator(base[0], base[1]);
  std::mt19937_64 rng(41204);
  int parsed = 0, refused = 0, bad = 0;
  for (int i = 0; i < 20000; i++) {
    const ojson m = mut.mutate(base[static_cast<size_t>(i) % base.size()], rng);
    bool ok = false;
    const std::string err = take(m, [&](const std::string& text) {
      const DrafterConfig d = parse_drafter_config(text, "fuzz/config.json");
      ok = true;
      for (const TargetConfig& t : targets) {
        try {
          check_drafter_pair(d, t);
        } catch (const Error&) {
        }
      }
    });
    if (!err.empty()) {
      if (++bad <= 8) ADD_FAILURE() << err << "\n  config: " << m.dump().substr(0, 600);
      continue;
    }
    (ok ? parsed : refused)++;
  }
  EXPECT_EQ(bad, 0);
  EXPECT_GT(parsed, 1000);
  EXPECT_GT(refused, 1000);
}

}  // namespace
}  // namespace qf::test
