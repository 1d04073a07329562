// Loading a target: layouts, the zero-centred norm +1 applied exactly once, and clear errors
// for missing or misshapen tensors.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "backend/backend.h"
#include "core/error.h"
#include "model/qwen38.h"
#include "support/fixtures.h"
#include "support/test_models.h"

namespace qf {
namespace {

namespace fs = std::filesystem;

bool zero_centred_norm(const std::string& n) {
  for (const char* s : {"input_layernorm.weight", "post_attention_layernorm.weight", "q_norm.weight", "k_norm.weight",
                        "pre_fc_norm_embedding.weight", "pre_fc_norm_hidden.weight"})
    if (n.size() >= std::strlen(s) && n.compare(n.size() - std::strlen(s), std::strlen(s), s) == 0) return true;
  return n == "model.norm.weight" || n == "mtp.norm.weight";
}

// Rewrites micro in the mlx-community layout: language_model.* names, norms stored already
// shifted (1+w, kept in f32 so the values are exact), conv1d as [C, K, 1].
std::string write_mlx_copy() {
  const std::string src = test::source_path("tests/fixtures/target/micro");
  const std::string dst = test::temp_dir("mlx");
  auto f = SafetensorsFile::open(src + "/model.safetensors");
  std::vector<std::vector<uint8_t>> keep;
  std::vector<TensorToWrite> out;
  for (const auto& t : f->tensors()) {
    if (t.name.rfind("mtp.", 0) == 0) continue;  // mlx-vlm drops the MTP head
    std::string name = t.name;
    if (name.rfind("model.", 0) == 0) name = "language_model." + name;
    if (name == "lm_head.weight") name = "language_model.lm_head.weight";
    std::vector<int64_t> shape = t.shape;
    if (zero_centred_norm(t.name)) {
      std::vector<uint8_t> buf(t.numel() * 4);
      for (int64_t i = 0; i < t.numel(); i++) {
        uint16_t h;
        std::memcpy(&h, t.data + 2 * i, 2);
        float v = bf16_to_f32(h) + 1.0f;
        std::memcpy(buf.data() + 4 * i, &v, 4);
      }
      keep.push_back(std::move(buf));
      out.push_back({name, DType::F32, shape, keep.back().data()});
      continue;
    }
    if (t.name.find("conv1d.weight") != std::string::npos) shape = {t.shape[0], t.shape[2], 1};
    out.push_back({name, t.dtype, shape, t.data});
  }
  write_safetensors(dst + "/model.safetensors", out);
  fs::copy_file(src + "/config.json", dst + "/config.json");
  return dst;
}

TEST(ModelLoad, MlxLayoutIsNotShiftedTwice) {
  auto be = make_cpu_backend();
  auto hf = Qwen38Model::load(test::source_path("tests/fixtures/target/micro"), be.get(), 16);
  auto mlx = Qwen38Model::load(write_mlx_copy(), be.get(), 16);
  EXPECT_EQ(mlx->layout(), TargetLayout::Mlx);
  EXPECT_EQ(mlx->norm_form(), NormForm::Full);
  EXPECT_TRUE(hf->final_norm().shifted);
  EXPECT_FALSE(mlx->final_norm().shifted);
  std::vector<int32_t> toks = {3, 1, 4, 1, 5, 9, 2, 6};
  auto a = hf->new_state(16, 0), b = mlx->new_state(16, 0);
  hf->forward(*a, toks.data(), 8, ForwardOpts{});
  mlx->forward(*b, toks.data(), 8, ForwardOpts{});
  const size_t n = 8 * static_cast<size_t>(hf->config().vocab_size);
  std::vector<float> la(n), lb(n);
  be->download(la.data(), hf->logits(), n * 4);
  be->download(lb.data(), mlx->logits(), n * 4);
  EXPECT_EQ(la, lb) << "an already-shifted (mlx) checkpoint must give the same logits as the HF one";
}

TEST(ModelLoad, RefusesToShiftAFullFormNormAgain) {
  std::vector<float> w = {0.5f, -0.25f};
  NormForm f = NormForm::ZeroCentred;
  norm_apply_plus_one(w, f, "x.weight");
  EXPECT_EQ(w[0], 1.5f);
  EXPECT_EQ(f, NormForm::Full);
  EXPECT_THROW(norm_apply_plus_one(w, f, "x.weight"), Error);
  EXPECT_EQ(w[0], 1.5f);
}

TEST(ModelLoad, MissingTensorIsNamed) {
  test::TinyTarget t;
  t.layers = 4;
  t.vocab = 512;
  t.mtp = false;
  const std::string dir = test::write_tiny_target(test::temp_dir("missing"), t);
  auto f = SafetensorsFile::open(dir + "/model.safetensors");
  std::vector<TensorToWrite> out;
  for (const auto& x : f->tensors())
    if (x.name != "model.layers.2.linear_attn.in_proj_z.weight") out.push_back({x.name, x.dtype, x.shape, x.data});
  const std::string dir2 = test::temp_dir("missing2");
  write_safetensors(dir2 + "/model.safetensors", out);
  fs::copy_file(dir + "/config.json", dir2 + "/config.json");
  auto be = make_cpu_backend();
  try {
    Qwen38Model::load(dir2, be.get(), 4);
    FAIL() << "load should fail";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Tensor);
    EXPECT_NE(std::string(e.what()).find("model.layers.2.linear_attn.in_proj_z.weight"), std::string::npos) << e.what();
  }
}

TEST(ModelLoad, MisshapenTensorNamesExpectedAndFound) {
  test::TinyTarget t;
  t.layers = 4;
  t.vocab = 512;
  t.mtp = false;
  const std::string dir = test::write_tiny_target(test::temp_dir("shape"), t);
  // Claim a larger intermediate size in config.json: every MLP tensor is now misshapen.
  std::string cfg = read_text_file(dir + "/config.json");
  const std::string from = "\"intermediate_size\": 768", to = "\"intermediate_size\": 832";
  ASSERT_NE(cfg.find(from), std::string::npos);
  cfg.replace(cfg.find(from), from.size(), to);
  write_file_atomic(dir + "/config.json", cfg);
  auto be = make_cpu_backend();
  try {
    Qwen38Model::load(dir, be.get(), 4);
    FAIL() << "load should fail";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::Tensor);
    EXPECT_NE(msg.find("mlp.gate_proj.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("832"), std::string::npos) << msg;
    EXPECT_NE(msg.find("768"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace qf
