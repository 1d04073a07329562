#include "runtime/engine.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>

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

std::unique_ptr<Backend> make_backend(const std::string& device) {
  if (device == "cpu") return make_cpu_backend();
  std::string why;
  if (device == "cuda") {
    auto b = make_cuda_backend(&why);
    if (!b) fail(ErrorKind::Backend, "--device cuda: %s", why.c_str());
    return b;
  }
  if (device != "auto") fail(ErrorKind::Usage, "--device must be auto, cpu or cuda (got '%s')", device.c_str());
  if (auto b = make_cuda_backend(&why)) return b;
  log_debug("no CUDA device: %s; using the CPU", why.c_str());
  return make_cpu_backend();
}

std::unique_ptr<Engine> Engine::create(const EngineOptions& opt) {
  auto e = std::make_unique<Engine>();
  e->model_dir_ = opt.model_dir.empty() ? default_model_dir() : opt.model_dir;
  if (!fs::exists(fs::path(e->model_dir_) / "config.json"))
    fail(ErrorKind::Io, "model folder '%s' has no config.json", e->model_dir_.c_str());
  e->be_ = make_backend(opt.device);
  e->tok_ = std::make_unique<Tokenizer>(Tokenizer::load(e->model_dir_));
  if (e->be_->is_gpu()) {
    // Guard before any weight is uploaded: headers and config only.
    const TargetConfig cfg = load_target_config(e->model_dir_);
    const TensorStore st = TensorStore::open_dir(e->model_dir_);
    const bool has_mtp = cfg.mtp_num_hidden_layers > 0 && st.find("mtp.fc.weight") != nullptr;
    const std::string d = resolve_draft(opt.draft, e->model_dir_, has_mtp);
    std::unique_ptr<TensorStore> dst;
    if (d != "none" && d != "mtp") dst = std::make_unique<TensorStore>(TensorStore::open_dir(d));
    size_t total = 0;
    const size_t free_b = e->be_->memory_free(&total);
    // Verify width: up to 16 drafts + 1 (the largest DFlash2 block) keep a GDN capture slot each.
    check_fits(estimate_memory(cfg, st, dst.get(), opt.max_context, opt.max_rows, 17), free_b, total,
               e->be_->name(), e->model_dir_);
  }
  e->target_ = Qwen38Model::load(e->model_dir_, e->be_.get(), opt.max_rows);
  e->draft_ = resolve_draft(opt.draft, e->model_dir_, e->target_->has_mtp());
  if (e->draft_ == "mtp") {
    e->source_ = std::make_unique<MtpDraftSource>(*e->target_, opt.max_context);
  } else if (e->draft_ != "none") {
    e->source_ = std::make_unique<DFlashDraftSource>(DFlash2Drafter::load(e->draft_, *e->target_));
  }
  e->gen_ = std::make_unique<Generator>(*e->target_, e->source_.get(), opt.max_context);
  log_info("backend %s, draft %s", e->be_->name().c_str(), e->source_ ? e->source_->name().c_str() : "none");
  return e;
}

GenStats Engine::generate_text(const std::vector<int32_t>& prompt, const GenerateOptions& g,
                              const std::function<bool(const std::string&)>& on_text, const RoundCallback& rc) {
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
