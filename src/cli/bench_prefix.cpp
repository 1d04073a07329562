// qflash bench --prefix-turn2 N: time to first token of a conversation's second turn with prefix
// reuse (runtime/prefix_cache.h) against the same turn prefilled from scratch. Turn 1 is a
// --prompt-len token prompt answered with --gen tokens; turn 2 is turn 1's prompt, its answer and
// N new tokens (the next message). Prints both turns' TTFT, the cold turn 2, and whether the warm
// and cold turn 2 produced the same tokens (they must).
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/commands.h"
#include "core/error.h"
#include "model/qwen38.h"
#include "runtime/generate.h"
#include "runtime/prefix_cache.h"

namespace qf::cli {

nlohmann::json bench_prefix_reuse(Qwen38Model& target, DraftSource* src, const BenchArgs& a) {
  const int V = target.config().vocab_size, L = a.prompt_len, T = static_cast<int>(a.prefix_turn2);
  std::mt19937_64 rng(7);
  auto random_ids = [&](int n) {
    std::vector<int32_t> v(n);
    for (auto& t : v) t = static_cast<int32_t>(rng() % static_cast<uint64_t>(V - 2));
    return v;
  };
  Backend& be = target.backend();
  PrefixCache cache(be, static_cast<size_t>(a.prefix_cache_mb) << 20);
  Generator g(target, src, static_cast<int>(a.max_context));
  GenerateOptions go;
  go.max_new_tokens = static_cast<int>(a.gen);
  struct Turn {
    GenStats st;
    std::vector<int32_t> out;
  };
  auto turn = [&](const std::vector<int32_t>& prompt, PrefixCache* c) {
    g.set_prefix_cache(c);
    Turn t;
    t.st = g.generate(prompt, go, [&](int32_t id) { t.out.push_back(id); return true; });
    return t;
  };
  turn(random_ids(std::min(L, 256)), nullptr);  // warm-up: GEMM plans, prefill buffers, graphs
  const std::vector<int32_t> p1 = random_ids(L);
  const Turn t1 = turn(p1, &cache);
  std::vector<int32_t> p2 = p1;
  p2.insert(p2.end(), t1.out.begin(), t1.out.end());
  const std::vector<int32_t> msg = random_ids(T);
  p2.insert(p2.end(), msg.begin(), msg.end());
  if (static_cast<int64_t>(p2.size()) + a.gen > a.max_context)
    fail(ErrorKind::Usage, "prefix_turn2: turn 2 needs %zu + %lld positions; raise --max-context (%lld)", p2.size(),
         (long long)a.gen, (long long)a.max_context);
  const Turn warm = turn(p2, &cache);
  const Turn cold = turn(p2, nullptr);
  const bool same = warm.out == cold.out;
  std::printf("prefix reuse (draft %s, cache %lld MiB, %d snapshot(s), %.1f MiB used)\n", src ? src->name().c_str() : "none",
              (long long)a.prefix_cache_mb, cache.entries(), cache.used() / 1048576.0);
  std::printf("%-14s %8s %8s %10s %10s\n", "turn", "prompt", "reused", "prefill", "TTFT ms");
  auto row = [](const char* name, const GenStats& s) {
    std::printf("%-14s %8d %8d %10.1f %10.1f\n", name, s.prompt_tokens, s.cached_tokens, s.prefill_ms, s.ttft_ms);
  };
  row("1", t1.st);
  row("2 (reused)", warm.st);
  row("2 (cold)", cold.st);
  std::printf("turn 2 speedup %.2fx; same tokens with and without reuse: %s\n",
              warm.st.ttft_ms > 0 ? cold.st.ttft_ms / warm.st.ttft_ms : 0.0, same ? "yes" : "NO");
  if (!same) fail(ErrorKind::Internal, "turn 2 with prefix reuse differs from turn 2 prefilled from scratch");
  return {{"draft", src ? src->name() : "none"},
          {"turn1", nlohmann::json::parse(t1.st.to_json())},
          {"turn2_reused", nlohmann::json::parse(warm.st.to_json())},
          {"turn2_cold", nlohmann::json::parse(cold.st.to_json())},
          {"cache_entries", cache.entries()},
          {"cache_bytes", cache.used()}};
}

}  // namespace qf::cli
