// Every case of the adaptive-depth harness (tests/support/demo_adaptive_harness.h) as a table: the
// demo pair on the CPU at real acceptance, injected round costs, auto against plain and the best
// fixed depth for several noise seeds (docs/experiments/adaptive_depth.md). Not a test: the cases
// that meet issue 15's target are tests in tests/e2e/demo_adaptive_test.cpp.
//
//   qflash_adaptive_sweep [--cases a,b,...] [--seeds 1,2,3,4] [--baselines FILE] [--detail 1] [--warm 1] [--root DIR]
//
// --root DIR: the tree whose models/demo and tests/fixtures/prompts are read (default: the source tree).
// --warm 1: every run as `qflash bench` times it on a GPU after Generator::warm_up: no graph-recording
// one-offs, and the greedy controller first taken through the warm-up's controller run (harness.h).
// Its baselines differ (no one-offs): they are cached under "<case>:warm".
// --detail 1: per auto run, where its true cost went (decode steps): plain rounds, drafting rounds
// (and the tokens they made), warm-up one-offs, catch-up, and the switches into drafting.
// --baselines: plain and fixed-k rates per case are read from FILE when there, else measured and
// written to it (they do not depend on the controller, so a controller change reruns auto only).
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "backend/registry.h"
#include "model/qwen38.h"
#include "runtime/draft_source.h"
#include "support/demo_adaptive_harness.h"

using namespace qf;
using namespace qf::harness;

namespace {

struct Case {
  const char* name;
  bool mtp;
  const Machine* mc;
  bool prose;
  float temperature;
  int force;  // forced acceptance (-1: real)
};

const Machine kMtpBrief{"mtp brief", 1.0, 0.15, 0.0, 4.0, 0.5};

const Case kCases[] = {
    {"dflash2-code-t0-demo", false, &kDflashDemo, false, 0.0f, -1},
    {"dflash2-code-t0-brief", false, &kDflashBrief, false, 0.0f, -1},
    {"dflash2-code-t08-demo", false, &kDflashDemo, false, 0.8f, -1},
    {"dflash2-prose-t0-demo", false, &kDflashDemo, true, 0.0f, -1},
    {"dflash2-prose-t08-demo", false, &kDflashDemo, true, 0.8f, -1},
    {"mtp-code-t0-demo", true, &kMtpDemo, false, 0.0f, -1},
    {"mtp-code-t08-demo", true, &kMtpDemo, false, 0.8f, -1},
    {"mtp-prose-t0-demo", true, &kMtpDemo, true, 0.0f, -1},
    {"mtp-prose-t08-demo", true, &kMtpDemo, true, 0.8f, -1},
    {"forced0-dflash2-brief", false, &kDflashBrief, false, 0.0f, 0},
    {"forced0-mtp-brief", true, &kMtpBrief, false, 0.0f, 0},
    {"forced4-dflash2-brief", false, &kDflashBrief, false, 0.0f, 4},
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string x;
  while (std::getline(ss, x, ',')) out.push_back(x);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> want;
  std::vector<uint64_t> seeds = {1, 2, 3, 4};
  std::string cache_path, root = QFLASH_SOURCE_DIR;
  bool detail = false, warm = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--cases") want = split(v);
    else if (a == "--seeds") {
      seeds.clear();
      for (auto& s : split(v)) seeds.push_back(std::stoull(s));
    } else if (a == "--baselines") cache_path = v;
    else if (a == "--detail") detail = v != "0";
    else if (a == "--warm") warm = v != "0";
    else if (a == "--root") root = v;
    else {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  std::string why;
  const BackendEntry* e = find_backend("cpu");
  std::unique_ptr<Backend> be = e->make(&why);
  auto m = Qwen38Model::load(root + "/models/demo", be.get(), 16);
  Tokenizer tok = Tokenizer::load(root + "/models/demo");
  DFlashDraftSource dfl(DFlash2Drafter::load(root + "/models/demo/drafter", *m));
  MtpDraftSource mtp(*m, 1024);

  nlohmann::json cache = nlohmann::json::object();
  if (!cache_path.empty()) {
    std::ifstream f(cache_path);
    if (f) cache = nlohmann::json::parse(f);
  }
  std::printf("%-24s %6s %9s | %-34s | %s\n", "case", "best", "best/pl", "auto/best per seed (min)", "auto/plain per seed (min), k mean");
  for (const Case& c : kCases) {
    if (!want.empty() && std::find(want.begin(), want.end(), c.name) == want.end()) continue;
    DraftSource* src = c.mtp ? static_cast<DraftSource*>(&mtp) : &dfl;
    const auto prompts = load_prompts(
        c.prose ? root + "/tests/fixtures/prompts/prose.jsonl" : root + "/models/demo/validation_prompts.jsonl", tok, 8);
    Baseline b;
    const std::string key = std::string(c.name) + (warm ? ":warm" : "");
    if (cache.contains(key)) {
      b.plain = cache[key]["plain"];
      b.fixed = cache[key]["fixed"].get<std::vector<double>>();
      b.best = b.plain;
      for (size_t k = 1; k < b.fixed.size(); k++)
        if (b.fixed[k] > b.best) b.best = b.fixed[k], b.best_k = static_cast<int>(k);
    } else {
      b = baseline(*m, src, *c.mc, prompts, c.temperature, 128, c.force, warm);
      cache[key] = {{"plain", b.plain}, {"fixed", b.fixed}};
      if (!cache_path.empty()) std::ofstream(cache_path) << cache.dump(1);
    }
    std::string per_best, per_plain, fixed_line, details;
    double min_best = 1e9, min_plain = 1e9, kbar = 0;
    for (size_t k = 1; k < b.fixed.size(); k++) {
      char buf[32];
      std::snprintf(buf, sizeof buf, " k%zu %.3f", k, b.fixed[k] / b.plain);
      fixed_line += buf;
    }
    for (uint64_t s : seeds) {
      const Result a = run(*m, src, kDraftKAuto, *c.mc, prompts, c.temperature, 128, s, c.force, warm);
      char buf[64];
      std::snprintf(buf, sizeof buf, " %.3f", a.rate / b.best);
      per_best += buf;
      std::snprintf(buf, sizeof buf, " %.3f", a.rate / b.plain);
      per_plain += buf;
      min_best = std::min(min_best, a.rate / b.best);
      min_plain = std::min(min_plain, a.rate / b.plain);
      kbar += a.k_mean / seeds.size();
      char d[256];
      std::snprintf(d, sizeof d,
                    "  seed %llu: plain %.0f, drafting %.0f (%.0f tokens, %.2f per step), warm-up %.0f, catch-up %.0f "
                    "(%d switches), k mean %.2f\n",
                    static_cast<unsigned long long>(s), a.plain_cost, a.draft_cost, a.draft_tokens,
                    a.draft_tokens / std::max(a.draft_cost, 1e-9), a.warmup_cost, a.catchup_cost, a.switches, a.k_mean);
      details += d;
      std::vector<int> per_k(src->max_k() + 1, 0);
      for (int kk : a.ks) per_k[kk]++;
      details += "    rounds per k:";
      for (size_t kk = 0; kk < per_k.size(); kk++) details += " " + std::to_string(per_k[kk]);
      details += "\n";
    }
    std::printf("%-24s %6s %9.3f |%s (%.3f) |%s (%.3f), k %.2f\n", c.name,
                b.best_k ? ("k" + std::to_string(b.best_k)).c_str() : "plain", b.best / b.plain, per_best.c_str(),
                min_best, per_plain.c_str(), min_plain, kbar);
    std::printf("  fixed/plain:%s\n", fixed_line.c_str());
    if (detail) std::printf("%s", details.c_str());
    std::fflush(stdout);
  }
  return 0;
}
