#include "server/server.h"

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/error.h"
#include "core/log.h"

namespace qf {

using json = nlohmann::json;

namespace {

const char* kLivePage = R"HTML(<!doctype html>
<html><head><meta charset="utf-8"><title>qflash</title>
<style>body{font:14px system-ui,sans-serif;margin:2em;max-width:50em}td{padding:2px 12px}
.bar{display:inline-block;height:12px;background:#48c}</style></head>
<body><h1>qflash</h1><p id="model"></p><h2>last request</h2><table id="t"></table>
<h3>accept profile (per draft position)</h3><div id="prof"></div>
<script>
async function tick(){
  const r = await fetch('/v1/stats'); const s = await r.json();
  document.getElementById('model').textContent = s.model + ' on ' + s.backend + ', draft ' + s.draft_source;
  const last = s.last || {};
  const rows = ['draft','generated_tokens','rounds','drafted','accepted','tau','tokens_per_second','stop_reason'];
  document.getElementById('t').innerHTML = rows.map(k => '<tr><td>'+k+'</td><td>'+
    (typeof last[k]==='number' ? last[k].toFixed(k==='tau'||k==='tokens_per_second'?2:0) : (last[k]||''))+'</td></tr>').join('');
  document.getElementById('prof').innerHTML = (last.accept_profile||[]).map((p,i) =>
    '<div>d'+(i+1)+' <span class="bar" style="width:'+(p*300)+'px"></span> '+p.toFixed(2)+'</div>').join('');
}
tick(); setInterval(tick, 1000);
</script></body></html>)HTML";

std::string error_body(const std::string& msg, const std::string& type) {
  return json{{"error", {{"message", msg}, {"type", type}}}}.dump();
}

}  // namespace

struct Server::Impl {
  Engine& engine;
  ServerOptions opt;
  httplib::Server http;
  std::mutex gen_mutex;   // one generation at a time
  std::mutex stats_mutex;
  json last_stats = json::object();
  std::thread bg;
  std::atomic<uint64_t> counter{0};

  Impl(Engine& e, const ServerOptions& o) : engine(e), opt(o) {
    if (opt.model_name.empty()) opt.model_name = std::filesystem::path(engine.model_dir()).filename().string();
    routes();
  }

  // Parses the sampling and length fields shared by both endpoints.
  GenerateOptions gen_options(const json& req) {
    GenerateOptions g;
    g.max_new_tokens = req.value("max_tokens", req.value("max_completion_tokens", opt.default_max_tokens));
    if (g.max_new_tokens < 1) throw Error(ErrorKind::Usage, "max_tokens must be >= 1");
    g.sampling.temperature = req.value("temperature", 0.0f);
    g.sampling.top_p = req.value("top_p", 1.0f);
    g.sampling.top_k = req.value("top_k", 0);
    g.sampling.seed = req.value("seed", static_cast<uint64_t>(counter.fetch_add(1)));
    if (g.sampling.temperature < 0 || g.sampling.top_p <= 0 || g.sampling.top_p > 1)
      throw Error(ErrorKind::Usage, "temperature must be >= 0 and top_p in (0, 1]");
    g.stop_ids = engine.stop_ids();
    return g;
  }

  // Runs one generation; `on_text` gets each decoded piece. Returns the telemetry.
  GenStats run(const std::string& prompt, const GenerateOptions& g, const std::function<bool(const std::string&)>& on_text) {
    std::lock_guard<std::mutex> lock(gen_mutex);
    GenStats st = engine.generate_text(engine.tokenizer().encode(prompt), g, on_text);
    std::lock_guard<std::mutex> sl(stats_mutex);
    last_stats = json::parse(st.to_json());
    return st;
  }

  json usage(const GenStats& st) {
    return {{"prompt_tokens", st.prompt_tokens},
            {"completion_tokens", st.generated_tokens},
            {"total_tokens", st.prompt_tokens + st.generated_tokens},
            {"qflash", json::parse(st.to_json())}};
  }

  static std::string finish_reason(const GenStats& st) { return st.stop_reason == "max_tokens" ? "length" : "stop"; }

  std::string prompt_of_chat(const json& req) {
    if (!req.contains("messages") || !req["messages"].is_array() || req["messages"].empty())
      throw Error(ErrorKind::Usage, "'messages' must be a non-empty array");
    std::vector<ChatMessage> msgs;
    for (const auto& m : req["messages"]) {
      if (!m.contains("role") || !m["role"].is_string())
        throw Error(ErrorKind::Usage, "each message needs a string 'role'");
      std::string content;
      if (m.contains("content") && m["content"].is_string()) content = m["content"].get<std::string>();
      msgs.push_back({m["role"].get<std::string>(), content, m.value("reasoning_content", std::string())});
    }
    bool thinking = true;
    if (req.contains("chat_template_kwargs")) thinking = req["chat_template_kwargs"].value("enable_thinking", true);
    return chat_render(msgs, true, thinking);
  }

  void handle(const httplib::Request& r, httplib::Response& res, bool chat) {
    json req = json::parse(r.body, nullptr, false);
    if (req.is_discarded() || !req.is_object()) {
      res.status = 400;
      res.set_content(error_body("request body is not a JSON object", "invalid_request_error"), "application/json");
      return;
    }
    std::string prompt;
    GenerateOptions g;
    try {
      if (chat) {
        prompt = prompt_of_chat(req);
      } else {
        if (!req.contains("prompt") || !req["prompt"].is_string())
          throw Error(ErrorKind::Usage, "'prompt' must be a string");
        prompt = req["prompt"].get<std::string>();
      }
      g = gen_options(req);
    } catch (const std::exception& e) {
      res.status = 400;
      res.set_content(error_body(e.what(), "invalid_request_error"), "application/json");
      return;
    }
    const std::string id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(counter.fetch_add(1));
    const int64_t created = std::chrono::duration_cast<std::chrono::seconds>(
                                std::chrono::system_clock::now().time_since_epoch()).count();
    const std::string object = chat ? "chat.completion" : "text_completion";
    if (req.value("stream", false)) {
      res.set_chunked_content_provider("text/event-stream", [this, prompt, g, chat, id, created](size_t, httplib::DataSink& sink) {
        auto chunk = [&](const json& choice) {
          json c = {{"id", id}, {"object", chat ? "chat.completion.chunk" : "text_completion"}, {"created", created},
                    {"model", opt.model_name}, {"choices", json::array({choice})}};
          const std::string line = "data: " + c.dump() + "\n\n";
          return sink.write(line.data(), line.size());
        };
        try {
          GenStats st = run(prompt, g, [&](const std::string& s) {
            return chunk(chat ? json{{"index", 0}, {"delta", {{"content", s}}}, {"finish_reason", nullptr}}
                              : json{{"index", 0}, {"text", s}, {"finish_reason", nullptr}});
          });
          json last = chat ? json{{"index", 0}, {"delta", json::object()}, {"finish_reason", finish_reason(st)}}
                           : json{{"index", 0}, {"text", ""}, {"finish_reason", finish_reason(st)}};
          json c = {{"id", id}, {"object", chat ? "chat.completion.chunk" : "text_completion"}, {"created", created},
                    {"model", opt.model_name}, {"choices", json::array({last})}, {"usage", usage(st)}};
          const std::string line = "data: " + c.dump() + "\n\ndata: [DONE]\n\n";
          sink.write(line.data(), line.size());
        } catch (const std::exception& e) {
          const std::string line = "data: " + error_body(e.what(), "server_error") + "\n\n";
          sink.write(line.data(), line.size());
        }
        sink.done();
        return true;
      });
      return;
    }
    try {
      std::string text;
      GenStats st = run(prompt, g, [&](const std::string& s) {
        text += s;
        return true;
      });
      json choice = chat ? json{{"index", 0}, {"message", {{"role", "assistant"}, {"content", text}}},
                                {"finish_reason", finish_reason(st)}}
                         : json{{"index", 0}, {"text", text}, {"finish_reason", finish_reason(st)}};
      json body = {{"id", id}, {"object", object}, {"created", created}, {"model", opt.model_name},
                   {"choices", json::array({choice})}, {"usage", usage(st)}};
      res.set_content(body.dump(), "application/json");
    } catch (const Error& e) {
      res.status = e.kind() == ErrorKind::Usage ? 400 : 500;
      res.set_content(error_body(e.what(), e.kind() == ErrorKind::Usage ? "invalid_request_error" : "server_error"),
                      "application/json");
    }
  }

  void routes() {
    http.Get("/", [](const httplib::Request&, httplib::Response& res) { res.set_content(kLivePage, "text/html"); });
    http.Get("/health", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"status":"ok"})", "application/json");
    });
    http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      json m = {{"object", "list"},
                {"data", json::array({{{"id", opt.model_name}, {"object", "model"}, {"owned_by", "qflash"}}})}};
      res.set_content(m.dump(), "application/json");
    });
    http.Get("/v1/stats", [this](const httplib::Request&, httplib::Response& res) {
      std::lock_guard<std::mutex> sl(stats_mutex);
      json s = {{"model", opt.model_name}, {"backend", engine.backend().name()},
                {"draft_source", engine.source() ? engine.source()->name() : "none"}, {"last", last_stats}};
      res.set_content(s.dump(), "application/json");
    });
    http.Post("/v1/completions", [this](const httplib::Request& r, httplib::Response& res) { handle(r, res, false); });
    http.Post("/v1/chat/completions", [this](const httplib::Request& r, httplib::Response& res) { handle(r, res, true); });
  }
};

Server::Server(Engine& engine, const ServerOptions& opt) : impl_(std::make_unique<Impl>(engine, opt)) {}
Server::~Server() { stop(); }

bool Server::listen() {
  log_info("serving %s on http://%s:%d (OpenAI-compatible: /v1/completions, /v1/chat/completions; live page /)",
           impl_->opt.model_name.c_str(), impl_->opt.host.c_str(), impl_->opt.port);
  return impl_->http.listen(impl_->opt.host, impl_->opt.port);
}

int Server::start_background() {
  const int port = impl_->http.bind_to_any_port(impl_->opt.host);
  if (port <= 0) return -1;
  impl_->bg = std::thread([this] { impl_->http.listen_after_bind(); });
  for (int i = 0; i < 200 && !impl_->http.is_running(); i++)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return port;
}

void Server::stop() {
  if (!impl_) return;
  impl_->http.stop();
  if (impl_->bg.joinable()) impl_->bg.join();
}

}  // namespace qf
