// int4 at load (--weights int4): the cache file beside the checkpoint (or under
// $XDG_CACHE_HOME/qflash when the folder is read-only) is built once, reused without
// re-quantizing, and rebuilt, never used, when it is stale (the source changed, even with its
// mtimes restored), truncated or corrupted (one byte flipped). The quantized matrices are the
// ones `qflash quantize` writes, bit for bit.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/dtype.h"
#include "core/error.h"
#include "io/int4_cache.h"
#include "io/quantize.h"
#include "io/safetensors.h"
#include "model/weights.h"
#include "runtime/fit.h"
#include "support/test_models.h"

namespace qf {
namespace {

namespace fs = std::filesystem;

test::TinyTarget small_target(uint64_t seed = 1) {
  test::TinyTarget t;
  t.hidden = 128;
  t.layers = 4;
  t.intermediate = 256;
  t.vocab = 512;
  t.heads = 2;
  t.kv_heads = 1;
  t.gdn_v_heads = 2;
  t.seed = seed;
  return t;
}

// The source matrices the rule selects, counted independently of the cache code: 2-D, named
// *.weight, not a norm; lm_head and the (untied) embedding follow the spec.
size_t expected_matrices(const TensorStore& st, bool head_int4) {
  size_t n = 0;
  for (const std::string& name : st.names()) {
    const TensorInfo* t = st.find(name);
    if (t->shape.size() != 2 || !name.ends_with(".weight") || name.find("norm") != std::string::npos) continue;
    if (!head_int4 && name == "lm_head.weight") continue;
    n++;
  }
  return n;
}

std::vector<uint8_t> read_all(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}
void write_all(const std::string& p, const std::vector<uint8_t>& b) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

struct CacheFixture : ::testing::Test {
  std::string dir, root;
  Int4Spec spec;
  void SetUp() override {
    dir = test::write_tiny_target(test::temp_dir("int4c_model"), small_target());
    root = test::temp_dir("int4c_xdg");
  }
  std::unique_ptr<Int4Cache> open() {
    const TensorStore st = TensorStore::open_dir(dir);
    return Int4Cache::open_or_build(st, spec, root);
  }
  std::string beside() const { return int4_cache_path_beside(dir, spec); }
};

TEST_F(CacheFixture, FreshBuildMatchesQuantizeAndIsReusedWithoutRequantizing) {
  const TensorStore st = TensorStore::open_dir(dir);
  const size_t want = expected_matrices(st, true);
  ASSERT_GT(want, 10u);
  const size_t q0 = int4_load_quantized_matrices();
  auto c = Int4Cache::open_or_build(st, spec, root);
  EXPECT_TRUE(c->status().built);
  EXPECT_EQ(c->status().path, beside());
  EXPECT_EQ(c->status().rejected, "");
  EXPECT_EQ(c->status().matrices, want);
  EXPECT_EQ(int4_load_quantized_matrices() - q0, want);
  EXPECT_TRUE(fs::exists(beside()));
  EXPECT_FALSE(beside().ends_with(".safetensors"));  // a folder scan never takes it for a shard
  EXPECT_EQ(int4_cache_problem(beside(), st, spec), "");

  // Every cached matrix is what `qflash quantize` (the same row quantizer) writes.
  const std::string qdir = test::temp_dir("int4c_quantized") + "/q";
  QuantizeOptions qo;
  qo.group = spec.group;
  quantize_checkpoint(dir, qdir, qo);
  const TensorStore qs = TensorStore::open_dir(qdir);
  size_t compared = 0;
  for (const std::string& name : st.names()) {
    const Int4Cache::Matrix* m = c->find(name);
    if (!m) continue;
    const std::string base = name.substr(0, name.size() - 7);
    for (auto [mine, theirs] : {std::pair{m->q, qs.find(name)}, std::pair{m->scales, qs.find(base + ".scales")},
                                std::pair{m->biases, qs.find(base + ".biases")}}) {
      ASSERT_NE(theirs, nullptr) << name;
      ASSERT_EQ(mine->nbytes, theirs->nbytes) << name;
      ASSERT_EQ(0, std::memcmp(mine->data, theirs->data, mine->nbytes)) << name;
    }
    compared++;
  }
  EXPECT_EQ(compared, want);

  // Second load: the same file, nothing quantized.
  const size_t q1 = int4_load_quantized_matrices();
  auto again = Int4Cache::open_or_build(st, spec, root);
  EXPECT_FALSE(again->status().built);
  EXPECT_EQ(again->status().path, beside());
  EXPECT_EQ(int4_load_quantized_matrices(), q1);
  EXPECT_EQ(again->status().matrices, want);
}

TEST_F(CacheFixture, SourceChangedIsDetectedEvenWithMtimesRestored) {
  open();
  const TensorStore st0 = TensorStore::open_dir(dir);
  const size_t want = expected_matrices(st0, true);
  // Same shapes, sizes and header, other values: only mtimes and bytes differ.
  std::map<std::string, struct stat> before;
  for (const auto& e : fs::directory_iterator(dir)) {
    struct stat sb {};
    ::stat(e.path().c_str(), &sb);
    before[e.path().string()] = sb;
  }
  test::write_tiny_target(dir, small_target(99));
  {
    const TensorStore st = TensorStore::open_dir(dir);
    EXPECT_NE(int4_cache_problem(beside(), st, spec).find("stale"), std::string::npos);
  }
  // Restore every file's mtime: the sampled bytes still differ.
  for (const auto& [path, sb] : before) {
    const struct timespec ts[2] = {sb.st_atim, sb.st_mtim};
    ASSERT_EQ(0, ::utimensat(AT_FDCWD, path.c_str(), ts, 0)) << path;
  }
  const size_t q0 = int4_load_quantized_matrices();
  auto c = open();
  EXPECT_TRUE(c->status().built);
  EXPECT_NE(c->status().rejected.find("stale"), std::string::npos) << c->status().rejected;
  EXPECT_EQ(int4_load_quantized_matrices() - q0, want);
  const TensorStore st = TensorStore::open_dir(dir);
  EXPECT_EQ(int4_cache_problem(beside(), st, spec), "");
  // The rebuilt cache holds the new values.
  const TensorInfo* src = st.find("model.layers.0.mlp.down_proj.weight");
  std::vector<uint32_t> q(static_cast<size_t>(src->numel() / 8));
  std::vector<uint16_t> s(static_cast<size_t>(src->shape[0] * (src->shape[1] / spec.group))), b(s.size());
  int4_quantize_matrix(src->data, src->dtype, src->shape[0], src->shape[1], spec.group, q.data(), s.data(), b.data());
  EXPECT_EQ(0, std::memcmp(c->find("model.layers.0.mlp.down_proj.weight")->q->data, q.data(), q.size() * 4));
}

TEST_F(CacheFixture, SpecChangeUsesItsOwnFile) {
  open();
  Int4Spec head_bf16 = spec;
  head_bf16.lm_head_int4 = false;
  const TensorStore st = TensorStore::open_dir(dir);
  auto c = Int4Cache::open_or_build(st, head_bf16, root);
  EXPECT_TRUE(c->status().built);
  EXPECT_NE(c->status().path, beside());
  EXPECT_EQ(c->find("lm_head.weight"), nullptr);
  EXPECT_NE(c->find("model.embed_tokens.weight"), nullptr);  // untied: the embedding is int4 either way
  EXPECT_EQ(c->status().matrices, expected_matrices(st, false));
  // Both caches stay valid side by side.
  EXPECT_EQ(int4_cache_problem(beside(), st, spec), "");
}

TEST_F(CacheFixture, TruncatedCacheIsRebuilt) {
  open();
  const std::vector<uint8_t> good = read_all(beside());
  for (size_t keep : {good.size() - 1, good.size() / 2, size_t(100), size_t(4)}) {
    SCOPED_TRACE(keep);
    write_all(beside(), std::vector<uint8_t>(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(keep)));
    const TensorStore st = TensorStore::open_dir(dir);
    EXPECT_NE(int4_cache_problem(beside(), st, spec), "");
    const size_t q0 = int4_load_quantized_matrices();
    auto c = open();
    EXPECT_TRUE(c->status().built);
    EXPECT_NE(c->status().rejected, "");
    EXPECT_GT(int4_load_quantized_matrices(), q0);
    EXPECT_EQ(read_all(beside()), good);  // the rebuilt file is the same file
  }
}

TEST_F(CacheFixture, OneFlippedByteIsDetectedAndRebuilt) {
  open();
  const std::vector<uint8_t> good = read_all(beside());
  uint64_t hlen = 0;
  for (int i = 0; i < 8; i++) hlen |= static_cast<uint64_t>(good[i]) << (8 * i);
  const size_t data0 = 8 + hlen;
  // Payload: first, middle and last byte; header: a digit of the fingerprint and of an offset.
  const std::string header(good.begin() + 8, good.begin() + static_cast<std::ptrdiff_t>(data0));
  const size_t in_source = 8 + header.find("\"source\":\"") + 12;
  // The last digit of the first tensor's end offset.
  const size_t in_offsets = 8 + header.find("]", header.find("\"data_offsets\":[")) - 1;
  for (size_t at : {data0, data0 + (good.size() - data0) / 2, good.size() - 1, in_source, in_offsets}) {
    SCOPED_TRACE(at);
    std::vector<uint8_t> bad = good;
    bad[at] ^= (at == in_source || at == in_offsets) ? 0x01 : 0x10;
    write_all(beside(), bad);
    const TensorStore st = TensorStore::open_dir(dir);
    const std::string problem = int4_cache_problem(beside(), st, spec);
    EXPECT_NE(problem, "");
    if (at >= data0) {
      EXPECT_NE(problem.find("corrupted"), std::string::npos) << problem;
    }
    const size_t q0 = int4_load_quantized_matrices();
    auto c = open();
    EXPECT_TRUE(c->status().built) << problem;
    EXPECT_GT(int4_load_quantized_matrices(), q0);
    EXPECT_EQ(read_all(beside()), good);
  }
}

// The checkpoint folder is read-only for the loading process: the cache goes under
// $XDG_CACHE_HOME/qflash. Root ignores permission bits, so the load runs in a child process that
// drops to an unprivileged user when the tests run as root.
TEST_F(CacheFixture, ReadOnlyFolderFallsBackToXdgCacheHome) {
  const std::string xdg = test::temp_dir("int4c_xdg_env");
  ASSERT_EQ(0, ::chmod(xdg.c_str(), 0777));
  ASSERT_EQ(0, ::chmod(dir.c_str(), 0555));
  const std::string expect_dir = xdg + "/qflash";
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int code = 0;
    if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) ::_exit(10);
    ::setenv("XDG_CACHE_HOME", xdg.c_str(), 1);
    try {
      if (::access(dir.c_str(), W_OK) == 0) ::_exit(11);  // the folder must really be read-only here
      const TensorStore st = TensorStore::open_dir(dir);
      auto c = Int4Cache::open_or_build(st, spec);  // root "" = $XDG_CACHE_HOME/qflash
      if (!c->status().built) code = 12;
      else if (c->status().path.rfind(expect_dir + "/", 0) != 0) code = 13;
      else if (int4_cache_problem(c->status().path, st, spec) != "") code = 14;
      else if (c->status().path != int4_cache_path_fallback(dir, spec, expect_dir)) code = 15;
    } catch (...) {
      code = 16;
    }
    ::_exit(code);
  }
  int status = 0;
  ASSERT_EQ(pid, ::waitpid(pid, &status, 0));
  ::chmod(dir.c_str(), 0755);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0) << "10 setuid failed, 11 folder writable, 12 not built, 13 not under "
                                    << expect_dir << ", 14 invalid, 15 wrong path, 16 threw";
  EXPECT_FALSE(fs::exists(beside()));
  const std::string cached = int4_cache_path_fallback(dir, spec, expect_dir);
  EXPECT_TRUE(fs::exists(cached));
  // A later load (writable folder now) finds the XDG copy first and quantizes nothing.
  const TensorStore st = TensorStore::open_dir(dir);
  const size_t q0 = int4_load_quantized_matrices();
  auto c = Int4Cache::open_or_build(st, spec, expect_dir);
  EXPECT_FALSE(c->status().built);
  EXPECT_EQ(c->status().path, cached);
  EXPECT_EQ(int4_load_quantized_matrices(), q0);
}

TEST(Int4Cache, RootFollowsXdgCacheHome) {
  const char* old_x = std::getenv("XDG_CACHE_HOME");
  const char* old_h = std::getenv("HOME");
  const std::string keep_x = old_x ? old_x : "", keep_h = old_h ? old_h : "";
  ::setenv("XDG_CACHE_HOME", "/some/where", 1);
  EXPECT_EQ(int4_cache_root(), "/some/where/qflash");
  ::setenv("XDG_CACHE_HOME", "relative/path", 1);  // the XDG spec says: ignore it
  ::setenv("HOME", "/h/u", 1);
  EXPECT_EQ(int4_cache_root(), "/h/u/.cache/qflash");
  ::unsetenv("XDG_CACHE_HOME");
  EXPECT_EQ(int4_cache_root(), "/h/u/.cache/qflash");
  old_x ? ::setenv("XDG_CACHE_HOME", keep_x.c_str(), 1) : ::unsetenv("XDG_CACHE_HOME");
  old_h ? ::setenv("HOME", keep_h.c_str(), 1) : ::unsetenv("HOME");
  // Two checkpoints with the same folder name get different fallback folders.
  Int4Spec s;
  EXPECT_NE(int4_cache_path_fallback("/a/model", s, "/r"), int4_cache_path_fallback("/b/model", s, "/r"));
  EXPECT_EQ(int4_cache_path_fallback("/a/model", s, "/r").rfind("/r/model-", 0), 0u);
}

TEST(Int4Cache, RuleAndTiedHead) {
  Int4Spec s;
  EXPECT_TRUE(int4_load_quantizes("model.layers.0.mlp.up_proj.weight", DType::BF16, {256, 128}, s, false));
  EXPECT_FALSE(int4_load_quantizes("model.layers.0.input_layernorm.weight", DType::BF16, {128}, s, false));
  EXPECT_FALSE(int4_load_quantizes("model.norm.weight", DType::BF16, {1, 128}, s, false));
  EXPECT_FALSE(int4_load_quantizes("candidate_selector.successor_codebook.weight", DType::BF16, {512, 64}, s, false));
  EXPECT_FALSE(int4_load_quantizes("model.visual.blocks.0.mlp.fc1.weight", DType::BF16, {256, 128}, s, false));
  EXPECT_FALSE(int4_load_quantizes("x.weight", DType::U32, {256, 16}, s, false));     // already int4
  EXPECT_FALSE(int4_load_quantizes("x.weight", DType::BF16, {256, 96}, s, false));    // 96 % 64 != 0
  EXPECT_FALSE(int4_load_quantizes("x.conv1d.weight", DType::BF16, {8, 1, 4}, s, false));
  s.lm_head_int4 = false;
  EXPECT_FALSE(int4_load_quantizes("lm_head.weight", DType::BF16, {512, 128}, s, false));
  EXPECT_TRUE(int4_load_quantizes("model.embed_tokens.weight", DType::BF16, {512, 128}, s, false));
  EXPECT_FALSE(int4_load_quantizes("model.embed_tokens.weight", DType::BF16, {512, 128}, s, true));  // it is the head
  s.lm_head_int4 = true;
  EXPECT_TRUE(int4_load_quantizes("language_model.lm_head.weight", DType::F16, {512, 128}, s, false));
  EXPECT_EQ(int4_matrix_bytes(256, 128, 64), size_t(256) * (64 + 2 * 4));
}

TEST(Int4Cache, NothingToQuantizeWritesNothing) {
  // An int4 checkpoint (qflash quantize's output) has no float matrix left but the kept norms.
  const std::string src = test::write_tiny_target(test::temp_dir("int4c_src"), small_target());
  const std::string q = test::temp_dir("int4c_q4") + "/m";
  quantize_checkpoint(src, q, QuantizeOptions{});
  const TensorStore st = TensorStore::open_dir(q);
  auto c = Int4Cache::open_or_build(st, Int4Spec{}, test::temp_dir("int4c_root"));
  EXPECT_EQ(c->status().matrices, 0u);
  EXPECT_EQ(c->status().path, "");
  EXPECT_FALSE(fs::exists(int4_cache_path_beside(q, Int4Spec{})));
}

TEST(Int4Cache, FitEstimateCountsInt4Sizes) {
  const std::string dir = test::write_tiny_target(test::temp_dir("int4c_fit"), small_target());
  const TargetConfig cfg = load_target_config(dir);
  const TensorStore st = TensorStore::open_dir(dir);
  Int4Spec s;
  const MemoryEstimate bf = estimate_memory(cfg, st, nullptr, 256, 8, 4);
  const MemoryEstimate q4 = estimate_memory(cfg, st, nullptr, 256, 8, 4, 0, &s);
  size_t want = 0;
  for (const std::string& n : st.names()) {
    const TensorInfo* t = st.find(n);
    if (t->shape.size() == 1) want += static_cast<size_t>(t->numel()) * 4;
    else if (t->shape.size() == 2 && n.ends_with(".weight") && n.find("norm") == std::string::npos)
      want += static_cast<size_t>(t->shape[0]) * (t->shape[1] / 2 + t->shape[1] / 64 * 4);
    else want += t->nbytes;
  }
  EXPECT_EQ(q4.target_weights, want);
  EXPECT_LT(q4.target_weights * 3, bf.target_weights);
  EXPECT_EQ(q4.cache, bf.cache);
}

// WeightSet in int4 mode hands out the cache's matrices (CPU: in place).
TEST(Int4Cache, WeightSetServesCachedMatrices) {
  const std::string dir = test::write_tiny_target(test::temp_dir("int4c_ws"), small_target());
  const TensorStore st = TensorStore::open_dir(dir);
  auto be = make_cpu_backend();
  WeightOptions wo;
  wo.int4 = true;
  wo.cache_root = test::temp_dir("int4c_ws_root");
  WeightSet ws(be.get(), &st, wo);
  ASSERT_NE(ws.int4_cache(), nullptr);
  const WeightRef w = ws.matrix("model.layers.1.mlp.gate_proj.weight", 256, 128);
  EXPECT_EQ(w.dtype, DType::U32);
  EXPECT_EQ(w.group, 64);
  auto c = Int4Cache::open_or_build(st, wo.spec, wo.cache_root);  // the same file, reused
  EXPECT_FALSE(c->status().built);
  const Int4Cache::Matrix* m = c->find("model.layers.1.mlp.gate_proj.weight");
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(0, std::memcmp(w.data, m->q->data, m->q->nbytes));
  EXPECT_EQ(0, std::memcmp(w.scales, m->scales->data, m->scales->nbytes));
  // The shape the model asks for must still be the source's.
  try {
    ws.matrix("model.layers.1.mlp.gate_proj.weight", 128, 256);
    FAIL() << "a wrong shape was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Tensor);
  }
}

}  // namespace
}  // namespace qf
