// After a partial accept, the restored GDN state and the KV rows equal those of plain decoding
// at the same position, bit for bit (docs/spec/speculative.md section 4).
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "backend/backend.h"
#include "model/qwen38.h"
#include "support/backends.h"
#include "support/test_models.h"

namespace qf {
namespace {

std::vector<float> download_all(Backend& be, const DeviceBuffer& b, size_t bytes) {
  std::vector<float> h(bytes / sizeof(float));
  be.download(h.data(), b.get(), bytes);
  return h;
}

class Rollback : public ::testing::TestWithParam<std::string> {};

TEST_P(Rollback, PartialAcceptRestoresPlainStateBitForBit) {
  test::TinyTarget t;
  t.mtp = false;
  const std::string dir = test::write_tiny_target(test::temp_dir("rb"), t);
  std::string why;
  auto be = test::make_test_backend(GetParam(), &why);
  ASSERT_TRUE(be) << why;
  auto m = Qwen38Model::load(dir, be.get(), 16);
  std::mt19937_64 rng(3);
  std::vector<int32_t> prompt(13);
  for (auto& x : prompt) x = rng() % 8000;
  const int k = 7;
  for (int a = 0; a <= k; a++) {
    // Plain: prefill, then feed the greedy tokens one at a time.
    auto sp = m->new_state(128, 0);
    ForwardOpts fo;
    fo.logits_last_only = true;
    m->forward(*sp, prompt.data(), static_cast<int>(prompt.size()), fo);
    std::vector<int32_t> seq;
    int32_t tok;
    be->download(&tok, m->argmax_ids(), 4);
    seq.push_back(tok);
    for (int i = 0; i <= a; i++) {
      m->forward(*sp, &seq.back(), 1, ForwardOpts{});
      be->download(&tok, m->argmax_ids(), 4);
      seq.push_back(tok);
    }
    // Speculative: same prefill, one verify of [anchor, d1..dk] with the first a drafts right.
    auto ss = m->new_state(128, k + 1);
    m->forward(*ss, prompt.data(), static_cast<int>(prompt.size()), fo);
    std::vector<int32_t> block(k + 1);
    block[0] = seq[0];
    for (int j = 1; j <= k; j++) block[j] = j <= a ? seq[j] : (seq[j < (int)seq.size() ? j : 0] + 17) % 8000;
    ForwardOpts vo;
    vo.capture = true;
    m->forward(*ss, block.data(), k + 1, vo);
    std::vector<int32_t> targ(k + 1);
    be->download(targ.data(), m->argmax_ids(), (k + 1) * 4);
    for (int j = 0; j < a; j++) ASSERT_EQ(targ[j], seq[j + 1]) << "verify row " << j << " disagrees with decode";
    const int P = static_cast<int>(prompt.size());
    if (a < k) m->rollback(*ss, a, P + a + 1);
    ASSERT_EQ(ss->pos, sp->pos);
    for (size_t i = 0; i < sp->gdn.size(); i++) {
      auto x = download_all(*be, sp->gdn[i], sp->gdn[i].bytes());
      auto y = download_all(*be, ss->gdn[i], ss->gdn[i].bytes());
      ASSERT_EQ(0, std::memcmp(x.data(), y.data(), x.size() * 4)) << "GDN layer slot " << i << " a=" << a;
    }
    const size_t kv_bytes = static_cast<size_t>(sp->pos) * t.kv_heads * t.head_dim * dtype_size(sp->kv_dtype);
    for (size_t i = 0; i < sp->kcache.size(); i++) {
      auto x = download_all(*be, sp->kcache[i], kv_bytes);
      auto y = download_all(*be, ss->kcache[i], kv_bytes);
      ASSERT_EQ(0, std::memcmp(x.data(), y.data(), kv_bytes)) << "K rows, attention layer " << i << " a=" << a;
      x = download_all(*be, sp->vcache[i], kv_bytes);
      y = download_all(*be, ss->vcache[i], kv_bytes);
      ASSERT_EQ(0, std::memcmp(x.data(), y.data(), kv_bytes)) << "V rows, attention layer " << i << " a=" << a;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, Rollback, ::testing::ValuesIn(test::test_backends()), test::backend_param_name);

}  // namespace
}  // namespace qf
