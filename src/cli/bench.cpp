// qflash bench: speed of plain decoding, MTP and DFlash2 drafting on one model pair, with the
// device's copy bandwidth measured in the same run as the ceiling. Random (synthetic) models use
// forced acceptance (the real draft and verify run at full cost; the accept step is told how
// many drafts to keep); trained pairs use real acceptance over a prompt file.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "cli/commands.h"
#include "core/error.h"
#include "core/log.h"
#include "io/int4_cache.h"
#include "io/safetensors.h"
#include "runtime/engine.h"
#include "runtime/fit.h"
#include "runtime/options.h"

namespace qf::cli {

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

template <class F>
double time_ms(Backend& be, int reps, F&& f, int warmups = 1) {
  std::vector<double> t;
  for (int i = 0; i < warmups; i++) f();  // warm-up
  be.sync();
  for (int i = 0; i < reps; i++) {
    auto t0 = Clock::now();
    f();
    be.sync();
    t.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  return median(t);
}

// Device copy bandwidth (bytes read + written per second), the ceiling for bandwidth ratios.
double copy_gbps(Backend& be) {
  const size_t bytes = be.is_gpu() ? (size_t(1) << 31) : (size_t(1) << 26);
  DeviceBuffer a(&be, bytes), b(&be, bytes);
  be.fill_random(a.get(), bytes / 4, DType::F32, 7, 1.0f);
  const double ms = time_ms(be, 10, [&] { be.copy(b.get(), a.get(), bytes); });
  return 2.0 * bytes / (ms * 1e-3) / 1e9;
}

std::vector<int32_t> random_prompt(int n, int vocab) {
  std::mt19937 rng(1234);
  std::vector<int32_t> p(n);
  for (auto& t : p) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(std::min(vocab, 32000)));
  return p;
}

// --force-accept: a comma list of forced accept counts, each 0..kMaxDraftK.
std::vector<int> parse_list(const std::string& s) {
  std::vector<int> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    size_t used = 0;
    int x = -1;
    try {
      x = std::stoi(item, &used);
    } catch (const std::exception&) {
    }
    if (used != item.size() || x < 0 || x > kMaxDraftK)
      fail_option("force_accept", strf("a comma list of integers in [0, %lld]", (long long)kMaxDraftK), s);
    v.push_back(x);
  }
  return v;
}

}  // namespace

// Turn-2 TTFT with and without prefix reuse (bench_prefix.cpp).
nlohmann::json bench_prefix_reuse(Qwen38Model& target, DraftSource* src, const BenchArgs& a);

namespace {
// Whether the end-to-end runs use forced acceptance: no prompts to read (none given, or a
// synthetic model without a tokenizer) and no --real.
bool bench_forced(const BenchArgs& a) { return (a.prompts.empty() || !a.synthetic.empty()) && !a.real; }

// A bench-only integer in [lo, hi]; `note` follows the range in the message.
void check_bench_int(const char* name, int64_t v, int64_t lo, int64_t hi, const char* note) {
  if (v < lo || v > hi)
    fail_option(name, strf("an integer in [%lld, %lld]%s", (long long)lo, (long long)hi, note), std::to_string(v));
}
}  // namespace

void validate_bench_args(const BenchArgs& a) {
  EngineOptions e;
  e.device = a.device;
  e.draft = a.drafter.empty() ? "auto" : a.drafter;
  e.max_context = a.max_context;
  e.prefill_rows = a.prefill_chunk;
  e.prefix_cache_mb = a.prefix_cache_mb;
  e.weights = a.weights;
  e.lm_head = a.lm_head;
  validate_engine_options(e);
  check_bench_int("prefix_turn2", a.prefix_turn2, 0, a.max_context - 1, " (0 = off)");
  GenerationOptions g;
  g.max_tokens = a.gen;
  g.draft_k = a.mtp_k;
  g.temperature = a.temperature;
  g.seed = a.seed;
  validate_generation_options(g);
  // Forced acceptance (random prompt or synthetic model, no --real) replaces the verdicts, which
  // only greedy decoding allows (Generator::begin): say so before anything loads.
  if (a.temperature > 0 && bench_forced(a))
    fail_option("temperature",
                "0 with forced acceptance (sampling needs real acceptance: --prompts with a model that has a "
                "tokenizer, or --real)",
                strf("%g", a.temperature));
  check_bench_int("prompt_len", a.prompt_len, 1, a.max_context - 1, " (below max_context)");
  if (a.reps < 1) fail_option("reps", "an integer >= 1", std::to_string(a.reps));
  if (a.n_prompts < 1) fail_option("n_prompts", "an integer >= 1", std::to_string(a.n_prompts));
  parse_list(a.force_accept);
}

int cmd_bench(const BenchArgs& a) {
  auto be = make_backend(a.device);
  // The ceiling first, so that its two copy buffers are not part of the peak memory reported.
  const double ceiling = copy_gbps(*be);
  be->memory_peak_reset();
  std::unique_ptr<Qwen38Model> target;
  std::unique_ptr<Tokenizer> tok;
  const int max_rows = 64;
  EngineOptions eo;
  eo.weights = a.weights;
  eo.lm_head = a.lm_head;
  const WeightOptions wo = weight_options(eo);  // the drafter follows the target's
  if (!a.synthetic.empty()) {
    target = Qwen38Model::load_synthetic(a.synthetic, be.get(), max_rows, 1, wo);
  } else {
    const std::string dir = a.model.empty() ? default_model_dir() : a.model;
    target = Qwen38Model::load(dir, be.get(), max_rows, wo);
    tok = std::make_unique<Tokenizer>(Tokenizer::load(dir));
  }
  const TargetConfig& c = target->config();
  // Bytes the target reads per decode step: every weight except the embedding (a row lookup).
  const WeightRef& E = target->embed_weight();
  const double embed_bytes = E.dtype == DType::U32 ? static_cast<double>(int4_matrix_bytes(E.rows, E.cols, E.group))
                                                   : static_cast<double>(E.rows) * E.cols * dtype_size(E.dtype);
  const double target_bytes = static_cast<double>(target->weight_bytes()) - embed_bytes;

  // ---- draft sources ----
  std::unique_ptr<DraftSource> mtp, dfl;
  if (target->has_mtp() && a.mtp) {
    mtp = std::make_unique<MtpDraftSource>(*target, static_cast<int>(a.max_context));
    GenerationOptions g;
    g.max_tokens = a.gen;
    g.draft_k = a.mtp_k;
    g.temperature = a.temperature;
    g.seed = a.seed;
    validate_generation_options(g, {mtp->name(), std::min(mtp->max_k(), max_rows - 1), c.vocab_size, a.max_context});
  }
  std::string drafter = a.drafter;
  if (drafter.empty() && a.synthetic.empty()) drafter = resolve_draft("auto", a.model.empty() ? default_model_dir() : a.model, false);
  if (!a.synthetic_drafter.empty())
    dfl = std::make_unique<DFlashDraftSource>(DFlash2Drafter::load_synthetic(a.synthetic_drafter, *target, 2));
  else if (!drafter.empty() && drafter != "none" && drafter != "mtp")
    dfl = std::make_unique<DFlashDraftSource>(DFlash2Drafter::load(drafter, *target));
  // --prefill-chunk auto as `qflash run` chooses it (fit.h), here from what is free after the loads.
  int64_t prefill_chunk = a.prefill_chunk;
  if (prefill_chunk == kPrefillRowsAuto) {
    size_t total = 0;
    const size_t free_b = be->is_gpu() ? be->memory_free(&total) : 0;
    const size_t other = cache_bytes(c, static_cast<int>(a.max_context), 17) + max_rows * work_row_bytes(c);
    prefill_chunk = auto_prefill_rows(be->is_gpu(), wo.int4 || c.quant_bits == 4, free_b, total, other, c);
  }
  target->set_prefill_rows(static_cast<int>(prefill_chunk));
  // Room for the prefill GEMM's row-major weight copies, as `qflash run` sets it (fit.h).
  if (be->is_gpu()) {
    size_t total = 0;
    const size_t free_b = be->memory_free(&total);
    const size_t pending = cache_bytes(c, static_cast<int>(a.max_context), 17) + max_rows * work_row_bytes(c) +
                           prefill_work_bytes(c, static_cast<int>(std::max<int64_t>(prefill_chunk, 0))) +
                           (a.prefix_turn2 > 0 ? static_cast<size_t>(a.prefix_cache_mb) << 20 : 0);
    be->set_prefill_copy_budget(prefill_copy_budget(free_b, total, pending));
  }

  // Peak device memory of what `qflash run` would hold: the loads (weights, drafter, load-time
  // copies), then the generation runs below; the op timings' own state (17 capture slots for
  // 16-row verifies) is counted apart.
  const size_t peak_load = be->memory_peak();
  nlohmann::json out;
  out["device"] = be->name();
  out["model"] = target->origin();
  out["copy_ceiling_gbps"] = ceiling;
  out["weights"] = a.weights;
  if (a.weights == "int4") out["lm_head"] = a.lm_head;
  out["target_weight_bytes"] = target_bytes;
  out["temperature"] = a.temperature;
  out["seed"] = a.seed;
  if (a.prefix_turn2 > 0) {
    out["prefix_reuse"] = bench_prefix_reuse(*target, dfl ? dfl.get() : mtp.get(), a);
    if (!a.json.empty()) write_file_atomic(a.json, out.dump(2) + "\n");
    return 0;
  }

  // ---- op-level timings: prefill of the prompt, then decode step, verify of k+1 rows and draft
  // passes at that context ----
  {
    const int P = a.prompt_len;
    auto st = target->new_state(P + 64, 17);
    if (dfl) target->set_taps(dfl->tap_layers());
    auto prompt = random_prompt(P, c.vocab_size);
    // The round loop's prefill: chunks of --prefill-chunk rows through the prefill ops (0: the
    // decode forward, max_rows at a time); with a drafter, its tap rows are kept and appended to
    // the drafter's context as the loop does.
    const int pchunk = prefill_chunk > 0 ? static_cast<int>(prefill_chunk) : max_rows;
    auto prefill = [&](int n, DFlashDraftSource* ds) {
      target->reset(*st);
      if (ds) ds->begin(n);
      for (int off = 0; off < n; off += pchunk) {
        const int m = std::min(pchunk, n - off);
        ForwardOpts po;
        po.prefill = prefill_chunk > 0;
        po.lm_head = off + m == n;
        po.logits_last_only = true;
        po.taps = ds != nullptr;
        po.final_hidden = false;
        target->forward(*st, prompt.data() + off, m, po);
        if (ds) ds->observe(*target, off, m, prompt.data());
      }
    };
    nlohmann::json ops;
    // Warm-up: GEMM plans, scratch buffers and the prefill GEMM's weight copies (fit.h), which a
    // cold first prompt pays for once; its time is reported beside the warm figure.
    const auto tw0 = std::chrono::steady_clock::now();
    prefill(std::min(P, pchunk), nullptr);
    be->sync();
    const double first_chunk_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - tw0).count();
    const double pre_ms = time_ms(*be, std::max(1, std::min(a.reps, 3)), [&] { prefill(P, nullptr); });
    ops["prefill_ms"] = pre_ms;
    ops["prefill_tokens_per_second"] = P / (pre_ms * 1e-3);
    ops["prefill_chunk"] = prefill_chunk;
    ops["prefill_chunk_auto"] = a.prefill_chunk == kPrefillRowsAuto;
    ops["prefill_weight_copy_bytes"] = be->prefill_copy_bytes();
    ops["prefill_first_chunk_ms"] = first_chunk_ms;
    std::vector<int32_t> toks(16, prompt[0]);
    ForwardOpts fo;
    fo.taps = dfl != nullptr;
    // Decode, verify and draft passes run as CUDA graphs: the first call runs the ops directly,
    // the second records the graph, later calls replay it (src/model/graph_runner.h). Two warm-up
    // calls, so every timed call is a replay (with one, --reps 1 or 2 timed the recording).
    const double decode = time_ms(*be, a.reps, [&] {
      st->pos = P;
      target->forward(*st, toks.data(), 1, fo);
    }, 2);
    ops["decode_ms"] = decode;
    ops["decode_gbps"] = target_bytes / (decode * 1e-3) / 1e9;
    for (int m : {2, 4, 8, 16}) {
      ForwardOpts vo = fo;
      vo.capture = true;
      const double v = time_ms(*be, a.reps, [&] {
        st->pos = P;
        target->forward(*st, toks.data(), m, vo);
      }, 2);
      ops["verify" + std::to_string(m) + "_ms"] = v;
      ops["verify" + std::to_string(m) + "_over_decode"] = v / decode;
    }
    if (dfl) {
      auto* ds = static_cast<DFlashDraftSource*>(dfl.get());
      prefill(P, ds);
      std::vector<int32_t> drafts(16);
      const int k = ds->max_k();
      const double d = time_ms(*be, a.reps, [&] { ds->draft(prompt[0], P, k, drafts.data()); }, 2);
      ops["dflash2_draft_ms"] = d;
      ops["dflash2_draft_over_decode"] = d / decode;
    }
    out["ops"] = ops;

    // Kernel profile: each kernel timed on its own (events around every launch, graphs off), so
    // the sum shows where a step's GPU time goes; the wall time of the same ops without graphs
    // is printed beside it (the difference is launch gaps and event overhead).
    if (a.profile) {
      const int iters = std::max(3, a.reps / 2);
      nlohmann::json prof;
      auto profile = [&](const char* what, auto&& f) {
        f();
        be->sync();
        be->profile_begin();
        const auto t0 = Clock::now();
        for (int i = 0; i < iters; i++) f();
        be->sync();
        const double wall = std::chrono::duration<double, std::milli>(Clock::now() - t0).count() / iters;
        const std::string table = be->profile_end(iters);
        std::printf("---- kernel profile: %s (%d iterations; wall %.3f ms per iteration with the profiler on) ----\n%s",
                    what, iters, wall, table.c_str());
        prof[what] = {{"wall_ms_profiled", wall}, {"table", table}};
      };
      profile("prefill (one chunk)", [&] {
        target->reset(*st);
        ForwardOpts po;
        po.prefill = prefill_chunk > 0;
        po.logits_last_only = true;
        po.final_hidden = false;
        target->forward(*st, prompt.data(), std::min(P, pchunk), po);
      });
      prefill(P, nullptr);  // the decode and verify profiles run at context P again
      profile("decode (1 row)", [&] {
        st->pos = P;
        target->forward(*st, toks.data(), 1, fo);
      });
      ForwardOpts vo = fo;
      vo.capture = true;
      profile("verify (8 rows)", [&] {
        st->pos = P;
        target->forward(*st, toks.data(), 8, vo);
      });
      if (dfl) {
        auto* ds = static_cast<DFlashDraftSource*>(dfl.get());
        std::vector<int32_t> drafts(16);
        profile("dflash2 draft", [&] { ds->draft(prompt[0], P, ds->max_k(), drafts.data()); });
      }
      out["profile"] = prof;
    }
  }

  const size_t peak_ops = be->memory_peak();
  be->memory_peak_reset();  // the op timings' state is freed: generation starts from the loaded model

  // ---- end-to-end generation ----
  nlohmann::json runs = nlohmann::json::array();
  auto prompt = random_prompt(a.prompt_len, c.vocab_size);
  std::vector<std::vector<int32_t>> prompts;
  if (!a.prompts.empty() && tok) {
    std::ifstream f(a.prompts);
    if (!f) fail(ErrorKind::Io, "cannot open --prompts '%s'", a.prompts.c_str());
    std::string line;
    while (std::getline(f, line) && static_cast<int>(prompts.size()) < a.n_prompts) {
      if (line.empty()) continue;
      // JSONL with token ids ("ids") or text ("text" or "prompt"); otherwise the line is the text.
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_object() && j.contains("ids")) {
        prompts.push_back(j["ids"].get<std::vector<int32_t>>());
        continue;
      }
      std::string text = line;
      if (j.is_object() && j.contains("text")) text = j["text"].get<std::string>();
      else if (j.is_object() && j.contains("prompt")) text = j["prompt"].get<std::string>();
      else if (j.is_string()) text = j.get<std::string>();
      prompts.push_back(tok->encode(text));
    }
  }
  // Each source runs at its fixed k (MTP --mtp-k, DFlash2 its block - 1); --adaptive adds a run
  // with the depth controller (--draft-k auto) after each, under the same forcing.
  struct Cfg {
    std::string name;
    DraftSource* src;
    int force;
    bool auto_k;
  };
  std::vector<Cfg> cfgs = {{"plain", nullptr, -1, false}};
  const bool forced = prompts.empty() && !a.real;
  if (forced && a.temperature > 0)  // validate_bench_args rules this out unless the prompt file was empty
    fail_option("temperature", "0 with forced acceptance (--prompts gave no prompt)", strf("%g", a.temperature));
  for (DraftSource* s : {mtp.get(), dfl.get()}) {
    if (!s) continue;
    std::vector<int> forces = {-1};
    if (forced) {
      forces.clear();
      for (int f : parse_list(a.force_accept))
        if (f <= (s == mtp.get() ? a.mtp_k : s->max_k())) forces.push_back(f);
    }
    for (int f : forces) {
      cfgs.push_back({s->name(), s, f, false});
      if (a.adaptive) cfgs.push_back({s->name(), s, f, true});
    }
  }
  double plain_tps = 0, fixed_tps = 0;
  if (a.ops_only) cfgs.clear();
  for (const Cfg& cf : cfgs) {
    Generator g(*target, cf.src, static_cast<int>(a.max_context));
    GenerateOptions go;
    go.max_new_tokens = static_cast<int>(a.gen);
    if (cf.force >= 0) go.accept_override = forced_acceptance(cf.force);
    go.draft_k = cf.src ? cf.src->default_k() : 0;
    if (cf.src == mtp.get()) go.draft_k = static_cast<int>(a.mtp_k);
    if (cf.auto_k) go.draft_k = kDraftKAuto;
    std::vector<GenStats> all;
    go.sampling.temperature = static_cast<float>(a.temperature);
    const auto& ps = prompts.empty() ? std::vector<std::vector<int32_t>>{prompt} : prompts;
    if (a.warmup) g.warm_up(ps[0]);  // not timed: every round shape's graphs recorded first
    for (size_t i = 0; i < ps.size(); i++) {
      go.sampling.seed = a.seed + i;  // prompt i draws from the same seed in every run
      all.push_back(g.generate(ps[i], go, nullptr));
    }
    double toks = 0, ms = 0, tau_sum = 0, draft = 0, verify = 0, acc = 0, ttft = 0;
    std::vector<int64_t> k_rounds(all[0].k_rounds.size(), 0);
    for (const auto& s : all) {
      for (size_t j = 0; j < k_rounds.size() && j < s.k_rounds.size(); j++) k_rounds[j] += s.k_rounds[j];
      ttft += s.ttft_ms;
      toks += s.generated_tokens;
      ms += s.total_decode_ms;
      tau_sum += s.tau();
      draft += s.draft_ms;
      verify += s.verify_ms;
      acc += s.accept_ms;
    }
    const double tps = toks / (ms * 1e-3);
    if (cf.name == "plain") plain_tps = tps;
    if (!cf.auto_k) fixed_tps = tps;  // the fixed run an auto run follows
    GenStats hist;
    hist.k_rounds = k_rounds;
    nlohmann::json r = {{"draft", cf.name},
                        {"k", all[0].k},
                        {"k_auto", cf.auto_k},
                        {"k_mean", hist.k_mean()},
                        {"k_rounds", k_rounds},
                        {"forced_accept", cf.force},
                        {"prompts", all.size()},
                        {"tokens_per_second", tps},
                        {"ms_per_token", ms / toks},
                        {"tau", tau_sum / all.size()},
                        {"speedup_vs_plain", plain_tps > 0 ? tps / plain_tps : 1.0},
                        {"time_to_first_token_ms", ttft / all.size()},
                        {"phases_ms", {{"draft", draft}, {"verify", verify}, {"accept", acc}, {"total", ms}}}};
    if (cf.name == "plain") r["achieved_gbps"] = target_bytes / (ms / toks * 1e-3) / 1e9;
    if (cf.auto_k) {
      r["speedup_vs_fixed_k"] = fixed_tps > 0 ? tps / fixed_tps : 1.0;
      // What a drafting round after j plain steps paid on top of its depth's cost (the catch-up of
      // their deferred rows): the controller charges it to plain steps (docs/DESIGN.md).
      const CatchUpSummary cu = catch_up_summary(all);
      nlohmann::json b = nlohmann::json::array();
      for (const auto& x : cu.buckets)
        if (x.n > 0)
          b.push_back({{"plain_steps", strf("%d-%d", x.lo, std::min(x.hi, 999))},
                       {"rounds", x.n},
                       {"excess_ms", x.excess_ms},
                       {"excess_plain_steps", cu.plain_ms > 0 ? x.excess_ms / cu.plain_ms : 0.0}});
      r["catch_up"] = {{"plain_step_ms", cu.plain_ms},
                       {"rounds", cu.n},
                       {"fixed_ms", cu.fixed_ms},
                       {"per_row_ms", cu.per_row_ms},
                       {"by_plain_run", b}};
    }
    if (all.size() == 1) r["accept_profile"] = all[0].accept_profile();
    runs.push_back(r);
  }
  out["runs"] = runs;
  // The most device memory in use at any allocation during the loads and the generation runs
  // (weights, load-time relayout copies, states for --max-context, scratch; CUDA context included).
  const size_t peak = std::max(peak_load, be->memory_peak());
  out["peak_memory_bytes"] = peak;
  out["peak_memory_op_timings_bytes"] = peak_ops;
  out["memory_total_bytes"] = [&] {
    size_t total = 0;
    be->memory_free(&total);
    return total;
  }();

  // ---- report ----
  std::printf("qflash bench: %s on %s (copy ceiling %.0f GB/s)", target->origin().c_str(), be->name().c_str(), ceiling);
  if (a.temperature > 0) std::printf(", sampled at temperature %g, seed %llu + prompt index", a.temperature,
                                     (unsigned long long)a.seed);
  std::printf("\n");
  const auto& ops = out["ops"];
  std::printf("prefill %d tokens %.1f ms (%.0f tokens/s, chunks of %lld rows%s; cold first chunk %.1f ms, weight "
              "copies %.2f GB)\n",
              a.prompt_len, ops["prefill_ms"].get<double>(), ops["prefill_tokens_per_second"].get<double>(),
              (long long)prefill_chunk, a.prefill_chunk == kPrefillRowsAuto ? ", auto" : "",
              ops["prefill_first_chunk_ms"].get<double>(), ops["prefill_weight_copy_bytes"].get<double>() / 1e9);
  std::printf("at context %d: decode step %.3f ms (%.0f GB/s, %.0f%% of ceiling)", a.prompt_len, ops["decode_ms"].get<double>(),
              ops["decode_gbps"].get<double>(), 100.0 * ops["decode_gbps"].get<double>() / ceiling);
  std::printf(" | verify 8 rows / decode %.3f", ops["verify8_over_decode"].get<double>());
  if (ops.contains("dflash2_draft_over_decode"))
    std::printf(" | dflash2 draft / decode %.3f", ops["dflash2_draft_over_decode"].get<double>());
  std::printf("\n%-8s %4s %6s %6s %9s %9s %7s %8s %9s\n", "draft", "k", "k mean", "forced", "tok/s", "ms/tok", "tau",
              "speedup", "vs fixed");
  for (const auto& r : runs) {
    const bool ak = r["k_auto"].get<bool>();
    const std::string k = ak ? "auto" : std::to_string(r["k"].get<int>());
    const std::string vs = ak ? strf("%.3f", r["speedup_vs_fixed_k"].get<double>()) : "";
    std::printf("%-8s %4s %6.2f %6d %9.2f %9.3f %7.3f %8.3f %9s\n", r["draft"].get<std::string>().c_str(), k.c_str(),
                r["k_mean"].get<double>(), r["forced_accept"].get<int>(), r["tokens_per_second"].get<double>(),
                r["ms_per_token"].get<double>(), r["tau"].get<double>(), r["speedup_vs_plain"].get<double>(), vs.c_str());
  }
  if (peak)
    std::printf("peak memory %.2f GB of %.2f GB (load + generation; weights %s%s, --max-context %lld)\n", peak / 1e9,
                out["memory_total_bytes"].get<size_t>() / 1e9, a.weights.c_str(),
                a.weights == "int4" ? (", lm_head " + a.lm_head).c_str() : "", (long long)a.max_context);
  // The op timings hold the prompt's own state (K/V for --prompt-len + 64 positions, 17 GDN capture
  // slots) beside the loads: at a long --prompt-len (and with --ops-only, where no generation runs)
  // that is the peak of the prefill itself.
  if (peak_ops)
    std::printf("peak memory of the op timings %.2f GB (loads + the prefill of %d tokens and its state)\n",
                std::max(peak_load, peak_ops) / 1e9, a.prompt_len);
  if (!a.json.empty()) write_file_atomic(a.json, out.dump(2) + "\n");
  return 0;
}

void add_bench_options(CLI::App* c, BenchArgs& a) {
  c->add_option("--model", a.model, "model folder (default: the demo pair)");
  c->add_option("--synthetic", a.synthetic, "config.json of a target to build with random weights (full-size speed)");
  c->add_option("--synthetic-drafter", a.synthetic_drafter, "config.json of a DFlash2 drafter with random weights");
  c->add_option("--drafter", a.drafter, "DFlash2 drafter folder (default: MODEL/drafter)");
  c->add_option("--device", a.device, "auto | cpu | cuda");
  c->add_option("--prompt-len", a.prompt_len, "prompt tokens (random ids): prefill timed, decode and verify at this context");
  c->add_option_function<std::string>(
      "--prefill-chunk", [&a](const std::string& r) { a.prefill_chunk = parse_prefill_rows(r); },
      "prompt rows per prefill forward: auto (default: on a GPU the largest of 8192/4096/2048/1024 that fits, "
      "4096 at most with int4 weights; 4096 on the CPU) or a multiple of 64; 0 = the decode forward");
  c->add_option("--gen", a.gen, "new tokens per run");
  c->add_option("--reps", a.reps, "repetitions of each op timing (median)");
  c->add_option("--force-accept", a.force_accept, "comma list of forced accept counts (random models)");
  c->add_option("--mtp-k", a.mtp_k, "MTP drafts per round");
  c->add_option("--temperature", a.temperature,
                "sample the end-to-end runs at this temperature (0 = greedy, default; needs --prompts or --real)");
  // As text, as `qflash run` takes it: a negative or oversized seed gets the shared message.
  c->add_option_function<std::string>(
      "--seed", [&a](const std::string& s) { a.seed = parse_seed(s); },
      "random seed for sampling (prompt i uses seed + i)");
  c->add_option("--prompts", a.prompts, "JSONL/text file of prompts: real acceptance");
  c->add_option("--n-prompts", a.n_prompts, "use the first N prompts");
  c->add_flag("--profile", a.profile, "time every kernel of a decode step, an 8-row verify and a draft pass (no graphs)");
  c->add_flag("!--no-warmup", a.warmup,
              "time generation without first recording the graphs of every round shape (Generator::warm_up)");
  c->add_flag("--ops-only", a.ops_only, "op timings (and --profile) only: no end-to-end generation");
  c->add_flag("--real", a.real, "real acceptance on the random prompt (no forcing)");
  c->add_flag("--adaptive", a.adaptive,
              "after each drafting run, the same with --draft-k auto (the depth controller), compared in 'vs fixed'");
  c->add_flag("!--no-mtp", a.mtp, "skip the MTP head");
  c->add_option("--max-context", a.max_context, "positions allocated");
  c->add_option("--weights", a.weights, "bf16 (as stored) | int4 (quantized at load; synthetic: on the device)");
  c->add_option("--lm-head", a.lm_head, "with --weights int4: int4 (default) | bf16");
  c->add_option("--json", a.json, "write all results as JSON to this file");
  c->add_option("--prefix-turn2", a.prefix_turn2,
                "N > 0: TTFT of a second turn (turn 1 + its answer + N new tokens) with and without prefix reuse");
  c->add_option("--prefix-cache-mb", a.prefix_cache_mb, "prefix cache budget for --prefix-turn2 (MiB)");
}

}  // namespace qf::cli
