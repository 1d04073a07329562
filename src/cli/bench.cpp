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
#include "io/safetensors.h"
#include "runtime/engine.h"

namespace qf::cli {

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

template <class F>
double time_ms(Backend& be, int reps, F&& f) {
  std::vector<double> t;
  f();  // warm-up
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

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) v.push_back(std::stoi(item));
  return v;
}

}  // namespace

int cmd_bench(const BenchArgs& a) {
  auto be = make_backend(a.device);
  std::unique_ptr<Qwen38Model> target;
  std::unique_ptr<Tokenizer> tok;
  const int max_rows = 64;
  if (!a.synthetic.empty()) {
    target = Qwen38Model::load_synthetic(a.synthetic, be.get(), max_rows, 1);
  } else {
    const std::string dir = a.model.empty() ? default_model_dir() : a.model;
    target = Qwen38Model::load(dir, be.get(), max_rows);
    tok = std::make_unique<Tokenizer>(Tokenizer::load(dir));
  }
  const TargetConfig& c = target->config();
  const double ceiling = copy_gbps(*be);
  // Bytes the target reads per decode step: every weight except the embedding (a row lookup).
  const double target_bytes = static_cast<double>(target->weight_bytes()) -
                              static_cast<double>(c.vocab_size) * c.hidden_size * 2.0 * (target->embed_weight().dtype == DType::F32 ? 2 : 1);

  // ---- draft sources ----
  std::unique_ptr<DraftSource> mtp, dfl;
  if (target->has_mtp() && a.mtp) mtp = std::make_unique<MtpDraftSource>(*target, a.max_context);
  std::string drafter = a.drafter;
  if (drafter.empty() && a.synthetic.empty()) drafter = resolve_draft("auto", a.model.empty() ? default_model_dir() : a.model, false);
  if (!a.synthetic_drafter.empty())
    dfl = std::make_unique<DFlashDraftSource>(DFlash2Drafter::load_synthetic(a.synthetic_drafter, *target, 2));
  else if (!drafter.empty() && drafter != "none" && drafter != "mtp")
    dfl = std::make_unique<DFlashDraftSource>(DFlash2Drafter::load(drafter, *target));

  nlohmann::json out;
  out["device"] = be->name();
  out["model"] = target->origin();
  out["copy_ceiling_gbps"] = ceiling;
  out["target_weight_bytes"] = target_bytes;

  // ---- op-level timings: decode step, verify of k+1 rows, draft passes ----
  {
    const int P = a.prompt_len;
    auto st = target->new_state(P + 64, 17);
    if (dfl) target->set_taps(dfl->tap_layers());
    auto prompt = random_prompt(P, c.vocab_size);
    ForwardOpts pre;
    pre.logits_last_only = true;
    for (int off = 0; off < P; off += max_rows) target->forward(*st, prompt.data() + off, std::min(max_rows, P - off), pre);
    std::vector<int32_t> toks(16, prompt[0]);
    nlohmann::json ops;
    ForwardOpts fo;
    fo.taps = dfl != nullptr;
    const double decode = time_ms(*be, a.reps, [&] {
      st->pos = P;
      target->forward(*st, toks.data(), 1, fo);
    });
    ops["decode_ms"] = decode;
    ops["decode_gbps"] = target_bytes / (decode * 1e-3) / 1e9;
    for (int m : {2, 4, 8, 16}) {
      ForwardOpts vo = fo;
      vo.capture = true;
      const double v = time_ms(*be, a.reps, [&] {
        st->pos = P;
        target->forward(*st, toks.data(), m, vo);
      });
      ops["verify" + std::to_string(m) + "_ms"] = v;
      ops["verify" + std::to_string(m) + "_over_decode"] = v / decode;
    }
    if (dfl) {
      auto* ds = static_cast<DFlashDraftSource*>(dfl.get());
      ds->begin(P);
      st->pos = 0;
      for (int off = 0; off < P; off += max_rows) {
        ForwardOpts po = fo;
        po.logits_last_only = true;
        const int m = std::min(max_rows, P - off);
        target->forward(*st, prompt.data() + off, m, po);
        ds->observe(*target, off, m, prompt.data());
      }
      std::vector<int32_t> drafts(16);
      const int k = ds->max_k();
      const double d = time_ms(*be, a.reps, [&] { ds->draft(prompt[0], P, k, drafts.data()); });
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
  struct Cfg {
    std::string name;
    DraftSource* src;
    int force;
  };
  std::vector<Cfg> cfgs = {{"plain", nullptr, -1}};
  const bool forced = prompts.empty() && !a.real;
  for (DraftSource* s : {mtp.get(), dfl.get()}) {
    if (!s) continue;
    if (forced) {
      for (int f : parse_list(a.force_accept))
        if (f <= (s == mtp.get() ? (a.mtp_k > 0 ? a.mtp_k : 3) : s->max_k())) cfgs.push_back({s->name(), s, f});
    } else {
      cfgs.push_back({s->name(), s, -1});
    }
  }
  double plain_tps = 0;
  if (a.ops_only) cfgs.clear();
  for (const Cfg& cf : cfgs) {
    Generator g(*target, cf.src, a.max_context);
    GenerateOptions go;
    go.max_new_tokens = a.gen;
    go.force_accept = cf.force;
    if (cf.src == mtp.get() && a.mtp_k > 0) go.draft_k = a.mtp_k;
    std::vector<GenStats> all;
    const auto& ps = prompts.empty() ? std::vector<std::vector<int32_t>>{prompt} : prompts;
    for (const auto& p : ps) {
      all.push_back(g.generate(p, go, nullptr));
    }
    double toks = 0, ms = 0, tau_sum = 0, draft = 0, verify = 0, acc = 0;
    for (const auto& s : all) {
      toks += s.generated_tokens;
      ms += s.total_decode_ms;
      tau_sum += s.tau();
      draft += s.draft_ms;
      verify += s.verify_ms;
      acc += s.accept_ms;
    }
    const double tps = toks / (ms * 1e-3);
    if (cf.name == "plain") plain_tps = tps;
    nlohmann::json r = {{"draft", cf.name},
                        {"k", all[0].k},
                        {"forced_accept", cf.force},
                        {"prompts", all.size()},
                        {"tokens_per_second", tps},
                        {"ms_per_token", ms / toks},
                        {"tau", tau_sum / all.size()},
                        {"speedup_vs_plain", plain_tps > 0 ? tps / plain_tps : 1.0},
                        {"phases_ms", {{"draft", draft}, {"verify", verify}, {"accept", acc}, {"total", ms}}}};
    if (cf.name == "plain") r["achieved_gbps"] = target_bytes / (ms / toks * 1e-3) / 1e9;
    if (all.size() == 1) r["accept_profile"] = all[0].accept_profile();
    runs.push_back(r);
  }
  out["runs"] = runs;
  out["peak_memory_bytes"] = be->memory_used();

  // ---- report ----
  std::printf("qflash bench: %s on %s (copy ceiling %.0f GB/s)\n", target->origin().c_str(), be->name().c_str(), ceiling);
  const auto& ops = out["ops"];
  std::printf("decode step %.3f ms (%.0f GB/s, %.0f%% of ceiling)", ops["decode_ms"].get<double>(),
              ops["decode_gbps"].get<double>(), 100.0 * ops["decode_gbps"].get<double>() / ceiling);
  std::printf(" | verify 8 rows / decode %.3f", ops["verify8_over_decode"].get<double>());
  if (ops.contains("dflash2_draft_over_decode"))
    std::printf(" | dflash2 draft / decode %.3f", ops["dflash2_draft_over_decode"].get<double>());
  std::printf("\n%-8s %3s %6s %9s %9s %7s %8s\n", "draft", "k", "forced", "tok/s", "ms/tok", "tau", "speedup");
  for (const auto& r : runs)
    std::printf("%-8s %3d %6d %9.2f %9.3f %7.3f %8.3f\n", r["draft"].get<std::string>().c_str(), r["k"].get<int>(),
                r["forced_accept"].get<int>(), r["tokens_per_second"].get<double>(), r["ms_per_token"].get<double>(),
                r["tau"].get<double>(), r["speedup_vs_plain"].get<double>());
  if (be->memory_used()) std::printf("peak memory %.2f GB\n", be->memory_used() / 1e9);
  if (!a.json.empty()) write_file_atomic(a.json, out.dump(2) + "\n");
  return 0;
}

void add_bench_options(CLI::App* c, BenchArgs& a) {
  c->add_option("--model", a.model, "model folder (default: the demo pair)");
  c->add_option("--synthetic", a.synthetic, "config.json of a target to build with random weights (full-size speed)");
  c->add_option("--synthetic-drafter", a.synthetic_drafter, "config.json of a DFlash2 drafter with random weights");
  c->add_option("--drafter", a.drafter, "DFlash2 drafter folder (default: MODEL/drafter)");
  c->add_option("--device", a.device, "auto | cpu | cuda");
  c->add_option("--prompt-len", a.prompt_len, "prompt tokens (random ids) for synthetic runs");
  c->add_option("--gen", a.gen, "new tokens per run");
  c->add_option("--reps", a.reps, "repetitions of each op timing (median)");
  c->add_option("--force-accept", a.force_accept, "comma list of forced accept counts (random models)");
  c->add_option("--mtp-k", a.mtp_k, "MTP drafts per round");
  c->add_option("--prompts", a.prompts, "JSONL/text file of prompts: real acceptance");
  c->add_option("--n-prompts", a.n_prompts, "use the first N prompts");
  c->add_flag("--profile", a.profile, "time every kernel of a decode step, an 8-row verify and a draft pass (no graphs)");
  c->add_flag("--ops-only", a.ops_only, "op timings (and --profile) only: no end-to-end generation");
  c->add_flag("--real", a.real, "real acceptance on the random prompt (no forcing)");
  c->add_flag("!--no-mtp", a.mtp, "skip the MTP head");
  c->add_option("--max-context", a.max_context, "positions allocated");
  c->add_option("--json", a.json, "write all results as JSON to this file");
}

}  // namespace qf::cli
