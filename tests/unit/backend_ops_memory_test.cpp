// Backend op table, memory and control: alloc (zero-filled), upload / download, fill_zero, copy
// (memmove semantics both ways), import_weight across a GPU's staging chunks, fill_random against
// its definition, the errors a backend must raise (out of memory, a token id outside the table, a
// KV write before the cache start: at the call or at the next sync), and CUDA-graph replay where a
// backend records graphs (replays equal direct runs bit for bit while StepMeta changes).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "support/op_harness.h"
#include "support/op_reference.h"

namespace qf::test {
namespace {

void check_alloc_zero(Backend& be) {
  DeviceBuffer z(&be, 1 << 20);
  const auto h = from_device<uint8_t>(be, z.get(), 1 << 20);
  EXPECT_TRUE(std::all_of(h.begin(), h.end(), [](uint8_t b) { return b == 0; })) << "alloc is not zero-filled";
}

void check_upload_fill_zero(Backend& be) {
  const auto v = randn(5000, 1);
  DeviceBuffer a = to_device(be, v);
  EXPECT_TRUE(same_bits(from_device<float>(be, a.get(), 5000), v, "upload / download round trip"));
  be.fill_zero(a.f() + 100, 50 * sizeof(float));
  std::vector<float> want = v;
  std::fill(want.begin() + 100, want.begin() + 150, 0.0f);
  EXPECT_TRUE(same_bits(from_device<float>(be, a.get(), 5000), want, "fill_zero of elements 100..149"));
}

// copy of 2000 floats from offset 1000 to 1000 + shift: overlapping both ways, adjacent, disjoint.
void check_copy(Backend& be) {
  const auto v = randn(5000, 2);
  for (int shift : {-700, -1, 1, 333, 1500, 2000}) {
    DeviceBuffer b = to_device(be, v);
    std::vector<float> want = v;
    const int n = 2000, s0 = 1000, d0 = s0 + shift;
    std::memmove(want.data() + d0, want.data() + s0, n * sizeof(float));
    be.copy(b.f() + d0, b.f() + s0, n * sizeof(float));
    EXPECT_TRUE(same_bits(from_device<float>(be, b.get(), 5000), want, "copy shifted by " + std::to_string(shift)));
  }
}

// 70 MiB + 12345 bytes: several of a GPU backend's 32 MiB staging chunks and a ragged tail.
void check_import_weight(Backend& be) {
  std::vector<uint8_t> big((size_t(70) << 20) + 12345);
  uint64_t s = 5;
  for (size_t i = 0; i < big.size(); i += 8) {
    const uint64_t x = s = splitmix64(s);
    std::memcpy(big.data() + i, &x, std::min<size_t>(8, big.size() - i));
  }
  const void* w = be.import_weight(big.data(), big.size());
  const auto back = from_device<uint8_t>(be, w, big.size());
  EXPECT_EQ(0, std::memcmp(back.data(), big.data(), big.size())) << "imported bytes differ";
  be.release_weight(w);
}

void check_fill_random(Backend& be, DType dt, size_t n, uint64_t seed, float scale) {
  const size_t bytes = n * (dt == DType::BF16 ? 2 : 4);
  Out out(be, bytes, 1);
  be.fill_random(out.f(), n, dt, seed, scale);
  std::vector<float> got = out.floats("fill_random");
  const auto want = ref_fill_random(0, n, dt, seed, scale);
  EXPECT_EQ(0, std::memcmp(got.data(), want.data(), bytes)) << dtype_tag(dt) << " elements differ from the definition";
}

// Out::floats reads bytes / 4 floats: keep byte counts a multiple of 4.
std::vector<OpCase> memory_cases() {
  return {
      {"alloc_zero_filled", check_alloc_zero},
      {"upload_download_fill_zero", check_upload_fill_zero},
      {"copy_memmove", check_copy},
      {"import_weight_70MiB", check_import_weight},
      {"fill_random_bf16", [](Backend& be) { check_fill_random(be, DType::BF16, 100004, 1234, 0.37f); }},
      {"fill_random_f32", [](Backend& be) { check_fill_random(be, DType::F32, 100003, 1234, 0.37f); }},
      {"fill_random_f32_seed0", [](Backend& be) { check_fill_random(be, DType::F32, 4096, 0, 1.0f); }},
  };
}
QF_OP_SUITE(Memory, memory_cases);

// ---- errors ---------------------------------------------------------------------------------
// A GPU reports device-side checks at the next sync; a CPU at the call. Either way the error is
// a qf::Error and the backend is usable afterwards.
template <class F>
void expect_error_then_usable(Backend& be, F op, ErrorKind kind, const std::string& what) {
  try {
    op();
    be.sync();
    ADD_FAILURE() << what << ": no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << what << ": " << e.what();
  }
  EXPECT_NO_THROW(be.sync()) << what << ": the error was not cleared";
  DeviceBuffer b(&be, 64);
  EXPECT_NO_THROW(be.fill_zero(b.get(), 64));
  EXPECT_NO_THROW(be.sync());
}

void check_out_of_memory(Backend& be) {
  try {
    void* p = be.alloc(size_t(1) << 50);
    be.release(p);
    ADD_FAILURE() << "a 1 PiB allocation succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Backend) << e.what();
    EXPECT_NE(std::string(e.what()).find("out of"), std::string::npos) << e.what();
  }
}

void check_embed_bad_id(Backend& be) {
  const HostWeight E = random_weight(DType::BF16, 10, 16, 3);
  const DevWeight dE = upload_weight(be, E);
  const DeviceBuffer ids = to_device(be, std::vector<int32_t>{1, 10});
  DeviceBuffer out(&be, 2 * 16 * sizeof(float));
  expect_error_then_usable(be, [&] { be.embed(dE.ref, ids.i(), out.f(), 2); }, ErrorKind::Usage, "token id 10 of 10 rows");
}

void check_kv_write_before_start(Backend& be) {
  const DeviceBuffer meta = to_device(be, std::vector<StepMeta>{StepMeta{3, 5, 8, 0}});
  DeviceBuffer cache(&be, 16 * 8 * sizeof(float)), rows(&be, 8 * sizeof(float));
  expect_error_then_usable(
      be, [&] { be.kv_write(cache.f(), rows.f(), 1, 8, reinterpret_cast<const StepMeta*>(meta.get())); },
      ErrorKind::Internal, "kv_write at q_pos0 3 < kv_pos0 5");
}

std::vector<OpCase> error_cases() {
  return {
      {"out_of_memory", check_out_of_memory},
      {"embed_id_outside_table", check_embed_bad_id},
      {"kv_write_before_cache_start", check_kv_write_before_start},
  };
}
QF_OP_SUITE(Errors, error_cases);

// ---- graph replay ---------------------------------------------------------------------------
// A decode-like op sequence (copy, rope, kv_write, attention, all reading positions from
// StepMeta in backend memory) recorded once and replayed for 20 steps with new positions and
// inputs: every replay equals a direct run of the same step bit for bit, and the recording stays
// valid (graph_epoch unchanged). Accelerator backends only (they must record graphs).
void check_graph_replay(Backend& be) {
  ASSERT_TRUE(be.graphs_enabled()) << "backend " << be.name() << " does not record graphs";
  const int nh = 4, nkv = 2, hd = 64, cap = 32, steps = 20;
  AttnParams p;
  p.n_heads = nh;
  p.n_kv_heads = nkv;
  p.head_dim = hd;
  p.scale = 0.125f;
  const size_t qf = static_cast<size_t>(nh) * hd, kvw = static_cast<size_t>(nkv) * hd;
  struct Path {
    DeviceBuffer x, q, k, kc, vc, out, meta;
  };
  auto make_path = [&](Backend& b) {
    Path s{DeviceBuffer(&b, qf * 4),        DeviceBuffer(&b, qf * 4),         DeviceBuffer(&b, kvw * 4),
           DeviceBuffer(&b, cap * kvw * 4), DeviceBuffer(&b, cap * kvw * 4), DeviceBuffer(&b, qf * 4),
           DeviceBuffer(&b, sizeof(StepMeta))};
    b.upload(s.vc.get(), randn(cap * kvw, 9).data(), cap * kvw * 4);
    return s;
  };
  Path direct = make_path(be), graph = make_path(be);
  auto ops = [&](Path& s) {
    const auto* m = reinterpret_cast<const StepMeta*>(s.meta.get());
    be.copy(s.q.get(), s.x.get(), qf * 4);
    be.rope(s.q.f(), 1, nh, hd, hd, 10000.0f, m);
    be.copy(s.k.get(), s.x.get(), kvw * 4);
    be.rope(s.k.f(), 1, nkv, hd, hd, 10000.0f, m);
    be.kv_write(s.kc.f(), s.k.f(), 1, static_cast<int>(kvw), m);
    be.attention(s.q.f(), s.kc.f(), s.vc.f(), s.out.f(), 1, p, m);
  };
  auto set_step = [&](Path& s, int t) {
    const StepMeta meta{t, 0, t + 1, 0};
    be.upload(s.meta.get(), &meta, sizeof(meta));
    be.upload(s.x.get(), randn(qf, 100 + t).data(), qf * 4);
  };
  set_step(graph, 0);
  ops(graph);  // a direct run first: scratch buffers reach their size before recording
  set_step(direct, 0);
  ops(direct);
  be.capture_begin();
  ops(graph);
  void* g = be.capture_end();
  ASSERT_NE(g, nullptr) << "graph instantiation failed on " << be.name();
  const uint64_t epoch = be.graph_epoch();
  for (int t = 1; t < steps; t++) {
    set_step(graph, t);
    be.graph_launch(g);
    set_step(direct, t);
    ops(direct);
    EXPECT_TRUE(same_bits(from_device<float>(be, graph.out.get(), qf), from_device<float>(be, direct.out.get(), qf),
                          "step " + std::to_string(t) + ": replay vs direct"));
  }
  EXPECT_TRUE(same_bits(from_device<float>(be, graph.kc.get(), cap * kvw), from_device<float>(be, direct.kc.get(), cap * kvw),
                        "key cache after the replays"));
  EXPECT_EQ(be.graph_epoch(), epoch) << "a scratch buffer moved during replays";
  be.graph_destroy(g);
}

std::vector<OpCase> graph_cases() { return {{"decode_step_replay", check_graph_replay, false, true}}; }
QF_OP_SUITE(Graphs, graph_cases);

}  // namespace
}  // namespace qf::test
