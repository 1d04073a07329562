// Long-prompt parity (issue 12): the prefill path and token-by-token decoding on a 2,100-token
// prompt against Hugging Face transformers (tools/reference/make_long_prompt_fixtures.py, the
// tiny micro and odd checkpoints), at the fixture's stored positions (every 61st and the last 8).
//
// Two references: fp32 is transformers as it runs; bf16in is the same forward with every
// decoder-layer projection reading bf16(x), the function the prefill path computes
// (Backend::gemm; the head stays the fp32 GEMV). Tolerances, relative to max|ref| of the tensor
// (derivations in tools/reference/README.md, "Long-prompt fixtures"):
//  - decode (prefill_rows 0) vs fp32: kFp32 = 1e-4, fp32 rounding on both sides (transformers'
//    fp32 is within 2e-5 of a float64 reference at this length, the fixture's checks);
//  - prefill vs bf16in: 2 x the reference's own spread + kFp32. Rounding to bf16 is discontinuous:
//    fp32 values that differ in the last bit (our summation order vs torch's) now and then round
//    to neighbouring bf16 values, a step of 2^-8 in one input that the later layers carry. The
//    fixture measures how far bf16in itself moves when its projection inputs are jittered by 1-4
//    fp32 ulps (bf16in_spread.*, per tensor; the last row and the greedy rows have their own):
//    that is the scale of the difference between two correct implementations, and twice it is
//    the tolerance. On a GPU backend the spread is bf16in_spread_gpu.*: the same runs plus runs
//    jittered by 2^-20 and 2^-19, the unit roundoff u = 2^-20 that the CUDA kernels' split-tf32 /
//    split-bf16 tensor-core products are held to (tests/unit/gdn_chunked_test.cpp,
//    tolerance_gpu) and 2u, since those backends' fp32 values sit up to that far from the
//    reference's; the CPU keeps bf16in_spread.*;
//  - prefill vs fp32: the above plus max|bf16in - fp32| (the reference's own bf16 effect, 0.6%
//    for micro, 3% for odd: these random models amplify input rounding); prefill vs our decode:
//    both chains added (prefill -> bf16in -> fp32 -> decode);
//  - bf16 K/V caches (the default) add one bf16 unit 2^-9 to each side (target_parity_test.cpp);
//  - argmax and greedy tokens: exact where the reference's top-1 margin exceeds twice the
//    tolerance at the row's scale (an error within it cannot swap two logits that far apart),
//    greedy up to the first step below that margin; a minimum count of decided rows or steps
//    keeps each check from being vacuous;
//  - chunkings (64, 512, a split at 1088 = 17 x 64, the whole prompt): bit-identical rows, the
//    prefill path's split invariance (docs/DESIGN.md, "Prefill path").
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <map>

#include "backend/backend.h"
#include "model/qwen38.h"
#include "runtime/generate.h"
#include "support/backends.h"
#include "support/fixtures.h"

namespace qf {
namespace {

constexpr double kFp32 = 1e-4;
constexpr double kBf16Unit = 0x1p-9;

// With QFLASH_TOL_REPORT=1 each comparison prints its error / tolerance.
::testing::AssertionResult close(const std::vector<float>& got, const std::vector<float>& ref, double tol,
                                 const std::string& what) {
  if (std::getenv("QFLASH_TOL_REPORT") && got.size() == ref.size()) {
    double mx = 0, err = 0;
    for (size_t i = 0; i < ref.size(); i++) {
      mx = std::max(mx, std::fabs(static_cast<double>(ref[i])));
      err = std::max(err, std::fabs(static_cast<double>(got[i]) - ref[i]));
    }
    std::printf("[tol] %-60s err/max|ref| %.3g  tol %.3g  (%.2f of tol)\n", what.c_str(), err / mx, tol,
                tol > 0 ? err / mx / tol : (err > 0 ? INFINITY : 0.0));
  }
  return test::close_rel(got, ref, tol, what);
}

class LongPromptParity : public ::testing::TestWithParam<std::tuple<std::string, std::string, std::string>> {
 protected:
  void SetUp() override {
    ref_ = std::make_unique<test::Fixture>(
        test::source_path("tests/fixtures/target/long/" + std::get<0>(GetParam()) + ".safetensors"));
    tokens_ = ref_->i32("tokens");
    pos_ = ref_->i32("positions");
    std::string why;
    be_ = test::make_test_backend(std::get<1>(GetParam()), &why);
    ASSERT_TRUE(be_) << why;
  }
  std::unique_ptr<Qwen38Model> load(int prefill_rows) {
    auto m = Qwen38Model::load(test::source_path("tests/fixtures/target/" + std::get<0>(GetParam())), be_.get(), 64);
    m->set_kv_dtype(kv());
    m->set_prefill_rows(prefill_rows);
    return m;
  }
  DType kv() const { return std::get<2>(GetParam()) == "kvf32" ? DType::F32 : DType::BF16; }
  double kv_extra() const { return kv() == DType::F32 ? 0.0 : kBf16Unit; }
  // The fixture's spread keys for this backend's arithmetic: "bf16in_spread_gpu." where the backend
  // is a GPU (tensor-core products with u = 2^-20), "bf16in_spread." (fp32, 1-4 ulps) otherwise.
  std::string spread_prefix() const { return be_->is_gpu() ? "bf16in_spread_gpu." : "bf16in_spread."; }
  // Prefill vs the bf16in reference, tensor `key` (logits, final_hidden, last_layer_out, hidden.L):
  // twice the reference's own spread under perturbations of its fp32 values of the size this
  // backend's arithmetic makes, plus fp32 rounding.
  double prefill_tol(const std::string& key) const {
    const double spread = ref_->f32(spread_prefix() + key)[0];
    if (std::getenv("QFLASH_TOL_REPORT"))
      std::printf("[tol] spread %s%s = %.3g (%s backend)\n", spread_prefix().c_str(), key.c_str(), spread,
                  be_->is_gpu() ? "GPU" : "CPU");
    return 2.0 * spread + kFp32 + kv_extra();
  }
  // How far the bf16 rounding of projection inputs moves the reference: max|bf16in - fp32| / max|fp32|.
  static double rounding_effect(const std::vector<float>& b, const std::vector<float>& f) {
    double mx = 0, d = 0;
    for (size_t i = 0; i < f.size(); i++) {
      mx = std::max(mx, std::fabs(static_cast<double>(f[i])));
      d = std::max(d, std::fabs(static_cast<double>(b[i]) - f[i]));
    }
    return d / mx;
  }
  int T() const { return static_cast<int>(tokens_.size()); }
  int P() const { return static_cast<int>(pos_.size()); }
  std::vector<float> dl(const float* p, size_t n) const {
    std::vector<float> v(n);
    be_->download(v.data(), p, n * sizeof(float));
    return v;
  }
  // Logits of `hidden` ([rows, H] host) through the model's own head (the GEMV every forward uses).
  std::vector<float> head(Qwen38Model& m, const std::vector<float>& hidden) const {
    const int H = m.config().hidden_size, V = m.config().vocab_size, n = static_cast<int>(hidden.size()) / H;
    DeviceBuffer x(be_.get(), hidden.size() * sizeof(float)), y(be_.get(), static_cast<size_t>(n) * V * sizeof(float));
    be_->upload(x.get(), hidden.data(), hidden.size() * sizeof(float));
    be_->matmul(m.lm_head_weight(), x.f(), y.f(), n);
    return dl(y.f(), static_cast<size_t>(n) * V);
  }

  struct Rows {
    std::vector<float> hidden, logits, last_logits;   // [P, H], [P, V], [V]
    std::map<std::string, std::vector<float>> dumps;  // "embed", "layer.L.out": [P, H]
  };
  // The prompt through the prefill path in forwards of `sizes` rows (as Generator::prefill runs
  // it: head on the last forward's last row), keeping the stored positions' rows.
  Rows prefill(Qwen38Model& m, const std::vector<int>& sizes, bool dump_layers) const {
    const int H = m.config().hidden_size;
    Rows r;
    r.hidden.resize(static_cast<size_t>(P()) * H);
    auto st = m.new_state(T() + 8, 0);
    int off = 0;
    for (size_t c = 0; c < sizes.size(); c++) {
      const int n = sizes[c];
      auto keep = [&](const float* rows, std::vector<float>& into) {
        for (int i = 0; i < P(); i++)
          if (pos_[i] >= off && pos_[i] < off + n)
            be_->download(into.data() + static_cast<size_t>(i) * H, rows + static_cast<size_t>(pos_[i] - off) * H,
                          H * sizeof(float));
      };
      DumpHook hook = [&](const std::string& name, const float* p, size_t) {
        if (name != "embed" && name.find(".out") == std::string::npos) return;
        auto& v = r.dumps[name];
        v.resize(static_cast<size_t>(P()) * H);
        keep(p, v);
      };
      ForwardOpts fo;
      fo.prefill = true;
      fo.lm_head = c + 1 == sizes.size();
      fo.logits_last_only = true;
      m.forward(*st, tokens_.data() + off, n, fo, dump_layers ? &hook : nullptr);
      keep(m.final_hidden(), r.hidden);
      off += n;
    }
    EXPECT_EQ(off, T());
    r.last_logits = dl(m.logits(), m.config().vocab_size);
    r.logits = head(m, r.hidden);
    return r;
  }
  // Every dumped tensor's row of the prompt's last position (the prefill path in chunks of 512),
  // on backend `be` (the test's own or another one, for cross-backend diagnosis).
  std::map<std::string, std::vector<float>> last_row_dumps(Backend* be) const {
    auto m = Qwen38Model::load(test::source_path("tests/fixtures/target/" + std::get<0>(GetParam())), be, 64);
    m->set_kv_dtype(kv());
    m->set_prefill_rows(512);
    std::map<std::string, std::vector<float>> out;
    auto st = m->new_state(T() + 8, 0);
    for (int off = 0; off < T(); off += 512) {
      const int n = std::min(512, T() - off);
      const bool has_last = off + n == T();
      DumpHook hook = [&](const std::string& name, const float* p, size_t count) {
        if (!has_last || count % n != 0) return;
        const size_t w = count / n;
        auto& v = out[name];
        v.resize(w);
        be->download(v.data(), p + static_cast<size_t>(n - 1) * w, w * sizeof(float));
      };
      ForwardOpts fo;
      fo.prefill = true;
      fo.lm_head = has_last;
      fo.logits_last_only = true;
      m->forward(*st, tokens_.data() + off, n, fo, &hook);
    }
    return out;
  }
  // The prompt one token per forward through the decode ops.
  Rows decode(Qwen38Model& m) const {
    const int H = m.config().hidden_size, V = m.config().vocab_size;
    Rows r;
    auto st = m.new_state(T() + 8, 0);
    for (int t = 0, i = 0; t < T(); t++) {
      m.forward(*st, &tokens_[t], 1, ForwardOpts{});
      if (i < P() && pos_[i] == t) {
        auto h = dl(m.final_hidden(), H), l = dl(m.logits(), V);
        r.hidden.insert(r.hidden.end(), h.begin(), h.end());
        r.logits.insert(r.logits.end(), l.begin(), l.end());
        i++;
      }
    }
    r.last_logits.assign(r.logits.end() - V, r.logits.end());
    return r;
  }
  // The rows whose argmax the reference decides by a margin above 2 tol max|row| agree (an error
  // within tol cannot swap two logits that far apart); at least `min_decided` rows must qualify.
  ::testing::AssertionResult argmax_agrees(const std::vector<float>& got, const std::vector<float>& ref, int V,
                                           double tol, int min_decided, const std::string& what) const {
    int decided = 0;
    const int rows = static_cast<int>(ref.size()) / V;
    for (int r = 0; r < rows; r++) {
      const float* g = got.data() + static_cast<size_t>(r) * V;
      const float* f = ref.data() + static_cast<size_t>(r) * V;
      const int best = static_cast<int>(std::max_element(f, f + V) - f);
      double second = -INFINITY, mx = 0;
      for (int v = 0; v < V; v++) {
        mx = std::max(mx, std::fabs(static_cast<double>(f[v])));
        if (v != best) second = std::max(second, static_cast<double>(f[v]));
      }
      if (f[best] - second <= 2 * tol * mx) continue;
      decided++;
      const int mine = static_cast<int>(std::max_element(g, g + V) - g);
      if (mine != best)
        return ::testing::AssertionFailure() << what << ": row " << r << " (position " << pos_[r] << ") argmax "
                                             << mine << ", reference " << best << " by a margin of "
                                             << f[best] - second;
    }
    if (std::getenv("QFLASH_TOL_REPORT")) std::printf("[tol] %s: %d of %d rows decided\n", what.c_str(), decided, rows);
    if (decided < min_decided)
      return ::testing::AssertionFailure() << what << ": only " << decided << " of " << rows
                                           << " rows have a decisive margin (need " << min_decided << ")";
    return ::testing::AssertionSuccess();
  }
  // Greedy tokens agree up to the reference's first step whose margin is below 2 tol scale (after
  // it the runs may continue from different tokens); at least `min_decided` steps qualify.
  ::testing::AssertionResult greedy_agrees(const std::vector<int32_t>& got, const std::string& key, double tol,
                                           size_t min_decided) const {
    const auto want = ref_->i32("greedy_" + key);
    const auto margin = ref_->f32("greedy_margin_" + key), scale = ref_->f32("greedy_scale_" + key);
    size_t n = 0;
    while (n < want.size() && margin[n] > 2 * tol * scale[n]) n++;
    if (std::getenv("QFLASH_TOL_REPORT")) std::printf("[tol] greedy %s: %zu of %zu steps decided\n", key.c_str(), n, want.size());
    if (n < min_decided)
      return ::testing::AssertionFailure() << key << ": the reference decides only " << n << " of " << want.size()
                                           << " greedy steps with margin (need " << min_decided << ")";
    if (got.size() < n) return ::testing::AssertionFailure() << key << ": generated " << got.size() << " tokens";
    for (size_t i = 0; i < n; i++)
      if (got[i] != want[i])
        return ::testing::AssertionFailure() << key << ": greedy token " << i << " is " << got[i] << ", reference "
                                             << want[i] << " (margin " << margin[i] << ")";
    return ::testing::AssertionSuccess();
  }
  std::vector<int32_t> generate(Qwen38Model& m, int n) const {
    Generator g(m, nullptr, T() + n + 8);
    GenerateOptions o;
    o.max_new_tokens = n;
    std::vector<int32_t> got;
    g.generate(tokens_, o, [&](int32_t t) {
      got.push_back(t);
      return true;
    });
    return got;
  }
  int layers(const Qwen38Model& m) const { return m.config().num_hidden_layers; }

  std::unique_ptr<test::Fixture> ref_;
  std::vector<int32_t> tokens_, pos_;
  std::unique_ptr<Backend> be_;
};

struct Schedule {
  std::string name;
  int prefill_rows;
  std::vector<int> sizes;  // empty: chunks of prefill_rows
};

std::vector<int> sizes_of(const Schedule& s, int T) {
  if (!s.sizes.empty()) return s.sizes;
  std::vector<int> v;
  for (int off = 0; off < T; off += s.prefill_rows) v.push_back(std::min(s.prefill_rows, T - off));
  return v;
}

TEST_P(LongPromptParity, PrefillMatchesTransformersAtEveryChunking) {
  ASSERT_EQ(T(), 2100);
  const std::vector<Schedule> schedules = {
      {"chunk64", 64, {}}, {"chunk512", 512, {}}, {"split1088", 2112, {1088, 1012}}, {"whole", 2112, {2100}}};
  const auto fh_b = ref_->f32("final_hidden_bf16in"), lg_b = ref_->f32("logits_bf16in");
  const auto fh_f = ref_->f32("final_hidden_fp32"), lg_f = ref_->f32("logits_fp32");
  const std::vector<float> last_b(lg_b.end() - (lg_b.size() / P()), lg_b.end());
  const double tol_h = prefill_tol("final_hidden"), tol_l = prefill_tol("logits");
  Rows first;
  for (const Schedule& s : schedules) {
    auto m = load(s.prefill_rows);
    Rows r = prefill(*m, sizes_of(s, T()), false);
    EXPECT_TRUE(close(r.hidden, fh_b, tol_h, s.name + ": final hidden vs bf16in"));
    EXPECT_TRUE(close(r.logits, lg_b, tol_l, s.name + ": logits vs bf16in"));
    EXPECT_TRUE(close(r.last_logits, last_b, prefill_tol("last_logits"),
                      s.name + ": last row's logits (the model's head) vs bf16in"));
    // |ours - fp32| <= |ours - bf16in| + |bf16in - fp32|: the second term is the reference's own.
    EXPECT_TRUE(close(r.hidden, fh_f, tol_h + rounding_effect(fh_b, fh_f), s.name + ": final hidden vs fp32"));
    EXPECT_TRUE(close(r.logits, lg_f, tol_l + rounding_effect(lg_b, lg_f), s.name + ": logits vs fp32"));
    EXPECT_TRUE(argmax_agrees(r.logits, lg_b, m->config().vocab_size, tol_l, P() / 2, s.name + ": argmax vs bf16in"));
    if (first.hidden.empty()) {
      first = r;
    } else {
      EXPECT_EQ(r.hidden, first.hidden) << s.name << " vs " << schedules[0].name << ": final hidden rows differ";
      EXPECT_EQ(r.last_logits, first.last_logits) << s.name << " vs " << schedules[0].name << ": last logits differ";
    }
  }
}

TEST_P(LongPromptParity, PrefillLayerOutputsMatchTransformers) {
  auto m = load(512);
  Rows r = prefill(*m, sizes_of({"chunk512", 512, {}}, T()), true);
  EXPECT_TRUE(close(r.dumps["embed"], ref_->f32("hidden_bf16in.0"), 0.0, "embeddings"));
  const int L = layers(*m);
  for (int l = 1; l < L; l++) {
    const std::string k = "hidden." + std::to_string(l);
    EXPECT_TRUE(close(r.dumps["layer." + std::to_string(l - 1) + ".out"], ref_->f32("hidden_bf16in." + std::to_string(l)),
                      prefill_tol(k), "output of layer " + std::to_string(l - 1) + " vs bf16in"));
  }
  EXPECT_TRUE(close(r.dumps["layer." + std::to_string(L - 1) + ".out"], ref_->f32("last_layer_out_bf16in"),
                    prefill_tol("last_layer_out"), "output of the last layer vs bf16in"));
  // With QFLASH_TOL_REPORT=1: the prompt's last row alone, layer by layer (where a deviation of
  // the last row's logits starts: a steady growth is rounding flips carried forward, a jump at
  // one layer points at that layer's op).
  if (std::getenv("QFLASH_TOL_REPORT")) {
    const int H = m->config().hidden_size;
    const int last = static_cast<int>(std::find(pos_.begin(), pos_.end(), T() - 1) - pos_.begin());
    ASSERT_LT(last, P()) << "the fixture stores the last position";
    auto row = [&](const std::vector<float>& v) {
      return std::vector<float>(v.begin() + static_cast<size_t>(last) * H, v.begin() + static_cast<size_t>(last + 1) * H);
    };
    for (int l = 1; l < L; l++) {
      const std::string k = "hidden." + std::to_string(l);
      close(row(r.dumps["layer." + std::to_string(l - 1) + ".out"]), row(ref_->f32("hidden_bf16in." + std::to_string(l))),
            prefill_tol(k), "last row: layer " + std::to_string(l - 1) + " out vs bf16in");
    }
    // On an accelerator: the same last row on the CPU backend, tensor by tensor in the order the
    // layers make them (mixer_in: the projections' input, which the prefill GEMM rounds to bf16;
    // gdn.mixed / gdn.z: projection outputs; gdn.y: the delta rule's output; attn.gated; the
    // mixer's output; the layer's output). "bf16 flips" counts the elements whose bf16 rounding
    // differs between the backends: in a projection input such a flip moves the projection by
    // 2^-8 of that element, the suspect of the micro_kvf32_cuda case (docs/DESIGN.md, "Parity at length").
    if (std::get<1>(GetParam()) != "cpu") {
      std::string why;
      auto cpu = test::make_test_backend("cpu", &why);
      ASSERT_TRUE(cpu) << why;
      const auto mine = last_row_dumps(be_.get()), ref = last_row_dumps(cpu.get());
      auto bf16_bits = [](float f) {
        uint32_t u;
        std::memcpy(&u, &f, 4);
        return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
      };
      for (int l = 0; l < L; l++)
        for (const char* part : {"mixer_in", "gdn.mixed", "gdn.z", "gdn.y", "attn.gated", "mixer_out", "out"}) {
          const std::string k = "layer." + std::to_string(l) + "." + part;
          const auto a = mine.find(k), b = ref.find(k);
          if (a == mine.end() || b == ref.end() || a->second.size() != b->second.size()) continue;
          double mx = 0, err = 0;
          int flips = 0;
          for (size_t i = 0; i < b->second.size(); i++) {
            mx = std::max(mx, std::fabs(static_cast<double>(b->second[i])));
            err = std::max(err, std::fabs(static_cast<double>(a->second[i]) - b->second[i]));
            flips += bf16_bits(a->second[i]) != bf16_bits(b->second[i]);
          }
          std::printf("[xb] last row %-22s %s vs cpu: max|diff|/max|cpu| %.3g, bf16 flips %d of %zu\n", k.c_str(),
                      std::get<1>(GetParam()).c_str(), mx > 0 ? err / mx : err, flips, b->second.size());
        }
    }
  }
}

TEST_P(LongPromptParity, TokenByTokenDecodeMatchesTransformers) {
  auto m = load(0);
  Rows r = decode(*m);
  const double tol = kFp32 + kv_extra();
  EXPECT_TRUE(close(r.hidden, ref_->f32("final_hidden_fp32"), tol, "decode: final hidden vs fp32"));
  EXPECT_TRUE(close(r.logits, ref_->f32("logits_fp32"), tol, "decode: logits vs fp32"));
  EXPECT_TRUE(argmax_agrees(r.logits, ref_->f32("logits_fp32"), m->config().vocab_size, tol, P() / 2,
                            "decode: argmax vs fp32"));
}

TEST_P(LongPromptParity, PrefillTracksTokenByTokenDecode) {
  auto dec_model = load(0);
  Rows dec = decode(*dec_model);
  auto m = load(512);
  Rows pre = prefill(*m, sizes_of({"chunk512", 512, {}}, T()), false);
  // prefill -> bf16in -> fp32 -> decode: the three tolerances above added.
  const double tol_h = prefill_tol("final_hidden") +
                       rounding_effect(ref_->f32("final_hidden_bf16in"), ref_->f32("final_hidden_fp32")) + kFp32 +
                       kv_extra();
  const double tol_l =
      prefill_tol("logits") + rounding_effect(ref_->f32("logits_bf16in"), ref_->f32("logits_fp32")) + kFp32 + kv_extra();
  EXPECT_TRUE(close(pre.hidden, dec.hidden, tol_h, "prefill vs decode: final hidden"));
  EXPECT_TRUE(close(pre.logits, dec.logits, tol_l, "prefill vs decode: logits"));
  EXPECT_TRUE(argmax_agrees(pre.logits, dec.logits, m->config().vocab_size, tol_l, 1, "prefill vs decode: argmax"));
}

TEST_P(LongPromptParity, GreedyAfterTheLongPromptMatchesTransformers) {
  const int n = static_cast<int>(ref_->i32("greedy_fp32").size());
  for (int rows : {64, 512}) {
    auto m = load(rows);
    EXPECT_TRUE(greedy_agrees(generate(*m, n), "bf16in", prefill_tol("greedy_logits"), 1)) << "prefill chunk " << rows;
  }
  auto m = load(0);
  EXPECT_TRUE(greedy_agrees(generate(*m, n), "fp32", kFp32 + kv_extra(), 1)) << "prompt through the decode ops";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, LongPromptParity,
                         ::testing::Combine(::testing::Values("micro", "odd"), ::testing::ValuesIn(test::test_backends()),
                                            ::testing::Values("kvf32", "kvbf16")),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::get<2>(info.param) + "_" + std::get<1>(info.param);
                         });

}  // namespace
}  // namespace qf
