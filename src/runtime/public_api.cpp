// The public API (include/qflash/qflash.h) over qf::Engine: exceptions stop here.
#include "qflash/qflash.h"

#include "core/error.h"
#include "runtime/engine.h"

namespace qflash {

struct Model::Impl {
  std::unique_ptr<qf::Engine> engine;
};

Model::Model() : impl_(std::make_unique<Impl>()) {}
Model::~Model() = default;

namespace {
template <class F>
Status guarded(F&& f) {
  try {
    f();
    return {};
  } catch (const qf::Error& e) {
    return {false, qf::error_kind_name(e.kind()), e.what()};
  } catch (const std::exception& e) {
    return {false, "internal", e.what()};
  }
}
qf::EngineOptions engine_options(const LoadOptions& opt) {
  qf::EngineOptions eo;
  eo.model_dir = opt.model_dir;
  eo.draft = opt.draft;
  eo.device = opt.device;
  eo.max_context = opt.max_context;
  eo.weights = opt.weights;
  eo.lm_head = opt.lm_head;
  return eo;
}

qf::GenerationOptions generation_options(const GenerateRequest& req) {
  qf::GenerationOptions g;
  g.max_tokens = req.max_tokens;
  g.temperature = req.temperature;
  g.top_k = req.top_k;
  g.top_p = req.top_p;
  g.seed = req.seed;
  if (req.draft_k) g.draft_k = *req.draft_k;
  g.ignore_eos = req.ignore_eos;
  g.stop_ids.assign(req.stop_ids.begin(), req.stop_ids.end());
  return g;
}

}  // namespace

Status validate(const LoadOptions& opt) {
  return guarded([&] { qf::validate_engine_options(engine_options(opt)); });
}

Status validate(const GenerateRequest& req) {
  return guarded([&] { qf::validate_generation_options(generation_options(req)); });
}

Status Model::load(const LoadOptions& opt, std::unique_ptr<Model>* out) {
  std::unique_ptr<Model> m(new Model());
  Status s = guarded([&] {
    m->impl_->engine = qf::Engine::create(engine_options(opt));
  });
  if (s) *out = std::move(m);
  return s;
}

Status Model::generate(const GenerateRequest& req, GenerateResult* out,
                       const std::function<bool(std::string_view)>& on_text) {
  return guarded([&] {
    qf::Engine& e = *impl_->engine;
    const qf::GenerationOptions g = generation_options(req);
    qf::validate_generation_options(g);  // before the prompt is tokenized
    // Chat: the prompt is message text, never parsed for special tokens.
    const std::vector<int32_t> ids = req.chat ? qf::chat_encode(e.tokenizer(), qf::chat_render_pieces({{"user", req.prompt, ""}}, {true, req.thinking, {}, {}}))
                                              : e.tokenizer().encode(req.prompt);
    out->text.clear();
    qf::GenStats st = e.generate_text(ids, g, [&](const std::string& piece) {
      out->text += piece;
      return on_text ? on_text(piece) : true;
    });
    out->stats_json = st.to_json();
  });
}

std::string Model::draft_source() const {
  return impl_->engine->source() ? impl_->engine->source()->name() : "none";
}
std::string Model::backend() const { return impl_->engine->backend().name(); }

}  // namespace qflash
