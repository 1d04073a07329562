#include "server/server.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "server/http.h"
#include "server/output.h"
#include "server/request.h"
#include "server/workers.h"
#include "tokenizer/utf8.h"

namespace qf {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

namespace {

// A request that ends before generation: status, message, parameter, code.
struct Refusal {
  int status;
  std::string message, param, code;
  http::Headers headers;
};

void refuse(http::Reply& r, const Refusal& f) {
  const char* type = f.status == 429 ? "rate_limit_error" : f.status >= 500 ? "server_error" : "invalid_request_error";
  r.send_json(f.status, http::error_json(f.message, type, f.param, f.code), f.headers);
}

// Running speculation figures of one generation, for the chunks the live page reads.
struct LiveStats {
  int rounds = 0, tokens = 0;
  int64_t drafted = 0, accepted = 0;
  std::vector<int64_t> drafted_at, accepted_at;
  Clock::time_point first_token;

  void round(int k, int a) {
    rounds++;
    drafted += k;
    accepted += a;
    if (static_cast<int>(drafted_at.size()) < k) drafted_at.resize(k), accepted_at.resize(k);
    for (int j = 0; j < k; j++) drafted_at[j]++, accepted_at[j] += j < a;
  }
  json to_json() const {
    json prof = json::array();
    for (size_t j = 0; j < drafted_at.size(); j++)
      prof.push_back(drafted_at[j] ? double(accepted_at[j]) / double(drafted_at[j]) : 0.0);
    const double s = tokens > 1 ? std::chrono::duration<double>(Clock::now() - first_token).count() : 0.0;
    return {{"generated_tokens", tokens},
            {"rounds", rounds},
            {"drafted", drafted},
            {"accepted", accepted},
            {"tau", rounds ? double(accepted + rounds) / rounds : 0.0},
            {"accept_profile", prof},
            {"tokens_per_second", s > 0 ? (tokens - 1) / s : 0.0}};
  }
};

std::string finish_reason(const GenStats& st, const OutputAssembler& out) {
  if (out.stopped()) return "stop";
  if (st.stop_reason == "max_tokens" || st.stop_reason == "context_full") return "length";
  return out.tool_calls() > 0 ? "tool_calls" : "stop";
}

}  // namespace

struct Server::Impl {
  Engine& engine;
  ServerOptions opt;
  std::unique_ptr<http::Server> http;
  std::unique_ptr<WorkerPool> workers;
  std::unique_ptr<EngineQueue> queue;
  int port = 0;
  std::thread bg;
  std::atomic<uint64_t> counter{0};
  std::mutex stats_mu;
  json last_stats = json::object();
  size_t max_prompt_bytes = 0;

  Impl(Engine& e, const ServerOptions& o, GenerateFn gen) : engine(e), opt(o) {
    if (opt.model_name.empty()) opt.model_name = std::filesystem::path(engine.model_dir()).filename().string();
    // A text longer than this has more tokens than the context holds, whatever it says: every
    // token covers at most `longest` bytes, and NFC shortens text at most 3x (Hangul jamo).
    size_t longest = 1;
    const Tokenizer& tok = engine.tokenizer();
    for (int32_t i = 0; i < tok.vocab_size(); i++) longest = std::max(longest, tok.token_bytes(i).size());
    max_prompt_bytes = static_cast<size_t>(engine.limits().max_context) * longest * 3;
    http::Limits lim;
    lim.max_body_bytes = static_cast<size_t>(opt.max_body_bytes);
    lim.request_timeout_s = opt.request_timeout_s;
    lim.idle_timeout_s = opt.idle_timeout_s;
    lim.send_timeout_s = opt.send_timeout_s;
    lim.max_connections = opt.max_connections;
    http = std::make_unique<http::Server>(lim, [this](http::Request&& r, std::shared_ptr<http::Reply> reply) {
      route(std::move(r), std::move(reply));
    });
    port = http->bind(opt.host, opt.port);
    workers = std::make_unique<WorkerPool>(opt.workers);
    queue = std::make_unique<EngineQueue>(engine, opt.queue, std::move(gen));
  }

  // On the HTTP thread: cheap answers here, completions to the pool.
  void route(http::Request&& r, std::shared_ptr<http::Reply> reply) {
    struct Route {
      const char* path;
      const char* method;
    };
    static const Route routes[] = {{"/", "GET"},          {"/health", "GET"},   {"/v1/models", "GET"},
                                   {"/v1/stats", "GET"},  {"/favicon.ico", "GET"},
                                   {"/v1/completions", "POST"}, {"/v1/chat/completions", "POST"}};
    const std::string models_prefix = "/v1/models/";
    const char* allowed = nullptr;
    for (const Route& rt : routes)
      if (r.path == rt.path) allowed = rt.method;
    if (!allowed && r.path.rfind(models_prefix, 0) == 0) allowed = "GET";
    if (!allowed)
      return refuse(*reply, {404, "no such endpoint: " + utf8::clip(r.path, 100) + " (see /v1/models, /v1/completions, /v1/chat/completions)", "", "not_found", {}});
    if (r.method != allowed)
      return refuse(*reply, {405, "method " + utf8::clip(r.method, 16) + " not allowed on " + utf8::clip(r.path, 100) + "; use " + allowed, "",
                             "method_not_allowed", {{"Allow", allowed}}});
    if (r.path == "/") return reply->send(200, "text/html; charset=utf-8", live_page_html(), {{"Cache-Control", "no-store"}});
    if (r.path == "/favicon.ico") return reply->send(204, "image/x-icon", "");
    if (r.path == "/health") return reply->send_json(200, R"({"status":"ok"})");
    if (r.path == "/v1/models") return reply->send_json(200, json{{"object", "list"}, {"data", json::array({model_card()})}}.dump());
    if (r.path.rfind(models_prefix, 0) == 0) {
      if (r.path.substr(models_prefix.size()) != opt.model_name) return refuse(*reply, unknown_model(r.path.substr(models_prefix.size())));
      return reply->send_json(200, model_card().dump());
    }
    if (r.path == "/v1/stats") return reply->send_json(200, stats().dump(), {{"Cache-Control", "no-store"}});
    const bool chat = r.path == "/v1/chat/completions";
    workers->submit([this, req = std::move(r), reply, chat]() mutable { complete(req, reply, chat); });
  }

  json model_card() const { return {{"id", opt.model_name}, {"object", "model"}, {"created", 0}, {"owned_by", "qflash"}}; }

  Refusal unknown_model(const std::string& name) const {
    return {404, "model '" + utf8::clip(name, 100) + "' not found; this server serves '" + opt.model_name + "'", "model", "model_not_found", {}};
  }

  json stats() {
    std::lock_guard<std::mutex> l(stats_mu);
    return {{"model", opt.model_name},
            {"backend", engine.backend().name()},
            {"draft_source", engine.draft_name() == "none" ? "none" : engine.limits().draft_source},
            {"max_context", engine.limits().max_context},
            {"queue", {{"waiting", queue->waiting()}, {"busy", queue->busy()}, {"capacity", opt.queue}}},
            {"last", last_stats}};
  }

  // On a pool thread: parse, validate, tokenize, queue. Nothing here holds the engine.
  void complete(const http::Request& r, const std::shared_ptr<http::Reply>& reply, bool chat) {
    CompletionRequest cr;
    std::vector<int32_t> ids;
    GenerateOptions go;
    try {
      if (json_depth(r.body) > kMaxJsonDepth)
        fail_option("request body", "JSON nested at most " + std::to_string(kMaxJsonDepth) + " deep", "deeper nesting");
      const ojson body = ojson::parse(r.body, nullptr, /*allow_exceptions=*/false);
      if (body.is_discarded()) fail_option("request body", "a JSON object", "text that is not JSON");
      cr = parse_completion_request(body, chat, opt.default_max_tokens, counter.fetch_add(1));
      if (!cr.model.empty() && cr.model != opt.model_name) return refuse(*reply, unknown_model(cr.model));
      size_t bytes = cr.prompt.size();
      for (const ChatPiece& p : cr.chat) bytes += p.text.size();
      if (bytes > max_prompt_bytes)
        fail(ErrorKind::Usage, "%s: expected at most %zu bytes (more cannot fit in max_context %lld tokens), found %zu",
             chat ? "messages" : "prompt", max_prompt_bytes, (long long)engine.limits().max_context, bytes);
      ids = chat ? chat_encode(engine.tokenizer(), cr.chat) : engine.tokenizer().encode(cr.prompt);
      const int64_t room = engine.limits().max_context - static_cast<int64_t>(ids.size());
      if (!cr.max_tokens_given && room >= 1) cr.gen.max_tokens = std::min(cr.gen.max_tokens, room);
      go = engine.generate_options(cr.gen, static_cast<int64_t>(ids.size()));
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::Usage) log_warn("request failed: %s", e.what());
      const std::string msg = e.kind() == ErrorKind::Usage ? e.what() : "internal error while reading the request";
      return refuse(*reply, {e.kind() == ErrorKind::Usage ? 400 : 500, msg, param_of_message(msg), "", {}});
    } catch (const std::exception& e) {
      log_warn("request failed: %s", e.what());  // library text stays in the log
      return refuse(*reply, {500, "internal error while reading the request", "", "", {}});
    }
    auto job = std::make_shared<Job>(*this, reply, chat, cr);
    auto ej = std::make_shared<EngineJob>();
    ej->prompt = std::move(ids);
    ej->options = go;
    ej->on_token = [job](int32_t t, TokenOrigin o) { return job->token(t, o); };
    ej->on_round = [job](int k, int a) { job->live.round(k, a); };
    ej->on_finish = [job](const GenStats& st, const std::string* err) { job->finish(st, err); };
    ej->cancelled = [reply] { return reply->gone(); };
    if (!queue->submit(ej)) {
      const int after = queue->retry_after_s();
      return refuse(*reply, {429, strf("the server is busy: %d requests wait for the engine (the most it queues); retry after %d s",
                                       queue->waiting(), after),
                             "", "queue_full", {{"Retry-After", std::to_string(after)}}});
    }
    if (cr.stream) job->start_stream();
  }

  // One completion, streamed or whole. Callbacks run on the engine thread except start_stream.
  struct Job {
    Impl& srv;
    std::shared_ptr<http::Reply> reply;
    const bool chat, stream;
    const std::string id;
    const int64_t created;
    OutputAssembler out;
    StreamDecoder dec;
    LiveStats live;
    std::mutex mu;  // the stream's first bytes: headers and role chunk, from either thread
    bool started = false;
    std::string content, reasoning;
    std::vector<ToolCall> calls;

    Job(Impl& s, std::shared_ptr<http::Reply> r, bool c, const CompletionRequest& cr)
        : srv(s), reply(std::move(r)), chat(c), stream(cr.stream),
          id((c ? "chatcmpl-" : "cmpl-") + std::to_string(s.counter.fetch_add(1))),
          created(std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count()),
          out(OutputOptions{cr.stop, c && cr.thinking, c && cr.tools, cr.tool_call_prefix, "call_" + id.substr(id.find('-') + 1) + "_"}),
          dec(s.engine.tokenizer()) {}

    json chunk(json choice, const json* extra) const {
      choice["index"] = 0;
      if (!choice.contains("finish_reason")) choice["finish_reason"] = nullptr;
      if (!chat && !choice.contains("logprobs")) choice["logprobs"] = nullptr;
      json c = {{"id", id}, {"object", chat ? "chat.completion.chunk" : "text_completion"}, {"created", created},
                {"model", srv.opt.model_name}, {"choices", json::array({choice})}};
      if (extra) c["qflash"] = *extra;
      return c;
    }
    bool send_chunk(const json& c) { return reply->write("data: " + c.dump() + "\n\n"); }

    void start_stream() {
      std::lock_guard<std::mutex> l(mu);
      if (started) return;
      started = true;
      reply->begin_stream(200, "text/event-stream");
      if (chat) send_chunk(chunk({{"delta", {{"role", "assistant"}, {"content", ""}}}}, nullptr));
    }

    void deliver(std::vector<OutputEvent>& events) {
      for (OutputEvent& e : events) {
        if (!stream) {
          if (e.kind == OutputEvent::Kind::Content) content += e.text();
          if (e.kind == OutputEvent::Kind::Reasoning) reasoning += e.text();
          if (e.kind == OutputEvent::Kind::ToolCall) calls.push_back(e.call);
          continue;
        }
        json pieces = json::array();
        for (const Segment& g : e.segments) pieces.push_back({{"text", g.text}, {"draft", g.origin == TokenOrigin::Draft}});
        const json extra = {{"pieces", pieces}, {"stats", live.to_json()}};
        json choice;
        if (e.kind == OutputEvent::Kind::ToolCall) {
          choice = {{"delta", {{"tool_calls", json::array({{{"index", static_cast<int>(calls.size())}, {"id", e.call.id}, {"type", "function"},
                                                           {"function", {{"name", e.call.name}, {"arguments", e.call.arguments}}}}})}}}};
          calls.push_back(e.call);
        } else if (!chat) {
          choice = {{"text", e.text()}};
        } else {
          choice = {{"delta", {{e.kind == OutputEvent::Kind::Reasoning ? "reasoning_content" : "content", e.text()}}}};
        }
        send_chunk(chunk(choice, &extra));
      }
      events.clear();
    }

    bool token(int32_t t, TokenOrigin origin) {
      if (live.tokens++ == 0) live.first_token = Clock::now();
      if (stream) start_stream();
      if (t >= srv.engine.tokenizer().vocab_size()) return true;  // padded vocabulary rows have no text
      const std::string piece = dec.push(t);
      std::vector<OutputEvent> events;
      const bool more = piece.empty() || out.push(piece, origin, events);
      deliver(events);
      return more && !reply->gone();
    }

    void finish(const GenStats& st, const std::string* error) {
      if (st.stop_reason == "cancelled") return;  // the client left while it waited
      std::vector<OutputEvent> events;
      const std::string tail = dec.flush();
      if (!tail.empty()) out.push(tail, TokenOrigin::Target, events);
      out.finish(events);
      deliver(events);
      const std::string reason = finish_reason(st, out);
      json stats_json = json::parse(st.to_json());
      {
        std::lock_guard<std::mutex> l(srv.stats_mu);
        srv.last_stats = stats_json;
        srv.last_stats["finish_reason"] = error ? "error" : reason;
        srv.last_stats["client_gone"] = reply->gone();
      }
      const json usage = {{"prompt_tokens", st.prompt_tokens},
                          {"completion_tokens", st.generated_tokens},
                          {"total_tokens", st.prompt_tokens + st.generated_tokens},
                          {"prompt_tokens_details", {{"cached_tokens", st.cached_tokens}}},
                          {"qflash", stats_json}};
      if (stream) {
        start_stream();
        if (error) {
          reply->write("data: " + http::error_json("generation failed (see the server log)", "server_error") + "\n\n");
        } else {
          json c = chunk(chat ? json{{"delta", json::object()}, {"finish_reason", reason}} : json{{"text", ""}, {"finish_reason", reason}},
                         nullptr);
          c["usage"] = usage;
          send_chunk(c);
        }
        reply->write("data: [DONE]\n\n");
        reply->end_stream();
        return;
      }
      if (error) return refuse(*reply, {500, "generation failed (see the server log)", "", "", {}});
      json choice;
      if (chat) {
        json msg = {{"role", "assistant"}, {"content", content.empty() && !calls.empty() ? json(nullptr) : json(content)}};
        if (!reasoning.empty()) msg["reasoning_content"] = reasoning;
        if (!calls.empty()) {
          msg["tool_calls"] = json::array();
          for (const ToolCall& c : calls)
            msg["tool_calls"].push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
        }
        choice = {{"index", 0}, {"message", msg}, {"finish_reason", reason}};
      } else {
        choice = {{"index", 0}, {"text", content}, {"finish_reason", reason}, {"logprobs", nullptr}};
      }
      const json body = {{"id", id}, {"object", chat ? "chat.completion" : "text_completion"}, {"created", created},
                         {"model", srv.opt.model_name}, {"choices", json::array({choice})}, {"usage", usage}};
      reply->send_json(200, body.dump());
    }
  };
};

Server::Server(Engine& engine, const ServerOptions& opt, GenerateFn generate_fn)
    : impl_(std::make_unique<Impl>(engine, opt, std::move(generate_fn))) {}

Server::~Server() {
  stop();
  // The pool first (its tasks may still queue jobs), then the engine thread (its last job may
  // still write through a Reply); the HTTP server outlives both.
  impl_->workers.reset();
  impl_->queue.reset();
}

int Server::port() const { return impl_->port; }

void Server::run() {
  log_info("serving %s on http://%s:%d (OpenAI-compatible: /v1/completions, /v1/chat/completions; live page /)",
           impl_->opt.model_name.c_str(), impl_->opt.host.c_str(), impl_->port);
  impl_->http->run();
}

int Server::start_background() {
  impl_->bg = std::thread([this] { impl_->http->run(); });
  return impl_->port;
}

void Server::stop() {
  impl_->http->stop();
  if (impl_->bg.joinable()) impl_->bg.join();
}

}  // namespace qf
