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
}  // namespace

Status Model::load(const LoadOptions& opt, std::unique_ptr<Model>* out) {
  std::unique_ptr<Model> m(new Model());
  Status s = guarded([&] {
    qf::EngineOptions eo;
    eo.model_dir = opt.model_dir;
    eo.draft = opt.draft;
    eo.device = opt.device;
    eo.max_context = opt.max_context;
    m->impl_->engine = qf::Engine::create(eo);
  });
  if (s) *out = std::move(m);
  return s;
}

Status Model::generate(const GenerateRequest& req, GenerateResult* out,
                       const std::function<bool(std::string_view)>& on_text) {
  return guarded([&] {
    qf::Engine& e = *impl_->engine;
    const std::string prompt = req.chat ? qf::chat_render({{"user", req.prompt, ""}}, true, req.thinking) : req.prompt;
    qf::GenerateOptions g;
    g.max_new_tokens = req.max_tokens;
    g.stop_ids = e.stop_ids();
    g.sampling.temperature = req.temperature;
    g.sampling.top_p = req.top_p;
    g.sampling.top_k = req.top_k;
    g.sampling.seed = req.seed;
    out->text.clear();
    qf::GenStats st = e.generate_text(e.tokenizer().encode(prompt), g, [&](const std::string& piece) {
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
