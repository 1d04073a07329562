#include "runtime/engine.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>

#include "backend/registry.h"
#include "core/error.h"
#include "core/log.h"
#include "runtime/fit.h"

namespace qf {

namespace fs = std::filesystem;

std::string default_model_dir() {
  if (const char* e = std::getenv("QFLASH_MODEL"); e && *e) return e;
#ifdef QFLASH_SOURCE_DIR
  const std::string built_in = std::string(QFLASH_SOURCE_DIR) + "/models/demo";
  if (fs::exists(fs::path(built_in) / "config.json")) return built_in;
#endif
  return "models/demo";
}

std::string resolve_draft(const std::string& requested, const std::string& model_dir, bool has_mtp) {
  std::string r = requested;
  if (r == "auto")
    if (const char* e = std::getenv("QFLASH_DRAFT"); e && *e) r = e;
  if (r != "auto") return r;
  if (const char* e = std::getenv("QFLASH_DFLASH2_DIR"); e && *e) return e;
  if (fs::exists(fs::path(model_dir) / "drafter" / "config.json")) return (fs::path(model_dir) / "drafter").string();
  return has_mtp ? "mtp" : "none";
}

std::unique_ptr<Backend> make_backend(const std::string& device) { return create_backend(device); }

WeightOptions weight_options(const EngineOptions& opt) {
  WeightOptions w;
  w.int4 = opt.weights == "int4";
  w.spec.lm_head_int4 = opt.lm_head == "int4";
  return w;
}

void check_before_upload(const std::string& model_dir, const EngineOptions& opt,
                         const std::function<void(const MemoryEstimate&)>& fit) {
  const TargetConfig cfg = load_target_config(model_dir);
  const TensorStore st = TensorStore::open_dir(model_dir);
  const bool has_mtp = cfg.mtp_num_hidden_layers > 0 && st.find("mtp.fc.weight") != nullptr;
  const std::string d = resolve_draft(opt.draft, model_dir, has_mtp);
  std::unique_ptr<TensorStore> dst;
  if (d != "none" && d != "mtp") {
    check_drafter_pair(load_drafter_config(d), cfg);  // config.json only: before its weights are opened
    dst = std::make_unique<TensorStore>(TensorStore::open_dir(d));
  }
  // Verify width: up to 16 drafts + 1 (the largest DFlash2 block) keep a GDN capture slot each.
  const WeightOptions wo = weight_options(opt);
  fit(estimate_memory(cfg, st, dst.get(), static_cast<int>(opt.max_context), static_cast<int>(opt.max_rows),
                      static_cast<int>(kMaxDraftK) + 1, static_cast<int>(opt.prefill_rows),
                      wo.int4 ? &wo.spec : nullptr));
}

std::unique_ptr<Engine> Engine::create(const EngineOptions& opt) {
  validate_engine_options(opt);
  auto e = std::make_unique<Engine>();
  e->opt_ = opt;
  e->model_dir_ = opt.model_dir.empty() ? default_model_dir() : opt.model_dir;
  if (!fs::exists(fs::path(e->model_dir_) / "config.json"))
    fail(ErrorKind::Io, "model folder '%s' has no config.json", e->model_dir_.c_str());
  e->be_ = make_backend(opt.device);
  e->tok_ = std::make_unique<Tokenizer>(Tokenizer::load(e->model_dir_));
  // --prefill-chunk auto: the CPU's fixed chunk, or on a GPU the largest chunk that fits beside
  // everything else the load allocates (fit.h, auto_prefill_rows); chosen before any upload.
  int prefill_rows = opt.prefill_rows == kPrefillRowsAuto ? kAutoPrefillRowsCpu : static_cast<int>(opt.prefill_rows);
  if (e->be_->is_gpu()) {
    size_t total = 0;
    const size_t free_b = e->be_->memory_free(&total);
    check_before_upload(e->model_dir_, opt, [&](const MemoryEstimate& est0) {
      MemoryEstimate est = est0;  // with auto: no prefill buffers counted yet
      if (opt.prefill_rows == kPrefillRowsAuto) {
        const TargetConfig cfg = load_target_config(e->model_dir_);
        const size_t reserved = static_cast<size_t>(opt.prefix_cache_mb) << 20;
        const bool int4 = opt.weights == "int4" || cfg.quant_bits == 4;
        prefill_rows = auto_prefill_rows(true, int4, free_b, total, est.total() + reserved, cfg);
        est.work += prefill_work_bytes(cfg, prefill_rows);
      }
      check_fits(est, free_b, total, e->be_->name(), e->model_dir_);
    });
  }
  const int max_context = static_cast<int>(opt.max_context);
  e->target_ = Qwen38Model::load(e->model_dir_, e->be_.get(), static_cast<int>(opt.max_rows), weight_options(opt));
  e->target_->set_prefill_rows(prefill_rows);
  e->draft_ = resolve_draft(opt.draft, e->model_dir_, e->target_->has_mtp());
  if (e->draft_ == "mtp") {
    e->source_ = std::make_unique<MtpDraftSource>(*e->target_, max_context);
  } else if (e->draft_ != "none") {
    e->source_ = std::make_unique<DFlashDraftSource>(DFlash2Drafter::load(e->draft_, *e->target_));
  }
  e->gen_ = std::make_unique<Generator>(*e->target_, e->source_.get(), max_context);
  if (opt.prefix_cache_mb > 0) {
    e->cache_ = std::make_unique<PrefixCache>(*e->be_, static_cast<size_t>(opt.prefix_cache_mb) << 20);
    e->gen_->set_prefix_cache(e->cache_.get());
  }
  // What stays free after the loads, less the prefill buffers (grown at the first long prompt) and
  // the prefix cache's budget: room for the prefill GEMM's row-major weight copies (fit.h).
  if (e->be_->is_gpu()) {
    size_t total = 0;
    const size_t free_now = e->be_->memory_free(&total);
    const size_t pending = prefill_work_bytes(e->target_->config(), prefill_rows) +
                           (static_cast<size_t>(opt.prefix_cache_mb) << 20);
    e->be_->set_prefill_copy_budget(prefill_copy_budget(free_now, total, pending));
  }
  log_info("backend %s, draft %s, prefill chunk %d rows%s", e->be_->name().c_str(),
           e->source_ ? e->source_->name().c_str() : "none", prefill_rows,
           opt.prefill_rows == kPrefillRowsAuto ? " (auto)" : "");
  return e;
}

double Engine::warm_up() {
  if (!be_->graphs_enabled()) return 0;
  const auto t0 = std::chrono::steady_clock::now();
  // Under 64 tokens: a prompt that leaves no prefix-cache snapshot.
  std::vector<int32_t> p = tok_->encode("def main():\n    print(\"hello\")\n", false);
  const int V = target_->config().vocab_size;
  p.erase(std::remove_if(p.begin(), p.end(), [&](int32_t t) { return t < 0 || t >= V; }), p.end());
  if (p.empty()) p.push_back(0);
  gen_->warm_up(p);
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

GenerationLimits Engine::limits() const {
  GenerationLimits l;
  l.draft_source = source_ ? source_->name() : "none";
  // The round loop verifies k drafts + 1 in one forward of at most max_rows rows.
  l.max_draft_k = source_ ? std::min(source_->max_k(), target_->max_rows() - 1) : 0;
  l.vocab_size = target_->config().vocab_size;
  l.max_context = opt_.max_context;
  return l;
}

GenerateOptions Engine::generate_options(const GenerationOptions& o, int64_t prompt_tokens) const {
  validate_generation_options(o, limits(), prompt_tokens);
  GenerateOptions g;
  g.max_new_tokens = static_cast<int>(o.max_tokens);
  g.draft_k = o.draft_k ? static_cast<int>(*o.draft_k) : -1;
  g.sampling.temperature = static_cast<float>(o.temperature);
  g.sampling.top_k = static_cast<int>(o.top_k);
  g.sampling.top_p = static_cast<float>(o.top_p);
  g.sampling.seed = o.seed;
  if (!o.ignore_eos) g.stop_ids = stop_ids();
  for (int64_t id : o.stop_ids)
    if (std::find(g.stop_ids.begin(), g.stop_ids.end(), id) == g.stop_ids.end())
      g.stop_ids.push_back(static_cast<int32_t>(id));
  return g;
}

GenStats Engine::generate_text(const std::vector<int32_t>& prompt, const GenerationOptions& o,
                              const std::function<bool(const std::string&)>& on_text, const RoundCallback& rc) {
  const GenerateOptions g = generate_options(o, static_cast<int64_t>(prompt.size()));
  StreamDecoder dec(*tok_);
  const int32_t n_text = tok_->vocab_size();
  bool warned = false;
  GenStats st = gen_->generate(prompt, g, [&](int32_t t) {
    if (t >= n_text) {
      if (!warned) log_warn("generated id %d has no text (tokenizer has %d ids); not printed", t, n_text);
      warned = true;
      return true;
    }
    const std::string piece = dec.push(t);
    return piece.empty() || !on_text ? true : on_text(piece);
  }, rc);
  const std::string tail = dec.flush();
  if (!tail.empty() && on_text) on_text(tail);
  return st;
}

std::vector<int32_t> Engine::stop_ids() const {
  std::vector<int32_t> s = tok_->eos_ids();
  for (int id : target_->config().eos_token_ids)
    if (std::find(s.begin(), s.end(), id) == s.end()) s.push_back(id);
  return s;
}

}  // namespace qf
