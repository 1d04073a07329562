// int4 quantization (mlx affine layout): the row quantizer's layout and error bound, and the
// quantized demo pair end to end: it loads as int4, stays close to bf16, and speculative decoding
// on it is still byte-identical to plain decoding.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "core/dtype.h"
#include "core/error.h"
#include "io/quantize.h"
#include "io/safetensors.h"
#include "model/qwen38.h"
#include "runtime/draft_source.h"
#include "runtime/generate.h"
#include "support/test_models.h"

namespace qf {
namespace {

TEST(Quantize, RowLayoutAndErrorBound) {
  // A group holding 0..15 twice quantizes to scale 1, bias 0 and nibble j == value.
  std::vector<float> w(64);
  for (int i = 0; i < 64; i++) w[i] = static_cast<float>(i % 16);
  std::vector<uint32_t> q(8);
  uint16_t s, b;
  int4_quantize_row(w.data(), 64, 64, q.data(), &s, &b);
  EXPECT_EQ(bf16_to_f32(s), 1.0f);
  EXPECT_EQ(bf16_to_f32(b), 0.0f);
  for (int i = 0; i < 64; i++) EXPECT_EQ((q[i / 8] >> (4 * (i % 8))) & 0xf, static_cast<uint32_t>(i % 16)) << i;
  // Random rows: every dequantized weight is within half a step (plus bf16 rounding of s, b).
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0, 0.05f);
  std::vector<float> r(256);
  for (auto& x : r) x = nd(rng);
  std::vector<uint32_t> qr(32);
  std::vector<uint16_t> sc(4), bi(4);
  int4_quantize_row(r.data(), 256, 64, qr.data(), sc.data(), bi.data());
  for (int i = 0; i < 256; i++) {
    const float sf = bf16_to_f32(sc[i / 64]), bf = bf16_to_f32(bi[i / 64]);
    const float deq = static_cast<float>((qr[i / 8] >> (4 * (i % 8))) & 0xf) * sf + bf;
    EXPECT_LE(std::fabs(deq - r[i]), 0.5f * sf + 0.01f * sf + 1e-6f) << i;
  }
}

std::string demo_dir() { return std::string(QFLASH_SOURCE_DIR) + "/models/demo"; }

bool is_int4_dir(const std::string& dir) {
  std::ifstream f(dir + "/config.json");
  return nlohmann::json::parse(f).contains("quantization");
}

// dequantize_checkpoint on a tiny random target quantized here: every int4 matrix comes back as
// bf16_rn(q * scale + bias) of its own words (recomputed from the int4 file, element by element),
// everything else byte for byte, and the config loses its quantization block. Bad input is refused.
TEST(Quantize, DequantizeExpandsEveryInt4Matrix) {
  test::TinyTarget tt;
  tt.layers = 4;
  const std::string src = test::write_tiny_target(test::temp_dir("dq_src"), tt);
  const std::string q4 = test::temp_dir("dq_q4") + "/m";
  const std::string bf = test::temp_dir("dq_bf") + "/m";
  quantize_checkpoint(src, q4, QuantizeOptions{});
  EXPECT_THROW(dequantize_checkpoint(src, test::temp_dir("dq_bad") + "/m"), Error);  // not int4
  dequantize_checkpoint(q4, bf);
  EXPECT_THROW(dequantize_checkpoint(q4, bf), Error);  // refuses to overwrite
  EXPECT_FALSE(is_int4_dir(bf));
  TensorStore a = TensorStore::open_dir(q4), b = TensorStore::open_dir(bf);
  int matrices = 0;
  for (const std::string& name : a.names()) {
    const TensorInfo& t = *a.find(name);
    const std::string base = name.size() > 7 ? name.substr(0, name.size() - 7) : name;
    if (name.size() > 7 && (name.ends_with(".scales") || name.ends_with(".biases"))) {
      EXPECT_EQ(b.find(name), nullptr) << name;
      continue;
    }
    const TensorInfo* u = b.find(name);
    ASSERT_NE(u, nullptr) << name;
    if (t.dtype != DType::U32) {
      EXPECT_EQ(u->dtype, t.dtype) << name;
      ASSERT_EQ(u->nbytes, t.nbytes) << name;
      EXPECT_EQ(std::memcmp(u->data, t.data, t.nbytes), 0) << name;
      continue;
    }
    matrices++;
    const TensorInfo &ts = *a.find(base + ".scales"), &tb = *a.find(base + ".biases");
    const int64_t rows = t.shape[0], cols = t.shape[1] * 8;
    ASSERT_EQ(u->dtype, DType::BF16) << name;
    ASSERT_EQ(u->shape, (std::vector<int64_t>{rows, cols})) << name;
    int bad = 0;
    for (int64_t r = 0; r < rows; r++)
      for (int64_t c = 0; c < cols; c++) {
        uint32_t word;
        uint16_t sh, bh, got;
        std::memcpy(&word, t.data + (r * (cols / 8) + c / 8) * 4, 4);
        std::memcpy(&sh, ts.data + (r * (cols / 64) + c / 64) * 2, 2);
        std::memcpy(&bh, tb.data + (r * (cols / 64) + c / 64) * 2, 2);
        std::memcpy(&got, u->data + (r * cols + c) * 2, 2);
        const float want = static_cast<float>((word >> (4 * (c % 8))) & 0xf) * bf16_to_f32(sh) + bf16_to_f32(bh);
        bad += got != f32_to_bf16(want);
      }
    EXPECT_EQ(bad, 0) << name;
  }
  EXPECT_GT(matrices, 20);
  // The bf16 copy is the same model: its next-token logits match the int4 checkpoint's closely.
  auto be = make_cpu_backend();
  auto mq = Qwen38Model::load(q4, be.get(), 32), mb = Qwen38Model::load(bf, be.get(), 32);
  EXPECT_EQ(mq->config().quant_bits, 4);
  EXPECT_EQ(mb->config().quant_bits, 0);
  const std::vector<int32_t> p = {5, 17, 301, 44, 9, 1200, 77, 3};
  auto sa = mq->new_state(32, 0), sb = mb->new_state(32, 0);
  ForwardOpts fo;
  fo.logits_last_only = true;
  mq->forward(*sa, p.data(), static_cast<int>(p.size()), fo);
  mb->forward(*sb, p.data(), static_cast<int>(p.size()), fo);
  std::vector<float> la(tt.vocab), lb(tt.vocab);
  be->download(la.data(), mq->logits(), la.size() * 4);
  be->download(lb.data(), mb->logits(), lb.size() * 4);
  double dot = 0, na = 0, nb = 0;
  for (int i = 0; i < tt.vocab; i++) {
    dot += la[i] * lb[i];
    na += la[i] * la[i];
    nb += lb[i] * lb[i];
  }
  EXPECT_GT(dot / std::sqrt(na * nb), 0.9999);
}

// The quantizer's end-to-end check needs a bf16 pair. The shipped pair is int4 since v10
// (docs/experiments/demo_data.md), so it runs on a bf16 copy expanded from it; a bf16 pair is used
// as it is.
std::string bf16_demo_dir() {
  if (!is_int4_dir(demo_dir())) return demo_dir();
  static const std::string dir = [] {
    const std::string d = test::temp_dir("demo_bf16") + "/demo";
    dequantize_checkpoint(demo_dir(), d);
    return d;
  }();
  return dir;
}

TEST(Quantize, DemoPairInt4IsCloseAndSpeculationStaysLossless) {
  const std::string out = test::temp_dir("q4") + "/demo_q4";
  QuantizeOptions o;
  const std::string src = bf16_demo_dir();
  quantize_checkpoint(src, out, o);
  EXPECT_THROW(quantize_checkpoint(src, out, o), Error);  // refuses to overwrite
  auto be = make_cpu_backend();
  auto ref = Qwen38Model::load(src, be.get(), 64);
  auto m = Qwen38Model::load(out, be.get(), 64);
  EXPECT_EQ(m->config().quant_bits, 4);
  EXPECT_EQ(m->lm_head_weight().dtype, DType::U32);
  EXPECT_LT(m->weight_bytes() * 3, ref->weight_bytes());

  std::ifstream f(demo_dir() + "/validation_prompts.jsonl");
  std::vector<std::vector<int32_t>> prompts;
  std::string line;
  while (std::getline(f, line) && prompts.size() < 3) prompts.push_back(nlohmann::json::parse(line)["ids"].get<std::vector<int32_t>>());

  // Close to bf16: next-token logits of the prompt agree in direction (cosine) and top-1.
  int same_top1 = 0;
  for (const auto& p : prompts) {
    auto sa = ref->new_state(256, 0), sb = m->new_state(256, 0);
    ForwardOpts fo;
    fo.logits_last_only = true;
    ref->forward(*sa, p.data(), static_cast<int>(p.size()), fo);
    m->forward(*sb, p.data(), static_cast<int>(p.size()), fo);
    std::vector<float> la(8192), lb(8192);
    be->download(la.data(), ref->logits(), la.size() * 4);
    be->download(lb.data(), m->logits(), lb.size() * 4);
    double dot = 0, na = 0, nb = 0;
    for (int i = 0; i < 8192; i++) {
      dot += la[i] * lb[i];
      na += la[i] * la[i];
      nb += lb[i] * lb[i];
    }
    EXPECT_GT(dot / std::sqrt(na * nb), 0.97);
    same_top1 += std::max_element(la.begin(), la.end()) - la.begin() == std::max_element(lb.begin(), lb.end()) - lb.begin();
  }
  EXPECT_GE(same_top1, 2);

  // Identity on the int4 target (bf16 drafter, int4 embedding and lm_head shared with it).
  MtpDraftSource mtp(*m, 512);
  DFlashDraftSource dfl(DFlash2Drafter::load(out + "/drafter", *m));
  for (const auto& p : prompts) {
    auto gen = [&](DraftSource* s, int k) {
      Generator g(*m, s, 512);
      GenerateOptions go;
      go.max_new_tokens = 96;
      go.draft_k = k;
      std::vector<int32_t> t;
      g.generate(p, go, [&](int32_t x) {
        t.push_back(x);
        return true;
      });
      return t;
    };
    const auto plain = gen(nullptr, 0);
    EXPECT_EQ(gen(&mtp, 3), plain);
    EXPECT_EQ(gen(&dfl, 7), plain);
  }
}

}  // namespace
}  // namespace qf
