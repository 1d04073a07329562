// qflash_gdn_bench: one gated-DeltaNet layer of the 27B (16 key heads, 48 value heads, d_k = d_v
// = 128, conv 4) over a prompt of M rows, gdn_chunked against gdn_rows, on the CUDA backend.
// Not a test: run it on the H200. Prints ms per layer, the 48-layer total, and a kernel table.
// Usage: qflash_gdn_bench [--rows M[,M...]] [--reps N] [--no-rows] [--attn-rows M[,M...]] [--attn-only]
//   --no-rows skips the sequential gdn_rows timing (slow at large M).
//   --attn-rows also times one 27B attention layer's attention_prefill (24 q heads, 4 kv heads,
//   head_dim 256, bf16 K/V, causal, a prompt of M rows from position 0) under the kernel that
//   QFLASH_ATTN_PREFILL selects (v1 | v3 | v4), with its 16-layer total and TFLOP/s of causal attention;
//   --attn-only skips the DeltaNet timings.
#include <chrono>
#include <functional>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"

using namespace qf;

namespace {

constexpr int kLayers = 48;      // gated-DeltaNet layers of the 27B
constexpr int kAttnLayers = 16;  // gated-attention layers of the 27B

double time_ms(Backend* be, int reps, const std::function<void()>& f) {
  f();  // warm-up (also grows the scratch)
  be->sync();
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < reps; r++) f();
  be->sync();
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::milli>(t1 - t0).count() / reps;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> Ms = {512, 2048, 8192};
  int reps = 5;
  bool rows = true, gdn = true;
  std::vector<int> attn_Ms;
  for (int i = 1; i < argc; i++) {
    if (!std::strcmp(argv[i], "--rows") && i + 1 < argc) {
      Ms.clear();
      for (char* p = std::strtok(argv[++i], ","); p; p = std::strtok(nullptr, ",")) Ms.push_back(std::atoi(p));
    } else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--no-rows")) {
      rows = false;
    } else if (!std::strcmp(argv[i], "--attn-rows") && i + 1 < argc) {
      for (char* p = std::strtok(argv[++i], ","); p; p = std::strtok(nullptr, ",")) attn_Ms.push_back(std::atoi(p));
    } else if (!std::strcmp(argv[i], "--attn-only")) {
      gdn = false;
    } else {
      std::fprintf(stderr, "usage: %s [--rows M[,M...]] [--reps N] [--no-rows] [--attn-rows M[,M...]] [--attn-only]\n",
                   argv[0]);
      return 2;
    }
  }
  std::string why;
  std::unique_ptr<Backend> be = make_cuda_backend(&why);
  if (!be) {
    std::fprintf(stderr, "no CUDA backend: %s\n", why.c_str());
    return 1;
  }
  GdnDims d;
  d.n_k_heads = 16;
  d.n_v_heads = 48;
  d.d_k = d.d_v = 128;
  d.conv_kernel = 4;
  std::printf("%s\n", be->name().c_str());
  if (gdn) std::printf("27B gated-DeltaNet layer (k heads 16, v heads 48, d 128, conv 4)\n");
  if (gdn) std::printf("%8s %14s %14s %16s %16s\n", "rows", "chunked ms", "rows ms", "48 layers (ch)", "rows/s (ch)");
  for (int M : gdn ? Ms : std::vector<int>{}) {
    const size_t C = d.conv_dim(), Hv = d.n_v_heads;
    DeviceBuffer mixed(be.get(), M * C * 4), alpha(be.get(), M * Hv * 4), beta(be.get(), M * Hv * 4),
        conv(be.get(), C * 4 * 4), A(be.get(), Hv * 4), dt(be.get(), Hv * 4), state(be.get(), d.state_floats() * 4),
        y(be.get(), static_cast<size_t>(M) * d.value_dim() * 4);
    // inputs in the ranges of the tests' "mixed" decay regime
    be->fill_random(mixed.get(), M * C, DType::F32, 1, 1.7f);
    be->fill_random(alpha.get(), M * Hv, DType::F32, 2, 1.7f);
    be->fill_random(beta.get(), M * Hv, DType::F32, 3, 3.0f);
    be->fill_random(conv.get(), C * 4, DType::F32, 4, 0.8f);
    be->fill_random(A.get(), Hv, DType::F32, 5, 2.0f);
    be->fill_random(dt.get(), Hv, DType::F32, 6, 0.8f);
    auto chunked = [&] {
      be->gdn_chunked(mixed.f(), alpha.f(), beta.f(), conv.f(), A.f(), dt.f(), d, state.f(), y.f(), M);
    };
    auto seq = [&] {
      be->gdn_rows(mixed.f(), alpha.f(), beta.f(), conv.f(), A.f(), dt.f(), d, state.f(), y.f(), M, nullptr);
    };
    const double tc = time_ms(be.get(), reps, chunked);
    const double tr = rows ? time_ms(be.get(), 1, seq) : 0.0;
    std::printf("%8d %14.3f %14.3f %16.2f %16.0f\n", M, tc, tr, tc * kLayers, M / tc * 1e3);
    be->profile_begin();
    chunked();
    std::printf("%s", be->profile_end(1).c_str());
  }
  if (!attn_Ms.empty()) {
    const char* v = std::getenv("QFLASH_ATTN_PREFILL");
    std::printf("27B attention layer, attention_prefill (24 q heads, 4 kv heads, head_dim 256, bf16 K/V, causal), "
                "QFLASH_ATTN_PREFILL=%s\n", v ? v : "(unset: v4 where it applies, else v3)");
    std::printf("%8s %12s %16s %14s\n", "rows", "ms / layer", "16 layers (ms)", "TFLOP/s");
  }
  for (int M : attn_Ms) {
    AttnParams p;
    p.n_heads = 24;
    p.n_kv_heads = 4;
    p.head_dim = 256;
    p.scale = 0.0625f;
    p.causal = true;
    p.kv_dtype = DType::BF16;
    const size_t kvw = static_cast<size_t>(p.n_kv_heads) * p.head_dim, rowf = static_cast<size_t>(p.n_heads) * p.head_dim;
    DeviceBuffer q(be.get(), M * rowf * 4), out(be.get(), M * rowf * 4), K(be.get(), M * kvw * 2),
        V(be.get(), M * kvw * 2), meta(be.get(), sizeof(StepMeta));
    be->fill_random(q.get(), M * rowf, DType::F32, 11, 1.5f);
    be->fill_random(K.get(), M * kvw, DType::BF16, 12, 1.5f);
    be->fill_random(V.get(), M * kvw, DType::BF16, 13, 1.0f);
    const StepMeta m{0, 0, M, 0};
    be->upload(meta.get(), &m, sizeof m);
    auto attn = [&] {
      be->attention_prefill(q.f(), K.get(), V.get(), out.f(), M, p, reinterpret_cast<const StepMeta*>(meta.get()));
    };
    const double t = time_ms(be.get(), reps, attn);
    // causal: M (M + 1) / 2 (query, key) pairs per head, 2 products of head_dim MACs each
    const double flop = 4.0 * p.head_dim * p.n_heads * (static_cast<double>(M) * (M + 1) / 2);
    std::printf("%8d %12.3f %16.1f %14.1f\n", M, t, t * kAttnLayers, flop / (t * 1e-3) / 1e12);
  }
  return 0;
}
