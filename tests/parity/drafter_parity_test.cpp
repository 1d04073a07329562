// DFlash2 / DFlash v1 drafter parity with the PyTorch reference written from docs/spec/dflash2.md
// (tools/reference/make_drafter_fixtures.py). Tolerance 1e-4 x max|ref| (fp32 both sides, bf16
// weights); candidate ids, selector walk and drafts must be identical. The context K/V cache runs
// in f32 against reference.safetensors and in bf16 (the default, as the target's) against
// reference_kvbf16.safetensors: the same reference with K and V rounded to bf16 once, everything
// else fp32; same tolerance, same exact ids.
#include <gtest/gtest.h>

#include <map>

#include "backend/backend.h"
#include "core/error.h"
#include "io/config.h"
#include "model/dflash2.h"
#include "support/backends.h"
#include "support/fixtures.h"

namespace qf {
namespace {

constexpr double kTol = 1e-4;

std::vector<float> dl(Backend& be, const float* p, size_t n) {
  std::vector<float> v(n);
  be.download(v.data(), p, n * 4);
  return v;
}

struct Case {
  std::string folder;
  int index;
  std::string backend;
  DType kv = DType::BF16;
};

const char* kv_name(DType kv) { return kv == DType::F32 ? "kvf32" : "kvbf16"; }

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.folder << "/case" << c.index << "/" << c.backend << "/" << kv_name(c.kv);
}

// The fixture's three cases (v2 cases 0 and 1, the v1 drafter's case 2) on every backend, with the
// context K/V cache in f32 and in bf16.
std::vector<Case> cases() {
  std::vector<Case> out;
  for (const std::string& b : test::test_backends())
    for (DType kv : {DType::F32, DType::BF16})
      for (const Case& c : {Case{"micro", 0, b, kv}, Case{"micro", 1, b, kv}, Case{"micro_v1", 2, b, kv}})
        out.push_back(c);
  return out;
}

class DrafterParity : public ::testing::TestWithParam<Case> {};

TEST_P(DrafterParity, BlockPassMatchesReference) {
  const Case c = GetParam();
  const std::string base = test::source_path("tests/fixtures/drafter/");
  test::Fixture ref(base + (c.kv == DType::F32 ? "micro/reference.safetensors" : "micro/reference_kvbf16.safetensors"));
  auto th = SafetensorsFile::open(base + "micro/target_embed_head.safetensors");
  std::string why;
  auto be = test::make_test_backend(c.backend, &why);
  ASSERT_TRUE(be) << why;
  TargetConfig tc;  // the fixture's target: hidden 128, vocab 512, 4 layers
  tc.hidden_size = 128;
  tc.vocab_size = 512;
  tc.num_hidden_layers = 4;
  tc.max_position_embeddings = 4096;
  WeightRef embed, head;
  for (const auto& t : th->tensors()) {
    WeightRef& w = t.name == "embed_tokens" ? embed : head;
    w.dtype = t.dtype;
    w.rows = t.shape[0];
    w.cols = t.shape[1];
    w.data = be->import_weight(t.data, t.nbytes);  // device copy on a GPU backend
  }
  ASSERT_TRUE(embed.valid() && head.valid());
  auto d = DFlash2Drafter::load(base + c.folder, tc, be.get(), embed, head, 16, 0, {}, c.kv);
  ASSERT_EQ(d->kv_dtype(), c.kv);
  const std::string p = "case" + std::to_string(c.index) + ".";
  const auto taps = ref.f32(p + "taps");
  const int start = ref.i32(p + "start")[0], anchor = ref.i32(p + "anchor")[0];
  const int n_ctx = static_cast<int>(ref.get(p + "taps").shape[0]);
  const int H = 128, V = 512, k = d->max_drafts();
  std::map<std::string, std::vector<float>> dumps;
  DumpHook hook = [&](const std::string& name, const float* ptr, size_t n) {
    auto v = dl(*be, ptr, n);
    dumps[name].insert(dumps[name].end(), v.begin(), v.end());
  };
  DeviceBuffer tb(be.get(), taps.size() * 4);
  be->upload(tb.get(), taps.data(), taps.size() * 4);
  d->append_context(tb.f(), n_ctx, start - n_ctx, &hook);
  std::vector<int32_t> drafts(k);
  d->draft(anchor, start, k, drafts.data(), &hook);
  EXPECT_TRUE(test::close_rel(dumps["drafter.ctx"], ref.f32(p + "ctx"), kTol, "context features"));
  for (int l = 0; l < 2; l++)
    EXPECT_TRUE(test::close_rel(dumps["drafter.layer." + std::to_string(l) + ".out"],
                                ref.f32(p + "layer" + std::to_string(l) + ".out"), kTol, "layer output"));
  EXPECT_TRUE(test::close_rel(dl(*be, d->final_hidden(), static_cast<size_t>(k) * H), ref.f32(p + "final_hidden"), kTol, "final hidden"));
  EXPECT_TRUE(test::close_rel(dl(*be, d->logits(), static_cast<size_t>(k) * V), ref.f32(p + "logits"), kTol, "logits"));
  EXPECT_EQ(drafts, ref.i32(p + "drafts"));
  if (d->is_v2()) {
    std::vector<int32_t> ids(k * 16);
    be->download(ids.data(), d->cand_ids(), ids.size() * 4);
    EXPECT_EQ(ids, ref.i32(p + "cand_ids"));
    EXPECT_TRUE(test::close_rel(dl(*be, d->cand_vals(), k * 16), ref.f32(p + "cand_logits"), kTol, "candidate logits"));
    EXPECT_TRUE(test::close_rel(dl(*be, d->scores(), k * 16), ref.f32(p + "scores"), kTol, "selector scores"));
  }
}

// A context cache of another element type is refused at load, naming the drafter and the dtype.
TEST(DrafterLoad, RejectsAKvDtypeOtherThanF32OrBf16) {
  const std::string base = test::source_path("tests/fixtures/drafter/");
  std::string why;
  auto be = test::make_test_backend("cpu", &why);
  ASSERT_TRUE(be) << why;
  TargetConfig tc;
  tc.hidden_size = 128;
  tc.vocab_size = 512;
  tc.num_hidden_layers = 4;
  tc.max_position_embeddings = 4096;
  try {
    DFlash2Drafter::load(base + "micro", tc, be.get(), WeightRef{}, WeightRef{}, 16, 0, {}, DType::F16);
    FAIL() << "an f16 context cache was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Usage) << e.what();
    const std::string msg = e.what();
    EXPECT_NE(msg.find("micro"), std::string::npos) << msg;
    EXPECT_NE(msg.find("F32 or BF16 expected"), std::string::npos) << msg;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, DrafterParity,
                         ::testing::ValuesIn(cases()),
                         [](const auto& info) {
                           return info.param.folder + "_case" + std::to_string(info.param.index) + "_" +
                                  kv_name(info.param.kv) + "_" + info.param.backend;
                         });

}  // namespace
}  // namespace qf
